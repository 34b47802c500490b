"""The runtime-family contract: every family (SGLang, llama.cpp, vLLM) keeps the promises of ``RuntimeFamily``.

Each family is exercised on text its own server wrote (a saved ``--help`` and real startup logs), never on the
other family's, and on garbage: reading never raises, the host and port are always elsa-tune's, the model
flag is one of the family's own flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from elsa_tune.runtime.failure import FailureHints, FailureKind
from elsa_tune.runtime.family import FamilyName, RuntimeFamily, detect, family
from elsa_tune.search_spaces.candidate import Candidate

LOGS = Path(__file__).parent / "logs"
DATA = Path(__file__).parent / "data"


@dataclass(frozen=True)
class Case:
    name: FamilyName
    help_text: Path
    booted_log: Path
    failed_log: Path
    failed_kind: FailureKind
    model: str


CASES = (
    Case(FamilyName.SGLANG, DATA / "sglang-0.5.23-help.txt", LOGS / "hybrid_mamba_qwen35_tp2.log",
         LOGS / "cuda_graph_oom_5285.log", FailureKind.CUDA_GRAPH_FAILED, "/models/m"),
    Case(FamilyName.LLAMACPP, LOGS / "llamacpp" / "help.txt", LOGS / "llamacpp" / "normal_c4096_np4.log",
         LOGS / "llamacpp" / "quantized_v_without_fa.log", FailureKind.BAD_FLAG, "/models/m.gguf"),
    Case(FamilyName.VLLM, DATA / "vllm-0.33.0-help.txt", LOGS / "vllm" / "v1_0330_booted_h200.log",
         LOGS / "vllm" / "v1_0330_cuda_graph_oom_capture_end.log", FailureKind.CUDA_GRAPH_FAILED, "/models/m"),
)


@pytest.fixture(params=CASES, ids=lambda c: c.name.value)
def case(request: pytest.FixtureRequest) -> Case:
    return request.param  # type: ignore[no-any-return]


def impl(case: Case) -> RuntimeFamily:
    return family(case.name)


def test_family_is_found_by_its_name_and_its_value(case: Case) -> None:
    assert family(case.name) is family(case.name.value)
    assert impl(case).name is case.name


def test_help_lists_the_model_and_slots_flags(case: Case) -> None:
    flags = impl(case).parse_help(case.help_text.read_text(), "saved --help")
    assert impl(case).model_flag in flags
    assert impl(case).slots_flag in flags
    assert len(flags.names) > 50


def test_argv_owns_host_and_port(case: Case) -> None:
    candidate = Candidate(flags={impl(case).model_flag: case.model, "host": "0.0.0.0", "port": 1})
    argv = impl(case).argv(("server",), candidate, "127.0.0.1", 43210)
    assert argv[0] == "server"
    assert argv.count("--host") == 1 and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv.count("--port") == 1 and argv[argv.index("--port") + 1] == "43210"
    assert f"--{impl(case).model_flag}" in argv and case.model in argv


def test_booted_log_gives_a_report_with_pool_and_slots(case: Case) -> None:
    text = case.booted_log.read_text()
    report = impl(case).boot_report(text)
    assert report.max_total_num_tokens and report.max_total_num_tokens > 0
    assert report.max_running_requests and report.max_running_requests > 0
    assert report.kv_capacity and report.kv_capacity > 0
    assert not impl(case).looks_failed(text)


def test_failed_log_is_classified_with_evidence_and_remedy(case: Case) -> None:
    text = case.failed_log.read_text()
    assert impl(case).looks_failed(text)
    failure = impl(case).classify(text, FailureHints(exit_code=1))
    assert failure.kind is case.failed_kind
    assert failure.evidence and failure.remedy


def test_garbage_never_raises(case: Case) -> None:
    for text in ("", "\x00\x01 not a log at all\n", "Traceback (most recent call last):\n" * 3):
        impl(case).boot_report(text)
        failure = impl(case).classify(text, FailureHints(exit_code=1))
        assert isinstance(failure.kind, FailureKind)
        assert impl(case).study_stopper(text) is None


def test_each_family_recognises_its_own_logs_only(case: Case) -> None:
    mine = case.booted_log.read_text()
    assert impl(case).recognises(mine)
    assert detect(mine) is impl(case)
    for other in CASES:
        if other.name is not case.name:
            assert not impl(case).recognises(other.booted_log.read_text())


def test_launch_other_than_the_default_is_kept(case: Case) -> None:
    assert impl(case).resolve_launch(("/opt/fork/bin/server", "--x")) == ("/opt/fork/bin/server", "--x")


def test_vocabulary_of_a_missing_model_is_unknown(case: Case, tmp_path: Path) -> None:
    assert impl(case).vocabulary_size(str(tmp_path / "missing")) is None
    assert impl(case).vocabulary_size(None) is None


def test_metric_names_carry_the_family_prefix(case: Case) -> None:
    names = impl(case).metrics
    series = [n for n in (names.prompt_tokens, names.generation_tokens, names.running) if n]
    assert series and all(n.startswith(names.prefix) for n in series)
