"""The simulated server's parts without a server process: flags, card, metrics, tokens, faults, boot log."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elsa_tune.errors import ConfigError
from elsa_tune.runtime import sglang_flags
from elsa_tune.runtime.failure import FailureHints, FailureKind
from elsa_tune.runtime.sim.card import IDLE_USED_BYTES, CardLease, CardSpec, SimulatedGpu, read_entries
from elsa_tune.runtime.sim.faults import BOOT_CRASH_KIND, Faults, boot_crash, first_generation_oom_crash
from elsa_tune.runtime.sim.metrics import SglangMetrics
from elsa_tune.runtime.sim.noise import NoiseSettings, ServingNoise
from elsa_tune.runtime.sim.startup import READY_LINE, Boot, MambaPool, ServerLog, StartupFacts
from elsa_tune.runtime.sim.tokens import Completion, block_hashes, solve, text_token_ids

GIB = 1024**3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sim")
    sglang_flags.add_sglang_arguments(parser)
    return parser


# ---- flags ---------------------------------------------------------------------------------------------------


def test_flag_table_is_sglang_0_5_23s() -> None:
    names = {name for spec in sglang_flags.sglang_flags() for name in spec.names}
    assert len(sglang_flags.sglang_flags()) > 500
    for flag in ("--mem-fraction-static", "--max-running-requests", "--mamba-full-memory-ratio",
                 "--speculative-num-steps", "--cuda-graph-max-bs-decode", "--enable-metrics", "--host", "--port"):
        assert flag in names
    # gone in 0.5.20+: the old names must not parse
    assert "--cuda-graph-max-bs" not in names and "--mamba-scheduler-strategy" not in names


def test_parse_keeps_only_given_flags_and_resolves_defaults() -> None:
    ns = _parser().parse_args(["--model-path", "m", "--mem-fraction-static", "0.9", "--enable-metrics",
                               "--context-length", "256k", "--fp4-gemm-backend", "flashinfer_cudnn"])
    given = vars(ns)
    assert given["context_length"] == 256_000
    flags = sglang_flags.requested_flags(given)
    assert flags == {"model-path": "m", "mem-fraction-static": 0.9, "enable-metrics": True,
                     "context-length": 256_000, "fp4-gemm-backend": "flashinfer_cudnn"}
    resolved = sglang_flags.resolve_defaults(given)
    assert resolved["fp4_gemm_runner_backend"] == "flashinfer_cudnn"
    assert resolved["max_prefill_tokens"] == 16384 and resolved["port"] == 30000


@pytest.mark.parametrize(("argv", "message"), [
    (["--model-path", "m", "--no-such-flag", "1"], "unrecognized arguments: --no-such-flag"),
    (["--model-path", "m", "--cuda-graph-max-bs", "8"], "ambiguous option: --cuda-graph-max-bs"),
    (["--model-path", "m", "--kv-cache-dtype", "int3"], "invalid choice: 'int3'"),
    (["--mem-fraction-static", "0.9"], "the following arguments are required: --model-path/--model"),
])
def test_bad_flags_exit_2_like_argparse(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        _parser().parse_args(argv)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_serve_rejects_an_unknown_flag_with_exit_2() -> None:
    done = subprocess.run([sys.executable, "-m", "elsa_tune", "sim", "serve", "--sim-profile", "x",
                           "--model-path", "m", "--enable-turbo"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "error: unrecognized arguments: --enable-turbo" in done.stderr


# ---- card ----------------------------------------------------------------------------------------------------


def test_simulated_gpu_sums_live_leases_and_forgets_dead_ones(tmp_path: Path) -> None:
    gpu = SimulatedGpu(tmp_path, CardSpec(name="RTX 5090", memory_total=32 * GIB, power_limit_w=600.0))
    assert gpu.uuid.startswith("GPU-sim-") and gpu.uuid == SimulatedGpu(tmp_path, gpu.card).uuid
    assert gpu.memory().used == IDLE_USED_BYTES
    mine = CardLease(tmp_path)
    mine.set_used(20 * GIB)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        CardLease(tmp_path, pid=child.pid).set_used(3 * GIB)
        assert gpu.memory().used == IDLE_USED_BYTES + 23 * GIB
        assert {p.pid for p in gpu.state().processes} == {os.getpid(), child.pid}
    finally:
        child.kill()
        child.wait()
    assert gpu.memory().used == IDLE_USED_BYTES + 20 * GIB   # a dead pid's memory is gone
    mine.release()
    mem = gpu.memory()
    assert mem.used == IDLE_USED_BYTES and mem.free == mem.total - mem.used
    assert gpu.state().name.endswith("(simulated)") and gpu.state().memory_total == 32 * GIB


def test_held_memory_outlives_its_process_until_the_hold_ends(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    lease = CardLease(tmp_path, pid=child.pid)
    lease.set_used(5 * GIB)
    lease.hold(0.6)
    child.kill()
    child.wait()
    assert [e.pid for e in read_entries(tmp_path)] == [child.pid]
    time.sleep(0.8)
    assert read_entries(tmp_path) == []


# ---- metrics -------------------------------------------------------------------------------------------------


def test_metrics_render_sglang_names_labels_and_buckets() -> None:
    metrics = SglangMetrics("qwen")
    streaming = {**metrics.tok, "is_streaming": "true"}
    metrics.prompt_tokens.inc(streaming, 100)
    metrics.ttft.observe(streaming, 0.3)
    metrics.itl.observe(metrics.tok, 0.012, weight=3)
    metrics.set_gauges({"num_running_reqs": 2, "token_usage": 0.25})
    text = metrics.render()
    assert "# TYPE sglang:prompt_tokens_total counter" in text
    assert 'sglang:prompt_tokens_total{model_name="qwen",engine_type="unified",is_streaming="true"} 100.0' in text
    assert ('sglang:time_to_first_token_seconds_bucket{model_name="qwen",engine_type="unified",is_streaming="true",'
            'le="0.4"} 1.0') in text
    assert 'sglang:time_to_first_token_seconds_bucket{model_name="qwen",engine_type="unified",is_streaming="true",' \
           'le="0.2"} 0.0' in text
    assert 'sglang:inter_token_latency_seconds_count{model_name="qwen",engine_type="unified"} 3.0' in text
    assert 'le="+Inf"' in text
    assert ('sglang:num_running_reqs{model_name="qwen",engine_type="unified",tp_rank="0",pp_rank="0",'
            'moe_ep_rank="0"} 2.0') in text


# ---- tokens --------------------------------------------------------------------------------------------------


def test_greedy_completion_depends_on_the_prompt_only() -> None:
    ids = text_token_ids("What is 17 + 25?")
    a = Completion.for_prompt(ids, "What is 17 + 25?")
    b = Completion.for_prompt(list(ids), "What is 17 + 25?")
    assert a.text(40) == b.text(40)
    assert a.text(5) == "The answer is 42."
    other = Completion.for_prompt(text_token_ids("What is 17 + 26?"), "What is 17 + 26?")
    assert other.text(40) != a.text(40)
    sampled = Completion.for_prompt(ids, "What is 17 + 25?", stream_salt=7)
    assert sampled.text(5) == a.text(5) and sampled.text(40) != a.text(40)
    assert "".join(a.pieces(0, 10)) + "".join(a.pieces(10, 30)) == a.text(40)


def test_quality_damage_changes_some_answers_deterministically() -> None:
    prompts = [f"Question {i}: what is {i} * 3?" for i in range(200)]
    damaged = [Completion.for_prompt(text_token_ids(p), p, damage=0.6, damage_salt="frspec") for p in prompts]
    wrong = [c for c in damaged if c.text(5) != f"The answer is {c.answer}."]
    assert 80 < len(wrong) < 160
    again = [Completion.for_prompt(text_token_ids(p), p, damage=0.6, damage_salt="frspec") for p in prompts]
    assert [c.text(30) for c in again] == [c.text(30) for c in damaged]


def test_block_hashes_share_exactly_the_common_prefix() -> None:
    a = list(range(100))
    b = [*range(64), *range(1000, 1036)]
    ha, hb = block_hashes(a, 16), block_hashes(b, 16)
    assert len(ha) == 6 and ha[:4] == hb[:4] and ha[4] != hb[4]
    assert solve("12 x 3 apples") == 36 and solve("no numbers") is None


# ---- noise ---------------------------------------------------------------------------------------------------


def test_noise_is_seeded_and_the_first_pass_is_slow() -> None:
    settings = NoiseSettings(boot_sigma=0.1, run_sigma=0.03, first_pass_slowdown=0.127, warm_requests=2)
    a, b = ServingNoise(settings, 1), ServingNoise(settings, 1)
    assert [a.factor(t * 0.01) for t in range(50)] == [b.factor(t * 0.01) for t in range(50)]
    drifts = [ServingNoise(settings, seed).drift for seed in range(200)]
    spread = (sum((d - 1) ** 2 for d in drifts) / len(drifts)) ** 0.5
    assert 0.06 < spread < 0.14
    quiet = ServingNoise(NoiseSettings(boot_sigma=0, run_sigma=0, first_pass_slowdown=0.127, warm_requests=1), 3)
    assert quiet.factor(0.0) == pytest.approx(1.127)
    quiet.request_finished()
    assert quiet.factor(1.0) == pytest.approx(1.0)


# ---- faults --------------------------------------------------------------------------------------------------


def test_fault_text_parses_and_rejects_unknown_names() -> None:
    faults = Faults.parse("slow_boot=3, crash_after_requests=5,gpu_not_released")
    assert faults.slow_boot == 3.0 and faults.crash_after_requests == 5 and faults.gpu_not_released_s == 5.0
    assert Faults.parse("hang").hang_after_requests == 0
    assert Faults.parse("cuda_graph_failed").boot_crash_at("graph", 0.9, 31.4) is not None
    with pytest.raises(ConfigError, match="unknown simulated fault"):
        Faults.parse("meteor_strike")


def _facts(**changes: object) -> StartupFacts:
    base: dict[str, object] = dict(
        server_args={"model_path": "Qwen/Qwen3.6-35B-A3B-NVFP4", "mem_fraction_static": 0.9,
                     "max_running_requests": 2, "context_length": 159776, "enable_mixed_chunk": False},
        total_gb=31.36, weights_gb=18.59, model_class="Qwen3_5ForConditionalGeneration", quant="modelopt_fp4",
        kv_tokens=134016, kv_dtype="torch.float8_e4m3fn", kv_gb=3.88, avail_after_pools_gb=1.9, graph_gb=0.9,
        available_gpu_mem_gb=1.0, chunked_prefill_size=2048, max_prefill_tokens=16384, max_running_requests=2,
        context_len=159776, draft_weights_gb=0.85, draft_buffers_gb=4.68,
        mamba=MambaPool(slots=8, conv_gb=0.1, ssm_gb=1.5, intermediate_ssm_gb=0.3, intermediate_conv_gb=0.04),
        decode_graph_bs=(1, 2), prefill_graph_tokens=(512, 1024, 2048), speculative=True,
        warnings=("max_running_requests is capped to 2 by the mamba state cache (max_mamba_cache_size=8, 3 state "
                  "slots per request). To raise it: increase --mamba-full-memory-ratio or --max-mamba-cache-size, "
                  "or halve the state size with --mamba-ssm-dtype bfloat16.",),
        phase_seconds={"weights": 0.01, "kv": 0.01, "graph": 0.01})
    base.update(changes)
    return StartupFacts(**base)  # type: ignore[arg-type]


def test_boot_log_is_read_back_by_the_runtime_parser() -> None:
    from elsa_tune.runtime.startup_log import build_report
    from elsa_tune.search_spaces.candidate import Candidate

    stream = io.StringIO()
    out = ServerLog(stream)
    used: list[float] = []
    crash = Boot(out, _facts(), lambda s: None, lambda phase: None, used.append).run()
    assert crash is None
    out.info(READY_LINE)
    text = stream.getvalue()
    candidate = Candidate(flags={"max-running-requests": 4, "mem-fraction-static": 0.9})
    report = build_report(text, candidate)
    assert report.max_total_num_tokens == 134016 and report.max_running_requests == 2
    assert report.context_len == 159776 and report.chunked_prefill_size == 2048
    assert report.kv_pool_tokens == 134016 and report.kv_pool_gb == pytest.approx(3.88, abs=0.011)
    assert report.mamba_cache_size == 8 and report.weights_mem_gb == pytest.approx(18.59)
    assert report.available_gpu_mem_gb == pytest.approx(1.0)
    assert report.server_args["mem_fraction_static"] == 0.9
    clamp = [a for a in report.adjustments if a.flag == "max-running-requests"]
    assert clamp and clamp[0].requested == 4 and clamp[0].effective == 2 and clamp[0].evidence
    assert used == sorted(used) and used[-1] > 20


@pytest.mark.parametrize("name", sorted(BOOT_CRASH_KIND))
def test_each_boot_crash_is_classified_as_its_kind(name: str) -> None:
    from elsa_tune.runtime.classify import classify

    stream = io.StringIO()
    out = ServerLog(stream)
    crash = boot_crash(name, 0.9, 31.36)
    stopped = Boot(out, _facts(), lambda s: None,
                   lambda phase: crash if phase == crash.phase else None, lambda gb: None).run()
    assert stopped is crash
    out.crash(crash, serving=False)
    failure = classify(stream.getvalue(), FailureHints(exit_code=-9))
    assert failure.kind is BOOT_CRASH_KIND[name], (failure, stream.getvalue())


def test_first_generation_oom_is_classified_as_oom_under_load() -> None:
    from elsa_tune.runtime.classify import classify

    stream = io.StringIO()
    out = ServerLog(stream)
    Boot(out, _facts(), lambda s: None, lambda phase: None, lambda gb: None).run()
    out.info(READY_LINE)
    out.crash(first_generation_oom_crash(), serving=True)
    failure = classify(stream.getvalue(), FailureHints(exit_code=-9, became_ready=True))
    assert failure.kind is FailureKind.OOM_UNDER_LOAD and failure.phase == "serve"


def test_damage_breaks_tool_call_arguments_and_retrieval() -> None:
    from elsa_tune.runtime.sim.tokens import lookup

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}}]
    text = "Weather in Oslo for 2 days? Use the tool."
    good = Completion.for_prompt(text_token_ids(text), text, tools=tools)
    assert good.tool_call is not None and good.text(100) == '{"city": "Oslo", "days": 2}'
    with pytest.raises(ValueError):
        json.loads(good.with_damage(1.0, "x").text(100))
    assert lookup("The code for door 4 is 991. What is the code for door 4?") == "991"
    assert lookup("What is the code for door 5?") is None


@pytest.mark.parametrize(("question", "answer"), [
    ("Mia has 30 shells in a box. Tom adds 4 more shells, then Mia gives away 9. How many are left?", 25),
    ("A crate holds 12 pears. Ana fills 2 more such crates to the same level and then removes 5 pears.", 31),
    ("Li packs 47 beads into groups of 5, keeping the remainder aside. How many full groups?", 9),
    ("Sam buys 3 boxes of nails with 20 nails in each box and already owned 7. How many nails?", 67),
    ("Each day Eve sorts 11 cards. After 3 days Bo has sorted 4 fewer than Eve. How many did Bo sort?", 29),
])
def test_simple_word_problems_are_answered(question: str, answer: int) -> None:
    assert solve(question) == answer
    assert Completion.for_prompt(text_token_ids(question), question).text(5) == f"The answer is {answer}."


def test_each_pass_after_an_idle_gap_gets_its_own_run_noise() -> None:
    noise = ServingNoise(NoiseSettings(boot_sigma=0.1, run_sigma=0.03, first_pass_slowdown=0.0, warm_requests=0), 9)
    factors = []
    for _ in range(400):
        noise.new_pass()
        factors.append(noise.pass_factor)
    mean = sum(factors) / len(factors)
    spread = (sum((f - mean) ** 2 for f in factors) / len(factors)) ** 0.5
    assert 0.022 < spread < 0.038
    assert noise.factor(0.0) == pytest.approx(noise.drift * noise.pass_factor, rel=0.05)


@pytest.mark.sglang
def test_flag_table_matches_the_installed_sglang() -> None:
    python = os.environ.get("ELSA_SGLANG_PYTHON")
    if not python:
        pytest.skip("ELSA_SGLANG_PYTHON is not set")
    def facts(specs: tuple[sglang_flags.FlagSpec, ...]) -> dict[tuple[str, ...], tuple[object, ...]]:
        # some choice lists come from sets in SGLang: their order is not stable between runs
        return {s.names: (s.dest, s.kind, s.nargs, frozenset(s.choices or ()), repr(s.default)) for s in specs}

    assert facts(sglang_flags.harvest(python)) == facts(sglang_flags.sglang_flags())
