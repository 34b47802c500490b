"""The quality gate against real simulated servers: each kind of quality damage is caught by the check meant
for it, with the evidence in the result, and a healthy candidate is not flagged."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from elsa_probe_sims import BUDGET, GATE, SPEC, SimBoots

from elsa_tune.probes.protocol import ProbeBudget, ProbeResult, ProbeStatus
from elsa_tune.probes.quality import QualityGate, QualitySample, knowledge_file
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.runtime.sim.runtime import SIM_TIMEOUTS, SimulatedSGLang
from elsa_tune.search_spaces.candidate import Candidate, FlagValue


def test_the_baseline_reference_is_a_competent_model(reference: QualitySample) -> None:
    assert not reference.errors
    # the profile's skill is 0.92: most, not all, of the arithmetic problems are right
    right, problems = sum(reference.arithmetic_correct), len(reference.arithmetic_correct)
    assert 0.8 * problems <= right < problems
    assert all(reference.tools_valid) and all(reference.needles_cold) and all(reference.needles_warm)
    assert reference.cache_cold == reference.cache_warm
    assert reference.accept_length is not None and reference.accept_length > 1.5


def test_a_healthy_candidate_on_another_boot_is_not_flagged(boots: SimBoots, reference: QualitySample) -> None:
    result = GATE.run(boots.start(SPEC), BUDGET, reference)
    assert result.status is ProbeStatus.PASSED, result.detail
    assert result.metrics["greedy_identical"] == len(reference.greedy)   # greedy is deterministic per prompt
    assert result.metrics["arithmetic_candidate"] == result.metrics["arithmetic_baseline"]


def test_wrong_output_technique_diverges_and_loses_accuracy(boots: SimBoots, reference: QualitySample) -> None:
    # seed 000: fusing the shared expert answers fluently and wrongly
    result = GATE.run(boots.start({**SPEC, "enforce-shared-experts-fusion": True}), BUDGET, reference)
    assert result.status is ProbeStatus.REGRESSED
    assert "greedy outputs diverge" in result.detail and "arithmetic accuracy fell" in result.detail
    assert result.metrics["arithmetic_candidate"] < result.metrics["arithmetic_baseline"] - 10
    assert result.evidence and result.evidence[0].startswith("baseline: ")


def test_garbage_draft_collapses_acceptance_but_answers_stay_right(boots: SimBoots,
                                                                    reference: QualitySample) -> None:
    # seed 000's FR-Spec bug: nothing errors, the draft guesses badly, the target still verifies every token
    result = GATE.run(boots.start({**SPEC, "speculative-token-map": "/models/hot_token_map.pt"}), BUDGET, reference)
    assert result.status is ProbeStatus.REGRESSED
    assert result.detail.startswith("speculative acceptance collapsed")
    assert result.metrics["accept_length_candidate"] < 0.7 * result.metrics["accept_length_baseline"]
    assert result.metrics["greedy_identical"] == len(reference.greedy)
    assert result.metrics["arithmetic_candidate"] == result.metrics["arithmetic_baseline"]


def test_host_cache_hits_answering_wrongly_are_caught(boots: SimBoots, reference: QualitySample) -> None:
    # seed 002: cold answers right, answers restored from the host tier fluently wrong
    result = GATE.run(boots.start({**SPEC, "enable-hierarchical-cache": True}), BUDGET, reference)
    assert result.status is ProbeStatus.REGRESSED
    assert "cached answers differ from the cold ones" in result.detail
    assert result.metrics["needles_cold"] == 3 and result.metrics["needles_warm"] < 3
    assert result.metrics["arithmetic_candidate"] == result.metrics["arithmetic_baseline"]
    assert result.evidence[0].startswith("cold: ")


@pytest.mark.slow
def test_wrong_answers_on_any_cache_hit_are_caught(boots: SimBoots, reference: QualitySample) -> None:
    result = GATE.run(boots.start(SPEC, env={"ELSA_BROKEN_RADIX": "1"}), BUDGET, reference)
    assert result.status is ProbeStatus.REGRESSED
    assert "cached answers differ" in result.detail


@pytest.mark.slow
def test_the_seeds_quality_traps_on_the_calibrated_profile(tmp_path: Path) -> None:
    """Seeds 000-002 on the Qwen3.6 profile against Elsa part one: FR-Spec collapses acceptance, the fused shared
    expert answers wrongly, stock host-cache hits answer wrongly; Elsa 1.7 carries the host-cache fix and passes."""
    profile = load_profile("rtx5090-qwen3.6-35b-a3b-nvfp4")
    runtime = SimulatedSGLang(profile.source, card_dir=tmp_path / "card", seed=2, speedup=50.0,
                              timeouts=replace(SIM_TIMEOUTS, boot_s=120.0), knowledge=knowledge_file())
    budget = ProbeBudget(deadline_s=300.0, request_timeout_s=120.0, hang_s=30.0)
    gate = QualityGate()

    def judged(config: str, flags: dict[str, FlagValue], env: dict[str, str],
               reference: QualitySample | None = None) -> ProbeResult | QualitySample:
        named = profile.config(config)
        server = runtime.start(Candidate(flags={**named.flags, **flags}, env={**named.env, **env}),
                               tmp_path / f"boot-{config}-{len(flags)}-{sorted(flags)}")
        try:
            return gate.sample(server, budget) if reference is None else gate.run(server, budget, reference)
        finally:
            runtime.stop(server)

    reference = judged("elsa-part-one", {}, {})
    assert isinstance(reference, QualitySample)
    cases: list[tuple[str, str, dict[str, FlagValue], dict[str, str]]] = [
        ("frspec", "elsa-part-one", {"speculative-token-map": "/models/map.pt"}, {"ELSA_HOT_VOCAB_HEAD": "0"}),
        ("fusion", "elsa-part-one", {"enforce-shared-experts-fusion": True}, {}),
        ("hicache-stock", "elsa-part-one", {"enable-hierarchical-cache": True}, {}),
        ("hicache-1.7", "elsa-1.7", {"enable-hierarchical-cache": True}, {}),
    ]
    outcomes = {name: judged(config, flags, env, reference) for name, config, flags, env in cases}
    details = {name: r.detail for name, r in outcomes.items() if isinstance(r, ProbeResult)}
    assert details["frspec"].startswith("speculative acceptance collapsed")
    assert "arithmetic accuracy fell" in details["fusion"]
    assert "cached answers differ from the cold ones" in details["hicache-stock"]
    assert details["hicache-1.7"] == "answers match the baseline"
