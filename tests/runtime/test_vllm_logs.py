"""vLLM logs, V0 and V1, become boot reports and classified failures (``runtime/vllm/``).

The logs under ``logs/vllm/`` are a holdout set: ``real_0330_*`` are what vLLM 0.33.0 itself printed here (a
refused flag, a refused value); the others are written from vLLM's own format strings (0.33.0's installed
source for V1, the issue's wording for V0: ``# GPU blocks``, ``# cuda blocks``, the bracketless prefix). Every
log is read by the vLLM family, recognised as vLLM's and no other family's, and every value below is the one
the log prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from elsa_tune.runtime.failure import FailureHints, FailureKind
from elsa_tune.runtime.family import FamilyName, detect, family
from elsa_tune.runtime.vllm.family import VLLM, cache_config_info
from elsa_tune.runtime.vllm.log_lines import split_lines
from elsa_tune.runtime.vllm.startup_log import build_report, merge_server_info
from elsa_tune.search_spaces.candidate import Candidate

LOGS = Path(__file__).parent / "logs" / "vllm"


@dataclass(frozen=True)
class Booted:
    log: str
    version: str | None
    kv_tokens: int
    concurrency: float | None
    context: int
    slots: int | None
    kv_gib: float | None


BOOTED = (
    Booted("v1_0330_booted_h200.log", "0.33.0", 756_224, 11.54, 65_536, 64, 103.86),
    Booted("v1_0330_hybrid_concurrency.log", "0.33.0", 89_760, 1.36, 262_144, 8, 4.12),
    Booted("v1_0101_two_line_kv.log", "0.10.1.1", 425_424, 6.49, 65_536, 128, 14.61),
    Booted("v1_0330_shm_broadcast_slow_compile.log", "0.33.0", 2_111_360, 51.55, 40_960, 32, 60.41),
    Booted("v1_0330_adjustments_cudagraph.log", None, 757_392, 18.49, 40_960, 16, 104.02),
    Booted("v1_0330_adjustments_eager_autofit.log", None, 9_216, 1.00, 9_216, None, 3.22),
    Booted("v0_063_gpu_blocks_booted.log", "0.6.3.post1", 27_057 * 16, 13.21, 32_768, 256, None),
    Booted("v0_073_cuda_blocks_booted.log", "0.7.3", 64_813 * 16, 31.65, 32_768, 128, 55.38),
    Booted("v0_083_cuda_blocks_block32.log", "0.8.3", 6_451 * 16, 12.60, 16_384, None, 25.20),
)


@dataclass(frozen=True)
class Failed:
    log: str
    kind: FailureKind
    evidence: str          # a fragment of the line that proves it
    remedy: str            # a fragment of the remedy


FAILED = (
    Failed("real_0330_api_server_unrecognized.log", FailureKind.BAD_FLAG,
           "unrecognized arguments: --max-num-seq-bogus", "--max-num-seq-bogus"),
    Failed("real_0330_serve_unrecognized.log", FailureKind.BAD_FLAG, "unrecognized arguments: --max-num-seqz 8",
           "--max-num-seqz"),
    Failed("real_0330_serve_bad_int.log", FailureKind.BAD_FLAG, "invalid int value: 'x'", "--max-num-seqs"),
    Failed("real_0330_kv_cache_dtype_fp7.log", FailureKind.BAD_FLAG, "validation error for CacheConfig",
           "--kv-cache-dtype"),
    Failed("v1_0330_cuda_graph_oom_capture_end.log", FailureKind.CUDA_GRAPH_FAILED,
           "RuntimeError: CUDA error: out of memory", "capture sizes"),
    Failed("v1_0330_no_room_for_max_seq_len.log", FailureKind.NO_ROOM_FOR_KV, "To serve at least one request",
           "--max-model-len 15,744"),
    Failed("v0_max_seq_len_larger_than_kv.log", FailureKind.NO_ROOM_FOR_KV, "is larger than the maximum number",
           "--max-model-len 23,648"),
    Failed("v1_0330_no_cache_blocks_negative.log", FailureKind.NO_ROOM_FOR_KV,
           "No available memory for the cache blocks", "--gpu-memory-utilization"),
    Failed("v1_0330_weights_oom.log", FailureKind.WEIGHTS_OOM, "CUDA out of memory", "--tensor-parallel-size"),
    Failed("v1_0330_profile_oom.log", FailureKind.PROFILE_OOM, "CUDA out of memory", "--max-num-batched-tokens"),
    Failed("v1_0330_gpu_busy.log", FailureKind.GPU_BUSY, "on startup is less than desired GPU memory utilization",
           "--gpu-memory-utilization"),
    Failed("v1_0330_port_in_use.log", FailureKind.PORT_IN_USE, "[Errno 98] Address already in use", "--port"),
    Failed("v1_0330_technique_crash.log", FailureKind.TECHNIQUE_CRASH, "NotImplementedError: FlashInfer",
           "drop the flag"),
)


def test_every_log_of_the_set_is_in_a_table() -> None:
    named = {case.log for case in BOOTED} | {case.log for case in FAILED}
    assert named == {path.name for path in LOGS.glob("*.log")}


@pytest.mark.parametrize("case", BOOTED, ids=lambda c: c.log)
def test_booted_log_gives_the_printed_capacity(case: Booted) -> None:
    text = (LOGS / case.log).read_text()
    report = VLLM.boot_report(text)
    assert report.runtime_version == case.version
    assert report.max_total_num_tokens == case.kv_tokens == report.kv_capacity
    assert report.max_concurrency == case.concurrency
    assert report.context_len == case.context
    assert report.max_running_requests == case.slots
    assert report.kv_pool_gb == case.kv_gib
    assert not VLLM.looks_failed(text)
    assert detect(text) is VLLM


def test_hybrid_concurrency_is_read_not_derived() -> None:
    report = VLLM.boot_report((LOGS / "v1_0330_hybrid_concurrency.log").read_text())
    assert report.max_total_num_tokens is not None and report.context_len is not None
    assert round(report.max_total_num_tokens / report.context_len, 2) == 0.34
    assert report.max_concurrency == 1.36


@pytest.mark.parametrize("case", FAILED, ids=lambda c: c.log)
def test_failed_log_is_classified_with_its_line_and_remedy(case: Failed) -> None:
    text = (LOGS / case.log).read_text()
    assert VLLM.looks_failed(text)
    failure = VLLM.classify(text, FailureHints(exit_code=1))
    assert failure.kind is case.kind, failure
    assert any(case.evidence in line for line in failure.evidence), failure.evidence
    assert case.remedy in failure.remedy
    assert detect(text) is VLLM
    assert VLLM.study_stopper(text) is None


def test_the_usage_block_of_a_refused_flag_runs_to_hundreds_of_lines_and_one_line_decides() -> None:
    text = (LOGS / "real_0330_api_server_unrecognized.log").read_text()
    assert len(text.splitlines()) > 300
    failure = VLLM.classify(text, FailureHints(exit_code=2))
    assert failure.evidence == ("api_server.py: error: unrecognized arguments: --max-num-seq-bogus",)


def test_the_flags_vllm_received_are_the_server_args() -> None:
    report = VLLM.boot_report((LOGS / "v1_0330_booted_h200.log").read_text())
    assert report.server_args["max_num_seqs"] == 64 and report.server_args["enable_prefix_caching"] is True
    assert report.server_args["model"] == "/models/Qwen3-8B"
    v0 = VLLM.boot_report((LOGS / "v0_063_gpu_blocks_booted.log").read_text())
    assert v0.server_args["block_size"] == 16 and v0.server_args["max_num_seqs"] == 256


def test_negative_available_kv_memory_is_reported_as_printed() -> None:
    report = VLLM.boot_report((LOGS / "v1_0330_no_cache_blocks_negative.log").read_text())
    assert report.kv_pool_gb == -3.21
    assert any("-3.21 GiB" in w for w in report.warnings)


def test_v0_blocks_use_the_requested_block_size_else_the_default_with_a_warning() -> None:
    text = (LOGS / "v0_083_cuda_blocks_block32.log").read_text()
    assumed = VLLM.boot_report(text)
    assert assumed.max_total_num_tokens == 6_451 * 16 and any("block size of 16" in w for w in assumed.warnings)
    given = VLLM.boot_report(text, Candidate(flags={"block-size": 32}))
    assert given.max_total_num_tokens == 6_451 * 32 and not given.warnings


def test_v0_lines_have_no_bracket_before_the_location() -> None:
    lines = split_lines((LOGS / "v0_063_gpu_blocks_booted.log").read_text())
    blocks = next(line for line in lines if "GPU blocks" in line.text)
    assert blocks.level == "INFO" and not blocks.v1_prefix and blocks.text.startswith("# GPU blocks: 27057")
    v1 = next(line for line in split_lines((LOGS / "v1_0330_booted_h200.log").read_text())
              if "KV cache size" in line.text)
    assert v1.process == "EngineCore_DP0" and v1.v1_prefix and v1.text.startswith("GPU KV cache size")


def test_silent_adjustments_carry_the_line_that_proves_them() -> None:
    report = VLLM.boot_report((LOGS / "v1_0330_adjustments_eager_autofit.log").read_text())
    eager = {a.flag: a for a in report.adjustments}
    # --max-model-len -1 (auto) asked vLLM to fit the context: the fit is the report's context, not a clamp;
    # --enforce-eager is applied as asked: a warning says what it turned off, no adjustment files it "clamped".
    assert "max-model-len" not in eager and report.context_len == 9_216
    assert "enforce-eager" not in eager and any("Enforce eager set" in w for w in report.warnings)
    assert eager["dtype"].requested == "bfloat16" and eager["dtype"].effective == "torch.float16"
    assert eager["max-num-batched-tokens"].requested is None and eager["max-num-batched-tokens"].effective == 2048
    graphs = VLLM.boot_report((LOGS / "v1_0330_adjustments_cudagraph.log").read_text()).adjustments
    effective = [a.effective for a in graphs if a.flag == "compilation-config"]
    assert effective == ["cudagraph_mode=PIECEWISE", "max_cudagraph_capture_size=16", "[1, 2, 4, 8, 16]"]


def test_a_numeric_max_model_len_vllm_shrank_is_an_adjustment_and_eager_cancels_requested_graph_sizes() -> None:
    text = (LOGS / "v1_0330_adjustments_eager_autofit.log").read_text()
    fitted = {a.flag: a for a in VLLM.boot_report(
        text, Candidate(flags={"max-model-len": 131072, "max-cudagraph-capture-size": 8, "enforce-eager": True}))
        .adjustments}
    assert fitted["max-model-len"].requested == 131072 and fitted["max-model-len"].effective == 9_216
    assert "Auto-fit max_model_len: reduced from 131072 to 9216" in fitted["max-model-len"].evidence
    assert fitted["max-cudagraph-capture-size"].requested == 8 and "Enforce eager set" in \
        fitted["max-cudagraph-capture-size"].evidence
    assert "enforce-eager" not in fitted


def test_a_requested_budget_vllm_kept_is_no_adjustment() -> None:
    text = (LOGS / "v1_0330_profile_oom.log").read_text()
    assert not [a for a in VLLM.boot_report(text).adjustments if a.flag == "max-num-batched-tokens"]
    asked = build_report(text, Candidate(flags={"max-num-batched-tokens": 4096}))
    (budget,) = [a for a in asked.adjustments if a.flag == "max-num-batched-tokens"]
    assert (budget.requested, budget.effective) == (4096, 131072)


def test_shared_memory_broadcast_warning_is_not_a_failure_but_is_said() -> None:
    text = (LOGS / "v1_0330_shm_broadcast_slow_compile.log").read_text()
    assert not VLLM.looks_failed(text)
    assert any("shared memory broadcast" in w for w in VLLM.boot_report(text).warnings)
    timed_out = VLLM.classify(text.split("torch.compile takes")[0], FailureHints(timed_out=True, elapsed_s=600))
    assert timed_out.kind is FailureKind.BOOT_TIMEOUT and "healthy slow compiles" in timed_out.summary
    hung = VLLM.classify(text, FailureHints(timed_out=True, became_ready=True))
    assert hung.kind is FailureKind.HANG and hung.phase == "serve"


def test_an_oom_after_the_server_was_ready_is_under_load() -> None:
    text = (LOGS / "v1_0330_booted_h200.log").read_text() + (
        "(EngineCore_DP0 pid=40388) ERROR 12-04 09:20:01 [core.py:1012] torch.OutOfMemoryError: CUDA out of "
        "memory. Tried to allocate 2.00 GiB.\n")
    failure = VLLM.classify(text, FailureHints(exit_code=1, became_ready=True))
    assert failure.kind is FailureKind.OOM_UNDER_LOAD and failure.phase == "serve"


@pytest.mark.parametrize(("line", "kind"), [
    ("ValueError: Failed to infer device type", "EnvironmentError_"),
    ("OSError: /models/x does not appear to have a file named config.json", "ConfigError"),
    ("ModuleNotFoundError: No module named 'vllm'", "RuntimeUnavailable"),
])
def test_study_stoppers(line: str, kind: str) -> None:
    stopper = VLLM.study_stopper(f"(APIServer pid=1) {line}\n")
    assert stopper is not None and type(stopper).__name__ == kind and stopper.remedy


def test_cache_config_info_fills_what_the_log_did_not_say() -> None:
    exposition = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
                  '# TYPE vllm:cache_config_info gauge\n'
                  'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",'
                  'kv_cache_max_concurrency="11.54",kv_cache_size_tokens="756224",num_gpu_blocks="47264"} 1.0\n')
    labels = cache_config_info(exposition)
    assert labels["num_gpu_blocks"] == "47264"
    report = merge_server_info(VLLM.boot_report(""), {"cache_config": labels, "max_model_len": 65536})
    assert report.max_total_num_tokens == 756_224 and report.max_concurrency == 11.54
    assert report.kv_dtype == "auto" and report.context_len == 65_536
    older = merge_server_info(VLLM.boot_report(""), {"cache_config": {"num_gpu_blocks": "100", "block_size": "16"}})
    assert older.max_total_num_tokens == 1600


def test_other_families_do_not_claim_vllm_logs() -> None:
    for path in LOGS.glob("*.log"):
        text = path.read_text()
        for name in (FamilyName.SGLANG, FamilyName.LLAMACPP):
            assert not family(name).recognises(text), (name, path.name)


def test_a_cold_compile_is_said_a_warm_one_is_not() -> None:
    booted = (LOGS / "v1_0330_booted_h200.log").read_text()
    prefix = "(EngineCore_DP0 pid=40388) INFO 12-04 09:14:40 [backends.py:418] "
    cold = booted + prefix + "Compiling a graph for compile range (1, 8192) takes 9.21 s\n"
    assert any("torch.compile ran cold" in w for w in VLLM.boot_report(cold).warnings)
    warm = booted + prefix + ("Directly load the compiled graph(s) for compile range (1, 8192) from the cache, "
                              "took 1.2 s\n")
    assert not VLLM.boot_report(warm).warnings


def test_an_engine_core_killed_by_signal_9_is_the_host_oom_killer() -> None:
    text = ("(EngineCore_DP0 pid=2) INFO 12-03 10:00:12 [gpu_model_runner.py:4961] Starting to load model /m...\n"
            "(APIServer pid=1) Traceback (most recent call last):\n"
            "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {'EngineCore_DP0': -9}\n")
    failure = VLLM.classify(text, FailureHints(exit_code=1))
    assert failure.kind is FailureKind.HOST_OOM_KILLED and "-9" in failure.evidence[0]
