"""The sequential A/B gate on seeded synthetic samplers with known true effects."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from elsa_tune.errors import BootFailed
from elsa_tune.history.records import Arm
from elsa_tune.history.verdict import Decision, Futility, Verdict
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.tuner.ab.boot_sample import BootSample, PassMeasurement
from elsa_tune.tuner.ab.boundaries import Design, calibrate, null_maxima
from elsa_tune.tuner.ab.gate import GatePolicy, GuardrailPolicy, decide, run_ab
from elsa_tune.tuner.ab.noise_model import NoiseModelSampler

POLICY = GatePolicy()


def outcomes(effect: float, runs: int, policy: GatePolicy = POLICY, **model: object) -> tuple[Counter[str], float]:
    counts: Counter[str] = Counter()
    boots = 0
    for seed in range(runs):
        result = run_ab(NoiseModelSampler(effect=effect, seed=seed, **model), policy, seed)  # type: ignore[arg-type]
        counts[result.verdict.decision.value] += 1
        boots += result.boots
    return counts, boots / runs


def test_no_op_is_almost_never_kept() -> None:
    counts, mean_boots = outcomes(0.0, 200)
    assert counts["keep"] / 200 <= 0.08          # designed ≤ 5%; 200 seeded runs
    assert mean_boots < 20                        # futility stops save boots


def test_large_effect_is_kept_early() -> None:
    for seed in range(20):
        result = run_ab(NoiseModelSampler(effect=0.40, seed=seed), POLICY, seed)
        assert result.verdict.decision is Decision.KEEP, result.verdict.reason
        assert result.boots <= 16
        assert result.verdict.effect is not None and result.verdict.ci_low is not None
        assert result.verdict.ci_low < result.verdict.effect < (result.verdict.ci_high or 0)
        assert result.verdict.p_value is not None and result.verdict.p_value <= POLICY.alpha


def test_ten_percent_at_five_percent_noise_is_kept() -> None:
    counts, _ = outcomes(0.10, 60, sigma_boot=0.05)
    assert counts["keep"] / 60 >= 0.9


def test_clear_regression_is_rejected_by_futility_at_the_first_look() -> None:
    result = run_ab(NoiseModelSampler(effect=-0.20, seed=5), POLICY, 5)
    assert result.verdict.decision is Decision.REJECT
    assert "futile" in result.verdict.reason
    assert result.boots == 8 and result.verdict.stopped_at_look == 1


def test_crashed_candidate_boot_rejects_at_once_with_the_reason() -> None:
    result = run_ab(NoiseModelSampler(effect=0.5, crash_on_boot=2, seed=1), POLICY, 1)
    assert result.verdict.decision is Decision.REJECT
    assert "oom_under_load" in result.verdict.reason
    assert result.samples[-1].failed is not None and result.samples[-1].arm is Arm.CANDIDATE
    assert result.verdict.failure is not None and result.verdict.failure.kind.value == "oom_under_load"


class RaisingSampler(NoiseModelSampler):
    def boot(self, arm: Arm, block: int, position: int) -> BootSample:
        if arm is Arm.CANDIDATE:
            raise BootFailed(Failure(kind=FailureKind.NO_ROOM_FOR_KV, summary="KV pool <= 0", remedy="lower it"))
        return super().boot(arm, block, position)


def test_sampler_raising_boot_failed_is_a_recorded_reject() -> None:
    result = run_ab(RaisingSampler(seed=0), POLICY, 0)
    assert result.verdict.decision is Decision.REJECT and "no_room_for_kv" in result.verdict.reason
    assert len(result.samples) <= 2


def test_memory_technique_kept_on_non_inferiority_and_memory_gain() -> None:
    # seed 000: an FP8 draft head changed no speed and grew the KV pool from 303K to 358K tokens
    memory = dataclasses.replace(POLICY, kind="memory", non_inferiority_margin=0.05)
    kept = 0
    for seed in range(20):
        sampler = NoiseModelSampler(effect=0.0, sigma_boot=0.03, kv_pool=(303_000, 358_000), seed=seed)
        verdict = run_ab(sampler, memory, seed).verdict
        kept += verdict.decision is Decision.KEEP
        assert verdict.decision is not Decision.KEEP or "memory grew" in verdict.reason
    assert kept >= 15
    # the same speed without a memory gain is not a memory technique
    no_gain = run_ab(NoiseModelSampler(sigma_boot=0.03, seed=3), memory, 3).verdict
    assert no_gain.decision is Decision.REJECT and "KV pool" in no_gain.reason
    # a speed technique with no speed gain is not kept even when it saves memory
    speed = run_ab(NoiseModelSampler(sigma_boot=0.03, kv_pool=(303_000, 358_000), seed=3), POLICY, 3).verdict
    assert speed.decision is not Decision.KEEP


def test_ttft_guardrail_failure_blocks_a_keep() -> None:
    result = run_ab(NoiseModelSampler(effect=0.40, ttft_effect=1.5, seed=2), POLICY, 2)
    assert result.verdict.decision is Decision.REJECT
    assert "ttft" in result.verdict.reason
    failed = [g for g in result.verdict.guardrails if g.passed is False]
    assert failed and failed[0].ratio is not None and failed[0].ratio > 1.3


def test_kv_pool_and_quality_guardrails_reject() -> None:
    smaller = run_ab(NoiseModelSampler(effect=0.40, kv_pool=(300_000, 200_000), seed=2), POLICY, 2).verdict
    assert smaller.decision is Decision.REJECT and "kv_pool_tokens" in smaller.reason
    broken = run_ab(NoiseModelSampler(effect=0.40, quality_b=False, seed=2), POLICY, 2).verdict
    assert broken.decision is Decision.REJECT and "quality" in broken.reason
    unknown = run_ab(NoiseModelSampler(effect=0.40, quality_b=None, seed=2), POLICY, 2).verdict
    assert unknown.decision is not Decision.KEEP


def test_inconclusive_at_the_cap_states_estimate_ci_and_mde() -> None:
    policy = dataclasses.replace(POLICY, futility="none")
    for seed in range(40):
        result = run_ab(NoiseModelSampler(effect=0.04, seed=seed), policy, seed)
        v = result.verdict
        if v.decision is Decision.INCONCLUSIVE:
            assert result.boots == 24 and v.final
            assert v.mde is not None and v.mde > 0.04
            assert v.effect is not None and v.ci_low is not None and v.ci_high is not None
            assert "incumbent stays" in v.reason and "could not be detected" in v.reason
            assert Verdict.from_dict(v.to_dict()) == v
            return
    pytest.fail("no inconclusive run among 40 small-effect A/Bs")


def measured(tok_s: list[float]) -> BootSample:
    return BootSample(arm=Arm.INCUMBENT, block=0, position=0,
                      passes=(PassMeasurement(800.0, 0.5, 1.5, warmup=True),
                              *(PassMeasurement(x, 0.5, 1.5) for x in tok_s)),
                      kv_pool_tokens=1000, quality_passed=True)


def test_degenerate_samples_are_inconclusive_never_keep() -> None:
    a = [dataclasses.replace(measured([1000.0, 1000.0]), block=i) for i in range(4)]
    b = [dataclasses.replace(measured([2000.0, 2000.0]), arm=Arm.CANDIDATE, block=i) for i in range(4)]
    v = decide(a, b, POLICY, 1)
    assert v.decision is Decision.INCONCLUSIVE and "zero standard error" in v.reason
    nan_b = [dataclasses.replace(s, passes=(*s.passes[:1], PassMeasurement(float("nan")), s.passes[2])) for s in b]
    assert decide(a, nan_b, POLICY, 3).decision is Decision.INCONCLUSIVE
    assert decide(a[:1], b[:1], POLICY, 3).decision is Decision.INCONCLUSIVE
    short = [dataclasses.replace(s, passes=s.passes[:2]) for s in b]   # one measured pass, protocol needs 2
    v = decide(a, short, POLICY, 3)
    assert v.decision is Decision.INCONCLUSIVE and v.statistics is not None and v.statistics.excluded_boots == 4


def test_first_pass_is_discarded_even_unflagged() -> None:
    rows = [measured([1000.0 + 20 * i, 1010.0 - 3 * i]) for i in range(4)]
    a = [dataclasses.replace(s, block=i, passes=tuple(dataclasses.replace(p, warmup=False) for p in s.passes))
         for i, s in enumerate(rows)]
    b = [dataclasses.replace(s, arm=Arm.CANDIDATE, passes=(PassMeasurement(100.0, 0.5, 1.5), *s.passes[1:]))
         for s in a]
    v = decide(a, b, POLICY, 1)
    assert v.effect == pytest.approx(1.0)     # the unflagged first passes (800 vs 100 tok/s) never entered


def test_boundaries_reproducible_and_match_the_spec() -> None:
    small = Design(replicates=2_000, seed=5)
    assert (null_maxima(small) == null_maxima(small)).all()     # two fresh simulations: no memo between them
    one = calibrate(Design())
    fresh = calibrate(Design(seed=7, robust=None))
    # statistics.md §3.5: OBF nominal one-sided p .0014 / .0175 / .0426 at 4 / 8 / 12 blocks for the plain t
    for got, want in zip(fresh.nominal_p, (0.0014, 0.0175, 0.0426), strict=True):
        assert got == pytest.approx(want, rel=0.15)
    # the gate's robust (biweight) t is calibrated to the same α
    assert 0.045 <= one.achieved_alpha <= 0.05
    pocock = calibrate(Design(shape="pocock"))
    assert len(set(pocock.nominal_p)) == 1 and 0.015 < pocock.nominal_p[0] < 0.03


def test_boundary_cache_round_trips_on_disk(tmp_path: object) -> None:
    from pathlib import Path

    folder = Path(str(tmp_path))
    design = Design(looks=(3, 6), replicates=2_000, seed=11)
    first = calibrate(design, cache_dir=folder)
    assert list(folder.glob("gate-boundaries-*.npz"))
    from elsa_tune.tuner.ab import boundaries

    boundaries._memo.clear()
    second = calibrate(design, cache_dir=folder)
    assert second.nominal_p == first.nominal_p and (second.null_max == first.null_max).all()


def test_a_level_too_small_for_the_null_sample_is_refused_with_the_smallest_it_can_place() -> None:
    from elsa_tune.tuner.ab.boundaries import smallest_level

    assert calibrate(Design(replicates=4000, seed=11, alpha=smallest_level(4000))).constant > 0
    with pytest.raises(ValueError, match=r"below what 4000 null replicates can calibrate \(at least 0.0013\)"):
        calibrate(Design(replicates=4000, seed=11, alpha=1e-5))


def test_adjusted_p_is_at_most_alpha_exactly_when_a_boundary_is_crossed() -> None:
    b = calibrate(Design())
    for look in (1, 2, 3):
        assert b.adjusted_p(look, b.nominal_p[look - 1] * 0.999) <= 0.0501
        assert b.adjusted_p(look, b.nominal_p[look - 1] * 1.2) > 0.05


def test_run_records_schedule_and_samples() -> None:
    result = run_ab(NoiseModelSampler(effect=0.0, seed=9), POLICY, 123, context={"runtime": "sglang 0.5.23"})
    assert result.schedule.seed == 123 and result.to_dict()["context"]["runtime"] == "sglang 0.5.23"
    looks = result.verdict.extra["looks"]
    assert looks[-1]["decision"] == result.verdict.decision.value and looks[-1]["boots"] == len(result.samples)
    assert all(look["decision"] == "inconclusive" for look in looks[:-1])
    assert result.verdict.order == result.schedule.letters() == "".join(s.arm.letter for s in result.samples)
    assert result.verdict.boots_incumbent + result.verdict.boots_candidate == len(result.samples)
    data = result.to_dict()
    assert data["schedule"]["order"] == result.schedule.letters() and len(data["samples"]) == len(result.samples)
    assert BootSample.from_dict(data["samples"][0]) == result.samples[0]


def test_policy_from_dimensioning_takes_the_measured_noise() -> None:
    from elsa_tune.tuner.ab.dimensioning import dimension

    sampler = NoiseModelSampler(sigma_boot=0.05, sigma_run=0.02, measured_passes=5, seed=4)
    report = dimension([sampler.boot(Arm.INCUMBENT, i, 0) for i in range(12)])
    policy = GatePolicy.from_dimensioning(report, min_effect=0.05)
    assert policy.sigma_boot == report.sigma_boot and policy.min_effect == 0.05
    assert policy.warmup_passes >= 1 and policy.measured_passes >= 2


def test_guardrails_can_be_switched_off() -> None:
    loose = dataclasses.replace(POLICY, guardrails=GuardrailPolicy(None, None, None, require_quality=False))
    v = run_ab(NoiseModelSampler(effect=0.40, ttft_effect=1.5, quality_b=None, seed=2), loose, 2).verdict
    assert v.decision is Decision.KEEP and v.guardrails == ()


def test_a_design_at_another_level_reuses_the_null_sample_and_crossing_it_means_an_adjusted_p_below_it() -> None:
    """The night's false-keep control gives each test its own level: the boundaries at that level come from the same
    null sample (no new simulation), and a look that crosses them has a design-adjusted p at or below the level."""
    base = calibrate(Design(replicates=4000, seed=11))
    strict = calibrate(Design(replicates=4000, seed=11, alpha=0.02))
    assert strict.null_max is base.null_max
    assert strict.constant > base.constant and strict.achieved_alpha <= 0.02
    for look in (1, 2, 3):
        p_at_boundary = strict.nominal_p[look - 1]
        assert strict.crosses(look, p_at_boundary)
        assert strict.adjusted_p(look, p_at_boundary) <= 0.02
        assert base.adjusted_p(look, p_at_boundary) == strict.adjusted_p(look, p_at_boundary)


def test_a_policy_level_calibrates_the_efficacy_boundaries_but_not_the_interval() -> None:
    policy = GatePolicy(looks=(2, 4, 6), replicates=2000, level=0.02)
    assert policy.design().alpha == 0.02 and policy.efficacy_level == 0.02
    assert GatePolicy(looks=(2, 4, 6), replicates=2000).efficacy_level == policy.alpha == 0.05
    assert policy.to_dict()["level"] == 0.02
    with pytest.raises(ValueError, match="level"):
        GatePolicy(level=0.5)


def test_a_boot_saving_futility_stop_says_so_and_the_same_test_can_go_on() -> None:
    """The boot-saving stop ends a test on its estimate at an early look; the verdict names that rule, so the test
    can be continued later. Continued (the same boots, futility by the interval only), it reads the same first
    look and goes past it; the interval rule is marked as such."""
    policy = dataclasses.replace(POLICY, futility="boot_saving")
    seed = next(s for s in range(200)
                if (v := run_ab(NoiseModelSampler(effect=0.05, sigma_boot=0.08, seed=s), policy, s).verdict)
                .futility is Futility.BOOT_SAVING and v.stopped_at_look == 1)
    stopped = run_ab(NoiseModelSampler(effect=0.05, sigma_boot=0.08, seed=seed), policy, seed)
    assert stopped.verdict.decision is Decision.REJECT and stopped.verdict.futile
    assert stopped.verdict.ci_high is not None and stopped.verdict.ci_high > 1.0 + policy.min_effect
    going_on = run_ab(NoiseModelSampler(effect=0.05, sigma_boot=0.08, seed=seed),
                      dataclasses.replace(policy, futility="ci"), seed)
    first = len(stopped.samples)
    assert [s.passes for s in going_on.samples[:first]] == [s.passes for s in stopped.samples]
    assert len(going_on.samples) > first
    if going_on.verdict.futile:
        assert going_on.verdict.futility is Futility.CI


def test_continuing_futility_stopped_tests_keeps_a_no_op_at_most_alpha() -> None:
    """Futility stops are non-binding: a no-op kept by its first test or by its continuation is kept no more often
    than the efficacy boundaries allow (designed ≤ 5%; 300 seeded runs)."""
    policy = dataclasses.replace(POLICY, futility="boot_saving")
    keeps = 0
    for seed in range(300):
        first = run_ab(NoiseModelSampler(effect=0.0, seed=seed), policy, seed).verdict
        if first.futility is Futility.BOOT_SAVING:
            first = run_ab(NoiseModelSampler(effect=0.0, seed=seed), dataclasses.replace(policy, futility="ci"),
                           seed).verdict
        keeps += first.decision is Decision.KEEP
    assert keeps / 300 <= 0.08
