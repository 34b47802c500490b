"""Request-level knobs compared inside one boot by paired interleaving.

Some settings need no reboot: sampling parameters the client sends, per-request flags. For those the
boot-to-boot drift (~10%) cancels exactly, because both arms run on the same server: alternate
batches of identical requests under A and B in ABBA·BAAB pairs (the same seeded order as boots, so
drift within the boot cancels too), discard the warm-up pairs, and test the paired differences of
per-batch log throughput (or per-request decode rate). Only the run noise (~3%) remains, so tens of
batches on one boot resolve effects that would need dozens of boots per arm.

Two tests, both one-sided on d = log B − log A per pair: a paired t, and an exact sign-flip
(randomisation) test that assumes only that d is symmetric under no effect (exact enumeration up to
16 pairs, seeded Monte Carlo above). The decision is fixed-n: KEEP when p ≤ α and the gain clears the
noise floor; REJECT when the upper bound is below the minimum worthwhile effect; else INCONCLUSIVE
with the MDE.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

import numpy as np
from scipy import stats

from elsa_tune.history.verdict import Decision, Verdict
from elsa_tune.tuner.schedule import Arm, Schedule, abba_baab
from elsa_tune.tuner.statistics import Comparison, InsufficientData, compare

SCHEMA_VERSION = 1
TESTS = ("sign_flip", "t")
_EXACT_MAX_PAIRS = 16


class BatchSampler(Protocol):
    """Runs one batch of the identical request set under ``arm`` on the running server.

    Returns the batch's output throughput in tok/s (or a per-request decode rate); ``pair`` and
    ``position`` come from the recorded order. Raise ``MeasurementFailed`` for a batch with failures.
    """

    def run_batch(self, arm: Arm, pair: int, position: int) -> float: ...


@dataclass(frozen=True)
class PairedPolicy:
    """Fixed-n paired comparison settings."""

    pairs: int = 24
    warmup_pairs: int = 1
    alpha: float = 0.05
    noise_floor: float = 0.01
    min_effect: float = 0.03
    test: str = "sign_flip"
    permutations: int = 20_000
    power: float = 0.8

    def __post_init__(self) -> None:
        if self.test not in TESTS:
            raise ValueError(f"test must be one of {TESTS}, got {self.test!r}")
        if self.pairs - self.warmup_pairs < 3:
            raise ValueError("a paired comparison needs at least 3 measured pairs")


@dataclass(frozen=True)
class PairedComparison:
    """Paired differences of log values: the paired t and the sign-flip p (both one-sided, B > A)."""

    comparison: Comparison
    p_sign_flip: float
    pairs: int
    exact: bool


@dataclass(frozen=True)
class PairedResult:
    """The verdict, the per-batch values in run order, and the recorded order."""

    verdict: Verdict
    values_a: tuple[float, ...]
    values_b: tuple[float, ...]
    schedule: Schedule
    policy: PairedPolicy
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "verdict": self.verdict.to_dict(),
                "values_a": list(self.values_a), "values_b": list(self.values_b),
                "schedule": self.schedule.to_dict(), "policy": asdict(self.policy)}


def sign_flip_p(d: Sequence[float], *, permutations: int = 20_000, seed: int = 0) -> tuple[float, bool]:
    """One-sided p of mean(d) > 0 under random sign flips: (p, exact). Exact up to 16 values."""
    x = np.asarray(d, dtype=np.float64)
    n = x.size
    if n < 3 or not np.all(np.isfinite(x)):
        raise InsufficientData(f"a sign-flip test needs ≥ 3 finite differences, got {n}")
    if not np.any(x != 0):
        raise InsufficientData("every difference is zero: there is nothing to test")
    observed = x.mean()
    tol = 1e-12 * max(1.0, float(np.abs(x).max()))
    if n <= _EXACT_MAX_PAIRS:
        signs = np.asarray(list(itertools.product((1.0, -1.0), repeat=n)))
        means = signs @ x / n
        return float(np.mean(means >= observed - tol)), True
    rng = np.random.default_rng(seed)
    signs = rng.choice((-1.0, 1.0), size=(permutations, n))
    means = signs @ x / n
    return float((np.sum(means >= observed - tol) + 1) / (permutations + 1)), False


def compare_paired(values_a: Sequence[float], values_b: Sequence[float], *, permutations: int = 20_000,
                   seed: int = 0) -> PairedComparison:
    """Paired comparison of positive per-batch values (e.g. tok/s), pair j of A with pair j of B."""
    a, b = np.asarray(values_a, dtype=np.float64), np.asarray(values_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise InsufficientData(f"paired values need equal lengths, got {a.shape} and {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and np.all(a > 0) and np.all(b > 0)):
        raise InsufficientData("a batch value is non-positive or non-finite")
    la, lb = np.log(a), np.log(b)
    comparison = compare(la.tolist(), lb.tolist(), analysis="paired")
    p_flip, exact = sign_flip_p((lb - la).tolist(), permutations=permutations, seed=seed)
    return PairedComparison(comparison=comparison, p_sign_flip=p_flip, pairs=int(a.size), exact=exact)


def paired_verdict(values_a: Sequence[float], values_b: Sequence[float], policy: PairedPolicy, *,
                   seed: int = 0) -> Verdict:
    """The fixed-n decision on measured pairs (warm-up pairs already removed)."""
    n = min(len(values_a), len(values_b))
    try:
        pc = compare_paired(values_a, values_b, permutations=policy.permutations, seed=seed)
    except InsufficientData as exc:
        return Verdict(decision=Decision.INCONCLUSIVE, reason=f"no valid paired test: {exc}; the incumbent stays",
                       effect=None, ci_low=None, ci_high=None, p_value=None, boots_incumbent=1, boots_candidate=1,
                       kind="request", extra={"pairs": n, "final": True})
    c = pc.comparison
    p = pc.p_sign_flip if policy.test == "sign_flip" else c.p_one_sided
    low, high = c.ratio_bounds(policy.alpha)
    gain = c.ratio - 1
    mde = c.mde(policy.alpha, policy.power)
    extra = {"pairs": pc.pairs, "test": policy.test, "p_t": c.p_one_sided, "p_sign_flip": pc.p_sign_flip,
             "exact": pc.exact, "delta_log": c.delta, "se": c.se, "df": c.df, "final": True,
             "ci_level": 1 - 2 * policy.alpha}
    if p <= policy.alpha and gain >= policy.noise_floor:
        decision, reason, mde_out = Decision.KEEP, f"{gain:+.1%} per batch, paired (p = {p:.4f})", None
    elif high - 1 < policy.min_effect:
        decision, mde_out = Decision.REJECT, mde
        reason = f"futile: upper bound {high - 1:+.1%} is below the minimum worthwhile {policy.min_effect:+.0%}"
    else:
        decision, mde_out = Decision.INCONCLUSIVE, mde
        reason = (f"inconclusive after {pc.pairs} pairs: {gain:+.1%} (CI {low - 1:+.1%} to {high - 1:+.1%}); "
                  f"effects below {f'{mde:.1%}' if mde is not None else 'any size'} could not be detected; "
                  "the incumbent stays")
    return Verdict(decision=decision, reason=reason, effect=c.ratio, ci_low=low, ci_high=high, p_value=p,
                   boots_incumbent=1, boots_candidate=1, mde=mde_out, kind="request", extra=extra)


def run_paired(sampler: BatchSampler, policy: PairedPolicy, seed: int) -> PairedResult:
    """Run ``policy.pairs`` pairs of batches in seeded ABBA·BAAB order on one boot and decide."""
    schedule = abba_baab(policy.pairs, seed)
    a: dict[int, float] = {}
    b: dict[int, float] = {}
    for slot in schedule:
        value = float(sampler.run_batch(slot.arm, slot.block, slot.position))
        (a if slot.arm is Arm.INCUMBENT else b)[slot.block] = value
    measured = range(policy.warmup_pairs, policy.pairs)
    values_a = tuple(a[j] for j in measured)
    values_b = tuple(b[j] for j in measured)
    verdict = paired_verdict(values_a, values_b, policy, seed=seed)
    verdict = replace(verdict, extra={**verdict.extra, "order": schedule.letters(), "schedule_seed": seed})
    return PairedResult(verdict=verdict, values_a=values_a, values_b=values_b, schedule=schedule, policy=policy)


def pairs_for(mde: float, *, sigma_run: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Measured pairs a paired comparison needs for ``mde`` when batches vary by ``sigma_run`` (log)."""
    if mde <= 0 or sigma_run <= 0:
        raise ValueError("mde and sigma_run must be positive")
    for n in range(3, 100_000):
        se = sigma_run * math.sqrt(2.0 / n)
        if math.expm1((float(stats.t.ppf(1 - alpha, n - 1)) + float(stats.t.ppf(power, n - 1))) * se) <= mde:
            return n
    raise InsufficientData(f"an MDE of {mde:.2%} needs more than 100000 pairs")
