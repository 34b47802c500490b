"""The gate's TTFT guardrails over the looks: Pocock levels and the extension after the cap.

The noise model here is the seed-004 profile's as the study measured it: boot drift σ 10.7%, the TTFT tail
moving with the drift (coupling 1: a slow boot is as slow to its first long-prompt token), run noise 1.6%.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from elsa_tune.history.records import Arm
from elsa_tune.history.verdict import Decision
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.tuner.ab.boot_sample import BootSample
from elsa_tune.tuner.ab.dimensioning import dimension
from elsa_tune.tuner.ab.gate import GUARD_CAP_SHARE, GatePolicy, GuardrailPolicy, decide, run_ab
from elsa_tune.tuner.ab.noise_model import NoiseModelSampler

TAIL_ONLY = GuardrailPolicy(ttft_p50_margin=None, ttft_p99_margin=1.20, kv_pool_min_ratio=None)
POLICY = GatePolicy(looks=(2, 4, 6), guardrails=TAIL_ONLY, sigma_boot=0.107, sigma_run=0.016, replicates=4000,
                    robust=None,
                    guard_extension=6)


def seed004(effect: float = 0.29, ttft: float = 1.0, seed: int = 0, **kw: object) -> NoiseModelSampler:
    return NoiseModelSampler(effect=effect, sigma_boot=0.107, sigma_run=0.016, ttft_effect=ttft, ttft_coupling=1.0,
                             sigma_ttft=0.03, seed=seed, **kw)  # type: ignore[arg-type]


def test_a_gain_whose_tail_is_unresolved_at_the_cap_runs_the_extension_and_is_kept() -> None:
    result = run_ab(seed004(seed=0), POLICY, 0)
    v = result.verdict
    looks = v.extra["looks"]
    assert [lk["boots"] for lk in looks] == [4, 8, 12, 24]
    assert "crossed the boundary at the cap" in looks[2]["reason"] and "6 more blocks for the guardrail" in \
        looks[2]["reason"]
    assert v.decision is Decision.KEEP and result.boots == 24
    assert v.stopped_at_look == 4 and v.statistics is not None and v.statistics.look_blocks == 12
    assert "at the cap; guardrails shown non-inferior after 6 more blocks: ttft_p99 ratio" in v.reason
    tail = next(g for g in v.guardrails if g.name == "ttft_p99")
    assert tail.passed is True and tail.ci_high is not None and tail.ci_high <= 1.20
    # The primary decision is the cap's: its p is the cap's, the effect and CI come from every boot.
    assert v.at_cap is not None and v.at_cap.p is not None and v.at_cap.boundary_p is not None
    assert v.at_cap.p <= v.at_cap.boundary_p
    assert v.boots_incumbent == v.boots_candidate == 12


def test_the_extension_ends_inconclusive_when_the_tail_stays_unresolved() -> None:
    v = run_ab(seed004(seed=17), POLICY, 17).verdict
    assert v.decision is Decision.INCONCLUSIVE and v.final is True
    assert "after 6 more blocks guardrail ttft_p99 was still not shown non-inferior" in v.reason
    assert v.reason.endswith("the incumbent stays")


def test_without_an_extension_the_cap_is_final() -> None:
    v = run_ab(seed004(seed=17), replace(POLICY, guard_extension=0), 17).verdict
    assert v.decision is Decision.INCONCLUSIVE and v.final is True
    assert len(v.extra["looks"]) == 3 and "was not shown non-inferior at the cap" in v.reason


def test_a_candidate_crash_in_the_extension_rejects() -> None:
    # The candidate's 7th boot is the first of the extension (6 boots per arm at the cap).
    v = run_ab(seed004(seed=0, crash_on_boot=6), POLICY, 0).verdict
    assert v.decision is Decision.REJECT and "a candidate boot failed: oom_under_load" in v.reason


def test_a_missing_quality_result_is_not_extended() -> None:
    # More boots cannot produce a quality result the candidate's boots do not have.
    v = run_ab(seed004(seed=0, quality_b=None), POLICY, 0).verdict
    assert v.decision is Decision.INCONCLUSIVE and v.final is True
    assert len(v.extra["looks"]) <= 3


def test_decide_is_pure_at_the_extension_look_and_rejects_a_look_past_it() -> None:
    sampler = seed004(seed=0)
    result = run_ab(sampler, POLICY, 0)
    a = [s for s in result.samples if s.arm is Arm.INCUMBENT]
    b = [s for s in result.samples if s.arm is Arm.CANDIDATE]
    again = decide(a, b, POLICY, 4)
    assert again.decision is result.verdict.decision and again.reason == result.verdict.reason
    with pytest.raises(ValueError, match=r"outside 1\.\.4"):
        decide(a, b, POLICY, 5)
    with pytest.raises(ValueError, match=r"outside 1\.\.3"):
        decide(a, b, replace(POLICY, guard_extension=0), 4)


def test_an_incumbent_crash_in_the_extension_keeps_the_incumbent() -> None:
    result = run_ab(seed004(seed=0), POLICY, 0)
    a = [s for s in result.samples if s.arm is Arm.INCUMBENT]
    b = [s for s in result.samples if s.arm is Arm.CANDIDATE]
    crashed = BootSample(arm=Arm.INCUMBENT, block=9, position=0, failed=Failure(
        kind=FailureKind.UNKNOWN_CRASH, summary="segfault", remedy="read the log", phase="serve"))
    v = decide([*a[:9], crashed], b[:10], POLICY, 4)
    assert v.decision is Decision.INCONCLUSIVE and "an incumbent boot failed" in v.reason


def test_guard_levels_split_alpha_between_the_cap_and_the_extension() -> None:
    """The cap's looks share 40% of α at one Pocock level; the extension's look, where a pending guardrail is
    decided, has the other 60%; the stages add up to α."""
    levels = POLICY.guard_levels()
    assert len(levels) == 4 and len(set(levels[:3])) == 1
    assert levels[0] < 0.05 * GUARD_CAP_SHARE and levels[3] == pytest.approx(0.05 * (1 - GUARD_CAP_SHARE))
    pocock = replace(POLICY, guard_spending="pocock").guard_levels()
    assert len(pocock) == 4 and len(set(pocock)) == 1 and 0.005 < pocock[0] < 0.05
    assert levels[3] > pocock[3] and levels[0] < pocock[0]
    assert replace(POLICY, guard_extension=0).guard_levels() == replace(POLICY, guard_extension=0,
                                                                         guard_spending="pocock").guard_levels()
    assert replace(POLICY, guard_spending="none").guard_levels() == (0.05,) * 4
    assert len(replace(POLICY, guard_extension=0).guard_levels()) == 3
    with pytest.raises(ValueError, match="guard_spending"):
        replace(POLICY, guard_spending="bonferroni")
    with pytest.raises(ValueError, match="guard_extension"):
        replace(POLICY, guard_extension=-1)


def test_the_study_policy_extends_by_the_cap() -> None:
    sampler = NoiseModelSampler(sigma_boot=0.107, sigma_run=0.016, seed=4)
    noise = dimension([sampler.boot(Arm.INCUMBENT, i, 0) for i in range(6)])
    assert GatePolicy.from_dimensioning(noise, looks=(2, 4, 6), replicates=4000).guard_extension == 6
    assert GatePolicy.from_dimensioning(noise, looks=(2, 4, 6), replicates=4000,
                                        guard_extension=0).guard_extension == 0


def outcomes(policy: GatePolicy, *, ttft: float, runs: int) -> Counter[Decision]:
    return Counter(run_ab(seed004(ttft=ttft, seed=s), policy, s).verdict.decision for s in range(runs))


@pytest.mark.slow
def test_operating_characteristics_of_the_tail_guardrail() -> None:
    """A real +29% whose tail is unchanged is kept more often with the extension; a tail truly at its 20% margin
    passes at most ~α over all the looks with the split levels, and more often than α with α at every look."""
    runs = 400
    flat = replace(POLICY, guard_extension=0, guard_spending="none")
    at_margin_flat = outcomes(flat, ttft=1.20, runs=runs)[Decision.KEEP] / runs
    at_margin = outcomes(POLICY, ttft=1.20, runs=runs)[Decision.KEEP] / runs
    kept_without = outcomes(replace(POLICY, guard_extension=0), ttft=1.0, runs=runs)[Decision.KEEP] / runs
    kept_with = outcomes(POLICY, ttft=1.0, runs=runs)[Decision.KEEP] / runs
    # 400 runs: a binomial 5% has a standard error of 1.1%.
    assert at_margin <= 0.05 + 2 * 0.011, at_margin
    assert at_margin_flat > at_margin, (at_margin_flat, at_margin)
    assert kept_with >= kept_without + 0.1 and kept_with >= 0.9, (kept_without, kept_with)


def test_a_retest_combines_its_tail_guardrail_with_the_first_tests_and_still_rejects_on_its_own_harm() -> None:
    """Seed 17's tail stays unresolved on its own boots; a first test that showed the tail within the margin (small
    p) lets the inverse-normal combination pass it, one that showed nothing (p 0.5) does not, and a retest whose own
    boots are confidently worse is rejected whatever the first test said."""
    alone = run_ab(seed004(seed=17), POLICY, 17).verdict
    assert alone.decision is Decision.INCONCLUSIVE
    tail = next(g for g in alone.guardrails if g.name == "ttft_p99")
    assert tail.p_value is not None and 0.0 < tail.p_value < 0.5

    helped = run_ab(seed004(seed=17), replace(POLICY, first_stage_guards=(("ttft_p99", 1e-4),)), 17).verdict
    assert helped.decision is Decision.KEEP
    passed = next(g for g in helped.guardrails if g.name == "ttft_p99")
    assert passed.passed is True and "with the first test (p 0.0001) combined p" in passed.detail

    nothing = run_ab(seed004(seed=17), replace(POLICY, first_stage_guards=(("ttft_p99", 0.5),)), 17).verdict
    assert nothing.decision is Decision.INCONCLUSIVE

    worse = run_ab(seed004(ttft=1.8, seed=3), replace(POLICY, first_stage_guards=(("ttft_p99", 1e-6),)), 3).verdict
    assert worse.decision is Decision.REJECT and worse.failed_guardrail == "ttft_p99"
