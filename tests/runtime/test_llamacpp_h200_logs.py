"""llama-server logs written on a real NVIDIA H200 (CUDA build of commit 0c1e570, the designed 1.1B model) during
the night of ``benchmarks/llamacpp/last_run.md``: the GPU facts of a boot report and the GPU failures."""

from __future__ import annotations

from pathlib import Path

from elsa_tune.runtime.failure import FailureHints, FailureKind
from elsa_tune.runtime.family import FamilyName, detect, family

LOGS = Path(__file__).parent / "logs" / "llamacpp"
LLAMACPP = family(FamilyName.LLAMACPP)


def test_gpu_boot_report_reads_offload_and_device_buffers() -> None:
    text = (LOGS / "h200_boot_c32768_np4.log").read_text()
    assert detect(text) is LLAMACPP
    report = LLAMACPP.boot_report(text)
    assert (report.layers_offloaded, report.layers_total) == (23, 23)
    assert report.max_total_num_tokens == 32768 and report.context_len == 8192
    assert report.max_running_requests == 4 and report.kv_unified is False
    assert report.kv_dtype == "f16" and report.kv_pool_tokens == 32768
    buffers = {(b.device, b.kind): b.mib for b in report.buffers}
    assert buffers[("CUDA0", "model")] == 1973.35
    assert buffers[("CUDA0", "kv")] == 704.0
    assert ("CUDA0", "compute") in buffers
    assert report.kv_capacity and abs(report.kv_capacity - 32768 / (704 / 1024)) < 1


def test_kv_cache_past_the_gpu_is_no_room_for_kv_with_the_cuda_lines() -> None:
    text = (LOGS / "h200_kv_cuda_oom.log").read_text()
    assert LLAMACPP.looks_failed(text)
    failure = LLAMACPP.classify(text, FailureHints(exit_code=1))
    assert failure.kind is FailureKind.NO_ROOM_FOR_KV
    assert any("cudaMalloc failed: out of memory" in line for line in failure.evidence)
    assert "-c" in failure.remedy


def test_quantized_v_without_flash_attention_is_a_bad_flag_on_the_gpu_too() -> None:
    failure = LLAMACPP.classify((LOGS / "h200_quantized_v_without_fa.log").read_text(), FailureHints(exit_code=1))
    assert failure.kind is FailureKind.BAD_FLAG
    assert "flash" in failure.summary.lower() or "flash" in failure.remedy.lower()


def test_incompatible_draft_is_an_ignored_technique_not_a_failure() -> None:
    text = (LOGS / "h200_draft_incompatible.log").read_text()
    report = LLAMACPP.boot_report(text)
    assert report.speculative is False
    assert [a.flag for a in report.adjustments if "vocabulary" in a.reason] == ["model-draft"]
    assert not LLAMACPP.looks_failed(text)
