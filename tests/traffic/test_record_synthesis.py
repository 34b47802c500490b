"""Synthesis from aggregates, without Prometheus: histogram sampling and prefix sharing to a hit rate."""

from __future__ import annotations

import numpy as np
import pytest

from elsa_tune.traffic.summary import prefix_reuse
from elsa_tune.traffic.synthesis import Histogram, sample_histogram, shared_prefix_blocks
from elsa_tune.traffic.trace import SCHEMA_VERSION, Trace, TraceMetadata

BOUNDS = (100.0, 300.0, 500.0, 1000.0, 2000.0, 5000.0, float("inf"))


@pytest.mark.parametrize("sigma", [0.3, 0.9, 1.5])
def test_histogram_samples_keep_every_bucket_share_and_the_mean(sigma: float) -> None:
    rng = np.random.default_rng(5)
    truth = np.maximum(1, rng.lognormal(np.log(700), sigma, 200_000)).astype(np.int64)
    buckets = np.searchsorted(np.asarray(BOUNDS), truth, side="left")
    cumulative = np.cumsum(np.bincount(buckets, minlength=len(BOUNDS))).astype(float)
    hist = Histogram(bounds=BOUNDS, cumulative=tuple(cumulative), total=float(truth.sum()))
    drawn = sample_histogram(hist, 100_000, np.random.default_rng(6))
    shares = np.bincount(np.searchsorted(np.asarray(BOUNDS), drawn, side="left"), minlength=len(BOUNDS)) / 1e5
    assert np.abs(shares - hist.shares()).max() < 0.006
    assert drawn.mean() == pytest.approx(truth.mean(), rel=0.02)
    assert drawn.min() >= 1


def test_histogram_without_a_sum_samples_uniformly_inside_buckets() -> None:
    hist = Histogram(bounds=(10.0, 20.0, float("inf")), cumulative=(0.0, 100.0, 100.0))
    drawn = sample_histogram(hist, 10_000, np.random.default_rng(1))
    assert drawn.min() >= 11 and drawn.max() <= 20
    assert drawn.mean() == pytest.approx(15.5, abs=0.2)


@pytest.mark.parametrize("target", [0.0, 0.3, 0.6, 0.87, 0.95])
def test_prefix_sharing_reaches_the_hit_rate(target: float) -> None:
    rng = np.random.default_rng(2)
    inputs = np.maximum(1, rng.lognormal(np.log(3000), 0.9, 20_000)).astype(np.int64)
    hashes = shared_prefix_blocks(inputs, 512, target, rng)
    meta = TraceMetadata(schema_version=SCHEMA_VERSION, source="t", block_size=512, start=None, end=None,
                         synthesized=True)
    trace = Trace.from_columns(meta, arrival_s=np.arange(len(inputs), dtype=float), input_tokens=inputs,
                               output_tokens=1, block_hashes=hashes)
    assert prefix_reuse(trace) == pytest.approx(target, abs=0.005)
