"""Paired request-level comparison inside one boot."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest
from scipy import stats

from elsa_tune.history.verdict import Decision
from elsa_tune.tuner.paired import PairedPolicy, compare_paired, pairs_for, run_paired, sign_flip_p
from elsa_tune.tuner.schedule import Arm


@dataclass
class DriftingBoot:
    """One boot whose speed drifts linearly; the candidate's batches are ``effect`` faster."""

    effect: float
    sigma_run: float = 0.03
    drift: float = 0.01
    seed: int = 0
    calls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def run_batch(self, arm: Arm, pair: int, position: int) -> float:
        self.calls.append(arm.value)
        gain = math.log1p(self.effect) if arm is Arm.CANDIDATE else 0.0
        warm = math.log(0.87) if len(self.calls) == 1 else 0.0
        return 1000.0 * math.exp(gain + warm + self.drift * len(self.calls) + self.rng.normal(0, self.sigma_run))


def test_sign_flip_exact_matches_enumeration_by_hand() -> None:
    p, exact = sign_flip_p([1.0, 2.0, 3.0])
    assert exact and p == pytest.approx(1 / 8)          # only all-positive reaches mean 2
    p, _ = sign_flip_p([1.0, -1.0, 2.0, 0.5])
    assert 0 < p < 1
    p_mc, exact = sign_flip_p(np.linspace(0.01, 0.2, 30).tolist(), permutations=5_000, seed=1)
    assert not exact and p_mc < 0.001


def test_paired_t_agrees_with_scipy() -> None:
    rng = np.random.default_rng(2)
    a = np.exp(rng.normal(7, 0.03, 10))
    b = a * np.exp(rng.normal(0.02, 0.01, 10))
    pc = compare_paired(a.tolist(), b.tolist())
    assert pc.comparison.p_one_sided == pytest.approx(stats.ttest_rel(np.log(b), np.log(a),
                                                                      alternative="greater").pvalue)


def test_five_percent_gain_kept_within_one_boot_despite_drift() -> None:
    kept = sum(run_paired(DriftingBoot(0.05, seed=s), PairedPolicy(), s).verdict.decision is Decision.KEEP
               for s in range(20))
    assert kept >= 18


def test_no_op_and_regression_are_not_kept() -> None:
    outcomes = [run_paired(DriftingBoot(0.0, seed=s), PairedPolicy(), s).verdict.decision for s in range(60)]
    assert outcomes.count(Decision.KEEP) <= 6
    worse = run_paired(DriftingBoot(-0.05, seed=1), PairedPolicy(test="t"), 1).verdict
    assert worse.decision is Decision.REJECT and "futile" in worse.reason


def test_order_is_recorded_and_warmup_pair_dropped() -> None:
    boot = DriftingBoot(0.0, seed=3)
    result = run_paired(boot, PairedPolicy(pairs=8, warmup_pairs=1), 3)
    assert "".join(boot.calls) == result.schedule.letters() == result.verdict.extra["order"]
    assert len(result.values_a) == len(result.values_b) == 7
    assert result.to_dict()["schedule"]["order"] == result.schedule.letters()


def test_degenerate_batches_are_inconclusive() -> None:
    from elsa_tune.tuner.paired import paired_verdict

    v = paired_verdict([1000.0] * 5, [1000.0] * 5, PairedPolicy())
    assert v.decision is Decision.INCONCLUSIVE
    v = paired_verdict([1000.0, 0.0, 900.0], [1000.0, 1000.0, 1000.0], PairedPolicy())
    assert v.decision is Decision.INCONCLUSIVE


def test_pairs_needed_are_far_fewer_than_boots() -> None:
    assert pairs_for(0.05, sigma_run=0.03) < 12
