"""Noise dimensioning on the baseline: how noisy is this stack, and what must the gate do about it.

Run once per model × GPU × build: the incumbent is booted n times and runs m
passes of the identical workload per boot. From that matrix this module estimates

- the warm-up length: per pass index, the mean log offset from the boot's steady state (the later
  half of its passes); the warm-up ends at the changepoint after which no pass index differs from
  steady state by more than max(3 SE, 1%); at least one pass is always discarded;
- the Kalibera–Jones variance components on the log scale: σ_run² = T_1² (within boot) and
  σ_boot² = T_2² = S_2² − S_1²/m (between boots), over every boot but one that stands apart from the others
  (``outlier_boot``: at least ``OUTLIER_MIN_BOOTS`` boots, and the boot farthest from the median lies beyond
  ``OUTLIER_Z`` in MAD units of all boot means and beyond ``OUTLIER_PREDICTION_Z`` in prediction-interval units
  of the other boots), so that one high or low boot cannot set the night's σ_boot; the report keeps that boot's
  index and σ_boot with it. Four boots cannot tell such a boot from normal noise often enough to drop it: the
  study boots more baseline boots when one of its first ones stands apart (``outlier_boot(..., min_boots=4)``);
- the lag-1 correlation of consecutive boot means (≥ 0.3 → analyse block differences, paired) and the
  correlation of boot means with each recorded covariate (clocks, temperature, free memory, boot
  order as a time trend);
- the protocol's parameters: measured passes k (the KJ optimum from the cost ratio, at least 2), the
  boots per arm needed for each MDE, and the MDE the capped gate can reach.

The result is a frozen ``NoiseReport`` that the report shows and ``GatePolicy.from_dimensioning``
turns into the gate's settings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from elsa_tune.history.study_record import NoiseRecord
from elsa_tune.tuner.ab.boot_sample import BootSample
from elsa_tune.tuner.ab.comparison import (
    Analysis,
    FloatArray,
    InsufficientData,
    boots_per_arm_for,
    mde_for,
    variance_components,
)

SCHEMA_VERSION = 1
DEFAULT_MDES = (0.02, 0.03, 0.05, 0.10, 0.15)
#: The gate's analysis is paired when consecutive baseline boots correlate at least this much (lag 1) and that
#: correlation is evidence, its one-sided p at most ``PAIRED_P``: 4 boots give 3 pairs, where r ≥ 0.3 often comes by
#: chance, and a paired test halves the degrees of freedom.
PAIRED_CORRELATION = 0.3
PAIRED_P = 0.05
_WARMUP_FLOOR = 0.01
#: a boot mean stands apart when it lies this many MAD-scaled standard deviations from the median of all boots
OUTLIER_Z = 3.5
#: ... and this many of the other boots' standard deviations (widened for one new boot) from their mean
OUTLIER_PREDICTION_Z = 4.5
#: the fewest boots among which one is set aside from σ_boot (with 4 normal boots the rule fires in ~16% of draws)
OUTLIER_MIN_BOOTS = 6


@dataclass(frozen=True)
class CovariateCorrelation:
    """Pearson correlation of a per-boot covariate with the boot's mean log throughput."""

    name: str
    r: float
    p_value: float
    n: int


@dataclass(frozen=True)
class NoiseReport:
    """The measured noise of one stack and the protocol parameters derived from it (log scale σ's)."""

    boots: int
    passes_per_boot: int
    warmup_detected: int
    warmup_passes: int
    first_pass_ratio: float
    pass_ratios: tuple[float, ...]
    sigma_boot: float
    sigma_run: float
    boot_level_resolved: bool
    lag1_correlation: float | None
    covariates: tuple[CovariateCorrelation, ...]
    measured_passes: int
    analysis: Analysis
    boots_per_arm: tuple[tuple[float, int | None], ...]
    cap_boots_per_arm: int
    mde_at_cap: float
    cost_ratio: float | None
    kv_pool_deterministic: bool | None
    context: Mapping[str, str] = field(default_factory=dict)
    alpha: float = 0.05
    power: float = 0.8
    schema_version: int = SCHEMA_VERSION
    #: the boot (0-based, in run order) set aside from σ_boot as an outlier, and its mean against the others' median
    set_aside_boot: int | None = None
    set_aside_off_median: float | None = None
    #: σ_boot with every boot, set aside or not (equals ``sigma_boot`` when none was)
    sigma_boot_all: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["context"] = dict(self.context)
        data["covariates"] = [asdict(c) for c in self.covariates]
        data["boots_per_arm"] = [list(pair) for pair in self.boots_per_arm]
        data["analysis"] = self.analysis.value
        return data

    def record(self) -> NoiseRecord:
        """What the study record keeps of this report (relative σ's, the warm-up bias, the MDE at the cap)."""
        return NoiseRecord(sigma_boot=self.sigma_boot, sigma_run=self.sigma_run,
                           warmup_bias=self.first_pass_ratio - 1.0, boots=self.boots,
                           passes_per_boot=float(self.passes_per_boot), mde=self.mde_at_cap,
                           set_aside_boot=self.set_aside_boot, set_aside_off_median=self.set_aside_off_median,
                           sigma_boot_all=self.sigma_boot_all if self.set_aside_boot is not None else None)

    def summary_lines(self) -> list[str]:
        """A short Markdown block for the report."""
        lines = [
            f"- baseline: {self.boots} boots × {self.passes_per_boot} passes"
            + (f" ({', '.join(f'{k}={v}' for k, v in self.context.items())})" if self.context else ""),
            f"- warm-up: first pass at {self.first_pass_ratio - 1:+.1%} of steady state; "
            f"{self.warmup_detected} pass(es) detected, {self.warmup_passes} discarded per boot",
            f"- boot-to-boot σ {self.sigma_boot:.1%}, run-to-run σ {self.sigma_run:.1%}"
            + ("" if self.boot_level_resolved else " (boot level not resolvable above run noise)")
            + (f" (boot {self.set_aside_boot + 1} of {self.boots} set aside as an outlier: "
               f"{self.set_aside_off_median:+.0%} off the others' median; with it σ_boot {self.sigma_boot_all:.1%})"
               if self.set_aside_boot is not None and self.set_aside_off_median is not None
               and self.sigma_boot_all is not None else ""),
            "- consecutive boots correlate at ρ = "
            + (f"{self.lag1_correlation:.2f}" if self.lag1_correlation is not None else "n/a")
            + f" → {self.analysis.value} analysis, k = {self.measured_passes} measured passes per boot",
        ]
        for c in self.covariates:
            lines.append(f"- throughput vs {c.name}: r = {c.r:+.2f} (p = {c.p_value:.3f}, n = {c.n})")
        needs = ", ".join(f"{mde:.0%}: {n if n is not None else '>10000'}" for mde, n in self.boots_per_arm)
        lines.append(f"- boots per arm for an MDE of {needs}")
        lines.append(f"- at the cap of {self.cap_boots_per_arm} boots per arm the smallest detectable effect is "
                     f"{self.mde_at_cap:.1%}")
        return lines


def dimension(samples: Sequence[BootSample], *, cost_ratio: float | None = None,
              mdes: Sequence[float] = DEFAULT_MDES, cap_boots_per_arm: int = 12, alpha: float = 0.05,
              power: float = 0.8, context: Mapping[str, str] | None = None) -> NoiseReport:
    """Dimension the noise from baseline boots (all passes, warm-up included, in run order).

    Failed boots are refused: a baseline that crashes is not a baseline.
    """
    failures = [s.failed for s in samples if s.failed is not None]
    if failures:
        raise InsufficientData(f"{len(failures)} baseline boot(s) failed ({failures[0].kind.value}: "
                               f"{failures[0].summary}); fix the baseline first")
    lengths = {len(s.passes) for s in samples}
    if len(lengths) != 1:
        raise InsufficientData(f"baseline boots ran different numbers of passes: {sorted(lengths)}")
    matrix = np.asarray([[p.output_throughput_tok_s for p in s.passes] for s in samples], dtype=np.float64)
    names = set.intersection(*(set(s.covariates.drifting()) for s in samples)) if samples else set()
    covariates = {name: [s.covariates.drifting()[name] for s in samples] for name in sorted(names)}
    kv = [s.kv_pool_tokens for s in samples]
    kv_deterministic = None if any(k is None for k in kv) or not kv else len(set(kv)) == 1
    return dimension_passes(matrix, covariates=covariates, cost_ratio=cost_ratio, mdes=mdes,
                            cap_boots_per_arm=cap_boots_per_arm, alpha=alpha, power=power, context=context,
                            kv_pool_deterministic=kv_deterministic)


def dimension_passes(throughput: FloatArray, *, covariates: Mapping[str, Sequence[float]] | None = None,
                     cost_ratio: float | None = None, mdes: Sequence[float] = DEFAULT_MDES,
                     cap_boots_per_arm: int = 12, alpha: float = 0.05, power: float = 0.8,
                     context: Mapping[str, str] | None = None,
                     kv_pool_deterministic: bool | None = None) -> NoiseReport:
    """Dimension the noise from an (n boots × m passes) throughput matrix in run order."""
    values = np.asarray(throughput, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] < 3 or values.shape[1] < 3:
        raise InsufficientData(f"dimensioning needs ≥ 3 boots × ≥ 3 passes, got shape {values.shape}")
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise InsufficientData("a baseline pass has a non-positive or non-finite throughput")
    logs = np.log(values)
    n, m = logs.shape
    detected, ratios = _warmup(logs)
    warmup = max(1, detected)
    if m - warmup < 2:
        raise InsufficientData(f"{m} passes per boot leave fewer than 2 measured passes after a warm-up of "
                               f"{warmup}; run more passes per baseline boot")
    boot_means = logs[:, warmup:].mean(axis=1)
    set_aside = outlier_boot(boot_means)
    t_boot_all, t_run = variance_components(logs[:, warmup:])
    t_boot = t_boot_all
    off_median: float | None = None
    if set_aside is not None:
        kept = np.delete(logs[:, warmup:], set_aside, axis=0)
        t_boot, t_run = variance_components(kept)
        off_median = math.expm1(float(boot_means[set_aside] - np.median(np.delete(boot_means, set_aside))))
    sigma_boot, sigma_run = math.sqrt(t_boot), math.sqrt(t_run)
    lag1 = _correlation(boot_means[:-1], boot_means[1:]) if n >= 4 else None
    paired = lag1 is not None and lag1[0] >= PAIRED_CORRELATION and lag1[1] / 2.0 <= PAIRED_P
    analysis = Analysis.PAIRED if paired else Analysis.UNPAIRED
    k = 2
    if cost_ratio is not None and cost_ratio > 0 and t_boot > 0:
        k = max(2, min(10, math.ceil(math.sqrt(cost_ratio * t_run / t_boot))))
    correlations = [CovariateCorrelation(name="boot_order", r=c[0], p_value=c[1], n=n)
                    for c in [_correlation(np.arange(n, dtype=np.float64), boot_means)] if c is not None]
    for name, series in (covariates or {}).items():
        found = _correlation(np.asarray(series, dtype=np.float64), boot_means)
        if found is not None:
            correlations.append(CovariateCorrelation(name=name, r=found[0], p_value=found[1], n=n))
    needed: list[tuple[float, int | None]] = []
    for mde in mdes:
        try:
            needed.append((mde, boots_per_arm_for(mde, sigma_boot=sigma_boot, sigma_run=sigma_run,
                                                  measured_passes=k, alpha=alpha, power=power, max_boots=10_000)))
        except InsufficientData:
            needed.append((mde, None))
    return NoiseReport(
        boots=n, passes_per_boot=m, warmup_detected=detected, warmup_passes=warmup,
        first_pass_ratio=float(ratios[0]), pass_ratios=tuple(float(r) for r in ratios),
        sigma_boot=sigma_boot, sigma_run=sigma_run, boot_level_resolved=t_boot > 0,
        lag1_correlation=None if lag1 is None else lag1[0], covariates=tuple(correlations), measured_passes=k,
        analysis=analysis, boots_per_arm=tuple(needed), cap_boots_per_arm=cap_boots_per_arm,
        mde_at_cap=mde_for(cap_boots_per_arm, sigma_boot=sigma_boot, sigma_run=sigma_run, measured_passes=k,
                           alpha=alpha, power=power),
        cost_ratio=cost_ratio, kv_pool_deterministic=kv_pool_deterministic, context=dict(context or {}),
        alpha=alpha, power=power, set_aside_boot=set_aside, set_aside_off_median=off_median,
        sigma_boot_all=math.sqrt(t_boot_all))


def outlier_boot(boot_means: FloatArray, *, min_boots: int = OUTLIER_MIN_BOOTS) -> int | None:
    """The one boot (index) whose mean log throughput stands apart from the others, or None.

    With at least ``min_boots`` boots, the boot farthest from the median is an outlier when it lies more than
    ``OUTLIER_Z`` from the median in units of 1.4826 × the median absolute deviation of all boot means, and more
    than ``OUTLIER_PREDICTION_Z`` from the other boots' mean in units of their standard deviation widened for one
    new boot (a prediction interval). Both must hold: the MAD of few boots can be tiny when two agree by chance, and
    the others' spread alone ignores how far the rest lie from each other. At most one boot is ever set aside.
    """
    means = np.asarray(boot_means, dtype=np.float64)
    n = means.size
    if n < max(4, min_boots):
        return None
    median = float(np.median(means))
    far = int(np.argmax(np.abs(means - median)))
    mad = 1.4826 * float(np.median(np.abs(means - median)))
    others = np.delete(means, far)
    spread = float(np.std(others, ddof=1)) * math.sqrt(1.0 + 1.0 / others.size)
    distance = abs(float(means[far]) - float(others.mean()))
    if mad <= 0 or spread <= 0:
        return None
    if abs(float(means[far]) - median) / mad > OUTLIER_Z and distance / spread > OUTLIER_PREDICTION_Z:
        return far
    return None


def _warmup(logs: FloatArray) -> tuple[int, FloatArray]:
    """(warm-up passes detected, mean ratio of each pass index to the boot's steady state)."""
    n, m = logs.shape
    steady_from = m // 2
    offsets = logs - logs[:, steady_from:].mean(axis=1, keepdims=True)
    mean = offsets.mean(axis=0)
    se = offsets.std(axis=0, ddof=1) / math.sqrt(n)
    off_steady = np.abs(mean) > np.maximum(3.0 * se, _WARMUP_FLOOR)
    detected = 0
    for j in range(steady_from):
        if off_steady[j:steady_from].any():
            detected = j + 1
    return detected, np.exp(mean)


def _correlation(x: FloatArray, y: FloatArray) -> tuple[float, float] | None:
    """Pearson (r, two-sided p), or None when either side is constant or too short to say anything."""
    if x.size < 3 or x.size != y.size or np.std(x) == 0 or np.std(y) == 0:
        return None
    result = stats.pearsonr(x, y)
    return float(result.statistic), float(result.pvalue)
