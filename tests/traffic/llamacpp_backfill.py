"""Test helper: llama-server-shaped Prometheus series (``LLAMACPP.metrics``) as OpenMetrics, with their truth.

llama-server exports token counters and two gauges, no request counter: ``generate_llamacpp`` writes hours of
them as one server exports them (processed prompt tokens excluding the cached ones, generation tokens counted
when a request finishes, one scrape after it arrived; a restart that resets every counter; an hour of burst with
requests waiting; draft tokens and accepted ones) and a decoy server under another job. ``running_prometheus``
(``prometheus_backfill``) serves them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_backfill import Family, _cumulative, write_openmetrics

from elsa_tune.runtime.family import MetricNames
from elsa_tune.runtime.llamacpp.family import LLAMACPP

JOB = 'job="llama",instance="cpu0:8080"'
DECOY = 'job="other",instance="cpu1:8080"'
SLOTS = 4
HIT_RATE = 0.6
DRAFTED_PER_TOKEN = 0.8
ACCEPTED_PER_DRAFT = 0.65
TIME_IN_SERVER_S = 20.0


@dataclass(frozen=True)
class LlamaTruth:
    """What was backfilled: per-scrape increments of each counter (element 0 is 0), the gauges, the means."""

    start: float
    end: float
    scrape_s: float
    times: np.ndarray[Any, Any]
    arrivals: np.ndarray[Any, Any]
    generated: np.ndarray[Any, Any]  # generation tokens counted per scrape (at completion)
    processed: np.ndarray[Any, Any]  # prompt tokens processed, cached ones excluded
    cached: np.ndarray[Any, Any]
    drafted: np.ndarray[Any, Any]
    accepted: np.ndarray[Any, Any]
    running: np.ndarray[Any, Any]
    deferred: np.ndarray[Any, Any]
    prompt_mean: float
    output_mean: float
    burst: tuple[float, float]  # (first, last) scrape of the burst


def generate_llamacpp(path: Path, *, hours: float, end: float, scrape_s: float = 15.0, seed: int = 11,
                      names: MetricNames = LLAMACPP.metrics, cached_name: str | None = None) -> LlamaTruth:
    """Write ``hours`` of llama-server series ending at ``end`` (aligned to the scrape) to ``path``.

    ``names`` writes another family's series of the same shape (vLLM's, whose prompt counter counts the cached
    tokens too when ``names.prompt_includes_cached``); ``cached_name`` writes the cached-token counter under
    another name (an older version's)."""
    rng = np.random.default_rng(seed)
    end = float(int(end // scrape_s) * scrape_s)
    n = int(hours * 3600 / scrape_s)
    times = end - scrape_s * np.arange(n - 1, -1, -1, dtype=np.float64)
    in_burst = np.abs(times - times[0] - hours * 1800) < 1800
    rate = np.where(in_burst, 0.4, 0.05) * (1 + 0.5 * np.sin((times - times[0]) / 3600 * np.pi))  # req/s
    arrivals = rng.poisson(rate * scrape_s)
    arrivals[0] = 0
    arrivals[-1] = 0   # whatever arrives in the last interval finishes after the window
    owner = np.repeat(np.arange(n), arrivals)
    prompts = np.maximum(1, rng.lognormal(np.log(700), 0.7, len(owner))).astype(np.int64)
    outputs = np.maximum(1, rng.lognormal(np.log(180), 0.6, len(owner))).astype(np.int64)
    prompt_sum = np.bincount(owner, prompts, minlength=n).astype(float)
    cached = np.round(prompt_sum * HIT_RATE)
    processed = prompt_sum - cached
    generated = np.roll(np.bincount(owner, outputs, minlength=n).astype(float), 1)  # counted one scrape later
    drafted = np.round(generated * DRAFTED_PER_TOKEN)
    accepted = np.round(drafted * ACCEPTED_PER_DRAFT)
    in_flight = rng.poisson(rate * TIME_IN_SERVER_S).astype(float)
    running = np.minimum(in_flight, SLOTS)
    deferred = in_flight - running
    restart = n * 2 // 3

    def counter(name: str | None, values: np.ndarray[Any, Any]) -> Family:
        assert name is not None
        decoy = np.full(n, 10.0)
        return (name.removesuffix("_total"), "counter",
                [(JOB, _cumulative(values, restart)), (DECOY, _cumulative(decoy, restart))])

    def gauge(name: str | None, values: np.ndarray[Any, Any]) -> Family:
        assert name is not None
        return (name, "gauge", [(JOB, values), (DECOY, np.ones(n))])

    prompt_counter = processed + cached if names.prompt_includes_cached else processed
    families = [counter(names.prompt_tokens, prompt_counter),
                counter(cached_name or names.cached_prompt_tokens, cached), counter(names.generation_tokens, generated),
                counter(names.spec_draft_tokens, drafted),
                counter(names.spec_accepted_tokens, accepted), gauge(names.running, running),
                gauge(names.waiting, deferred)]
    write_openmetrics(path, families, times)
    return LlamaTruth(start=float(times[0]), end=float(times[-1]), scrape_s=scrape_s, times=times, arrivals=arrivals,
                      generated=generated, processed=processed, cached=cached, drafted=drafted, accepted=accepted,
                      running=running, deferred=deferred, prompt_mean=float(prompts.mean()),
                      output_mean=float(outputs.mean()), burst=(float(times[in_burst].min()),
                                                                float(times[in_burst].max())))
