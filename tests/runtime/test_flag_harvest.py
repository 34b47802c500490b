"""Flag harvest from ``--help`` and validation with nearest-match hints (real SGLang 0.5.23 help text)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from elsa_tune.errors import ConfigError, RuntimeUnavailable
from elsa_tune.runtime.flags import FlagSet, harvest, parse_help, rejected_by_runtime, require_known, validate

HELP = Path(__file__).parent / "data" / "sglang-0.5.23-help.txt"


@pytest.fixture(scope="module")
def known() -> FlagSet:
    return parse_help(HELP.read_text(), source="sglang 0.5.23")


def test_real_help_text_gives_the_tuning_flags(known: FlagSet) -> None:
    for flag in ("mem-fraction-static", "max-running-requests", "cuda-graph-max-bs-decode", "cuda-graph-max-bs-prefill",
                 "mamba-radix-cache-strategy", "max-mamba-cache-size", "speculative-num-steps", "enable-metrics",
                 "disable-cuda-graph", "model-path", "port", "host"):
        assert flag in known, flag
    assert len(known.names) > 300
    assert "help" not in known.names


def test_aliases_and_negations_are_known(known: FlagSet) -> None:
    assert known.canonical("tensor-parallel-size") == "tp-size"
    assert known.canonical("speculative-draft-model") == "speculative-draft-model-path"
    assert "no-enable-tf32-matmul" in known


def test_flags_removed_in_0523_are_refused_with_the_new_name(known: FlagSet) -> None:
    problems = {p.flag: p for p in validate(["cuda-graph-max-bs", "mamba-scheduler-strategy",
                                             "collect-tokens-histogram", "mem-fraction-static"], known)}
    assert set(problems) == {"cuda-graph-max-bs", "mamba-scheduler-strategy", "collect-tokens-histogram"}
    ambiguous = problems["cuda-graph-max-bs"]
    assert "ambiguous" in ambiguous.message and ambiguous.suggestion == "cuda-graph-max-bs-decode"
    assert problems["mamba-scheduler-strategy"].suggestion is not None
    assert problems["mamba-scheduler-strategy"].suggestion.startswith("mamba-")


def test_typo_gets_nearest_flag_and_abbreviation_is_reported(known: FlagSet) -> None:
    (typo,) = validate(["--mem-fraction-statc"], known)
    assert typo.suggestion == "mem-fraction-static"
    assert typo.explain() == ("--mem-fraction-statc: not a flag of this runtime version; "
                              "did you mean --mem-fraction-static?")
    (abbrev,) = validate(["mem-fraction-stat"], known)
    assert "abbreviation" in abbrev.message and abbrev.suggestion == "mem-fraction-static"


def test_require_known_raises_one_config_error_with_the_remedy(known: FlagSet) -> None:
    require_known(["mem-fraction-static", "tensor-parallel-size"], known)
    with pytest.raises(ConfigError) as caught:
        require_known(["max-runing-requests", "page-size"], known, where="space.yaml")
    assert caught.value.message.startswith("space.yaml: 1 flag(s) not accepted by sglang 0.5.23")
    assert caught.value.remedy.startswith("did you mean --max-running-requests?")
    assert caught.value.exit_code == 2


def test_validate_accepts_a_plain_collection() -> None:
    assert validate(["a-b"], {"a-b", "c"}) == []
    (problem,) = validate(["zzz"], {"a-b"})
    assert problem.suggestion is None


def test_harvest_runs_the_launch_command(tmp_path: Path) -> None:
    script = tmp_path / "launch.py"
    script.write_text("import sys\nprint('usage: x [-h] [--alpha A]\\n\\noptions:\\n  -h, --help  show\\n"
                      "  --alpha A, --a-long A  the alpha\\n  --beta      the beta')\n")
    flags = harvest((sys.executable, str(script)), timeout_s=60)
    assert flags.names == {"alpha", "beta"} and flags.canonical("a-long") == "alpha"


def test_harvest_failures_are_runtime_unavailable(tmp_path: Path) -> None:
    with pytest.raises(RuntimeUnavailable):
        harvest(("/no/such/python", "-m", "sglang.launch_server"))
    with pytest.raises(RuntimeUnavailable) as slow:
        harvest((sys.executable, "-c", "import time; time.sleep(30)"), timeout_s=0.5)
    assert "did not print its flags and exit within 0.5 s" in slow.value.message
    with pytest.raises(RuntimeUnavailable) as broken:
        harvest((sys.executable, "-c", "import sys; print('No module named sglang'); sys.exit(1)"), timeout_s=30)
    assert "No module named sglang" in broken.value.message


@pytest.mark.sglang
def test_real_sglang_help_harvest() -> None:
    python = os.environ.get("ELSA_SGLANG_PYTHON")
    if not python:
        pytest.skip("ELSA_SGLANG_PYTHON is not set")
    flags = harvest((python, "-m", "sglang.launch_server"), timeout_s=600)
    assert {"mem-fraction-static", "cuda-graph-max-bs-decode", "max-mamba-cache-size"} <= flags.names
    assert "cuda-graph-max-bs" not in flags
    saved = parse_help(HELP.read_text())
    assert saved.names == flags.names, "tests/runtime/data/sglang-0.5.23-help.txt is stale"


def test_rejected_by_runtime_without_sglang_is_runtime_unavailable() -> None:
    with pytest.raises(RuntimeUnavailable) as caught:
        rejected_by_runtime(sys.executable, [["--model-path", "x"]], timeout_s=60)
    assert "prepare_server_args" in caught.value.message
    with pytest.raises(RuntimeUnavailable):
        rejected_by_runtime("/no/such/python", [[]])


@pytest.mark.sglang
def test_real_prepare_server_args_accepts_good_and_names_bad_argv() -> None:
    python = os.environ.get("ELSA_SGLANG_PYTHON")
    if not python:
        pytest.skip("ELSA_SGLANG_PYTHON is not set")
    argvs = [["--model-path", "Qwen/Qwen3-8B", "--mem-fraction-static", "0.9", "--max-running-requests", "4"],
             ["--model-path", "Qwen/Qwen3-8B", "--cuda-graph-max-bs", "16"],
             ["--model-path", "Qwen/Qwen3-8B", "--mamba-radix-cache-strategy", "extra_buffer_lazy",
              "--page-size", "32"]]
    rejected = rejected_by_runtime(python, argvs)
    assert [i for i, _ in rejected] == [1]
    assert "ambiguous option: --cuda-graph-max-bs" in rejected[0][1]
