"""vLLM's flags from its own ``--help=all`` (saved from vLLM 0.33.0), and the command line of a vLLM boot."""

from __future__ import annotations

from pathlib import Path

import pytest

from elsa_tune.runtime.flags import validate
from elsa_tune.runtime.vllm.family import VLLM
from elsa_tune.runtime.vllm.flags import VllmFlagSet, canonical, parse_help
from elsa_tune.search_spaces.candidate import Candidate

HELP = Path(__file__).parent / "data" / "vllm-0.33.0-help.txt"


@pytest.fixture(scope="module")
def flags() -> VllmFlagSet:
    return parse_help(HELP.read_text(), "vllm serve")


def test_the_help_lists_the_flags_a_study_tunes(flags: VllmFlagSet) -> None:
    for name in ("model", "max-num-seqs", "max-num-batched-tokens", "gpu-memory-utilization", "kv-cache-memory-bytes",
                 "kv-cache-dtype", "block-size", "max-model-len", "speculative-config", "compilation-config",
                 "enable-chunked-prefill", "enable-prefix-caching", "enforce-eager", "tensor-parallel-size"):
        assert name in flags, name
    assert len(flags.names) > 300


def test_other_spellings_of_a_valued_flag_are_aliases(flags: VllmFlagSet) -> None:
    assert flags.canonical("tp") == "tensor-parallel-size"
    assert flags.canonical("device-memory-utilization") == "gpu-memory-utilization"
    assert flags.canonical("cc") == "compilation-config"
    for alias, main in flags.aliases.items():
        assert canonical(alias) == main or alias not in ("tp", "pp", "dp", "cc", "sc", "q")


def test_each_spelling_of_a_switch_is_a_switch_of_its_own(flags: VllmFlagSet) -> None:
    shapes = flags.shapes()
    for name in ("enable-prefix-caching", "disable-prefix-caching", "enforce-eager", "no-enforce-eager",
                 "enable-chunked-prefill", "disable-chunked-prefill"):
        assert name in flags.names and not shapes[name].takes_value, name
    assert shapes["max-num-seqs"].takes_value and shapes["max-num-seqs"].choices is None


def test_choices_printed_as_a_python_list_are_read(flags: VllmFlagSet) -> None:
    choices = flags.shapes()["kv-cache-dtype"].choices
    assert choices is not None and "fp8" in choices and "auto" in choices and "fp7" not in choices
    assert flags.shapes()["performance-mode"].choices == ("balanced", "interactivity", "throughput")


def test_an_abbreviated_prefix_is_refused_though_argparse_would_read_it(flags: VllmFlagSet) -> None:
    (problem,) = validate(["max-num-seq"], flags)
    assert problem.suggestion == "max-num-seqs" and "abbreviation" in problem.message
    assert not validate(["max-num-seqs", "tp", "enable-prefix-caching"], flags)


def test_argv_puts_the_model_after_serve_and_owns_host_and_port() -> None:
    candidate = Candidate(flags={"model": "/models/m", "max-num-seqs": 8, "tp": 2, "enable-prefix-caching": True,
                                 "port": 1})
    argv = VLLM.argv(("vllm", "serve"), candidate, "127.0.0.1", 4321)
    assert argv[:3] == ["vllm", "serve", "/models/m"]
    assert "--model" not in argv and "--max-num-seqs" in argv and "--tensor-parallel-size" in argv
    assert argv[-4:] == ["--host", "127.0.0.1", "--port", "4321"] and argv.count("--port") == 1
    fork = VLLM.argv(("python", "-m", "vllm.entrypoints.openai.api_server"), candidate, "127.0.0.1", 4321)
    assert fork[fork.index("--model") + 1] == "/models/m"


def test_readiness_is_health_alone_and_the_help_needs_every_flag() -> None:
    assert VLLM.ready_line is None
    assert VLLM.help_flag == "--help=all" and VLLM.help_env["VLLM_TARGET_DEVICE"] == "cpu"
    assert VLLM.slots_flag == "max-num-seqs" and VLLM.model_flag == "model"


def test_metric_names_and_their_older_names() -> None:
    names = VLLM.metrics
    assert names.kv_usage == "vllm:kv_cache_usage_perc"
    assert names.renamed["vllm:gpu_cache_usage_perc"] == names.kv_usage
    assert names.renamed["vllm:gpu_prefix_cache_hits_total"] == names.cached_prompt_tokens
    assert names.renamed["vllm:time_per_output_token_seconds"] == "vllm:inter_token_latency_seconds"
