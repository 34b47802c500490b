"""Synthesis of requests from aggregate distributions: lengths from a histogram, prefixes from a hit rate.

``recording`` reads the aggregates from Prometheus; this module turns them into per-request values
that reproduce them: ``sample_histogram`` keeps every bucket's share and the mean, and
``shared_prefix_blocks`` builds prefix sharing whose infinite-cache reuse equals a target hit rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_FAMILY_SPAN = 1 << 24  # block ids reserved per prefix family (more than any prompt has blocks)
_UNIQUE_BASE = 1 << 52


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts over the window (``bounds`` ascending, the last is +Inf), and the sum."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    total: float | None = None

    @property
    def count(self) -> float:
        return self.cumulative[-1] if self.cumulative else 0.0

    def shares(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        counts = np.diff(np.concatenate([[0.0], np.asarray(self.cumulative)]))
        counts = np.clip(counts, 0.0, None)
        return np.asarray(counts / counts.sum(), dtype=np.float64)


def mean_exponent(hist: Histogram) -> float:
    """The ``a`` of ``lo + (hi - lo) * u**a`` whose expected mean is the histogram's ``_sum / _count``.

    1 (uniform inside buckets) when the sum is unknown. Lengths inside a bucket are rarely uniform,
    and the mean is what sets the token volume.
    """
    if hist.total is None or hist.count <= 0:
        return 1.0
    lower, upper = _edges(hist)
    shares = hist.shares()
    # E[floor(lo + (hi - lo) u^a) + 1] ≈ lo + (hi - lo) / (a + 1) + 0.5, solved for a.
    room = hist.total / hist.count - 0.5 - float(shares @ lower)
    width = float(shares @ (upper - lower))
    return float(np.clip(width / room - 1.0, 0.05, 50.0)) if room > 0 else 50.0


def sample_histogram(hist: Histogram, n: int, rng: np.random.Generator,
                     exponent: float | None = None) -> np.ndarray[Any, np.dtype[np.int64]]:
    """``n`` integer lengths: a bucket by its share, then ``lo + (hi - lo) * u**a`` inside it.

    ``a`` is ``mean_exponent(hist)`` unless given (e.g. the whole window's, for an hour's histogram
    with too few requests to pin its own). The open top bucket spans up to four times its lower bound.
    """
    lower, upper = _edges(hist)
    power = mean_exponent(hist) if exponent is None else exponent
    buckets = rng.choice(len(lower), size=n, p=hist.shares())
    spread = rng.random(n) ** power
    values = np.floor(lower[buckets] + spread * (upper[buckets] - lower[buckets])) + 1
    return np.asarray(np.minimum(values, np.maximum(np.floor(upper[buckets]), 1)), dtype=np.int64)


def _edges(hist: Histogram) -> tuple[np.ndarray[Any, np.dtype[np.float64]], np.ndarray[Any, np.dtype[np.float64]]]:
    lower = np.concatenate([[0.0], np.asarray(hist.bounds[:-1], dtype=np.float64)])
    upper = np.asarray(hist.bounds, dtype=np.float64).copy()
    upper[-1] = 4.0 * lower[-1] if lower[-1] > 0 else 1.0
    return lower, upper


def shared_prefix_blocks(inputs: np.ndarray[Any, np.dtype[np.int64]], block_size: int, target: float,
                         rng: np.random.Generator, *, per_family: int = 50) -> list[list[int]]:
    """Block ids whose infinite-cache reuse is ``target`` of prompt tokens (as close as the lengths allow).

    Request ``i`` joins one of ``len / per_family`` prefix families and takes the first ``s_i`` ids of
    the family's chain, then ids of its own. It reuses ``min(s_i, max s_j)`` blocks over the earlier
    requests ``j`` of its family; the share ``r`` in ``s_i ≈ r * blocks_i`` is calibrated on that.
    Each family's first request computes its prefix cold, so a high rate needs fewer, larger families:
    when ``r = 1`` is not enough, families grow fourfold until the rate is met or there is one family.
    (Aggregates say nothing about how many distinct prefixes there were; 50 requests a family is a guess.)
    """
    n = len(inputs)
    blocks = -(-inputs // block_size)
    jitter = rng.random(n)
    draw = rng.random(n)
    shared = np.zeros(n, dtype=np.int64)
    families = np.zeros(n, dtype=np.int64)
    size = max(1, per_family)
    while target > 0:
        count = max(1, n // size)
        families = np.minimum((draw * count).astype(np.int64), count - 1)
        share = target
        achieved = 0.0
        for _ in range(30):
            shared = np.minimum(np.floor(share * blocks + jitter).astype(np.int64), blocks)
            achieved = _family_reuse(shared, families, inputs, block_size)
            if abs(achieved - target) < 0.001 or (share >= 1.0 and achieved < target):
                break
            share = min(1.0, share * target / max(achieved, 1e-9))
        if achieved >= target - 0.001 or count == 1:
            break
        size *= 4
    out: list[list[int]] = []
    unique = _UNIQUE_BASE
    for total, run, family in zip(blocks.tolist(), shared.tolist(), families.tolist(), strict=True):
        base = int(family) * _FAMILY_SPAN
        ids = list(range(base, base + run)) + list(range(unique, unique + total - run))
        unique += total - run
        out.append(ids)
    return out


def _family_reuse(shared: np.ndarray[Any, Any], families: np.ndarray[Any, Any], inputs: np.ndarray[Any, Any],
                  block_size: int) -> float:
    order = np.lexsort((np.arange(len(shared)), families))
    fam, run = families[order], shared[order]
    offset = fam.astype(np.int64) * (int(run.max(initial=0)) + 1)
    running = np.maximum.accumulate(run + offset) - offset
    before = np.concatenate([[0], running[:-1]])
    first = np.concatenate([[True], fam[1:] != fam[:-1]])
    before = np.where(first, 0, before)
    reused = np.minimum(np.minimum(run, before) * block_size, inputs[order])
    return float(reused.sum() / inputs.sum())
