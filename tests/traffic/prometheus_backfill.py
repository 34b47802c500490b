"""Test helper: SGLang-shaped Prometheus series as OpenMetrics, backfilled into a real Prometheus.

``generate`` writes days of series in the shape the seeds describe (a daily and weekly rhythm, one
burst day far above the others, queues only in bursts, KV cache mostly empty while Mamba slots fill,
most prompt tokens from the prefix cache, a server restart that resets the counters, a decoy job and a
health-check endpoint that must not count as traffic) and returns the ground truth it wrote.
``running_prometheus`` backfills them with ``promtool tsdb create-blocks-from openmetrics`` and serves
them from a Prometheus on a free loopback port, killed on exit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
PROMPT_BOUNDS = (100, 300, 500, 1000, 2000, 3000, 5000, 8000, 12000, 20000, 40000, float("inf"))
OUTPUT_BOUNDS = (10, 50, 100, 200, 300, 500, 800, 1200, 2000, 4000, float("inf"))
SLOTS = 12
HIT_RATE = 0.87
LATENCY_S = 9.0
LATENCY_BOUNDS = (1, 2, 4, 6, 8, 10, 20, 40, float("inf"))
JOB = 'job="sglang",instance="gpu0:30000"'


Family = tuple[str, str, list[tuple[str, np.ndarray[Any, Any]]]]
"""(name, type, [(labels, one value per scrape)]): a counter's name without ``_total``; labels as written inside
braces, or a suffix with its own braces (``_bucket{...}``) for a histogram's series."""


@dataclass(frozen=True)
class Truth:
    """What was backfilled: per-scrape arrivals and the aggregates a recording must reproduce."""

    start: float  # first scrape, Unix seconds
    end: float  # last scrape
    scrape_s: float
    times: np.ndarray[Any, Any]  # scrape times
    arrivals: np.ndarray[Any, Any]  # requests arrived in (times[k-1], times[k]]
    prompt_shares: np.ndarray[Any, Any]  # share of requests per prompt bucket (PROMPT_BOUNDS)
    output_shares: np.ndarray[Any, Any]
    prompt_mean: float
    output_mean: float
    hit_rate: float
    queued_share: float
    busiest_day: str
    day_counts: dict[str, int]
    kv_peak: float  # max token_usage on the busiest day
    mamba_peak: float
    concurrency_mean: float  # mean of running + queued over the scrapes
    latency_mean: float
    prompt_mean_by_day: dict[str, float]  # UTC day → mean prompt length of the requests that arrived then
    burst: tuple[float, float]  # (first, last) scrape time of the burst
    prompt_mean_burst: float
    prompt_mean_calm: float


def generate(path: Path, *, days: float, end: float, scrape_s: float = 60.0, seed: int = 7,
             busy_day: int | None = None) -> Truth:
    """Write ``days`` of series ending at ``end`` (aligned to the scrape) to ``path``; return the truth."""
    rng = np.random.default_rng(seed)
    end = float(int(end // scrape_s) * scrape_s)
    n = int(days * 86400 / scrape_s)
    times = end - scrape_s * np.arange(n - 1, -1, -1, dtype=np.float64)
    hour = (times % 86400) / 3600
    weekday = ((times // 86400) + 4) % 7  # 1970-01-01 was a Thursday
    rate = 0.02 * (0.25 + np.clip(np.sin((hour - 8) / 24 * 2 * np.pi), 0, None) * 1.5)  # req/s
    rate *= np.where(weekday >= 5, 0.5, 1.0)
    day_index = ((times - times[0]) // 86400).astype(int)
    burst = busy_day if busy_day is not None else int(days) // 2
    # The burst: a whole day in traces of two days or more, else six hours in the middle of the day.
    in_burst = day_index == burst if days >= 2 else np.abs(times - times[0] - days * 43200) < 3 * 3600
    rate = np.where(in_burst, np.maximum(rate * 40.0, 1.5), rate)
    if days >= 7:
        rate *= np.where(day_index == burst + 3, 30.0, 1.0)
    arrivals = rng.poisson(rate * scrape_s)
    arrivals[0] = 0
    total = int(arrivals.sum())
    owner = np.repeat(np.arange(n), arrivals)  # which scrape interval each request belongs to
    # Agents in the bursts resume long shared contexts: prompts in the burst are three times longer.
    median = np.where(in_burst[owner], 7500.0, 2500.0)
    prompts = np.maximum(1, rng.lognormal(np.log(median), 0.9)).astype(np.int64)
    outputs = np.maximum(1, rng.lognormal(np.log(250), 0.8, total)).astype(np.int64)
    prompt_sum = np.bincount(owner, prompts, minlength=n)
    output_sum = np.bincount(owner, outputs, minlength=n)
    restart = n * 2 // 3  # the server restarts here: every counter starts again from zero
    latencies = LATENCY_S * rng.lognormal(-0.045, 0.3, total)  # mean LATENCY_S
    concurrency = rng.poisson(rate * LATENCY_S).astype(float)  # in flight: Little's law, integral like the gauge
    running = np.minimum(concurrency, SLOTS)
    queue = concurrency - running
    kv = np.round(0.01 + running / SLOTS * 0.16, 2)
    mamba = np.round(running / SLOTS, 2)

    families: list[Family] = []

    def counter(name: str, series: list[tuple[str, np.ndarray[Any, Any]]]) -> None:
        families.append((name, "counter", [(labels, _cumulative(v, restart)) for labels, v in series]))

    counter("sglang:http_requests", [
        (f'{JOB},endpoint="/v1/chat/completions",method="POST"', arrivals.astype(float)),
        (f'{JOB},endpoint="/health",method="GET"', np.full(n, 4.0)),
        ('job="other",instance="gpu1:30000",endpoint="/v1/chat/completions",method="POST"', np.full(n, 1.0)),
    ])
    counter("sglang:num_requests", [(f'{JOB},is_streaming="true"', arrivals.astype(float))])
    counter("sglang:prompt_tokens", [(f'{JOB},is_streaming="true"', prompt_sum)])
    counter("sglang:generation_tokens", [(f'{JOB},is_streaming="true"', output_sum)])
    counter("sglang:cached_tokens", [(f'{JOB},cache_source="device"', np.round(prompt_sum * 0.70)),
                                     (f'{JOB},cache_source="host"', np.round(prompt_sum * (HIT_RATE - 0.70))),
                                     (f'{JOB},cache_source="total"', np.round(prompt_sum * HIT_RATE))])
    for metric, values, bounds in (("sglang:prompt_tokens_histogram", prompts, PROMPT_BOUNDS),
                                   ("sglang:generation_tokens_histogram", outputs, OUTPUT_BOUNDS),
                                   ("sglang:e2e_request_latency_seconds", latencies, LATENCY_BOUNDS)):
        series = []
        bucket = np.searchsorted(np.asarray(bounds), values, side="left")  # le is inclusive
        for i, bound in enumerate(bounds):
            per_step = np.bincount(owner[bucket <= i], minlength=n).astype(float)
            le = "+Inf" if np.isinf(bound) else f"{bound:g}"
            series.append((f"_bucket{{{JOB},le=\"{le}\"}}", _cumulative(per_step, restart)))
        series.append((f"_sum{{{JOB}}}", _cumulative(np.bincount(owner, values, minlength=n), restart)))
        series.append((f"_count{{{JOB}}}", _cumulative(arrivals.astype(float), restart)))
        families.append((metric, "histogram", series))
    for name, values in (("sglang:num_running_reqs", running), ("sglang:num_queue_reqs", queue),
                         ("sglang:token_usage", kv), ("sglang:mamba_usage", mamba)):
        families.append((name, "gauge", [(JOB, values)]))

    write_openmetrics(path, families, times)

    days_of = [datetime.fromtimestamp(t - scrape_s / 2, UTC).strftime("%Y-%m-%d") for t in times]
    day_counts: dict[str, int] = {}
    for day, count in zip(days_of, arrivals.tolist(), strict=True):
        day_counts[day] = day_counts.get(day, 0) + int(count)
    busiest = max(day_counts, key=lambda d: day_counts[d])
    on_busiest = np.asarray([datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d") == busiest for t in times])
    return Truth(start=float(times[0]), end=float(times[-1]), scrape_s=scrape_s, times=times, arrivals=arrivals,
                 prompt_shares=_shares(prompts, PROMPT_BOUNDS), output_shares=_shares(outputs, OUTPUT_BOUNDS),
                 prompt_mean=float(prompts.mean()), output_mean=float(outputs.mean()), hit_rate=HIT_RATE,
                 queued_share=float((queue > 0).mean()), busiest_day=busiest, day_counts=day_counts,
                 kv_peak=float(kv[on_busiest].max()), mamba_peak=float(mamba[on_busiest].max()),
                 concurrency_mean=float(concurrency.mean()), latency_mean=float(latencies.mean()),
                 prompt_mean_by_day=_mean_by_day(times, owner, prompts, scrape_s),
                 burst=(float(times[in_burst].min()), float(times[in_burst].max())),
                 prompt_mean_burst=float(prompts[in_burst[owner]].mean()),
                 prompt_mean_calm=float(prompts[~in_burst[owner]].mean()))


def write_openmetrics(path: Path, families: list[Family], times: np.ndarray[Any, Any]) -> None:
    """``families`` sampled at ``times`` (Unix seconds), as the OpenMetrics text that promtool backfills."""
    stamps = [f"{t:.0f}" for t in times]
    with path.open("w") as out:
        for name, kind, series in families:
            out.write(f"# TYPE {name} {kind}\n")
            for labels, values in series:
                head = (name + labels) if labels.startswith("_") else (
                    f"{name}_total{{{labels}}}" if kind == "counter" else f"{name}{{{labels}}}")
                out.writelines(f"{head} {v:.17g} {s}\n" for v, s in zip(values.tolist(), stamps, strict=True))
        out.write("# EOF\n")


def _mean_by_day(times: np.ndarray[Any, Any], owner: np.ndarray[Any, Any], values: np.ndarray[Any, Any],
                 scrape_s: float) -> dict[str, float]:
    days = np.asarray([datetime.fromtimestamp(t - scrape_s / 2, UTC).strftime("%Y-%m-%d") for t in times])[owner]
    return {day: float(values[days == day].mean()) for day in np.unique(days).tolist()}


def _cumulative(per_step: np.ndarray[Any, Any], restart: int) -> np.ndarray[Any, Any]:
    out = np.cumsum(per_step, dtype=np.float64)
    out[restart:] -= out[restart - 1]
    return out


def _shares(values: np.ndarray[Any, Any], bounds: tuple[float, ...]) -> np.ndarray[Any, Any]:
    bucket = np.searchsorted(np.asarray(bounds), values, side="left")
    counts = np.bincount(bucket, minlength=len(bounds)).astype(float)
    return counts / counts.sum()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_prometheus(openmetrics: Path, workdir: Path, *, timeout_s: float = 300.0) -> Iterator[str]:
    """Backfill ``openmetrics`` into a fresh TSDB and serve it; yields the base URL; kills it on exit."""
    data = workdir / "tsdb"
    data.mkdir(parents=True, exist_ok=True)
    subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(openmetrics), str(data)],
                   check=True, capture_output=True, timeout=timeout_s)
    with serving_prometheus(workdir, "global:\n  scrape_interval: 1h\n", timeout_s=timeout_s) as url:
        yield url


@contextlib.contextmanager
def serving_prometheus(workdir: Path, config_text: str, *, timeout_s: float = 300.0) -> Iterator[str]:
    """A Prometheus on a free loopback port with ``config_text`` as its configuration and its TSDB under
    ``workdir/tsdb``; yields the base URL once ready; kills its process group on exit."""
    data = workdir / "tsdb"
    data.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(config_text)
    port = free_port()
    log = (workdir / "prometheus.log").open("w")
    process = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=400d"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {process.returncode}: "
                                   + (workdir / "prometheus.log").read_text()[-2000:])
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/-/ready", timeout=2.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus not ready after {timeout_s} s")
            time.sleep(0.2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)
        log.close()
