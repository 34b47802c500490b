"""Noise dimensioning on the baseline: how noisy is this stack, and what must the gate do about it.

Run once per model × GPU × build: the incumbent is booted n times and runs m
passes of the identical workload per boot. From that matrix this module estimates

- the warm-up length: per pass index, the mean log offset from the boot's steady state (the later
  half of its passes); the warm-up ends at the changepoint after which no pass index differs from
  steady state by more than max(3 SE, 1%); at least one pass is always discarded;
- the Kalibera–Jones variance components on the log scale: σ_run² = T_1² (within boot) and
  σ_boot² = T_2² = S_2² − S_1²/m (between boots);
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
from elsa_tune.tuner.boot_sample import BootSample
from elsa_tune.tuner.comparison import (
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
    analysis: str
    boots_per_arm: tuple[tuple[float, int | None], ...]
    cap_boots_per_arm: int
    mde_at_cap: float
    cost_ratio: float | None
    kv_pool_deterministic: bool | None
    context: Mapping[str, str] = field(default_factory=dict)
    alpha: float = 0.05
    power: float = 0.8
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["context"] = dict(self.context)
        data["covariates"] = [asdict(c) for c in self.covariates]
        data["boots_per_arm"] = [list(pair) for pair in self.boots_per_arm]
        return data

    def record(self) -> NoiseRecord:
        """What the study record keeps of this report (relative σ's, the warm-up bias, the MDE at the cap)."""
        return NoiseRecord(sigma_boot=self.sigma_boot, sigma_run=self.sigma_run,
                           warmup_bias=self.first_pass_ratio - 1.0, boots=self.boots,
                           passes_per_boot=float(self.passes_per_boot), mde=self.mde_at_cap)

    def summary_lines(self) -> list[str]:
        """A short Markdown block for the report."""
        lines = [
            f"- baseline: {self.boots} boots × {self.passes_per_boot} passes"
            + (f" ({', '.join(f'{k}={v}' for k, v in self.context.items())})" if self.context else ""),
            f"- warm-up: first pass at {self.first_pass_ratio - 1:+.1%} of steady state; "
            f"{self.warmup_detected} pass(es) detected, {self.warmup_passes} discarded per boot",
            f"- boot-to-boot σ {self.sigma_boot:.1%}, run-to-run σ {self.sigma_run:.1%}"
            + ("" if self.boot_level_resolved else " (boot level not resolvable above run noise)"),
            "- consecutive boots correlate at ρ = "
            + (f"{self.lag1_correlation:.2f}" if self.lag1_correlation is not None else "n/a")
            + f" → {self.analysis} analysis, k = {self.measured_passes} measured passes per boot",
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
    names = set.intersection(*(set(s.covariates.as_mapping()) for s in samples)) if samples else set()
    covariates = {name: [s.covariates.as_mapping()[name] for s in samples] for name in sorted(names)}
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
    t_boot, t_run = variance_components(logs[:, warmup:])
    sigma_boot, sigma_run = math.sqrt(t_boot), math.sqrt(t_run)
    boot_means = logs[:, warmup:].mean(axis=1)
    lag1 = _correlation(boot_means[:-1], boot_means[1:]) if n >= 4 else None
    paired = lag1 is not None and lag1[0] >= PAIRED_CORRELATION and lag1[1] / 2.0 <= PAIRED_P
    analysis = "paired" if paired else "unpaired"
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
        alpha=alpha, power=power)


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
