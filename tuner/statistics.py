"""Tests on per-boot means of log throughput: t statistics, confidence bounds, MDE, non-inferiority.

The boot is the unit of replication: the inputs here are one number per boot (a log of a mean
throughput, a log TTFT), never pooled iterations. The comparison is a Student t with pooled variance,
switched to Welch when one arm's variance exceeds the other's by more than ``welch_ratio`` (a candidate
that adds instability), or a paired t on block differences when consecutive boots are correlated. The
same vectorised rule serves the gate and the Monte Carlo that calibrates its boundaries, so the
simulated statistic is exactly the one the gate computes.

Nothing here fails open: NaNs, fewer than two boots per arm or a zero standard error raise
``InsufficientData``, which the gate turns into INCONCLUSIVE, never into KEEP and never into a zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

FloatArray = npt.NDArray[np.float64]
ANALYSES = ("unpaired", "paired")
#: The gate's winsorization of boot values: robust σ's from the median, from this many boots per arm.
WINSOR_K = 2.5
WINSOR_MIN_BOOTS = 6
_TINY_SE = 1e-12


class InsufficientData(ValueError):
    """The data cannot support a test: too few boots, NaNs, or no variance at all."""


@dataclass(frozen=True)
class Comparison:
    """B − A on the log scale: ``delta`` (log ratio), its ``se``, ``df``, ``t`` against ``null_delta``.

    ``p_one_sided`` is the nominal (fixed-n) p for H1: delta > null_delta. ``test`` is ``"student"``,
    ``"welch"`` or ``"paired"``. ``sd_a``/``sd_b`` are the per-boot standard deviations.
    """

    delta: float
    se: float
    df: float
    t: float
    p_one_sided: float
    test: str
    n_a: int
    n_b: int
    sd_a: float
    sd_b: float
    null_delta: float = 0.0

    @property
    def ratio(self) -> float:
        return math.exp(self.delta)

    def bounds(self, alpha: float) -> tuple[float, float]:
        """One-sided ``1 − alpha`` lower and upper bounds of the log ratio (together a 1 − 2α interval)."""
        q = float(stats.t.ppf(1.0 - alpha, self.df))
        return self.delta - q * self.se, self.delta + q * self.se

    def ratio_bounds(self, alpha: float) -> tuple[float, float]:
        low, high = self.bounds(alpha)
        return math.exp(low), math.exp(high)

    def mde(self, alpha: float, power: float = 0.8) -> float:
        """The smallest ratio − 1 this comparison's SE could detect at ``alpha`` with ``power``."""
        return mde_from_se(self.se, self.df, alpha=alpha, power=power)


def winsorize(y: FloatArray, k: float | None) -> FloatArray:
    """Each row's values clipped to its median ± ``k`` robust σ (1.4826 · MAD); rows of fewer than 6 untouched.

    A boot that the host slowed for reasons of its own (a neighbour, a throttle) sits far from its arm's other
    boots; clipped, it still counts as a slow boot but no longer decides the mean or inflates the variance.
    ``None`` switches it off.
    """
    if k is None or y.shape[-1] < WINSOR_MIN_BOOTS:
        return y
    med = np.median(y, axis=-1, keepdims=True)
    scale = 1.4826 * np.median(np.abs(y - med), axis=-1, keepdims=True)
    clipped: FloatArray = np.clip(y, med - k * scale, med + k * scale)
    return clipped


def winsorize_pair(ya: FloatArray, yb: FloatArray, k: float | None) -> tuple[FloatArray, FloatArray]:
    """Both arms clipped to their own medians ± ``k`` robust σ, the σ from both arms' residuals pooled.

    Pooling the residuals (each boot minus its arm's median) gives the scale twice the boots of one arm, so a
    single slow boot among four cannot hide in its own arm's spread.
    """
    if k is None or min(ya.shape[-1], yb.shape[-1]) < WINSOR_MIN_BOOTS:
        return ya, yb
    ma = np.median(ya, axis=-1, keepdims=True)
    mb = np.median(yb, axis=-1, keepdims=True)
    residuals = np.concatenate([ya - ma, yb - mb], axis=-1)
    scale = 1.4826 * np.median(np.abs(residuals), axis=-1, keepdims=True)
    clipped_a: FloatArray = np.clip(ya, ma - k * scale, ma + k * scale)
    clipped_b: FloatArray = np.clip(yb, mb - k * scale, mb + k * scale)
    return clipped_a, clipped_b


def t_statistics(ya: FloatArray, yb: FloatArray, *, analysis: str = "unpaired", welch_ratio: float = 2.0,
                 null_delta: float = 0.0, winsor: float | None = None
                 ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
    """Vectorised over rows: ``ya`` (R, n_a) and ``yb`` (R, n_b) boot values → delta, se, df, t, is_welch.

    ``analysis="paired"`` needs ``n_a == n_b`` and pairs column j of both (block j). Each arm (or the paired
    differences) is winsorized first (``winsorize``, ``winsor`` robust σ); the boundaries are calibrated on the
    same statistic.
    """
    if analysis not in ANALYSES:
        raise ValueError(f"analysis must be one of {ANALYSES}, got {analysis!r}")
    n_a, n_b = ya.shape[-1], yb.shape[-1]
    if n_a < 2 or n_b < 2:
        raise InsufficientData(f"a t test needs at least 2 boots per arm, got {n_a} and {n_b}")
    if analysis == "paired":
        if n_a != n_b:
            raise InsufficientData(f"a paired test needs whole blocks, got {n_a} and {n_b} boots")
        d = winsorize(yb - ya, winsor)
        delta = d.mean(axis=-1)
        se = d.std(axis=-1, ddof=1) / math.sqrt(n_a)
        df = np.full_like(delta, n_a - 1.0)
        welch = np.zeros_like(delta)
    else:
        ya, yb = winsorize_pair(ya, yb, winsor)
        delta = yb.mean(axis=-1) - ya.mean(axis=-1)
        va, vb = ya.var(axis=-1, ddof=1), yb.var(axis=-1, ddof=1)
        pooled = ((n_a - 1) * va + (n_b - 1) * vb) / (n_a + n_b - 2)
        se_student = np.sqrt(pooled * (1.0 / n_a + 1.0 / n_b))
        wa, wb = va / n_a, vb / n_b
        se_welch = np.sqrt(wa + wb)
        with np.errstate(divide="ignore", invalid="ignore"):
            df_welch = (wa + wb) ** 2 / (wa**2 / (n_a - 1) + wb**2 / (n_b - 1))
            ratio = np.maximum(va, vb) / np.minimum(va, vb)
        use_welch = ratio > welch_ratio
        se = np.where(use_welch, se_welch, se_student)
        df = np.where(use_welch, np.nan_to_num(df_welch, nan=1.0), float(n_a + n_b - 2))
        welch = use_welch.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (delta - null_delta) / se
    return delta, se, df, t, welch


def compare(a: Sequence[float], b: Sequence[float], *, analysis: str = "unpaired", welch_ratio: float = 2.0,
            null_delta: float = 0.0, winsor: float | None = None) -> Comparison:
    """The gate's test on boot values ``a`` (incumbent) and ``b`` (candidate), on the log scale."""
    ya, yb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if ya.ndim != 1 or yb.ndim != 1:
        raise InsufficientData("boot values must be one-dimensional")
    if not (np.all(np.isfinite(ya)) and np.all(np.isfinite(yb))):
        raise InsufficientData("a boot value is NaN or infinite")
    delta, se, df, t, welch = t_statistics(ya[None, :], yb[None, :], analysis=analysis, welch_ratio=welch_ratio,
                                           null_delta=null_delta, winsor=winsor)
    se0, df0, t0 = float(se[0]), float(df[0]), float(t[0])
    if not math.isfinite(se0) or se0 <= _TINY_SE or not math.isfinite(t0):
        raise InsufficientData("the boot values have no spread (zero standard error): a test cannot be trusted")
    test = "paired" if analysis == "paired" else ("welch" if welch[0] else "student")
    return Comparison(delta=float(delta[0]), se=se0, df=df0, t=t0, p_one_sided=float(stats.t.sf(t0, df0)),
                      test=test, n_a=len(ya), n_b=len(yb), sd_a=float(np.std(ya, ddof=1)),
                      sd_b=float(np.std(yb, ddof=1)), null_delta=null_delta)


def mde_from_se(se: float, df: float, *, alpha: float, power: float = 0.8) -> float:
    """MDE as a ratio − 1: exp[(t_{1−α,df} + t_{power,df}) · SE] − 1."""
    if not (se > 0 and df > 0 and 0 < alpha < 1 and 0 < power < 1):
        raise InsufficientData(f"no MDE for se={se}, df={df}, alpha={alpha}, power={power}")
    return math.expm1((float(stats.t.ppf(1 - alpha, df)) + float(stats.t.ppf(power, df))) * se)


def boot_sd(sigma_boot: float, sigma_run: float, measured_passes: int) -> float:
    """SD of one boot's mean log throughput: √(σ_boot² + σ_run²/k)."""
    return math.sqrt(sigma_boot**2 + sigma_run**2 / measured_passes)


def mde_for(n_per_arm: int, *, sigma_boot: float, sigma_run: float, measured_passes: int, alpha: float = 0.05,
            power: float = 0.8) -> float:
    """Planned MDE of a fixed-n Student t with ``n_per_arm`` boots per arm."""
    if n_per_arm < 2:
        raise InsufficientData("an MDE needs at least 2 boots per arm")
    se = boot_sd(sigma_boot, sigma_run, measured_passes) * math.sqrt(2.0 / n_per_arm)
    return mde_from_se(se, 2 * n_per_arm - 2, alpha=alpha, power=power)


def boots_per_arm_for(mde: float, *, sigma_boot: float, sigma_run: float, measured_passes: int,
                      alpha: float = 0.05, power: float = 0.8, max_boots: int = 100_000) -> int:
    """The fewest boots per arm whose planned MDE is ≤ ``mde`` (e.g. 15 for 10% at σ_boot 10%)."""
    if mde <= 0:
        raise ValueError("mde must be positive")
    lo, hi = 2, 2
    while mde_for(hi, sigma_boot=sigma_boot, sigma_run=sigma_run, measured_passes=measured_passes, alpha=alpha,
                  power=power) > mde:
        lo, hi = hi, hi * 2
        if hi > max_boots:
            raise InsufficientData(f"an MDE of {mde:.2%} needs more than {max_boots} boots per arm")
    while lo < hi:
        mid = (lo + hi) // 2
        if mde_for(mid, sigma_boot=sigma_boot, sigma_run=sigma_run, measured_passes=measured_passes, alpha=alpha,
                   power=power) > mde:
            lo = mid + 1
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class NonInferiority:
    """A guardrail test on a log metric where higher is worse (TTFT): upper bound of B/A vs ``margin``.

    ``passed`` when the one-sided ``1 − alpha`` upper bound of the ratio is ≤ ``margin``;
    ``confidently_worse`` when even the lower bound exceeds it (a REJECT, not just a blocked KEEP).
    """

    ratio: float
    ci_low: float
    ci_high: float
    margin: float
    passed: bool
    confidently_worse: bool


def non_inferiority(a: Sequence[float], b: Sequence[float], *, margin: float, alpha: float = 0.05,
                    welch_ratio: float = 2.0) -> NonInferiority:
    """Is B no worse than A by more than ``margin`` (a ratio, e.g. 1.10) on a lower-is-better log metric?"""
    c = compare(a, b, welch_ratio=welch_ratio)
    low, high = c.ratio_bounds(alpha)
    return NonInferiority(ratio=c.ratio, ci_low=low, ci_high=high, margin=margin, passed=high <= margin,
                          confidently_worse=low > margin)


def variance_components(values: FloatArray) -> tuple[float, float]:
    """Kalibera–Jones unbiased level variances of an (n boots × m passes) log array: (T_boot², T_run²).

    S_1² is the mean within-boot variance; S_2² the variance of boot means; T_1² = S_1² and
    T_2² = S_2² − S_1²/m (clamped at 0: a negative estimate means the boot level is not resolvable).
    """
    if values.ndim != 2 or values.shape[0] < 2 or values.shape[1] < 2:
        raise InsufficientData(f"variance components need ≥ 2 boots × ≥ 2 passes, got shape {values.shape}")
    if not np.all(np.isfinite(values)):
        raise InsufficientData("a pass value is NaN or infinite")
    m = values.shape[1]
    s1 = float(values.var(axis=1, ddof=1).mean())
    s2 = float(values.mean(axis=1).var(ddof=1))
    return max(s2 - s1 / m, 0.0), s1
