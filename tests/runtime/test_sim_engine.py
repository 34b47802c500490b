"""The scheduling core: continuous batching, chunked prefill, the radix prefix cache, retraction, speculation."""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Mapping
from typing import Any

import pytest

from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.sim.engine import Engine, EngineCrash, RequestRejected, SimRequest, StepResult
from elsa_tune.runtime.sim.memory import plan_memory
from elsa_tune.runtime.sim.performance import PerformanceModel
from elsa_tune.runtime.sim.profile import load_profile

BLOCK = 64


def make_engine(flags: Mapping[str, Any] | None = None, *, config: str = "small", profile_name: str = "tiny-test",
                seed: int = 1, env: Mapping[str, str] | None = None) -> Engine:
    profile = load_profile(profile_name)
    merged = {**profile.config(config).flags, **(flags or {})}
    env = {**profile.config(config).env, **(env or {})}
    plan = plan_memory(profile, merged, env)
    assert plan.boot_failure is None, plan.boot_failure
    return Engine(profile, plan, PerformanceModel(profile, plan, merged, env), random.Random(seed), block_size=BLOCK)


def drain(engine: Engine, limit: int = 100_000) -> list[StepResult]:
    steps: list[StepResult] = []
    for _ in range(limit):
        step = engine.step()
        if step is None:
            nxt = engine.next_event
            if nxt is None:
                return steps
            engine.advance_to(nxt)
            continue
        steps.append(step)
    raise AssertionError("engine did not drain")


def emitted(steps: list[StepResult]) -> dict[str, int]:
    out: dict[str, int] = {}
    for step in steps:
        for rid, n in step.emitted.items():
            out[rid] = out.get(rid, 0) + n
    return out


def test_same_seed_same_steps() -> None:
    def run() -> list[tuple[str, float, tuple[tuple[str, int], ...]]]:
        engine = make_engine(config="small-mtp")
        for i in range(6):
            engine.submit(SimRequest(f"r{i}", 300 + 50 * i, 40, regime="chat"))
        return [(s.kind, s.duration_s, tuple(sorted(s.emitted.items()))) for s in drain(engine)]

    assert run() == run()


def test_every_request_gets_exactly_its_output_tokens() -> None:
    engine = make_engine(config="small-mtp")
    wants = {f"r{i}": 17 + 13 * i for i in range(7)}
    for rid, n in wants.items():
        engine.submit(SimRequest(rid, 200, n, regime="tool"))
    steps = drain(engine)
    assert emitted(steps) == wants
    assert sorted(rid for s in steps for rid in s.finished) == sorted(wants)
    assert engine.idle


def test_chunked_prefill_splits_a_long_prompt() -> None:
    engine = make_engine({"chunked-prefill-size": 1024})
    engine.submit(SimRequest("long", 5000, 4))
    steps = drain(engine)
    prefills = [s for s in steps if s.kind == "prefill"]
    assert [s.new_tokens for s in prefills] == [1024, 1024, 1024, 1024, 904]
    assert prefills[-1].first_token == ("long",) and not any(s.first_token for s in prefills[:-1])
    # later chunks attend over more context: each takes longer than the one before
    assert all(a.duration_s < b.duration_s for a, b in itertools.pairwise(prefills[:-1]))


def test_running_requests_are_capped_by_the_effective_slots() -> None:
    engine = make_engine()
    assert engine.slots == 4
    for i in range(10):
        engine.submit(SimRequest(f"r{i}", 100, 30))
    steps = drain(engine)
    assert max(s.running for s in steps) == 4
    assert steps[0].queued == 6


def test_prefix_cache_hits_are_block_and_page_aligned() -> None:
    engine = make_engine({"page-size": 16})
    shared = tuple(range(1, 11))                     # 10 blocks of 64 tokens
    engine.submit(SimRequest("a", 700, 2, block_hashes=(*shared, 99)))
    first = drain(engine)
    assert first[0].cached == {"a": 0}
    engine.submit(SimRequest("b", 650, 2, block_hashes=(*shared[:8], 77, 78)))
    second = drain(engine)
    assert second[0].cached == {"b": 8 * BLOCK}
    assert second[0].new_tokens == 650 - 8 * BLOCK
    # a prompt entirely cached still computes its last token
    engine.submit(SimRequest("c", 640, 2, block_hashes=shared))
    third = drain(engine)
    assert third[0].cached == {"c": (640 - 1) // 16 * 16}


def test_flush_cache_empties_the_prefix_cache() -> None:
    engine = make_engine()
    hashes = tuple(range(1, 9))
    engine.submit(SimRequest("a", 512, 2, block_hashes=hashes))
    drain(engine)
    assert engine.flush_cache()
    engine.submit(SimRequest("b", 512, 2, block_hashes=hashes))
    assert drain(engine)[0].cached == {"b": 0}


def test_flush_cache_refuses_while_requests_run() -> None:
    engine = make_engine()
    engine.submit(SimRequest("a", 512, 50))
    engine.step()
    assert not engine.flush_cache()


def test_lru_eviction_keeps_the_recent_prefix() -> None:
    engine = make_engine({"max-total-tokens": 2048})
    for k in range(6):                                # six different 5-block prompts, 320 tokens each
        engine.submit(SimRequest(f"old{k}", 320, 1, block_hashes=tuple(1000 * k + j for j in range(5))))
        drain(engine)
    # the pool holds 2048 tokens = 32 blocks: all six prompts (30 blocks) still fit, then a big one evicts the oldest
    engine.submit(SimRequest("big", 1600, 1, block_hashes=tuple(9000 + j for j in range(25))))
    drain(engine)
    engine.submit(SimRequest("newest", 320, 1, block_hashes=tuple(5000 + j for j in range(5))))
    assert drain(engine)[0].cached == {"newest": 319}
    engine.submit(SimRequest("oldest", 320, 1, block_hashes=tuple(range(5))))
    assert drain(engine)[0].cached == {"oldest": 0}


def test_retraction_when_decode_outgrows_the_pool() -> None:
    engine = make_engine({"max-total-tokens": 1500})
    for i in range(4):
        engine.submit(SimRequest(f"r{i}", 200, 400))
    steps = drain(engine)
    assert max(s.running for s in steps) == 3          # the fourth waits: the admission reserve says no room
    retracted = [rid for s in steps for rid in s.retracted]
    assert retracted, "three requests growing to 600 tokens each cannot share a 1,500-token pool"
    assert emitted(steps) == {f"r{i}": 400 for i in range(4)}
    assert engine.retractions == len(retracted)
    assert max(s.used_tokens for s in steps) <= 1500


def test_a_lone_request_outgrowing_the_pool_is_aborted() -> None:
    engine = make_engine({"max-total-tokens": 1000})
    engine.submit(SimRequest("grows", 900, 200))
    steps = drain(engine)
    aborted = {rid: why for s in steps for rid, why in s.aborted.items()}
    assert aborted["grows"].startswith("Decode out of memory.")
    assert not any("grows" in s.finished for s in steps)
    assert engine.idle


def test_prompt_larger_than_the_pool_is_aborted_not_hung() -> None:
    engine = make_engine({"max-total-tokens": 1000})
    engine.submit(SimRequest("huge", 1200, 5))
    engine.submit(SimRequest("fine", 100, 5))
    steps = drain(engine)
    aborted = {rid: why for s in steps for rid, why in s.aborted.items()}
    assert list(aborted) == ["huge"] and aborted["huge"].startswith("Prefill out of memory.")
    assert emitted(steps) == {"fine": 5}


def test_context_length_rejections_use_sglangs_text() -> None:
    engine = make_engine()
    with pytest.raises(RequestRejected, match=r"The input \(40000 tokens\) is longer than the model's context length"):
        engine.submit(SimRequest("x", 40_000, 1))
    with pytest.raises(RequestRejected, match="Requested token count exceeds the model's maximum context length"):
        engine.submit(SimRequest("y", 30_000, 5_000))


def test_speculative_steps_emit_accepted_chains() -> None:
    engine = make_engine(config="small-mtp")
    engine.submit(SimRequest("t", 100, 4000, regime="tool"))
    steps = [s for s in drain(engine) if s.kind == "decode"]
    per_step = [s.emitted.get("t", 0) for s in steps[:-1]]
    assert min(per_step) >= 1 and max(per_step) <= 4
    mean = sum(s.accepted_tokens for s in steps) / sum(s.verify_calls for s in steps)
    assert mean == pytest.approx(engine.perf.accept_length("tool"), rel=0.05)
    assert all(s.verify_calls == 1 for s in steps)


def test_regime_changes_acceptance_not_the_step_time() -> None:
    tool, prose = make_engine(config="small-mtp"), make_engine(config="small-mtp")
    tool.submit(SimRequest("a", 100, 600, regime="tool"))
    prose.submit(SimRequest("a", 100, 600, regime="prose"))
    tool_steps, prose_steps = drain(tool), drain(prose)
    assert len(tool_steps) < len(prose_steps) / 2
    assert statistics.median(s.duration_s for s in tool_steps if s.kind == "decode") == pytest.approx(
        statistics.median(s.duration_s for s in prose_steps if s.kind == "decode"), rel=0.05)


def test_bigger_batches_take_longer_steps_but_more_tokens_per_second() -> None:
    engine = make_engine()
    perf = engine.perf
    one, four = perf.decode_step_s(1, 500), perf.decode_step_s(4, 500)
    assert one < four < 4 * one
    assert perf.decode_step_s(1, 20_000) > perf.decode_step_s(1, 500)
    # a prefix-cache hit only computes the tail, though the tail attends over the cached part
    assert perf.prefill_s(1000, cached_tokens=3000) < perf.prefill_s(4000)
    assert perf.prefill_s(1000, cached_tokens=3000) > perf.prefill_s(1000)


def test_arrivals_wait_for_their_time() -> None:
    engine = make_engine()
    engine.submit(SimRequest("later", 100, 3, arrival_s=5.0))
    assert engine.step() is None and engine.next_event == 5.0
    engine.advance_to(5.0)
    step = engine.step()
    assert step is not None and step.started_at == pytest.approx(5.0)


def test_abort_frees_the_request() -> None:
    engine = make_engine()
    engine.submit(SimRequest("a", 100, 1000))
    engine.submit(SimRequest("b", 100, 3))
    first = engine.step()
    assert first is not None
    engine.abort("a")
    assert emitted([first, *drain(engine)]) == {"a": 1, "b": 3}
    assert engine.idle


def test_crash_under_load_is_raised_with_its_lines() -> None:
    engine = make_engine({"speculative-algorithm": "NGRAM"})
    engine.submit(SimRequest("a", 100, 50))
    with pytest.raises(EngineCrash) as info:
        drain(engine)
    assert info.value.crash.kind is FailureKind.OOM_UNDER_LOAD
    assert "CUDA out of memory" in info.value.crash.lines[-1]


def test_first_generation_oom_strikes_on_the_first_prefill() -> None:
    profile = load_profile("rtx5090-qwen3.8-27b-nvfp4")
    config = profile.config("no-mtp-0.97")
    plan = plan_memory(profile, config.flags, config.env)
    engine = Engine(profile, plan, PerformanceModel(profile, plan, config.flags, config.env), random.Random(0))
    engine.submit(SimRequest("a", 100, 5))
    with pytest.raises(EngineCrash) as info:
        engine.step()
    assert info.value.crash.phase == "first_generation"
    assert "Triton Error [CUDA]: out of memory" in info.value.crash.lines[-1]


def test_usage_reports_tokens_and_mamba_slots() -> None:
    engine = make_engine()
    for i in range(3):
        engine.submit(SimRequest(f"r{i}", 400, 20))
    step = engine.step()
    assert step is not None and step.kind == "prefill"
    assert step.used_tokens == 3 * 401 and step.token_capacity == engine.capacity
    assert step.mamba_used == 3 * engine.plan.slots_per_request and step.mamba_capacity == 24
    assert 0 < step.token_usage < 1 and 0 < step.mamba_usage <= 1


def test_eviction_takes_leaves_before_the_prefix_they_extend() -> None:
    engine = make_engine({"max-total-tokens": 2048})
    chain = tuple(range(1, 21))                          # 20 blocks = 1,280 tokens
    engine.submit(SimRequest("a", 1280, 1, block_hashes=chain))
    drain(engine)
    engine.submit(SimRequest("b", 1024, 1, block_hashes=tuple(range(500, 516))))
    drain(engine)                                        # needs room: some of a's blocks go
    engine.submit(SimRequest("again", 1280, 1, block_hashes=chain))
    hit = drain(engine)[0].cached["again"]
    assert 0 < hit < 1280 and hit % BLOCK == 0


def test_a_running_requests_prompt_is_shared_before_it_finishes() -> None:
    # SGLang caches a prefilled prompt in the radix tree at once (cache_unfinished_req), not when it finishes
    engine = make_engine()
    prefix = tuple(range(1, 9))
    engine.submit(SimRequest("first", 600, 500, block_hashes=(*prefix, 50)))
    first = engine.step()
    assert first is not None and first.first_token == ("first",)
    engine.submit(SimRequest("second", 600, 5, block_hashes=(*prefix, 60)))
    second = engine.step()
    assert second is not None and second.cached == {"second": 8 * BLOCK}
    assert first.used_tokens == 601
    assert second.used_tokens == 601 + (600 - 8 * BLOCK) + 1


def test_long_prefills_report_their_temporaries() -> None:
    # the draft reads the prompt too: its buffers grow with the context (seed 000's 200K-token stress test)
    profile = load_profile("rtx5090-qwen3.6-35b-a3b-nvfp4")
    config = profile.config("elsa-part-one")
    plan = plan_memory(profile, config.flags, config.env)
    engine = Engine(profile, plan, PerformanceModel(profile, plan, config.flags, config.env), random.Random(0))
    engine.submit(SimRequest("long", 150_000, 4))
    prefills = [s for s in drain(engine) if s.kind == "prefill"]
    assert prefills[0].transient_gb < prefills[-1].transient_gb < plan.headroom_gb


def test_hybrid_prefix_reuse_needs_a_spare_mamba_slot() -> None:
    # a cached prefix of a hybrid model is reusable only where a recurrent-state checkpoint survives, and each
    # cached prompt's checkpoints take a Mamba slot the running requests leave free
    a, b = tuple(range(1, 9)), tuple(range(100, 109))

    def second_visit_of_a(slots: int) -> int:
        engine = make_engine({"max-running-requests": 1, "max-mamba-cache-size": slots})
        assert engine.plan.slots_per_request == 5
        for rid, hashes in (("a1", a), ("b1", b)):
            engine.submit(SimRequest(rid, 512, 4, block_hashes=hashes))
            drain(engine)
        engine.submit(SimRequest("a2", 512, 4, block_hashes=a))
        return drain(engine)[0].cached["a2"]

    assert second_visit_of_a(5) == 0            # b1 running took every slot: a1's state is gone, its KV is not
    assert second_visit_of_a(10) == 8 * BLOCK - 1   # five spare slots keep it (the last token is recomputed)


def test_checkpoints_follow_the_track_interval() -> None:
    engine = make_engine({"mamba-track-interval": 256})
    engine.submit(SimRequest("a", 20 * BLOCK, 2, block_hashes=tuple(range(20))))
    drain(engine)
    engine.submit(SimRequest("b", 20 * BLOCK, 2, block_hashes=(*range(10), *range(500, 510))))
    # 10 shared blocks, checkpoints every 256 tokens = 4 blocks: resume from block 8
    assert drain(engine)[0].cached == {"b": 8 * BLOCK}
