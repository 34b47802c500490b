"""``elsa-tune log explain`` on vLLM logs, V0 and V1 (``tests/runtime/logs/vllm/``), through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elsa_tune.runtime.family import FamilyName, family
from elsa_tune.tuner.cli import main

LOGS = Path(__file__).parents[1] / "runtime" / "logs" / "vllm"


def test_capacity_and_the_flags_vllm_received(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "explain", str(LOGS / "v1_0330_booted_h200.log")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Boot report (vLLM)")
    assert "vLLM 0.33.0" in out and "756,224 tokens, dtype auto" in out
    assert "11.54x at 65,536 tokens per request" in out and "103.86 GiB" in out
    assert "Flags vLLM received (non-default args)" in out
    assert "--max-num-seqs" in out and "--enable-prefix-caching" in out
    assert "--max-num-batched-tokens: unset → 8192" in out and "Chunked prefill is enabled" in out
    assert "Failure" not in out


def test_v0_capacity_from_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "explain", str(LOGS / "v0_073_cuda_blocks_booted.log")]) == 0
    out = capsys.readouterr().out
    assert "1,037,008 tokens" in out and "31.65x at 32,768 tokens per request" in out and "55.38 GiB" in out


def test_negative_kv_memory_and_the_failure_with_its_remedy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "explain", str(LOGS / "v1_0330_no_cache_blocks_negative.log")]) == 1
    out = capsys.readouterr().out
    assert "-3.21 GiB" in out and "Failure: no_room_for_kv (boot)" in out
    assert "No available memory for the cache blocks" in out and "remedy: raise --gpu-memory-utilization" in out


@pytest.mark.parametrize(("name", "kind"), [
    ("real_0330_api_server_unrecognized", "bad_flag"), ("real_0330_kv_cache_dtype_fp7", "bad_flag"),
    ("v1_0330_cuda_graph_oom_capture_end", "cuda_graph_failed"), ("v1_0330_no_room_for_max_seq_len", "no_room_for_kv"),
    ("v0_max_seq_len_larger_than_kv", "no_room_for_kv"), ("v1_0330_weights_oom", "weights_oom"),
    ("v1_0330_profile_oom", "profile_oom"), ("v1_0330_gpu_busy", "gpu_busy"), ("v1_0330_port_in_use", "port_in_use"),
    ("v1_0330_technique_crash", "technique_crash")])
def test_json_names_the_family_and_each_failure_class(name: str, kind: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "explain", str(LOGS / f"{name}.log"), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["family"] == "vllm" and data["failure"]["kind"] == kind and data["failure"]["remedy"]


def test_requested_flags_show_what_vllm_changed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "explain", str(LOGS / "v1_0330_profile_oom.log"), "--flags",
                 "vllm serve /models/Qwen3-8B --max-num-batched-tokens 4096 -tp 1"]) == 1
    assert "--max-num-batched-tokens: 4096 → 131072" in capsys.readouterr().out


def test_read_flags_takes_the_model_after_serve_and_short_spellings() -> None:
    candidate = family(FamilyName.VLLM).read_flags("vllm serve /models/m -tp 2 --max_num_seqs 8 --enforce-eager "
                                                   "--gpu-memory-utilization=0.85")
    assert dict(candidate.flags) == {"model": "/models/m", "tensor-parallel-size": 2, "max-num-seqs": 8,
                                     "enforce-eager": True, "gpu-memory-utilization": "0.85"}
