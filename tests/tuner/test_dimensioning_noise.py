"""Noise dimensioning recovers known σ's, the warm-up length and drift correlations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from elsa_tune.history.records import Arm, Covariates
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.tuner.ab.boot_sample import BootSample
from elsa_tune.tuner.ab.comparison import InsufficientData
from elsa_tune.tuner.ab.dimensioning import dimension, dimension_passes, outlier_boot
from elsa_tune.tuner.ab.noise_model import NoiseModelSampler


def matrix(n: int, m: int, *, sigma_boot: float, sigma_run: float, warm: tuple[float, ...] = (0.873,),
           seed: int = 0, rho: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    beta = np.empty(n)
    beta[0] = rng.normal(0, sigma_boot)
    for i in range(1, n):   # AR(1) boot effects with the same marginal σ
        beta[i] = rho * beta[i - 1] + math.sqrt(1 - rho**2) * rng.normal(0, sigma_boot)
    logs = 7.0 + beta[:, None] + rng.normal(0, sigma_run, (n, m))
    for j, ratio in enumerate(warm):
        logs[:, j] += math.log(ratio)
    return np.exp(logs)


def test_recovers_known_sigmas_and_the_first_pass_penalty() -> None:
    report = dimension_passes(matrix(200, 6, sigma_boot=0.10, sigma_run=0.03))
    assert report.sigma_boot == pytest.approx(0.10, rel=0.12)
    assert report.sigma_run == pytest.approx(0.03, rel=0.08)
    assert report.first_pass_ratio == pytest.approx(0.873, abs=0.01)
    assert report.warmup_detected == 1 and report.warmup_passes == 1


def test_detects_a_two_pass_warmup_and_always_discards_one() -> None:
    report = dimension_passes(matrix(10, 6, sigma_boot=0.05, sigma_run=0.02, warm=(0.80, 0.93)))
    assert report.warmup_detected == 2 and report.warmup_passes == 2
    none = dimension_passes(matrix(10, 6, sigma_boot=0.05, sigma_run=0.02, warm=()))
    assert none.warmup_detected == 0 and none.warmup_passes == 1


def test_protocol_parameters_follow_the_spec() -> None:
    report = dimension_passes(matrix(10, 6, sigma_boot=0.10, sigma_run=0.03, seed=4), cost_ratio=40.0)
    needs = dict(report.boots_per_arm)
    assert needs[0.10] is not None and 5 <= needs[0.10] <= 40
    assert report.measured_passes >= 2
    assert report.mde_at_cap > 0.05
    cheap = dimension_passes(matrix(10, 6, sigma_boot=0.01, sigma_run=0.05, seed=5), cost_ratio=100.0)
    assert cheap.measured_passes > 2     # KJ: many passes when the boot is costly and quiet


def test_correlated_boots_switch_to_paired_analysis() -> None:
    report = dimension_passes(matrix(40, 4, sigma_boot=0.10, sigma_run=0.01, rho=0.8, seed=2))
    assert report.lag1_correlation is not None and report.lag1_correlation > 0.3
    assert report.analysis == "paired"
    iid = dimension_passes(matrix(40, 4, sigma_boot=0.10, sigma_run=0.01, rho=0.0, seed=2))
    assert iid.analysis == "unpaired"


def test_drift_correlation_with_covariates_from_boot_samples() -> None:
    sampler = NoiseModelSampler(sigma_boot=0.08, sigma_run=0.02, measured_passes=4, seed=6)
    boots = [sampler.boot(Arm.INCUMBENT, i, 0) for i in range(15)]
    report = dimension(boots, context={"runtime": "sim", "gpu": "RTX 5090", "model": "qwen"})
    by_name = {c.name: c for c in report.covariates}
    assert by_name["sm_clock_mhz"].r > 0.9          # the model ties clocks to the boot effect
    assert by_name["temperature_c"].r < -0.9
    assert report.kv_pool_deterministic is True
    lines = report.summary_lines()
    assert any("boot-to-boot" in line for line in lines) and any("sm_clock_mhz" in line for line in lines)
    assert report.to_dict()["context"]["gpu"] == "RTX 5090"


def test_refuses_too_little_or_failed_baseline() -> None:
    with pytest.raises(InsufficientData):
        dimension_passes(matrix(2, 6, sigma_boot=0.1, sigma_run=0.03))
    with pytest.raises(InsufficientData):
        dimension_passes(matrix(10, 2, sigma_boot=0.1, sigma_run=0.03))
    crashed = BootSample(arm=Arm.INCUMBENT, block=0, position=0, covariates=Covariates(),
                         failed=Failure(kind=FailureKind.HANG, summary="watchdog", remedy="x"))
    with pytest.raises(InsufficientData, match="hang"):
        dimension([crashed])


def test_four_boots_that_happen_to_decline_stay_unpaired() -> None:
    """Four baseline boots reading 96, 91, 75 and 65 tok/s correlate at lag 1 by chance (three pairs); that is no
    evidence of correlated boots, and a paired test would halve the degrees of freedom for nothing."""
    levels = [96.2, 90.6, 75.0, 65.2]
    passes = np.array([[level * f for f in (0.9, 1.0, 1.01, 0.99)] for level in levels])
    report = dimension_passes(passes)
    assert report.lag1_correlation is not None and report.lag1_correlation > 0.3
    assert report.analysis == "unpaired"


def _boots_at(means: list[float], *, passes: int = 4, sigma_run: float = 0.01, seed: int = 3) -> np.ndarray:
    """Boots whose steady passes centre on ``means`` (tok/s), with a cold first pass."""
    rng = np.random.default_rng(seed)
    logs = np.log(np.asarray(means))[:, None] + rng.normal(0, sigma_run, (len(means), passes))
    logs[:, 0] += math.log(0.873)
    return np.exp(logs)


def test_one_high_first_boot_is_set_aside_from_sigma_boot() -> None:
    first = _boots_at([53.4, 40.1, 36.6, 40.5])
    assert dimension_passes(first).set_aside_boot is None              # four boots: not enough to drop one
    assert outlier_boot(np.log(first[:, 1:].mean(axis=1)), min_boots=4) == 0   # but enough to ask for more
    report = dimension_passes(_boots_at([53.4, 40.1, 36.6, 40.5, 38.9, 41.7]))
    assert report.set_aside_boot == 0
    assert report.set_aside_off_median == pytest.approx(53.4 / 40.1 - 1, abs=0.02)
    assert report.sigma_boot_all is not None and report.sigma_boot_all > 0.12     # what the high boot makes of it
    assert report.sigma_boot < 0.07                                                 # the others agree
    everything = dimension_passes(_boots_at([45.0, 40.1, 36.6, 40.5, 38.9, 41.7]))   # none apart: all count
    assert everything.set_aside_boot is None and everything.sigma_boot == everything.sigma_boot_all
    line = next(x for x in report.summary_lines() if "σ_boot" in x or "boot-to-boot" in x)
    assert "boot 1 of 6 set aside as an outlier" in line
    assert report.record().set_aside_boot == 0 and report.record().mde == report.mde_at_cap


def test_outlier_rule_rarely_sets_a_boot_aside_on_normal_noise() -> None:
    assert outlier_boot(np.log(np.asarray([53.4, 40.1, 36.6])), min_boots=3) is None
    fired = sum(outlier_boot(np.log(matrix(6, 3, sigma_boot=0.10, sigma_run=0.0, warm=(), seed=s)[:, 0])) is not None
                for s in range(2000))
    assert fired / 2000 < 0.08
