"""Tests on per-boot means of log throughput: t statistics, confidence bounds, MDE, non-inferiority.

The boot is the unit of replication: the inputs here are one number per boot (a log of a mean
throughput, a log TTFT), never pooled iterations. The comparison is a Student t with pooled variance,
switched to Welch when one arm's variance exceeds the other's by more than ``welch_ratio`` (a candidate
that adds instability), or a paired t on block differences when consecutive boots are correlated. The gate
runs it robustly (``robust``): from 4 boots per arm each arm's mean is replaced by a Tukey-biweight location
that lets a boot its host slowed count less or not at all (``biweight``), and the boots count by their weights.
The same vectorised rule serves the gate and the Monte Carlo that calibrates its boundaries, so the
simulated statistic is exactly the one the gate computes.

Nothing here fails open: NaNs, fewer than two boots per arm or a zero standard error raise
``InsufficientData``, which the gate turns into INCONCLUSIVE, never into KEEP and never into a zero.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

FloatArray = npt.NDArray[np.float64]


class Analysis(enum.StrEnum):
    """How the arms' boots are compared: as two independent samples, or as pairs (block j of both arms)."""

    UNPAIRED = "unpaired"
    PAIRED = "paired"

#: The gate's winsorization of boot values: robust σ's from the median, from this many boots per arm.
WINSOR_K = 2.5
WINSOR_MIN_BOOTS = 6
#: The gate's robust comparison: Tukey's biweight with this tuning constant (in pooled robust σ's), from this many
#: boots per arm; a boot whose weight falls below ``COUNTED_WEIGHT`` is reported as down-weighted.
BIWEIGHT_C = 4.685
ROBUST_MIN_BOOTS = 4
COUNTED_WEIGHT = 0.5
_SCALE_CUT = 3.0
#: 1 / √(1 − 2cφ(c)/(2Φ(c) − 1)) at c = 3: the SD of a normal sample cut at ±3σ is this much too small
_SCALE_CORRECTION = 1.0 / math.sqrt(1.0 - 2.0 * _SCALE_CUT * float(stats.norm.pdf(_SCALE_CUT))
                                    / (2.0 * float(stats.norm.cdf(_SCALE_CUT)) - 1.0))
_MAD_SIGMA = 1.4826
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
    weights_a: tuple[float, ...] = ()
    weights_b: tuple[float, ...] = ()

    @property
    def outliers_a(self) -> tuple[int, ...]:
        return tuple(i for i, w in enumerate(self.weights_a) if w < COUNTED_WEIGHT)

    @property
    def outliers_b(self) -> tuple[int, ...]:
        return tuple(i for i, w in enumerate(self.weights_b) if w < COUNTED_WEIGHT)

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

    def mde(self, alpha: float, power: float = 0.8) -> float | None:
        """The smallest ratio − 1 this comparison's SE could detect at ``alpha`` with ``power``; ``None`` where no
        finite effect is detectable (a record holds no infinity)."""
        mde = mde_from_se(self.se, self.df, alpha=alpha, power=power)
        return mde if math.isfinite(mde) else None


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


@dataclass(frozen=True)
class RobustArms:
    """Each arm's biweight location, each boot's weight in it (1 = full, 0 = left out), each arm's variance.

    Rows are replicates: ``locations`` and ``variances`` have shape (R,), each of ``weights`` (R, n) like its arm.
    An arm's variance is its weighted residual variance about its location, Σw·r² / (Σw − 1).
    """

    locations: tuple[FloatArray, ...]
    weights: tuple[FloatArray, ...]
    variances: tuple[FloatArray, ...]


def robust_scale(arms: Sequence[FloatArray]) -> FloatArray:
    """One scale for every arm, shape (R, 1): the SD of the residuals from each arm's median within 3 MAD-σ's.

    The MAD (1.4826 · the median absolute residual, pooled over the arms so that it has every boot behind it and a
    slow boot cannot hide in its own arm's spread) only decides which residuals are far out; the scale is then the
    SD of the rest, corrected for the cut at 3 σ, which is nearly as efficient as a plain SD on few boots.
    """
    res = np.concatenate([a - np.median(a, axis=-1, keepdims=True) for a in arms], axis=-1)
    mad = _MAD_SIGMA * np.median(np.abs(res), axis=-1, keepdims=True)
    near = np.abs(res) < _SCALE_CUT * mad
    dof = near.sum(axis=-1, keepdims=True) - len(arms)
    with np.errstate(divide="ignore", invalid="ignore"):
        sd = np.sqrt(np.where(near, res**2, 0.0).sum(axis=-1, keepdims=True) / dof) * _SCALE_CORRECTION
    scale: FloatArray = np.where(dof > 0, sd, mad)
    return scale


def biweight(arms: Sequence[FloatArray], c: float, *, slow_only: bool) -> RobustArms:
    """Each arm's Tukey-biweight M-estimate of location on one pooled ``robust_scale``; ``c`` in scale units.

    A boot's weight falls from 1 at its arm's median to 0 at ``c`` scales from it, and the location is the weighted
    mean: one reweighting step from the median, which is deterministic, vectorised and cannot run away from the bulk
    of the boots. With ``slow_only`` only boots below the median are down-weighted: a host (a neighbour, a throttle)
    can slow a boot down but not speed it up, and a rule applied alike to both arms leaves their difference unbiased
    under symmetric noise; at least half of each arm then keeps its full weight. A row whose scale is zero gets NaN
    (no valid test).
    """
    scale = robust_scale(arms)
    width = np.where(scale > _TINY_SE, c * scale, np.nan)
    locations, weights, variances = [], [], []
    for a in arms:
        w = _tukey_weights((a - np.median(a, axis=-1, keepdims=True)) / width, slow_only)
        total = w.sum(axis=-1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            loc = (w * a).sum(axis=-1, keepdims=True) / total
            variances.append((w * (a - loc) ** 2).sum(axis=-1) / (total[..., 0] - 1.0))
        locations.append(loc[..., 0])
        weights.append(w)
    return RobustArms(locations=tuple(locations), weights=tuple(weights), variances=tuple(variances))


def _tukey_weights(u: FloatArray, slow_only: bool) -> FloatArray:
    w: FloatArray = np.where(np.abs(u) < 1.0, (1.0 - u**2) ** 2, 0.0)
    if slow_only:
        w = np.where(u >= 0.0, 1.0, w)
    return w


def t_statistics(ya: FloatArray, yb: FloatArray, *, analysis: Analysis = Analysis.UNPAIRED,
                 welch_ratio: float = 2.0, null_delta: float = 0.0, winsor: float | None = None,
                 robust: float | None = None) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
    """Vectorised over rows: ``ya`` (R, n_a) and ``yb`` (R, n_b) boot values → delta, se, df, t, is_welch.

    ``analysis="paired"`` needs ``n_a == n_b`` and pairs column j of both (block j). With ``robust`` (a biweight
    tuning constant c) and at least ``ROBUST_MIN_BOOTS`` boots per arm, each arm is summarised by its biweight
    location (``biweight``; slow boots down-weighted, or for a paired analysis the differences, both ways) and
    weighted variance, and the Student/Welch rule runs with each arm's total weight W in place of its boot count
    (a boot left out counts for nothing, in the SE and in the degrees of freedom). ``winsor`` clips each arm (or
    the paired differences) to its median ± that many robust σ first (``winsorize``). The boundaries are calibrated
    on the same statistic.
    """
    analysis = Analysis(analysis)
    n_a, n_b = ya.shape[-1], yb.shape[-1]
    if n_a < 2 or n_b < 2:
        raise InsufficientData(f"a t test needs at least 2 boots per arm, got {n_a} and {n_b}")
    use_robust = robust is not None and min(n_a, n_b) >= ROBUST_MIN_BOOTS
    if analysis == Analysis.PAIRED:
        if n_a != n_b:
            raise InsufficientData(f"a paired test needs whole blocks, got {n_a} and {n_b} boots")
        d = winsorize(yb - ya, winsor)
        if use_robust and robust is not None:
            fit = biweight([d], robust, slow_only=False)
            total = fit.weights[0].sum(axis=-1)
            with np.errstate(divide="ignore", invalid="ignore"):
                delta, se, df = fit.locations[0], np.sqrt(fit.variances[0] / total), total - 1.0
        else:
            delta = d.mean(axis=-1)
            se = d.std(axis=-1, ddof=1) / math.sqrt(n_a)
            df = np.full_like(delta, n_a - 1.0)
        welch = np.zeros_like(delta)
    else:
        ya, yb = winsorize_pair(ya, yb, winsor)
        if use_robust and robust is not None:
            fit = biweight([ya, yb], robust, slow_only=True)
            delta = fit.locations[1] - fit.locations[0]
            va, vb = fit.variances
            m_a, m_b = fit.weights[0].sum(axis=-1), fit.weights[1].sum(axis=-1)
        else:
            delta = yb.mean(axis=-1) - ya.mean(axis=-1)
            va, vb = ya.var(axis=-1, ddof=1), yb.var(axis=-1, ddof=1)
            m_a, m_b = np.full_like(delta, float(n_a)), np.full_like(delta, float(n_b))
        with np.errstate(divide="ignore", invalid="ignore"):   # a row with no spread: NaN, never a pass
            pooled = ((m_a - 1) * va + (m_b - 1) * vb) / (m_a + m_b - 2)
            se_student = np.sqrt(pooled * (1.0 / m_a + 1.0 / m_b))
            wa, wb = va / m_a, vb / m_b
            se_welch = np.sqrt(wa + wb)
            df_welch = (wa + wb) ** 2 / (wa**2 / (m_a - 1) + wb**2 / (m_b - 1))
            ratio = np.maximum(va, vb) / np.minimum(va, vb)
        use_welch = ratio > welch_ratio
        se = np.where(use_welch, se_welch, se_student)
        df = np.where(use_welch, np.nan_to_num(df_welch, nan=1.0), m_a + m_b - 2.0)
        welch = use_welch.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (delta - null_delta) / se
    return delta, se, df, t, welch


def compare(a: Sequence[float], b: Sequence[float], *, analysis: Analysis = Analysis.UNPAIRED,
            welch_ratio: float = 2.0, null_delta: float = 0.0, winsor: float | None = None,
            robust: float | None = None) -> Comparison:
    """The gate's test on boot values ``a`` (incumbent) and ``b`` (candidate), on the log scale.

    With ``robust``, ``Comparison.weights_a``/``weights_b`` hold each boot's biweight weight (empty when the plain
    test ran); ``outliers_a``/``outliers_b`` the positions of those below ``COUNTED_WEIGHT``.
    """
    ya, yb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if ya.ndim != 1 or yb.ndim != 1:
        raise InsufficientData("boot values must be one-dimensional")
    if not (np.all(np.isfinite(ya)) and np.all(np.isfinite(yb))):
        raise InsufficientData("a boot value is NaN or infinite")
    delta, se, df, t, welch = t_statistics(ya[None, :], yb[None, :], analysis=analysis, welch_ratio=welch_ratio,
                                           null_delta=null_delta, winsor=winsor, robust=robust)
    se0, df0, t0 = float(se[0]), float(df[0]), float(t[0])
    if not math.isfinite(se0) or se0 <= _TINY_SE or not math.isfinite(t0) or df0 < 1:
        raise InsufficientData("the boot values have no spread (zero standard error): a test cannot be trusted")
    weights_a: tuple[float, ...] = ()
    weights_b: tuple[float, ...] = ()
    if robust is not None and min(len(ya), len(yb)) >= ROBUST_MIN_BOOTS:
        if analysis == Analysis.PAIRED:
            (w,) = biweight([(yb - ya)[None, :]], robust, slow_only=False).weights
            weights_a = weights_b = tuple(float(x) for x in w[0])
        else:
            wa, wb = biweight([ya[None, :], yb[None, :]], robust, slow_only=True).weights
            weights_a, weights_b = tuple(float(x) for x in wa[0]), tuple(float(x) for x in wb[0])
    test = "paired" if analysis == Analysis.PAIRED else ("welch" if welch[0] else "student")
    return Comparison(delta=float(delta[0]), se=se0, df=df0, t=t0, p_one_sided=float(stats.t.sf(t0, df0)),
                      test=test, n_a=len(ya), n_b=len(yb), sd_a=float(np.std(ya, ddof=1)),
                      sd_b=float(np.std(yb, ddof=1)), null_delta=null_delta, weights_a=weights_a,
                      weights_b=weights_b)


def mde_from_se(se: float, df: float, *, alpha: float, power: float = 0.8) -> float:
    """MDE as a ratio − 1: exp[(t_{1−α,df} + t_{power,df}) · SE] − 1."""
    if not (se > 0 and df > 0 and 0 < alpha < 1 and 0 < power < 1):
        raise InsufficientData(f"no MDE for se={se}, df={df}, alpha={alpha}, power={power}")
    exponent = (float(stats.t.ppf(1 - alpha, df)) + float(stats.t.ppf(power, df))) * se
    # a few effective boots (outliers weighted down) on a heavy-tailed t: nothing finite is detectable
    return math.expm1(exponent) if math.isfinite(exponent) and exponent < 700.0 else math.inf


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
    p_value: float = 1.0          # one-sided p of "no better than the margin": ``passed`` is ``p_value ≤ alpha``


def non_inferiority(a: Sequence[float], b: Sequence[float], *, margin: float, alpha: float = 0.05,
                    welch_ratio: float = 2.0) -> NonInferiority:
    """Is B no worse than A by more than ``margin`` (a ratio, e.g. 1.10) on a lower-is-better log metric?"""
    c = compare(a, b, welch_ratio=welch_ratio)
    low, high = c.ratio_bounds(alpha)
    t = (math.log(margin) - c.delta) / c.se if c.se > 0 else (math.inf if c.delta < math.log(margin) else -math.inf)
    return NonInferiority(ratio=c.ratio, ci_low=low, ci_high=high, margin=margin, passed=high <= margin,
                          confidently_worse=low > margin, p_value=float(stats.t.sf(t, c.df)))


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
