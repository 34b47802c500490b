"""llama-server's real logs read by the llama.cpp family: boot reports, adjustments with evidence, failures.

The fixtures in ``logs/llamacpp/`` were captured from the real CPU build by ``llamacpp_cases.py`` (one
``.log`` and one ``.json`` with the argv, exit code, ``/props`` + ``/slots`` and any HTTP error body per case).
Each case's ``check`` holds the facts that must stay true wherever the case runs; the default tier checks
them on the fixtures, the ``llamacpp`` tier regenerates each case with the real binary and checks them again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from llamacpp_cases import CASES, FIXTURES, binary, capture, write_models

from elsa_tune.errors import ConfigError
from elsa_tune.runtime.boot_report import Adjustment, BootReport
from elsa_tune.runtime.failure import Failure, FailureHints, FailureKind
from elsa_tune.runtime.family import FamilyName, detect
from elsa_tune.runtime.llamacpp.family import LLAMACPP
from elsa_tune.search_spaces.candidate import Candidate


@dataclass(frozen=True)
class Seen:
    """One case as the family reads it."""

    log: str
    report: BootReport
    failure: Failure | None
    info: dict[str, Any] | None
    response: dict[str, Any] | None

    def adjustment(self, flag: str) -> Adjustment:
        (found,) = [a for a in self.report.adjustments if a.flag == flag]
        assert found.evidence.strip() and found.evidence.split(" ", 2)[-1] in self.log
        return found


def _read(log: str, info: dict[str, Any] | None, response: dict[str, Any] | None,
          flags: dict[str, Any] | None = None) -> Seen:
    assert detect(log) is LLAMACPP
    candidate = Candidate(flags=flags) if flags else None
    report = LLAMACPP.boot_report(log, candidate, info)
    failure = LLAMACPP.classify(log) if LLAMACPP.looks_failed(log) else None
    return Seen(log, report, failure, info, response)


def _served(seen: Seen, slots: int, per_slot: int, unified: bool) -> None:
    report = seen.report
    assert seen.failure is None
    assert report.runtime_version == "b0-0c1e570"
    assert (report.max_running_requests, report.context_len, report.kv_unified) == (slots, per_slot, unified)
    assert report.boot_seconds is not None and 0 < report.boot_seconds < 30
    assert {(b.device, b.kind) for b in report.buffers} >= {("CPU_Mapped", "model"), ("CPU", "kv"), ("CPU", "compute")}
    assert report.weights_mem_gb == pytest.approx(0.41 / 1024, rel=0.05)
    assert report.kv_dtype == "f16"


def _normal(seen: Seen) -> None:
    _served(seen, slots=4, per_slot=1024, unified=False)
    assert seen.report.max_total_num_tokens == seen.report.kv_pool_tokens == 4096
    assert seen.report.speculative is False
    # without the requested flags only what the log proves: nothing was changed behind our back
    assert seen.report.adjustments == ()
    split = _read(seen.log, seen.info, None, {"c": 4096, "np": 4}).adjustment("ctx-size")
    assert (split.requested, split.effective) == (4096, 1024)
    assert "llama_context: n_ctx_seq             = 1024" in split.evidence and "split across 4 slots" in split.reason


def _fit_np_auto(seen: Seen) -> None:
    _served(seen, slots=4, per_slot=2048, unified=True)
    auto = seen.adjustment("parallel")
    assert (auto.requested, auto.effective) == (None, 4)
    assert "n_parallel is set to auto, using n_parallel = 4 and kv_unified = true" in auto.evidence
    assert any("one unified pool of 2,048 cells shared by 4 slots" in w and "every running generation is aborted" in w
               for w in seen.report.warnings)


def _fit_ctx_unset(seen: Seen) -> None:
    _served(seen, slots=2, per_slot=2048, unified=False)
    derived = seen.adjustment("ctx-size")
    assert (derived.requested, derived.effective) == (None, 4096)
    assert "context size unset and KV cache not unified -> using 4096 for 2 sequences" in derived.evidence
    assert any(w.startswith("--fit is on (the default)") for w in seen.report.warnings)


def _host_oom_kv(seen: Seen) -> None:
    assert seen.failure is not None and seen.failure.kind is FailureKind.NO_ROOM_FOR_KV
    assert seen.failure.summary.startswith("host memory ran out allocating the KV cache")
    assert any("ggml_aligned_malloc: insufficient memory" in e for e in seen.failure.evidence)
    assert any("failed to allocate buffer for kv cache" in e for e in seen.failure.evidence)
    assert "-c" in seen.failure.remedy and "-ctk q8_0" in seen.failure.remedy
    assert any("--fit leaves a -c set by the user alone" in w for w in seen.report.warnings)


def _host_oom_bad_alloc(seen: Seen) -> None:
    assert seen.failure is not None and seen.failure.kind is FailureKind.NO_ROOM_FOR_KV
    assert "n_ctx = 40,000,000" in seen.failure.summary
    assert any("failed to initialize the context: std::bad_alloc" in e for e in seen.failure.evidence)


def _compute_oom(seen: Seen) -> None:
    assert seen.failure is not None and seen.failure.kind is FailureKind.COMPUTE_BUFFER_OOM
    assert any("failed to allocate compute pp buffers" in e for e in seen.failure.evidence)
    assert "-ub" in seen.failure.remedy and "-fa on" in seen.failure.remedy
    assert seen.report.kv_pool_gb == pytest.approx(1.0)       # the KV cache was allocated, the compute buffer not


def _bad_flag(seen: Seen) -> None:
    assert seen.failure is not None and seen.failure.kind is FailureKind.BAD_FLAG
    assert seen.failure.evidence == ("error: invalid argument: --no-such-flag",)
    assert "--no-such-flag" in seen.failure.remedy


def _bad_value(flag: str, why: str) -> Callable[[Seen], None]:
    def check(seen: Seen) -> None:
        assert seen.failure is not None and seen.failure.kind is FailureKind.BAD_FLAG
        assert f'"{flag}"' in seen.failure.evidence[0] and why in seen.failure.summary
        assert flag in seen.failure.remedy
    return check


def _quantized_v(seen: Seen) -> None:
    assert seen.failure is not None and seen.failure.kind is FailureKind.BAD_FLAG
    assert "quantized V cache requires flash_attn to be enabled" in seen.failure.evidence[0]
    assert "-fa on" in seen.failure.remedy


def _missing_model(seen: Seen) -> None:
    assert seen.failure is not None and seen.failure.kind is FailureKind.MODEL_LOAD_FAILED
    assert "failed to open GGUF file 'no-such-model.gguf'" in seen.failure.evidence[0]
    stopper = LLAMACPP.study_stopper(seen.log)
    assert isinstance(stopper, ConfigError) and "-m/--model" in (stopper.remedy or "")


def _port_in_use(seen: Seen) -> None:
    assert seen.failure is not None and seen.failure.kind is FailureKind.PORT_IN_USE
    assert "couldn't bind HTTP server socket" in seen.failure.evidence[0]


def _draft_incompatible(seen: Seen) -> None:
    _served(seen, slots=2, per_slot=2048, unified=False)
    assert seen.report.speculative is False
    dropped = seen.adjustment("model-draft")
    assert (dropped.requested, dropped.effective) == ("draft-bad.gguf", None)
    assert "the target and draft vocabs are not compatible" in dropped.evidence
    assert "serves on without speculative decoding" in dropped.reason
    assert {b.kind for b in seen.report.buffers} >= {"draft-model", "draft-kv"}


def _draft_unused(seen: Seen) -> None:
    _served(seen, slots=2, per_slot=2048, unified=False)
    assert seen.report.speculative is False
    unused = seen.adjustment("model-draft")
    assert (unused.requested, unused.effective) == ("draft.gguf", None)
    assert "no implementations specified for speculative decoding" in unused.evidence
    assert "--spec-type draft-simple" in unused.reason


def _draft_active(seen: Seen) -> None:
    _served(seen, slots=2, per_slot=2048, unified=False)
    assert seen.report.speculative is True
    assert seen.report.server_args["spec_type"] == "draft-simple"
    assert not [a for a in seen.report.adjustments if a.flag == "model-draft"]


def _env_overridden(seen: Seen) -> None:
    # LLAMA_ARG_N_PARALLEL=2 took effect silently; LLAMA_ARG_CTX_SIZE lost to -c and the log says so
    _served(seen, slots=2, per_slot=2048, unified=False)
    assert any(w.startswith("LLAMA_ARG_CTX_SIZE is set in the environment (here overridden by -c)")
               for w in seen.report.warnings)
    env = Candidate(flags={"ctx-size": 4096}, env={"LLAMA_ARG_CTX_SIZE": "2048", "LLAMA_ARG_N_PARALLEL": "2"})
    report = LLAMACPP.boot_report(seen.log, env)
    (from_env,) = [a for a in report.adjustments if a.flag == "parallel"]
    assert (from_env.requested, from_env.effective, from_env.evidence) == (None, "2",
                                                                           "environment: LLAMA_ARG_N_PARALLEL=2")


def _context_exceeded(seen: Seen) -> None:
    assert seen.failure is not None and seen.failure.kind is FailureKind.CONTEXT_EXCEEDED
    assert seen.failure.phase == "serve"
    assert "exceeds the available context size (512 tokens)" in seen.failure.evidence[0]
    assert "-c" in seen.failure.remedy and "-np" in seen.failure.remedy
    assert seen.response is not None and seen.response["error"]["type"] == "exceed_context_size_error"
    assert LLAMACPP.classify(json.dumps(seen.response)).kind is FailureKind.CONTEXT_EXCEEDED


CHECKS: dict[str, Callable[[Seen], None]] = {
    "normal_c4096_np4": _normal, "fit_np_auto": _fit_np_auto, "fit_ctx_unset_np2": _fit_ctx_unset,
    "host_oom_kv": _host_oom_kv, "host_oom_bad_alloc": _host_oom_bad_alloc, "compute_buffer_oom": _compute_oom,
    "bad_flag": _bad_flag, "bad_value_ctk": _bad_value("-ctk", "Unsupported cache type: foo"),
    "bad_value_fa": _bad_value("-fa", "unknown value for --flash-attn: 'maybe'"),
    "quantized_v_without_fa": _quantized_v, "missing_model": _missing_model, "port_in_use": _port_in_use,
    "draft_incompatible": _draft_incompatible, "draft_unused": _draft_unused, "draft_active": _draft_active,
    "env_overridden": _env_overridden, "context_exceeded": _context_exceeded,
}


def test_every_case_has_a_check_and_a_fixture() -> None:
    assert set(CHECKS) == set(CASES)
    for name in CASES:
        assert (FIXTURES / f"{name}.log").is_file() and (FIXTURES / f"{name}.json").is_file()


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_fixture(name: str) -> None:
    meta = json.loads((FIXTURES / f"{name}.json").read_text())
    CHECKS[name](_read((FIXTURES / f"{name}.log").read_text(), meta["info"], meta["response"]))
    assert (meta["exit_code"] == 1) is (not CASES[name].serves)


def test_the_ready_line_is_the_listening_line() -> None:
    log = (FIXTURES / "normal_c4096_np4.log").read_text()
    (line,) = [ln for ln in log.splitlines() if LLAMACPP.ready_line in ln]
    assert line.endswith(tuple(f":{port}" for port in range(1024, 65536))) and "llama_server: listening on" in line


def test_info_overrides_the_log_and_the_log_fills_the_rest() -> None:
    meta = json.loads((FIXTURES / "draft_active.json").read_text())
    report = LLAMACPP.boot_report((FIXTURES / "draft_active.log").read_text(), None, meta["info"])
    assert (report.max_running_requests, report.context_len, report.speculative) == (2, 2048, True)
    assert LLAMACPP.boot_report("", None, meta["info"]).runtime_version == "b0-0c1e570"


def test_normal_report_fields_exactly() -> None:
    report = LLAMACPP.boot_report((FIXTURES / "normal_c4096_np4.log").read_text())
    assert [(b.device, b.kind, b.mib) for b in report.buffers] == [
        ("CPU_Mapped", "model", 0.41), ("CPU", "output", 0.0), ("CPU", "kv", 1.0), ("CPU", "compute", 2.01)]
    assert report.kv_pool_gb == pytest.approx(1 / 1024, abs=1e-6)
    assert report.server_args["n_ctx_train"] == 2048 and report.server_args["n_batch"] == 2048
    assert [p.name for p in report.phases] == ["fit", "load_weights", "context", "warmup"]
    assert report.layers_offloaded is None                    # the CPU build offloads nothing and says nothing


def test_requested_values_the_runtime_changed() -> None:
    log = (FIXTURES / "normal_c4096_np4.log").read_text()
    report = LLAMACPP.boot_report(log, Candidate(flags={"ctx-size": 4096, "parallel": 4, "ubatch-size": 4096,
                                                        "cache-type-k": "q8_0"}))
    by_flag = {a.flag: a for a in report.adjustments}
    assert by_flag["ubatch-size"].effective == 512 and "n_ubatch              = 512" in by_flag["ubatch-size"].evidence
    assert by_flag["cache-type-k"].effective == "f16" and "K (f16)" in by_flag["cache-type-k"].evidence
    assert "parallel" not in by_flag


def test_sigkill_without_an_error_line_is_the_oom_killer() -> None:
    log = (FIXTURES / "normal_c4096_np4.log").read_text()
    failure = LLAMACPP.classify(log, FailureHints(exit_code=-9, became_ready=True))
    assert failure.kind is FailureKind.HOST_OOM_KILLED and failure.phase == "serve"
    assert "--cache-ram" in failure.remedy and "-c" in failure.remedy


def test_a_clean_boot_is_not_a_failure_and_sglang_logs_are_not_llamacpp() -> None:
    for name in ("normal_c4096_np4", "draft_incompatible", "draft_unused", "env_overridden"):
        assert not LLAMACPP.looks_failed((FIXTURES / f"{name}.log").read_text())
    sglang = (FIXTURES.parent / "hybrid_mamba_qwen35_tp2.log").read_text()
    assert not LLAMACPP.recognises(sglang)
    detected = detect(sglang)
    assert detected is not None and detected.name is FamilyName.SGLANG


def test_device_kv_allocation_failure_as_the_research_notes_quote_it() -> None:
    # No GPU here: the two lines the H200 wrote for `-c 40000000` (shared/research/llamacpp.md), in their frame.
    log = ("0.00.004.102 I llama_context: n_ctx                 = 40000000\n"
           "0.04.512.000 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 859386.00 MiB on device 0: "
           "cudaMalloc failed: out of memory\n"
           "0.04.513.000 E llama_init_from_model: failed to initialize the context: failed to allocate buffer for "
           "kv cache\n0.04.520.000 E srv  llama_server: exiting due to model loading error\n")
    failure = LLAMACPP.classify(log)
    assert failure.kind is FailureKind.NO_ROOM_FOR_KV and "GPU" in failure.summary
    assert "cudaMalloc failed: out of memory" in failure.evidence[0] and "-ngl" in failure.remedy


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    server = binary()
    if server is None:
        pytest.skip("no llama-server: set ELSA_LLAMA_SERVER or build it (python -m elsa_tune.runtime.llamacpp.build)")
    work = tmp_path_factory.mktemp("llamacpp")
    write_models(work)
    return server, work


@pytest.mark.llamacpp
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_live(name: str, live: tuple[Path, Path]) -> None:
    server, work = live
    captured = capture(name, server, work)
    CHECKS[name](_read(captured.log, captured.info, captured.response))
