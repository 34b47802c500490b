"""The simulator speaking vLLM 0.33.0: its parser, the vocabulary to the engine's knobs, the V1 boot log read by
the vLLM family, its failures as vLLM prints them, and a live ``sim serve --family vllm`` server's endpoints and
metric names. Every number is simulated."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from elsa_tune.errors import BootFailed
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.family import FamilyName, detect
from elsa_tune.runtime.sim import vllm_flags
from elsa_tune.runtime.sim.dialect import dialect
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.runtime.sim.runtime import SimulatedServer
from elsa_tune.runtime.sim.truth import TruthWorkload
from elsa_tune.runtime.sim.virtual import VirtualServer
from elsa_tune.runtime.sim.vocabulary import EngineConfigError, batch_defaults, resolve
from elsa_tune.search_spaces.candidate import Candidate

TINY = "tiny-test"
BIG = "rtx5090-qwen3.8-27b-nvfp4"
#: ``(<Proc> pid=<pid>) LEVEL MM-DD HH:MM:SS [file.py:line] msg`` (vllm/logger.py's _FORMAT)
PREFIX = re.compile(r"^\((APIServer|EngineCore) pid=\d+\) (INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d "
                    r"\[[\w.]+\.py:\d+\] ")


def launch(profile: str, flags: dict[str, object]) -> tuple[VirtualServer, Candidate]:
    return VirtualServer(profile, family_name="vllm"), Candidate(flags=flags)  # type: ignore[arg-type]


# ---- the parser ---------------------------------------------------------------------------------------------


def test_the_parser_reads_vllms_spellings() -> None:
    parsed = vllm_flags.parser().parse_args(["my-model", "--max_num_seqs=8", "--disable-prefix-caching",
                                             "--max-model-len", "auto", "--max-num-batched-tokens", "4k",
                                             "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}'])
    given = vllm_flags.given_args(parsed)
    assert given == {"model": "my-model", "max_num_seqs": 8, "enable_prefix_caching": False, "max_model_len": -1,
                     "max_num_batched_tokens": 4000,
                     "speculative_config": {"method": "mtp", "num_speculative_tokens": 2}}
    assert vllm_flags.requested_flags(given)["speculative-config"] == '{"method": "mtp", "num_speculative_tokens": 2}'


def test_an_unknown_flag_exits_2_like_vllm(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "elsa_tune", "sim", "serve", "--family", "vllm", "--sim-profile",
                           TINY, "--sim-card-dir", str(tmp_path), "--model", "m", "--max-num-seqz", "4"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: ")
    # like vLLM's own serve parser, the value after an unknown flag is read as the positional model_tag
    assert done.stderr.rstrip().splitlines()[-1] == "vllm: error: unrecognized arguments: --max-num-seqz"
    bad_type = subprocess.run([sys.executable, "-m", "elsa_tune", "sim", "serve", "--family", "vllm",
                               "--sim-profile", TINY, "--max-num-seqs", "many"],
                              capture_output=True, text=True, timeout=120, check=False)
    assert bad_type.returncode == 2 and "argument --max-num-seqs: invalid int value: 'many'" in bad_type.stderr


# ---- the vocabulary -----------------------------------------------------------------------------------------


def test_vllms_defaults_follow_the_card_memory() -> None:
    assert batch_defaults(32) == (2048, 256)
    assert batch_defaults(80) == (8192, 1024)
    assert batch_defaults(192) == (16384, 1024)
    config = resolve(load_profile(TINY), {})
    assert (config.max_num_batched_tokens, config.max_num_seqs, config.chunked_prefill) == (2048, 256, True)
    assert config.prefix_caching and config.gpu_memory_utilization == 0.92 and config.block_size == 16
    knobs = config.knobs
    assert knobs["max-running-requests"] == 256 and knobs["chunked-prefill-size"] == 2048
    assert knobs["disable-radix-cache"] is False and knobs["kv-cache-dtype"] == "bf16"


def test_the_engine_config_refuses_what_vllm_refuses() -> None:
    profile = load_profile(TINY)
    with pytest.raises(EngineConfigError, match="must be greater than or equal to max_num_seqs"):
        resolve(profile, {"max_num_batched_tokens": 4, "max_num_seqs": 8})
    with pytest.raises(EngineConfigError, match=r"is smaller than max_model_len \(8192\)"):
        resolve(profile, {"enable_chunked_prefill": False, "max_num_batched_tokens": 4096, "max_model_len": 8192})
    with pytest.raises(EngineConfigError, match="Invalid kv_cache_dtype: 'fp7'") as caught:
        resolve(profile, {"kv_cache_dtype": "fp7"})
    assert caught.value.text.startswith("pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                                        "CacheConfig")
    with pytest.raises(EngineConfigError, match="less than or equal to 1"):
        resolve(profile, {"gpu_memory_utilization": 1.5})


def test_memory_knobs_move_the_kv_cache_as_in_vllm() -> None:
    runtime = VirtualServer(TINY, family_name="vllm")

    def tokens(flags: dict[str, object]) -> int:
        launched = runtime.launch(Candidate(flags={"max-model-len": 4096, "max-num-seqs": 2, **flags}))  # type: ignore[dict-item]
        assert launched.report is not None, launched.failure
        assert launched.report.kv_pool_tokens is not None
        return launched.report.kv_pool_tokens

    base = tokens({"gpu-memory-utilization": 0.8})
    assert tokens({"gpu-memory-utilization": 0.9}) > base                          # a larger budget
    assert 1.9 < tokens({"gpu-memory-utilization": 0.8, "kv-cache-dtype": "fp8"}) / base < 2.1   # fp8 doubles it
    assert tokens({"gpu-memory-utilization": 0.8, "enforce-eager": True}) > base   # no graphs: their memory is KV
    explicit = tokens({"kv-cache-memory-bytes": "1G"})
    bytes_per_token = load_profile(TINY).model.kv_bytes("bf16")
    assert abs(explicit - 10**9 // bytes_per_token) < 0.05 * explicit


def test_enforce_eager_costs_decode_speed() -> None:
    runtime = VirtualServer(TINY, family_name="vllm")
    work = TruthWorkload(concurrency=2, num_requests=8, input_tokens=(512,), output_tokens=(128,), name="eager")
    graphs = runtime.serve(Candidate(flags={"max-model-len": 4096, "max-num-seqs": 2}), work)
    eager = runtime.serve(Candidate(flags={"max-model-len": 4096, "max-num-seqs": 2, "enforce-eager": True}), work)
    assert eager.makespan_s > 1.1 * graphs.makespan_s


def test_max_model_len_auto_fits_the_context_to_the_cache() -> None:
    runtime, candidate = launch(TINY, {"max-model-len": "auto", "gpu-memory-utilization": 0.6, "max-num-seqs": 2})
    launched = runtime.launch(candidate)
    assert launched.report is not None and launched.report.context_len is not None
    assert launched.report.context_len < load_profile(TINY).model.context_length
    assert "Auto-fit max_model_len: reduced from 32768 to " in launched.log_text


# ---- the boot log, read by the vLLM family ------------------------------------------------------------------


def test_the_boot_log_is_vllms_v1_log_and_the_family_reads_it() -> None:
    runtime, candidate = launch(TINY, {"max-model-len": 4096, "max-num-seqs": 2, "gpu-memory-utilization": 0.8})
    launched = runtime.launch(candidate)
    text = launched.log_text
    family = detect(text)
    assert family is not None and family.name is FamilyName.VLLM
    prefixed = [line for line in text.splitlines() if line.startswith("(")]
    assert all(PREFIX.match(line) or "INFO:     " in line for line in prefixed), prefixed
    assert "Uvicorn running on" not in text and "ready to roll" not in text
    assert re.search(r"non-default args: \{.*'max_num_seqs': 2", text)
    assert re.search(r"Available KV cache memory: \d+\.\d\d GiB", text)
    match = re.search(r"GPU KV cache size: ([\d,]+) tokens, Maximum concurrency for 4,096 tokens per request: "
                      r"(\d+\.\d\d)x", text)
    assert match is not None
    assert "Chunked prefill is enabled with max_num_batched_tokens=2048." in text
    assert "Graph capturing finished in" in text
    report = launched.report
    assert report is not None and launched.failure is None
    assert report.kv_pool_tokens == int(match[1].replace(",", ""))
    assert report.max_concurrency == pytest.approx(float(match[2]), abs=0.01)
    assert report.max_running_requests == 2 and report.context_len == 4096


@pytest.mark.parametrize(("flags", "kind", "text"), [
    ({"max-model-len": 32768, "gpu-memory-utilization": 0.6}, FailureKind.NO_ROOM_FOR_KV,
     "To serve at least one request with the model's max seq len (32768)"),
    ({"gpu-memory-utilization": 0.3}, FailureKind.NO_ROOM_FOR_KV, "No available memory for the cache blocks"),
    ({"gpu-memory-utilization": 0.999}, FailureKind.GPU_BUSY,
     "on startup is less than desired GPU memory utilization (0.999"),
    ({"max-num-seqz": 2}, FailureKind.BAD_FLAG, "vllm: error: unrecognized arguments: --max-num-seqz"),
])
def test_failures_print_vllms_text_and_classify(flags: dict[str, object], kind: FailureKind, text: str) -> None:
    runtime, candidate = launch(TINY, flags)
    launched = runtime.launch(candidate)
    assert launched.failure is not None and launched.report is None
    assert launched.failure.kind is kind, launched.failure
    assert text in launched.log_text


def test_a_capture_oom_is_a_graph_failure(tmp_path: Path) -> None:
    runtime = SimulatedServer(TINY, card_dir=tmp_path / "card", speedup=50.0, family_name="vllm",
                              faults="cuda_graph_failed")
    with pytest.raises(BootFailed) as caught:
        runtime.start(Candidate(flags={"max-model-len": 4096, "max-num-seqs": 2}), tmp_path / "boot")
    assert caught.value.failure.kind is FailureKind.CUDA_GRAPH_FAILED
    log = (tmp_path / "boot" / "server.log").read_text()
    assert "Capturing CUDA graphs" in log and "capture_end" in log and "RuntimeError: CUDA error: out of memory" in log


# ---- a live server ------------------------------------------------------------------------------------------


def test_a_live_simulated_vllm_server(tmp_path: Path) -> None:
    runtime = SimulatedServer(TINY, card_dir=tmp_path / "card", speedup=50.0, family_name="vllm")
    assert runtime.family.name is FamilyName.VLLM and runtime.version == "0.33.0"
    server = runtime.start(Candidate(flags={"max-model-len": 4096, "max-num-seqs": 2,
                                            "speculative-config": '{"method": "mtp", "num_speculative_tokens": 2}'}),
                           tmp_path / "boot")
    try:
        assert server.report.kv_pool_tokens and server.report.max_concurrency
        assert server.report.speculative is not False
        base = server.base_url
        assert httpx.get(f"{base}/version", timeout=10).json() == {"version": "0.33.0"}
        models = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]
        assert models["owned_by"] == "vllm" and models["max_model_len"] == 4096
        assert httpx.get(f"{base}/server_info", timeout=10).status_code == 404    # SGLang's, not vLLM's
        answer = httpx.post(f"{base}/v1/completions", json={"model": models["id"], "prompt": "What is 2+2?",
                                                            "max_tokens": 16}, timeout=30)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] > 0
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                     "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
                     "vllm:prefix_cache_hits_total", "vllm:request_success_total",
                     "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                     "vllm:e2e_request_latency_seconds_bucket", "vllm:request_prompt_tokens_bucket",
                     "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total",
                     "vllm:cache_config_info"):
            assert f"\n{name}" in metrics, name
        assert "sglang:" not in metrics
        info = re.search(r'vllm:cache_config_info\{[^}]*kv_cache_size_tokens="(\d+)"', metrics)
        assert info is not None and int(info[1]) == server.report.kv_pool_tokens
        log = server.log_path.read_text()
        assert "Starting vLLM server on http://127.0.0.1:" in log and "Uvicorn running on" not in log
    finally:
        assert runtime.stop(server).returncode == 0


def test_a_live_boot_failure_is_classified_by_the_vllm_family(tmp_path: Path) -> None:
    runtime = SimulatedServer(TINY, card_dir=tmp_path / "card", speedup=50.0, family_name="vllm")
    with pytest.raises(BootFailed) as caught:
        runtime.start(Candidate(flags={"max-model-len": 32768, "gpu-memory-utilization": 0.6}), tmp_path / "boot")
    assert caught.value.failure.kind is FailureKind.NO_ROOM_FOR_KV
    assert caught.value.failure.exit_code == 1     # vLLM's API server exits 1; SGLang's tree is SIGKILLed (-9)
    log = (tmp_path / "boot" / "server.log").read_text()
    assert "EngineCore failed to start." in log and "Engine core initialization failed" in log


def test_the_sglang_dialect_is_unchanged() -> None:
    out = io.StringIO()
    log = dialect("sglang").log(out)
    dialect("sglang").ready(log)
    assert out.getvalue().rstrip().endswith("The server is fired up and ready to roll!")
