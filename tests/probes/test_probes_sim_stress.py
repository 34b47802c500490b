"""Stress probes against real simulated servers: every shipped serving fault is caught by the probe meant for it
and classified with the runtime's failure kinds, the headroom floor rejects a survivor short of memory, the
vision probe reproduces seed 001's crash, and a healthy candidate passes everything."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from elsa_probe_sims import BASE, BUDGET, MIB, SimBoots

from elsa_tune.probes.plan import ProbeKind, boot_probes, budget_from_settings
from elsa_tune.probes.protocol import ProbeBudget, ProbeStatus
from elsa_tune.probes.quality import knowledge_file
from elsa_tune.probes.stress import LoadProbe, LongContextProbe, burst_probe, retractions, soak_probe
from elsa_tune.probes.vision import VisionProbe
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.protocol import HealthState
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.runtime.sim.runtime import SIM_TIMEOUTS, SimulatedSGLang
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.search_spaces.loader import load_space
from elsa_tune.search_spaces.space import ModelSpec, ProbeSettings
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.traffic.workload import synthetic
from elsa_tune.tuner.flow.load import HttpLoad

TARGET = 20_000


def long_context(boots: SimBoots, *, concurrent: bool = True) -> LongContextProbe:
    return LongContextProbe(boots.runtime.check, boots.runtime.gpu, target_tokens=TARGET, concurrent=concurrent,
                            concurrent_output_tokens=256)


def test_a_healthy_candidate_passes_every_probe(boots: SimBoots) -> None:
    server = boots.start(BASE)
    space = load_space("qwen3.6-35b-a3b-nvfp4-rtx5090")
    specs = boot_probes(context_target=space.model.context_target, slots=server.report.max_running_requests,
                        burst=None, vision=space.model.vision)
    assert [s.name for s in specs] == ["long_context", "long_context_concurrent", "vision"]
    # shorter generations and image request than a study's: the same probes, faster
    specs = tuple(replace(s, output_tokens=256) if s.kind is ProbeKind.LONG_CONTEXT_CONCURRENT else
                  replace(s, target_tokens=TARGET) if s.kind is ProbeKind.VISION else s for s in specs)
    load = HttpLoad(boots.runtime.check, boots.runtime.gpu, PromptSynth(512))
    results = [load.probe(server, spec, BUDGET) for spec in specs]
    assert all(r.status is ProbeStatus.PASSED for r in results), [(r.name, r.detail) for r in results]
    long = results[1]
    assert long.metrics["needles_found"] == 3 and long.metrics["concurrent_generations"] == 3
    # the space's 262K target is capped by the pool the server reported (seed 004 trap 2)
    assert long.metrics["prompt_tokens"] <= server.report.max_total_num_tokens
    assert all(r.min_free_bytes is not None and r.min_free_bytes > BUDGET.headroom_floor_bytes for r in results)


def test_a_crash_mid_run_is_oom_under_load_with_the_log_as_evidence(boots: SimBoots) -> None:
    server = boots.start(BASE, fault="crash_after_requests=4")
    result = long_context(boots).run(server, BUDGET)
    assert result.status is ProbeStatus.FAILED
    assert result.failure is not None and result.failure.kind is FailureKind.OOM_UNDER_LOAD
    assert any("Decode out of memory" in line for line in result.failure.evidence)
    assert boots.runtime.check(server).state is HealthState.DEAD


def test_a_hang_with_health_still_answering_is_a_hang(boots: SimBoots) -> None:
    server = boots.start(BASE, fault="hang_after_requests=3")
    budget = replace(BUDGET, request_timeout_s=6.0, hang_s=3.0, deadline_s=30.0)
    result = long_context(boots).run(server, budget)
    assert result.status is ProbeStatus.FAILED
    assert result.failure is not None and result.failure.kind is FailureKind.HANG
    assert result.seconds < 20.0           # one stalled request is enough, not one per needle
    assert result.metrics["concurrent_generations"] == 3
    assert "while the server stayed up" in result.detail
    assert boots.runtime.check(server).state is HealthState.HEALTHY   # /health answers all along


def test_first_generation_oom_at_a_too_high_static_fraction(boots: SimBoots) -> None:
    # seed 004: the pool leaves no workspace; the server boots and dies on its first generation
    server = boots.start({**BASE, "mem-fraction-static": 0.97})
    result = long_context(boots, concurrent=False).run(server, BUDGET)
    assert result.status is ProbeStatus.FAILED
    assert result.failure is not None and result.failure.kind is FailureKind.OOM_UNDER_LOAD
    assert any("out of memory" in line for line in result.failure.evidence)


@pytest.mark.slow
def test_a_technique_that_dies_under_load_is_oom_under_load(boots: SimBoots) -> None:
    server = boots.start({**BASE, "speculative-algorithm": "NGRAM"})
    result = long_context(boots).run(server, BUDGET)
    assert result.status is ProbeStatus.FAILED
    assert result.failure is not None and result.failure.kind is FailureKind.OOM_UNDER_LOAD
    assert any("Tried to allocate 1.52 GiB" in line for line in result.failure.evidence)


def test_the_headroom_floor_rejects_a_survivor_short_of_memory(boots: SimBoots) -> None:
    server = boots.start({**BASE, "mem-fraction-static": 0.88})
    result = long_context(boots).run(server, BUDGET)
    assert result.status is ProbeStatus.LOW_HEADROOM
    assert result.failure is None and result.metrics["needles_found"] == 3      # it did survive
    assert result.min_free_bytes is not None and result.min_free_bytes < BUDGET.headroom_floor_bytes
    assert result.min_free_bytes == boots.runtime.gpu.memory().free              # read from the simulated card
    # the same survivor passes a lower floor: the floor, not the probe, rejected it
    lower = long_context(boots).run(server, replace(BUDGET, headroom_floor_bytes=256 * MIB))
    assert lower.status is ProbeStatus.PASSED


def test_a_maximum_size_image_kills_a_config_short_of_headroom(boots: SimBoots) -> None:
    # seed 001: a 29K-token request with a maximum-size image crashed 144 MiB short of memory
    server = boots.start({**BASE, "mem-fraction-static": 0.88})
    result = VisionProbe(boots.runtime.check, boots.runtime.gpu, target_tokens=TARGET).run(server, BUDGET)
    assert result.status is ProbeStatus.FAILED
    assert result.failure is not None and result.failure.kind is FailureKind.OOM_UNDER_LOAD
    assert any("vision encoder" in line for line in result.failure.evidence)


def test_a_boot_runs_the_probes_that_apply_to_it() -> None:
    text_model = load_space("qwen3.8-27b-nvfp4-rtx5090")
    assert text_model.model.vision is False
    burst = synthetic(4, 200, 16, concurrency=2, block_size=512, tag="plan")
    names = [s.name for s in boot_probes(context_target=1000, slots=4, burst=burst, vision=False)]
    assert names == ["long_context", "long_context_concurrent", "burst"]
    assert [s.name for s in boot_probes(context_target=1000, slots=1, burst=None, vision=True)] == \
        ["long_context", "vision"]                       # one slot: no room for generations beside the prompt
    assert [s.name for s in boot_probes(context_target=None, slots=8, burst=None, vision=False)] == []
    concurrent = boot_probes(context_target=1000, slots=8, burst=None, vision=False)[1]
    assert concurrent.generations == 7 and concurrent.target_tokens == 1000


def test_the_budget_comes_from_the_space_probes_section() -> None:
    space = load_space("qwen3.8-27b-nvfp4-rtx5090")
    budget = budget_from_settings(space.probes)
    assert budget.headroom_floor_bytes == space.probes.headroom_floor_mib * MIB == 512 * MIB
    assert budget.deadline_s == space.probes.probe_timeout_s and budget.hang_s == space.probes.hang_s
    assert budget.hang_s <= budget.request_timeout_s <= budget.deadline_s
    defaults = budget_from_settings(ProbeSettings())
    assert defaults.headroom_floor_bytes == 512 * MIB
    assert ModelSpec(path=None).context_target is None     # no target: the probe fills what the server holds


@pytest.mark.slow
def test_seed_000_a_higher_static_fraction_fails_the_200k_stress_test(tmp_path: Path) -> None:
    """Seed 000: raising mem-fraction-static from 0.88 to 0.90 passed benchmarks and failed a stress test with a
    200K-token prompt beside seven long sampled generations."""
    profile = "rtx5090-qwen3.6-35b-a3b-nvfp4"
    config = load_profile(profile).config("elsa-part-one")
    runtime = SimulatedSGLang(profile, card_dir=tmp_path / "card", seed=2, speedup=50.0,
                              timeouts=replace(SIM_TIMEOUTS, boot_s=120.0),
                              knowledge=knowledge_file())
    budget = ProbeBudget(deadline_s=180.0, request_timeout_s=120.0, hang_s=30.0)
    outcomes = {}
    for fraction in (0.88, 0.90):
        server = runtime.start(Candidate(flags={**config.flags, "mem-fraction-static": fraction}, env=dict(config.env)),
                               tmp_path / f"boot-{fraction}")
        try:
            probe = LongContextProbe(runtime.check, runtime.gpu, target_tokens=200_000, concurrent=True)
            outcomes[fraction] = probe.run(server, budget)
        finally:
            runtime.stop(server)
    passed, failed = outcomes[0.88], outcomes[0.90]
    assert passed.status is ProbeStatus.PASSED, passed.detail
    assert passed.metrics["concurrent_generations"] == 7 and passed.metrics["needles_found"] == 3
    assert 190_000 <= int(str(passed.metrics["prompt_tokens"])) <= 200_000
    assert failed.status is ProbeStatus.FAILED
    assert failed.failure is not None and failed.failure.kind is FailureKind.OOM_UNDER_LOAD


def _burst(boots: SimBoots) -> LoadProbe:
    workload = synthetic(12, 2000, 64, concurrency=4, block_size=512, tag="probe-burst")
    return burst_probe(boots.runtime.check, boots.runtime.gpu, workload, PromptSynth(512, seed=1))


def test_a_burst_at_the_slot_limit_passes_a_healthy_candidate(boots: SimBoots) -> None:
    result = _burst(boots).run(boots.start(BASE), BUDGET)
    assert result.status is ProbeStatus.PASSED, result.detail
    assert result.metrics["requests"] == 12 and result.metrics["errors"] == 0


def test_a_burst_that_kills_the_server_is_classified_from_its_log(boots: SimBoots) -> None:
    server = boots.start(BASE, fault="crash_after_requests=5")
    result = _burst(boots).run(server, BUDGET)
    assert result.status is ProbeStatus.FAILED
    assert result.failure is not None and result.failure.kind is FailureKind.OOM_UNDER_LOAD


@pytest.mark.slow
def test_seed_001_a_maximum_size_image_needs_more_than_the_headroom_floor(tmp_path: Path) -> None:
    """Seed 001: text traffic ran fine; a 29K-token request with a maximum-size image died short of memory. At a
    static fraction that still leaves ~700 MiB free on the card (above the 512 MiB floor) only the vision probe sees
    it."""
    profile = "rtx5090-qwen3.6-35b-a3b-nvfp4"
    config = load_profile(profile).config("elsa-1.7")
    runtime = SimulatedSGLang(profile, card_dir=tmp_path / "card", seed=4, speedup=50.0,
                              timeouts=replace(SIM_TIMEOUTS, boot_s=120.0))
    budget = ProbeBudget(deadline_s=120.0, request_timeout_s=90.0, hang_s=30.0)
    results = {}
    for fraction in (0.88, 0.94):
        server = runtime.start(Candidate(flags={**config.flags, "mem-fraction-static": fraction}, env=dict(config.env)),
                               tmp_path / f"boot-{fraction}")
        try:
            results[fraction] = VisionProbe(runtime.check, runtime.gpu).run(server, budget)
        finally:
            runtime.stop(server)
    assert results[0.88].status is ProbeStatus.PASSED, results[0.88].detail
    assert 27_000 <= int(str(results[0.88].metrics["prompt_tokens"])) <= 29_000
    assert int(str(results[0.88].metrics["image_tokens_estimate"])) >= 16_384
    crashed = results[0.94]
    assert crashed.status is ProbeStatus.FAILED
    assert crashed.failure is not None and crashed.failure.kind is FailureKind.OOM_UNDER_LOAD
    assert crashed.min_free_bytes is not None and crashed.min_free_bytes > budget.headroom_floor_bytes


def test_retractions_are_read_from_the_server_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("[2026-11-29 10:00:00] Decode batch. #running-req: 8\n")
    start = log.stat().st_size
    with log.open("a") as f:
        f.write("[2026-11-29 10:00:01] KV cache pool is full. Retract requests. #retracted_reqs: 2, "
                "#new_tokens_gained: 4096, #new_token_ratio: 0.7000 -> 1.0000\n"
                "[2026-11-29 10:00:02] KV cache pool is full. Retract requests. #retracted_reqs: 1, "
                "#new_tokens_gained: 512, #mamba_num_gained: 1, #new_token_ratio: 0.7000 -> 1.0000\n")
    count, lines = retractions(log, start)
    assert count == 3 and len(lines) == 2 and lines[0].endswith("0.7000 -> 1.0000")
    assert retractions(tmp_path / "missing.log") == (0, ())


def test_a_soak_repeats_mixed_traffic_for_its_duration(boots: SimBoots) -> None:
    workload = synthetic(6, 800, 32, concurrency=4, block_size=512, tag="probe-soak")
    probe = soak_probe(boots.runtime.check, boots.runtime.gpu, workload, PromptSynth(512, seed=2), duration_s=1.5)
    result = probe.run(boots.start(BASE), BUDGET)
    assert result.status is ProbeStatus.PASSED, result.detail
    assert int(str(result.metrics["passes"])) >= 2 and result.seconds >= 1.5
