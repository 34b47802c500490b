"""The gate against outlier boots: the biweight comparison (``comparison.biweight``) under contaminated noise."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from elsa_tune.history.reasons import reason_from_verdict
from elsa_tune.history.records import Arm
from elsa_tune.history.verdict import Decision, Verdict
from elsa_tune.search_spaces.space import ReasonCategory
from elsa_tune.tuner.ab.boot_sample import BootSample, PassMeasurement
from elsa_tune.tuner.ab.comparison import biweight, compare, t_statistics
from elsa_tune.tuner.ab.gate import GatePolicy, GuardrailPolicy, decide, run_ab
from elsa_tune.tuner.ab.noise_model import NoiseModelSampler

SLOW = math.log(1.25)    # a boot its host slowed by 25%


def _boots(arm: Arm, logs: list[float]) -> list[BootSample]:
    out = []
    for i, y in enumerate(logs):
        tput = 1000.0 * math.exp(y)
        passes = (PassMeasurement(tput * 0.88, 0.5, 1.5, warmup=True), PassMeasurement(tput, 0.5, 1.5),
                  PassMeasurement(tput, 0.5, 1.5))
        out.append(BootSample(arm=arm, block=i, position=0, passes=passes, kv_pool_tokens=1000, quality_passed=True))
    return out


def test_one_slow_boot_does_not_decide_the_comparison_and_the_verdict_names_it() -> None:
    """A true +10% with one candidate boot slowed 25% by its host: kept by the robust gate, not by the plain t."""
    policy = GatePolicy(looks=(6,), replicates=4000, guardrails=GuardrailPolicy(ttft_p50_margin=None,
                                                                                 ttft_p99_margin=None))
    a = [0.01, -0.02, 0.03, -0.01, 0.0, 0.02]
    b = [0.11, 0.08, 0.12, 0.09, 0.10 - SLOW - 0.05, 0.11]
    robust = decide(_boots(Arm.INCUMBENT, a), _boots(Arm.CANDIDATE, b), policy, 1)
    plain = decide(_boots(Arm.INCUMBENT, a), _boots(Arm.CANDIDATE, b), replace(policy, robust=None), 1)
    assert robust.decision is Decision.KEEP
    assert plain.decision is not Decision.KEEP
    assert robust.effect is not None and 1.07 < robust.effect < 1.13     # the estimate stays near the truth
    (slow,) = robust.outlier_boots
    assert (slow.arm, slow.block) == ("candidate", 4) and slow.weight == 0.0
    assert slow.off_median == pytest.approx(math.exp(b[4] - 0.105) - 1.0, abs=0.01)
    again = Verdict.from_dict(robust.to_dict())                         # the record keeps it through the store
    assert again.outlier_boots == robust.outlier_boots
    assert "1 boot down-weighted as an outlier: candidate in block 4 −24% off its arm's median, weight 0.00" in \
        reason_from_verdict(replace(robust, decision=Decision.INCONCLUSIVE))
    assert plain.outlier_boots == ()


def test_ordinary_spread_is_not_down_weighted_and_fast_boots_never_are() -> None:
    ya = np.linspace(-0.05, 0.05, 8)[None, :]
    yb = ya[:, ::-1] + 0.1
    fit = biweight([ya, yb], 4.685, slow_only=True)
    assert all(float(w.min()) > 0.5 for w in fit.weights)
    c, plain = compare(ya[0].tolist(), yb[0].tolist(), robust=4.685), compare(ya[0].tolist(), yb[0].tolist())
    assert c.outliers_a == c.outliers_b == () and c.delta == pytest.approx(plain.delta, abs=0.01)
    fast = yb.copy()
    fast[0, 2] += SLOW                                                  # a boot 25% faster than its arm
    assert float(biweight([ya, fast], 4.685, slow_only=True).weights[1][0, 2]) == 1.0


def test_a_paired_analysis_down_weights_a_block_whose_difference_is_far_out_either_way() -> None:
    a = [0.01, -0.02, 0.03, -0.01, 0.0, 0.02, -0.03, 0.01]
    b = [y + 0.10 + e for y, e in zip(a, [0.01, -0.01, 0.0, 0.02, -0.02, 0.01, 0.0, -0.01], strict=True)]
    for sign in (1.0, -1.0):                                            # a slow candidate or a slow incumbent boot
        outlier = list(b)
        outlier[5] -= sign * SLOW
        c = compare(a, outlier, analysis="paired", robust=4.685)
        assert c.outliers_a == c.outliers_b == (5,)
        assert c.delta == pytest.approx(0.10, abs=0.01) and c.df < 7   # the block counts for nothing in the df


def test_few_boots_fall_back_to_the_plain_t_and_no_spread_never_passes() -> None:
    ya, yb = np.array([[0.0, 0.02, -0.01]]), np.array([[0.1, 0.12, 0.09 - SLOW]])
    robust, plain = t_statistics(ya, yb, robust=4.685), t_statistics(ya, yb)
    assert all(np.array_equal(r, p) for r, p in zip(robust, plain, strict=True))
    same = [0.1, 0.1, 0.1, 0.1]
    with pytest.raises(ValueError, match="no spread"):
        compare(same, same, robust=4.685)


def _keep_rate(policy: GatePolicy, effect: float, runs: int) -> float:
    keeps = 0
    for rep in range(runs):
        seed = 7_000_003 * rep + round(1000 * effect)
        sampler = NoiseModelSampler(effect=effect, sigma_boot=0.05, sigma_run=0.03, seed=seed, family="contaminated")
        keeps += run_ab(sampler, policy, rng_seed=seed).verdict.decision is Decision.KEEP
    return keeps / runs


def test_contaminated_noise_keeps_a_real_gain_that_the_plain_t_loses() -> None:
    """10% of boots 25% slow, a true +10% at 5% boot noise, 300 seeded A/B runs: ≥ 90% kept; the plain t misses it."""
    policy = GatePolicy()
    robust, plain = _keep_rate(policy, 0.10, 300), _keep_rate(replace(policy, robust=None), 0.10, 300)
    assert robust >= 0.90                     # 0.933 on these seeds
    assert plain < 0.88                       # 0.853 on these seeds


@pytest.mark.slow
@pytest.mark.parametrize("family", ["contaminated", "t3", "drift_step"])
def test_operating_characteristics_outside_the_calibration_model(family: str) -> None:
    """No-op kept at most ~α and a true +10% at 5% boot noise kept most of the time, 300 runs per cell."""
    policy = GatePolicy()

    def keep_rate(effect: float) -> float:
        keeps = 0
        for rep in range(300):
            seed = 7_000_003 * rep + round(1000 * effect)
            sampler = NoiseModelSampler(effect=effect, sigma_boot=0.05, sigma_run=0.03, seed=seed, family=family)
            keeps += run_ab(sampler, policy, rng_seed=seed).verdict.decision is Decision.KEEP
        return keeps / 300

    assert keep_rate(0.0) <= 0.075            # α = 5% plus two Monte Carlo standard errors
    assert keep_rate(0.10) >= 0.88            # 0.933 contaminated, 0.983 t3, 0.960 step drift on these seeds


def _futile(a: list[float], b: list[float]) -> Verdict:
    policy = GatePolicy(looks=(len(a),), replicates=4000, guardrails=GuardrailPolicy(ttft_p50_margin=None,
                                                                                      ttft_p99_margin=None))
    verdict = decide(_boots(Arm.INCUMBENT, a), _boots(Arm.CANDIDATE, b), policy, 1)
    assert verdict.decision is Decision.REJECT and verdict.futile
    return verdict


def test_slower_needs_the_keep_level_in_the_robust_and_the_plain_comparison_alike() -> None:
    """An incumbent block 37% slow, left out by the outlier rule, makes a no-op look slower: filed "no gain"."""
    slow_block = math.log(0.63)
    a = [0.05, 0.06, 0.04, 0.05, 0.06, 0.05 + slow_block]
    b = [-0.04, -0.06, -0.05, -0.04, -0.06, -0.05]           # the plain means agree within 1%: a no-op
    robust = compare(a, b, robust=4.685)
    assert robust.outliers_a == (5,) and robust.bounds(0.05)[1] < 0     # the robust interval alone reads slower
    verdict = _futile(a, b)
    assert verdict.category is ReasonCategory.NO_GAIN
    assert any(o.arm == "incumbent" and o.weight < 0.5 for o in verdict.outlier_boots)
    assert reason_from_verdict(verdict).startswith("no demonstrated benefit")
    # the candidate's own arm: a no-op with one candidate boot 40% slow is not filed slower either
    c = [0.0, 0.01, -0.01, 0.0, 0.01, -0.01]
    assert _futile(c, [0.0, 0.01, -0.01, 0.0, 0.01, math.log(0.6)]).category is ReasonCategory.NO_GAIN
    # a candidate slower in every block is slower under both comparisons
    slower = _futile(c, [y - 0.12 for y in c])
    assert slower.category is ReasonCategory.SLOWER
    assert reason_from_verdict(slower).startswith("slower: −11%")
