"""The gate against outlier boots: winsorized boot values (``statistics.winsorize_pair``) under contaminated noise."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from elsa_tune.history.verdict import Decision
from elsa_tune.tuner.boot_sample import BootSample, PassMeasurement
from elsa_tune.tuner.gate import GatePolicy, GuardrailPolicy, decide, run_ab
from elsa_tune.tuner.noise_model import NoiseModelSampler
from elsa_tune.tuner.schedule import Arm
from elsa_tune.tuner.statistics import winsorize_pair


def _boots(arm: Arm, logs: list[float]) -> list[BootSample]:
    out = []
    for i, y in enumerate(logs):
        tput = 1000.0 * math.exp(y)
        passes = (PassMeasurement(tput * 0.88, 0.5, 1.5, warmup=True), PassMeasurement(tput, 0.5, 1.5),
                  PassMeasurement(tput, 0.5, 1.5))
        out.append(BootSample(arm=arm, block=i, position=0, passes=passes, kv_pool_tokens=1000, quality_passed=True))
    return out


def test_one_slow_boot_does_not_decide_the_comparison() -> None:
    """A true +10% with one candidate boot slowed 25% by its host: kept by the winsorized gate, not by the plain t."""
    policy = GatePolicy(looks=(6,), replicates=4000, guardrails=GuardrailPolicy(ttft_p50_margin=None,
                                                                                 ttft_p99_margin=None))
    a = [0.01, -0.02, 0.03, -0.01, 0.0, 0.02]
    b = [0.11, 0.08, 0.12, 0.09, 0.10 - math.log(1.25) - 0.05, 0.11]
    robust = decide(_boots(Arm.INCUMBENT, a), _boots(Arm.CANDIDATE, b), policy, 1)
    plain = decide(_boots(Arm.INCUMBENT, a), _boots(Arm.CANDIDATE, b), replace(policy, winsor=None), 1)
    assert robust.decision is Decision.KEEP
    assert plain.decision is not Decision.KEEP
    assert robust.effect is not None and 1.07 < robust.effect < 1.13     # the estimate stays near the truth


def test_winsorizing_leaves_ordinary_spread_alone() -> None:
    ya = np.linspace(-0.05, 0.05, 8)[None, :]
    yb = ya[:, ::-1] + 0.1
    wa, wb = winsorize_pair(ya, yb, 2.5)
    assert np.allclose(wa, ya) and np.allclose(wb, yb)
    three_a, three_b = winsorize_pair(ya[:, :3], yb[:, :3], 2.5)        # too few boots to judge an outlier
    assert np.array_equal(three_a, ya[:, :3]) and np.array_equal(three_b, yb[:, :3])


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
    assert keep_rate(0.10) >= 0.78
