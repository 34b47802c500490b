"""Failure classification on real SGLang failure lines and on the §3 signatures."""

from __future__ import annotations

from pathlib import Path

import pytest

from elsa_tune.errors import ConfigError, EnvironmentError_, RuntimeUnavailable
from elsa_tune.runtime.classify import classify, looks_failed, study_stopper
from elsa_tune.runtime.failure import FailureHints, FailureKind

LOGS = Path(__file__).parent / "logs"


def log(name: str) -> str:
    return (LOGS / name).read_text()


def test_startup_oom_while_loading_weights() -> None:
    failure = classify(log("startup_oom_weights_lsglang7.log"), FailureHints(exit_code=-9))
    assert failure.kind is FailureKind.WEIGHTS_OOM
    assert failure.phase == "boot"
    assert "CUDA out of memory. Tried to allocate 24.00 MiB" in failure.evidence[0]
    assert "--tp-size" in failure.remedy


def test_cuda_graph_capture_oom_is_a_graph_failure_not_a_weights_oom() -> None:
    failure = classify(log("cuda_graph_oom_5285.log"), FailureHints(exit_code=-9))
    assert failure.kind is FailureKind.CUDA_GRAPH_FAILED
    assert failure.evidence[0].startswith("Exception: Capture cuda graph failed: CUDA out of memory")
    assert "--cuda-graph-max-bs-decode" in failure.remedy


def test_negative_kv_profile_and_not_enough_memory_mean_no_room_for_kv() -> None:
    for name in ("no_room_for_kv_profiled_7691.log", "not_enough_memory_4330.log"):
        failure = classify(log(name), FailureHints(exit_code=-9))
        assert failure.kind is FailureKind.NO_ROOM_FOR_KV, name
        assert "--mem-fraction-static" in failure.remedy


def test_cut_traceback_without_its_exception_line_is_unknown_not_guessed() -> None:
    failure = classify(log("sigquit_scheduler_oom_8864.log"), FailureHints(exit_code=-9))
    assert failure.kind is FailureKind.UNKNOWN_CRASH
    assert "exit code -9" in failure.summary


def test_boot_logs_and_runtime_lines_do_not_look_failed() -> None:
    for name in ("hybrid_mamba_qwen35_tp2.log", "hybrid_mamba_ling_0523_ready.log", "spec_eagle3_accept_len_11948.log",
                 "clamp_mamba_cap_38846.log"):
        assert not looks_failed(log(name)), name
    assert looks_failed(log("cuda_graph_oom_5285.log"))


# ---- §3 signatures (the exact f-strings of sglang 0.5.23 and argparse) ---------------------------

SIGNATURES = [
    ("usage: sglang serve [-h] --model-path MODEL_PATH\n"
     "sglang serve: error: unrecognized arguments: --cuda-graph-max-bs 16", 2, False, FailureKind.BAD_FLAG,
     "--cuda-graph-max-bs"),
    ("usage: x\nx: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
     "--cuda-graph-max-bs-prefill", 2, False, FailureKind.BAD_FLAG, "--cuda-graph-max-bs"),
    ("usage: x\nx: error: argument --mamba-radix-cache-strategy: invalid choice: 'lazy'", 2, False,
     FailureKind.BAD_FLAG, "--mamba-radix-cache-strategy"),
    ("[2026-01-01 00:00:00] ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): "
     "address already in use", 1, False, FailureKind.PORT_IN_USE, "--port"),
    ("ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.8. "
     "Raise --mem-fraction-static above 0.912 (minimum viable = 0.91)", -9, False, FailureKind.NO_ROOM_FOR_KV,
     "above 0.912"),
    ("RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
     "max_mamba_cache_size=0", -9, False, FailureKind.MAMBA_POOL_TOO_SMALL, "--mamba-full-memory-ratio"),
    ("RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
     "max_mamba_cache_size=3, mamba_ratio=5, resulting max_num_reqs=0", -9, False,
     FailureKind.MAMBA_POOL_TOO_SMALL, "--max-mamba-cache-size"),
    ("[t TP0] Load weight end. elapsed=1.00 s, type=X, avail mem=1.00 GB, mem usage=1.00 GB.\n"
     "The server is fired up and ready to roll!\n"
     "[t TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
     "RuntimeError: Prefill out of memory. Try to lower your batch size.\nTry to allocate 8192 tokens.", -9, True,
     FailureKind.OOM_UNDER_LOAD, "--mem-fraction-static"),
    ("Load weight end. elapsed=1.00 s, type=X, avail mem=1.00 GB, mem usage=1.00 GB.\n"
     "The server is fired up and ready to roll!\n"
     "Triton Error [CUDA]: out of memory", -9, True, FailureKind.OOM_UNDER_LOAD, "--mem-fraction-static"),
    ("Exception: Capture prefill CUDA graph failed: CUDA out of memory. Tried to allocate 2.00 GiB", -9, False,
     FailureKind.CUDA_GRAPH_FAILED, "--disable-prefill-cuda-graph"),
    ("Exception: Capture frozen-KV MTP cuda graph failed: boom", -9, False, FailureKind.CUDA_GRAPH_FAILED,
     "--cuda-graph-max-bs-decode"),
    ("[t TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)", -9, True, FailureKind.HANG,
     "--watchdog-timeout"),
    ("[t] Subprocess scheduler_0 (pid=123) crashed with exit code -9. Triggering SIGQUIT for cleanup...", -9, True,
     FailureKind.HOST_OOM_KILLED, "dmesg"),
    ("Load weight end. elapsed=1.00 s, type=X, avail mem=1.00 GB, mem usage=1.00 GB.", -9, False,
     FailureKind.HOST_OOM_KILLED, "host"),
    ("[t TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
     '  File "/sglang/srt/mem_cache/hicache.py", line 12, in init\n'
     "    n = pool.layer_num\n"
     "AttributeError: 'HybridLinearKVPool' object has no attribute 'layer_num'", -9, False,
     FailureKind.TECHNIQUE_CRASH, "technique"),
]


@pytest.mark.parametrize(("text", "code", "ready", "kind", "remedy_word"), SIGNATURES)
def test_signatures(text: str, code: int, ready: bool, kind: FailureKind, remedy_word: str) -> None:
    failure = classify(text, FailureHints(exit_code=code, became_ready=ready))
    assert failure.kind is kind
    assert remedy_word in failure.remedy or remedy_word in failure.summary
    assert failure.evidence and failure.summary and failure.remedy
    assert failure.exit_code == code
    assert failure.phase == ("serve" if ready else "boot")


def test_technique_crash_names_the_exception_and_where() -> None:
    failure = classify(SIGNATURES[-1][0], FailureHints(exit_code=-9))
    assert "'HybridLinearKVPool' object has no attribute 'layer_num'" in failure.summary
    assert any("hicache.py" in line for line in failure.evidence)


def test_timeouts_split_into_boot_timeout_and_hang() -> None:
    boot = classify("[t TP0] Load weight begin. avail mem=80.00 GB", FailureHints(timed_out=True, elapsed_s=900.0))
    assert boot.kind is FailureKind.BOOT_TIMEOUT and "900 s" in boot.summary
    assert boot.evidence == ("[t TP0] Load weight begin. avail mem=80.00 GB",)
    hang = classify("The server is fired up and ready to roll!", FailureHints(timed_out=True, became_ready=True))
    assert hang.kind is FailureKind.HANG and hang.phase == "serve"


def test_exit_2_with_usage_and_nothing_else_is_a_bad_flag() -> None:
    failure = classify("usage: sglang serve [-h]", FailureHints(exit_code=2))
    assert failure.kind is FailureKind.BAD_FLAG


def test_empty_log_is_unknown_and_says_so() -> None:
    failure = classify("", FailureHints(exit_code=1))
    assert failure.kind is FailureKind.UNKNOWN_CRASH and "exit code 1" in failure.summary


@pytest.mark.parametrize("name", ["watchdog_hang_7783.log", "watchdog_hang_softthinking10.log"])
def test_real_watchdog_timeouts_are_hangs(name: str) -> None:
    failure = classify(log(name), FailureHints(exit_code=-9, became_ready=True))
    assert failure.kind is FailureKind.HANG
    assert "Watchdog timeout (self.watchdog_timeout=300)" in failure.evidence[0]
    assert "--watchdog-timeout" in failure.remedy


def test_real_0523_ambiguous_flag_names_the_flag() -> None:
    failure = classify(log("bad_flag_ambiguous_sglang0523_local.log"), FailureHints(exit_code=2))
    assert failure.kind is FailureKind.BAD_FLAG
    assert failure.summary == "the runtime rejected the flag --cuda-graph-max-bs"
    assert failure.evidence[0].startswith("sglang serve: error: ambiguous option: --cuda-graph-max-bs")
    assert study_stopper(log("bad_flag_ambiguous_sglang0523_local.log")) is None


def test_real_0523_bad_model_path_stops_the_study() -> None:
    stopper = study_stopper(log("model_path_invalid_sglang0523_local.log"))
    assert isinstance(stopper, ConfigError)
    assert "the model path cannot be loaded" in stopper.message and "--model-path" in stopper.remedy


@pytest.mark.parametrize(("line", "error"), [
    ("/usr/bin/python3: Error while finding module specification for 'sglang.launch_server' "
     "(ModuleNotFoundError: No module named 'sglang')", RuntimeUnavailable),
    ("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU",
     EnvironmentError_),
])
def test_environment_failures_stop_the_study(line: str, error: type[Exception]) -> None:
    assert isinstance(study_stopper(line), error)
    assert study_stopper(log("cuda_graph_oom_5285.log")) is None
