"""Operating characteristics of the gate at the issue's goals (big Monte Carlo: slow tier)."""

from __future__ import annotations

import pytest

from elsa_tune.history.verdict import Decision
from elsa_tune.tuner.ab.gate import GatePolicy, run_ab
from elsa_tune.tuner.ab.noise_model import NoiseModelSampler

pytestmark = pytest.mark.slow


def keep_rate(effect: float, sigma_boot: float, runs: int, **model: float) -> float:
    policy = GatePolicy()
    kept = sum(run_ab(NoiseModelSampler(effect=effect, sigma_boot=sigma_boot, seed=10_000 + s, **model),  # type: ignore[arg-type]
                      policy, s).verdict.decision is Decision.KEEP for s in range(runs))
    return kept / runs


@pytest.mark.parametrize("sigma_boot", [0.05, 0.10])
def test_no_op_kept_at_most_five_percent(sigma_boot: float) -> None:
    assert keep_rate(0.0, sigma_boot, 1200) <= 0.05 + 0.015     # 2.4 SE of slack over 1200 runs


def test_ten_percent_kept_at_the_goal_rates() -> None:
    assert keep_rate(0.10, 0.10, 600) >= 0.62
    assert keep_rate(0.10, 0.05, 300) >= 0.95


def test_linear_drift_does_not_turn_a_no_op_into_a_keep() -> None:
    # +1% per boot slot: +24% over a full run, cancelled by ABBA·BAAB
    assert keep_rate(0.0, 0.05, 800, drift_per_slot=0.01) <= 0.07
