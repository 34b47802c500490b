"""Recording traffic from Prometheus: a trace synthesised from SGLang's aggregate series.

Prometheus cannot see individual requests, so we sample requests whose aggregates match the series
and the metadata says ``synthesized: true``:

- **Arrivals.** Per-step increments of the arrival counter (``sglang:http_requests_total`` on the
  generation endpoints; ``sglang:num_requests_total`` as a fallback, which counts at completion and
  so lags by the latency) are placed uniformly inside their step: an inhomogeneous Poisson process
  conditioned on the observed counts, so the rate curve is reproduced at the step's resolution.
- **Lengths.** Prompt and completion lengths are drawn from ``sglang:prompt_tokens_histogram`` and
  ``sglang:generation_tokens_histogram``, hour by hour, so a burst keeps its own length mix: a bucket
  by its share in that hour, a length inside it shaped so that the window's mean (``_sum/_count``)
  is kept (``synthesis.sample_histogram``). Without histograms the means
  (``*_tokens_total / num_requests_total``) drive exponential lengths, and the metadata says so.
- **Prefix reuse.** ``cached_tokens_total / prompt_tokens_total`` is the hit rate. Requests join
  prefix families and share a leading run of the family's blocks; the run's share of each prompt
  is calibrated until the trace's infinite-cache reuse (``summary.prefix_reuse``) equals the rate.
- **Concurrency and pressure.** Running/queued requests, KV and Mamba usage cannot be imposed on a
  trace (they depend on the server); they are measured and stored in the report, with what to look at
  before tuning: the busiest days, the share of time with queued requests, usage at peak.
  Little's law checks the trace against the gauges: its arrival rate times the recorded mean latency
  (``sglang:e2e_request_latency_seconds``) should equal the mean number in flight.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from elsa_tune.errors import TrafficError
from elsa_tune.traffic.prometheus import Grid, PrometheusClient, Series, counter_increments, selector_matchers
from elsa_tune.traffic.prometheus import with_matchers as sel
from elsa_tune.traffic.summary import prefix_reuse
from elsa_tune.traffic.synthesis import Histogram, mean_exponent, sample_histogram, shared_prefix_blocks
from elsa_tune.traffic.trace import DEFAULT_BLOCK_SIZE, SCHEMA_VERSION, Trace, TraceMetadata

log = logging.getLogger(__name__)

REPORT_VERSION = 1
GENERATION_ENDPOINTS = 'endpoint=~".*(completions|generate).*"'
ARRIVAL_METRICS = (
    ("sglang:http_requests_total", GENERATION_ENDPOINTS, "counted at arrival"),
    ("http_requests_total", GENERATION_ENDPOINTS, "counted at arrival"),
    ("sglang:num_requests_total", "", "counted at completion: lags arrivals by the request latency"),
)
MAX_REQUESTS = 5_000_000
PERIOD_S = 3600.0
"""Lengths are drawn from each hour's histograms, so a burst with longer prompts keeps them."""
DAY_PERIODS = 24
MIN_SHAPE_REQUESTS = 200


#: A recorded window needs this many grid points for a rate curve; an automatic step aims at ``AUTO_POINTS``.
MIN_POINTS = 10
AUTO_POINTS = 120
#: Automatic steps: the finest (a common scrape interval's order) and the coarsest (the historical default).
AUTO_STEPS = (5.0, 10.0, 15.0, 30.0, 60.0)


def auto_step(span_s: float) -> float:
    """The step for a window of ``span_s`` seconds: the finest of ``AUTO_STEPS`` giving at most ``AUTO_POINTS``
    points, or the coarsest; a 3-minute window gets 5 s (36 points), 14 days 60 s."""
    return next((step for step in AUTO_STEPS if span_s / step <= AUTO_POINTS), AUTO_STEPS[-1])


@dataclass(frozen=True)
class RecordWindow:
    """What to record: Unix-second bounds, the query step in seconds (``None``: chosen from the window's length,
    ``auto_step``), and the label matchers."""

    start: float
    end: float
    step: float | None = None
    selector: str = ""

    def checked(self, now: float) -> RecordWindow:
        """The window with its end clamped to ``now`` and its step chosen; ``TrafficError`` when it cannot be
        recorded (too few points at the step asked for)."""
        end = min(self.end, now)
        if not (math.isfinite(self.start) and math.isfinite(end)) or self.start >= end:
            raise TrafficError(f"empty or reversed time range: {_iso(self.start)} → {_iso(self.end)}"
                               + (" (the end was clamped to now)" if end < self.end else ""),
                               remedy="pass --since 14d, or --start before --end, both in the past")
        span = end - self.start
        step = auto_step(span) if self.step is None else self.step
        if step <= 0 or span < MIN_POINTS * step:
            finer = span / MIN_POINTS
            raise TrafficError(f"the window ({span:.0f} s) holds {max(0, int(span // step)) if step > 0 else 0} "
                               f"steps of {step:g} s; a rate curve needs at least {MIN_POINTS}",
                               remedy=(f"pass --step {math.floor(finer)}s or less, or leave --step out to have it "
                                       "chosen from the window" if finer >= 1 else "record a longer window"))
        # Whole steps on the Unix epoch: readable bounds, and steps that line up with scrapes.
        start = math.floor(self.start / step) * step
        end = math.floor(end / step) * step
        return RecordWindow(start=start, end=end, step=step, selector=self.selector)


@dataclass(frozen=True)
class RecordingReport:
    """What the series said, what the synthetic trace reproduces, and the pressure to look at before tuning."""

    prometheus: str
    selector: str
    start: str
    end: str
    step_s: float
    arrival_metric: str
    requests_observed: float
    requests_synthesized: int
    busiest_days: tuple[tuple[str, int], ...]  # (UTC date, requests), busiest first
    busiest_hour: tuple[str, int] | None
    queued_share: float | None  # share of sampled time with at least one queued request
    running_max: float | None
    running_mean: float | None
    queue_max: float | None
    kv_usage_peak: float | None  # max of sglang:token_usage during the busiest day
    kv_usage_max: float | None  # over the whole window
    mamba_usage_peak: float | None  # max of sglang:mamba_usage during the busiest day
    mamba_usage_max: float | None
    latency_mean_s: float | None  # sglang:e2e_request_latency_seconds _sum / _count
    concurrency_mean_observed: float | None  # mean of running + queued requests over the window
    concurrency_mean_implied: float | None  # Little's law: the trace's mean arrival rate x the mean latency
    prefix_hit_rate_observed: float | None  # cached / prompt tokens over the window
    prefix_reuse_synthesized: float
    prompt_mean_observed: float | None
    prompt_mean_synthesized: float
    output_mean_observed: float | None
    output_mean_synthesized: float
    lengths_from: str  # histogram | means
    notes: tuple[str, ...] = ()
    schema_version: int = REPORT_VERSION

    def to_json(self) -> str:
        return json.dumps(_finite(asdict(self)), sort_keys=True)

    def lines(self) -> list[str]:
        """The human summary ``elsa-tune record`` prints."""
        days = ", ".join(f"{day} {n:,}" for day, n in self.busiest_days[:3]) or "none"
        out = [f"recorded   {self.start} → {self.end} from {self.prometheus} {self.selector or '(all series)'}",
               f"requests   {self.requests_synthesized:,} synthesised from {self.arrival_metric} "
               f"({self.requests_observed:,.0f} observed)",
               f"busiest    days: {days}"]
        if self.busiest_hour:
            out.append(f"           hour: {self.busiest_hour[0]} with {self.busiest_hour[1]:,} requests")
        out.append(f"queued     {_pct(self.queued_share)} of the time with requests waiting; running max "
                   f"{_num(self.running_max)}, mean {_num(self.running_mean)}; queue max {_num(self.queue_max)}")
        out.append(f"in flight  {_num1(self.concurrency_mean_observed)} on average (running + queued); "
                   f"arrivals x mean latency {_num1(self.latency_mean_s)} s = {_num1(self.concurrency_mean_implied)} "
                   "(Little's law)")
        out.append(f"KV usage   {_pct(self.kv_usage_peak)} at most on the busiest day ({_pct(self.kv_usage_max)} "
                   f"over the window); Mamba usage {_pct(self.mamba_usage_peak)} ({_pct(self.mamba_usage_max)})")
        out.append(f"prefix     {_pct(self.prefix_hit_rate_observed)} of prompt tokens from cache; trace reuse "
                   f"{_pct(self.prefix_reuse_synthesized)}")
        out.append(f"lengths    prompt mean {_num(self.prompt_mean_observed)} → {self.prompt_mean_synthesized:,.0f}, "
                   f"output mean {_num(self.output_mean_observed)} → {self.output_mean_synthesized:,.0f} "
                   f"(from {self.lengths_from})")
        out.extend(f"note       {note}" for note in self.notes)
        return out


@dataclass(frozen=True)
class Recording:
    trace: Trace
    report: RecordingReport


@dataclass
class _Lengths:
    values: np.ndarray[Any, np.dtype[np.int64]]
    observed_mean: float | None
    source: str
    notes: list[str] = field(default_factory=list)


def record(client: PrometheusClient, window: RecordWindow, *, seed: int = 0, scale: float = 1.0,
           block_size: int = DEFAULT_BLOCK_SIZE, now: float | None = None) -> Recording:
    """Query the series of ``window`` and synthesise a trace that reproduces them. Nothing is written."""
    window = window.checked(time.time() if now is None else now)
    if scale <= 0:
        raise TrafficError(f"--scale must be positive, got {scale}", remedy="use e.g. --scale 0.1 to thin traffic")
    assert window.step is not None   # checked() chose it
    grid = Grid.spanning(window.start, window.end, window.step)
    matchers = selector_matchers(window.selector)
    client.query("vector(1)", window.end)  # reachability and a sane answer, before anything else
    rng = np.random.default_rng(seed)
    metric, query, lag_note, counts = _arrival_counts(client, grid, matchers)
    notes: list[str] = [f"arrivals from {metric}, {lag_note}"]
    step_note = _step_note(client, query, counts, grid)
    if step_note:
        notes.append(step_note)
    arrivals, steps = _arrivals(counts * scale, grid, rng, metric, window)
    range_s = f"{round(window.end - window.start)}s"
    prompt = _lengths(client, "prompt", matchers, window, grid, steps, rng)
    output = _lengths(client, "generation", matchers, window, grid, steps, rng)
    notes += prompt.notes + output.notes
    hit = _hit_rate(client, matchers, range_s, window.end)
    if hit is None:
        notes.append("no sglang:cached_tokens_total: prefix reuse unknown, so the trace shares no prefixes")
    trace = _synthesised(client.url, window, arrivals, prompt.values, output.values, hit, block_size, rng,
                         "synthesised from Prometheus aggregates: arrivals, lengths and prefix reuse match the series, "
                         "individual requests are samples")
    report = _report(client, window, grid, matchers, metric, counts, trace, hit, prompt, output, notes)
    return Recording(trace=_with_provenance(trace, window, seed, scale, report.to_json(),
                                            f"elsa-tune record --prometheus {client.url}"), report=report)


def _arrivals(expected: npt.NDArray[np.float64], grid: Grid, rng: np.random.Generator, metric: str,
              window: RecordWindow) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Arrival times for ``expected`` requests per grid step, and each request's step (arrivals stay in step order).

    A step's count is ``expected`` rounded at random (up with the probability of its fraction, so the totals are
    kept on average), its requests placed uniformly inside it; ``TrafficError`` when ``metric`` gave no request,
    or more than ``MAX_REQUESTS``."""
    draws = np.floor(expected + rng.random(len(expected))).astype(np.int64)
    total = int(draws.sum())
    if total == 0:
        raise TrafficError(f"{metric} did not grow between {_iso(window.start)} and {_iso(window.end)}",
                           remedy="record a window in which the server served requests")
    if total > MAX_REQUESTS:
        raise TrafficError(f"the window holds {total:,} requests, more than {MAX_REQUESTS:,}",
                           remedy=f"thin it with --scale {MAX_REQUESTS / total:.2g} or record a shorter window")
    step_starts = np.repeat(grid.times - grid.step, draws)
    arrivals = np.sort(step_starts + rng.random(total) * grid.step)
    return arrivals, np.repeat(np.arange(len(draws)), draws)


def _synthesised(url: str, window: RecordWindow, arrivals: npt.NDArray[np.float64], prompts: npt.NDArray[np.int64],
                 outputs: npt.NDArray[np.int64], hit: float | None, block_size: int, rng: np.random.Generator,
                 notes: str) -> Trace:
    """The synthetic trace of a recording: arrivals from the window's first grid point, prompts sharing prefixes
    at the hit rate (none when it is unknown)."""
    origin = window.start  # the first grid point
    hashes = shared_prefix_blocks(prompts, block_size, hit or 0.0, rng)
    meta = TraceMetadata(schema_version=SCHEMA_VERSION, source=f"prometheus:{url}", block_size=block_size,
                         start=_iso(origin), end=_iso(window.end), synthesized=True, notes=notes)
    return Trace.from_columns(meta, arrival_s=arrivals - origin, input_tokens=prompts, output_tokens=outputs,
                              block_hashes=hashes, kind="chat")


def _with_provenance(trace: Trace, window: RecordWindow, seed: int, scale: float, report: str,
                     provenance: str) -> Trace:
    """``trace`` with what recorded it in its metadata: the selector, step, seed, scale, report and command."""
    extra = {"selector": window.selector, "step_s": f"{window.step:g}", "seed": str(seed), "scale": f"{scale:g}",
             "recording": report, "provenance": provenance}
    return Trace(trace.table, trace.metadata.with_extra(**extra))


def exponential_lengths(mean: float, n: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """``n`` lengths of at least one token, exponential with ``mean``: what a mean alone says of a distribution."""
    return np.maximum(1, np.ceil(rng.exponential(mean, n))).astype(np.int64)


def _arrival_counts(client: PrometheusClient, grid: Grid,
                    matchers: str) -> tuple[str, str, str, np.ndarray[Any, np.dtype[np.float64]]]:
    """The first arrival counter that grew: its name, its selector, what it counts, per-step increments."""
    for metric, extra, note in ARRIVAL_METRICS:
        query = sel(metric, matchers, extra)
        counts = counter_increments(client.query_range(query, grid))
        if len(counts) and counts.sum() > 0:
            return metric, query, note, counts
    _explain_empty(client, grid, matchers)
    raise AssertionError("unreachable")  # pragma: no cover - _explain_empty always raises


def _step_note(client: PrometheusClient, query: str, counts: npt.NDArray[np.float64], grid: Grid) -> str | None:
    """A warning (logged, and returned for the report) when the step is finer than the scrape interval of the
    counter ``query``, read around its busiest step; ``None`` when the step is fine."""
    scrape = _scrape_interval(client, query, float(grid.times[int(np.argmax(counts))]))
    if scrape is None or grid.step >= 0.9 * scrape:
        return None
    note = (f"the step ({grid.step:g} s) is finer than the scrape interval (~{scrape:.0f} s): arrivals bunch into "
            f"the steps that saw a scrape; record with --step {scrape:.0f}s or more")
    log.warning("%s", note)
    return note


def _scrape_interval(client: PrometheusClient, query: str, busy: float) -> float | None:
    """The median gap between raw samples in the half hour before ``busy`` (a time the server was up)."""
    gaps = [np.diff(times) for _, times in client.samples(query, 1800.0, busy) if len(times) > 1]
    return float(np.median(np.concatenate(gaps))) if gaps else None


def _explain_empty(client: PrometheusClient, grid: Grid, matchers: str) -> None:
    """Raise the most useful error for a window with no request counters: wrong selector, or no data."""
    span = f"{round(grid.step * (grid.points - 1))}s"
    end = grid.start + grid.step * (grid.points - 1)
    where = f"between {_iso(grid.start)} and {_iso(end)}"
    step = f"{grid.step:g} s"
    if matchers:
        mine = client.query(f"count by (job, instance) (last_over_time(sglang:num_requests_total{{{matchers}}}"
                            f"[{span}]))", end)
        if mine:   # the selector is right: the counters exist under it, they did not grow between grid points
            raise TrafficError(f"SGLang's request counters under {{{matchers}}} did not grow {where} at a step of "
                               f"{step} ({grid.points} points): requests served between two points, or a series "
                               "that began inside the window, leave no increment",
                               remedy=f"pass a smaller --step (at least the scrape interval, e.g. "
                                      f"{auto_step(grid.step * (grid.points - 1)):g}s) or record a longer window")
        elsewhere = client.query(f"count by (job, instance) (last_over_time(sglang:num_requests_total[{span}]))",
                                 end)
        if elsewhere:
            found = "; ".join(", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) or "(no labels)"
                              for labels, _ in elsewhere[:5])
            raise TrafficError(f"the selector {{{matchers}}} matches no SGLang request counters {where}; "
                               f"SGLang series exist with: {found}",
                               remedy="pass a --selector that matches them, e.g. '{job=\"<job above>\"}'")
    raise TrafficError(f"no SGLang request counters (sglang:http_requests_total, sglang:num_requests_total) {where}",
                       remedy="start SGLang with --enable-metrics, make Prometheus scrape it, and record a window "
                              "(--since/--start/--end) in which it served requests")


def _lengths(client: PrometheusClient, which: str, matchers: str, window: RecordWindow, grid: Grid,
             steps: np.ndarray[Any, np.dtype[np.int64]], rng: np.random.Generator) -> _Lengths:
    """Lengths for requests arriving in grid steps ``steps``: each from its hour's histogram when it has one."""
    n = len(steps)
    range_s = f"{round(window.end - window.start)}s"
    metric = f"sglang:{which}_tokens_histogram"
    hist = _histogram(client, metric, matchers, range_s, window.end)
    counter = "prompt" if which == "prompt" else "generation"
    if hist is not None and hist.count > 0:
        mean = hist.total / hist.count if hist.total is not None else None
        period_of_step, periods, exponents = _period_histograms(client, metric, matchers, grid)
        if len(periods) <= 1:
            return _Lengths(values=sample_histogram(hist, n, rng), observed_mean=mean, source="histogram")
        values = np.empty(n, dtype=np.int64)
        index = period_of_step[steps]
        overall = mean_exponent(hist)
        for k in np.unique(index).tolist():
            chosen = np.flatnonzero(index == k)
            own = periods[k]
            shape = exponents.get(k // DAY_PERIODS, overall)
            values[chosen] = sample_histogram(own if own is not None else hist, len(chosen), rng, shape)
        return _Lengths(values=values, observed_mean=mean, source="hourly histograms")
    tokens = _scalar(client, f"sum(increase({sel(f'sglang:{counter}_tokens_total', matchers)}[{range_s}]))",
                     window.end)
    finished = _scalar(client, f"sum(increase({sel('sglang:num_requests_total', matchers)}[{range_s}]))",
                       window.end)
    if tokens is None or not finished:
        raise TrafficError(f"no {which} length series: neither sglang:{which}_tokens_histogram nor "
                           f"sglang:{counter}_tokens_total / sglang:num_requests_total",
                           remedy="check that SGLang runs with --enable-metrics and the selector matches it")
    mean = tokens / finished
    return _Lengths(values=exponential_lengths(mean, n, rng), observed_mean=mean, source="means",
                    notes=[f"no {which} histogram: lengths are exponential with the observed mean {mean:.0f}"])


def _period_histograms(client: PrometheusClient, metric: str, matchers: str, grid: Grid
                       ) -> tuple[np.ndarray[Any, np.dtype[np.int64]], list[Histogram | None], dict[int, float]]:
    """The period (``PERIOD_S``) of every grid step, one histogram per period (None: no request), and
    the in-bucket shape exponent of each day of periods that has enough requests to pin it.

    The raw bucket counters are read on the arrival grid and differenced per series, so resets are
    handled where they happen (an hourly ``increase`` would lose the part of the hour before one),
    and the steps are summed into periods exactly as the arrivals are. An hour's own ``_sum`` is too
    noisy to shape its buckets, and the window's is dominated by its bursts: a day's is both.
    """
    period_of_step = (np.maximum(np.arange(grid.points) - 1, 0) * grid.step // PERIOD_S).astype(np.int64)
    periods = int(period_of_step[-1]) + 1
    if periods <= 1:
        return period_of_step, [], {}
    by_bound: dict[float, list[Series]] = {}
    for one in client.query_range(sel(metric + "_bucket", matchers), grid):
        try:
            by_bound.setdefault(float(one.labels.get("le", "nan")), []).append(one)
        except ValueError:
            continue
    bounds = sorted(b for b in by_bound if not math.isnan(b))
    if not bounds or not math.isinf(bounds[-1]):
        return period_of_step, [], {}
    per_step = np.stack([counter_increments(by_bound[b]) for b in bounds])  # bucket x step
    per_period = np.stack([np.bincount(period_of_step, row, minlength=periods) for row in per_step])
    out: list[Histogram | None] = []
    for k in range(periods):
        cumulative = np.maximum.accumulate(per_period[:, k])
        out.append(Histogram(bounds=tuple(bounds), cumulative=tuple(float(c) for c in cumulative))
                   if cumulative[-1] > 0 else None)
    sums = counter_increments(client.query_range(sel(metric + "_sum", matchers), grid))
    exponents: dict[int, float] = {}
    if len(sums):
        day_of_step = period_of_step // DAY_PERIODS
        days = int(day_of_step[-1]) + 1
        day_sums = np.bincount(day_of_step, sums, minlength=days)
        per_day = np.stack([np.bincount(day_of_step, row, minlength=days) for row in per_step])  # bucket x day
        for day in range(days):
            cumulative = np.maximum.accumulate(per_day[:, day])
            if cumulative[-1] >= MIN_SHAPE_REQUESTS:
                exponents[day] = mean_exponent(Histogram(bounds=tuple(bounds), total=float(day_sums[day]),
                                                         cumulative=tuple(float(c) for c in cumulative)))
    return period_of_step, out, exponents


def _histogram(client: PrometheusClient, metric: str, matchers: str, range_s: str, end: float) -> Histogram | None:
    rows = client.query(f"sum by (le) (increase({sel(metric + '_bucket', matchers)}[{range_s}]))", end)
    if not rows:
        return None
    pairs = sorted((float(labels.get("le", "nan")), value) for labels, value in rows)
    pairs = [(b, v) for b, v in pairs if not math.isnan(b)]
    if not pairs or not math.isinf(pairs[-1][0]):
        return None
    cumulative = np.maximum.accumulate(np.asarray([v for _, v in pairs]))  # increase() may jitter by rounding
    total = _scalar(client, f"sum(increase({sel(metric + '_sum', matchers)}[{range_s}]))", end)
    return Histogram(bounds=tuple(b for b, _ in pairs), cumulative=tuple(float(c) for c in cumulative), total=total)


def _hit_rate(client: PrometheusClient, matchers: str, range_s: str, end: float) -> float | None:
    rows = client.query(f"sum by (cache_source) (increase({sel('sglang:cached_tokens_total', matchers)}[{range_s}]))",
                        end)
    if not rows:
        return None
    by_source = {labels.get("cache_source", ""): value for labels, value in rows}
    cached = by_source["total"] if "total" in by_source else sum(by_source.values())
    prompt = _scalar(client, f"sum(increase({sel('sglang:prompt_tokens_total', matchers)}[{range_s}]))", end)
    if not prompt:
        return None
    return min(1.0, max(0.0, float(cached) / prompt))


def _scalar(client: PrometheusClient, promql: str, at: float) -> float | None:
    rows = client.query(promql, at)
    return float(rows[0][1]) if rows else None


def _gauge(client: PrometheusClient, agg: str, metric: str, matchers: str, grid: Grid) -> np.ndarray[Any, Any] | None:
    series = client.query_range(f"{agg}({sel(metric, matchers)})", grid)
    return series[0].values if series else None


def _report(client: PrometheusClient, window: RecordWindow, grid: Grid, matchers: str, metric: str,
            counts: np.ndarray[Any, Any], trace: Trace, hit: float | None, prompt: _Lengths, output: _Lengths,
            notes: list[str]) -> RecordingReport:
    days = _per_period(grid, counts, "%Y-%m-%d")
    hours = _per_period(grid, counts, "%Y-%m-%dT%H:00Z")
    running = _gauge(client, "sum", "sglang:num_running_reqs", matchers, grid)
    queue = _gauge(client, "sum", "sglang:num_queue_reqs", matchers, grid)
    kv = _gauge(client, "max", "sglang:token_usage", matchers, grid)
    mamba = _gauge(client, "max", "sglang:mamba_usage", matchers, grid)
    busiest_day = days[0][0] if days else None
    on_busiest = np.asarray([datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d") == busiest_day
                             for t in grid.times])
    if queue is None:
        notes.append("no sglang:num_queue_reqs series: queueing unknown")
    range_s = f"{round(window.end - window.start)}s"
    latency_sum = _scalar(client, f"sum(increase({sel('sglang:e2e_request_latency_seconds_sum', matchers)}"
                                  f"[{range_s}]))", window.end)
    latency_count = _scalar(client, f"sum(increase({sel('sglang:e2e_request_latency_seconds_count', matchers)}"
                                    f"[{range_s}]))", window.end)
    latency = latency_sum / latency_count if latency_sum is not None and latency_count else None
    in_flight = running + np.nan_to_num(queue) if running is not None and queue is not None else running
    # Little's law over the same stretch of time the gauges cover (they are absent while the server is down).
    covered = ~np.isnan(in_flight) if in_flight is not None else np.ones(len(counts), dtype=bool)
    implied = float(counts[covered].mean()) / grid.step * latency if latency is not None and covered.any() else None
    return RecordingReport(
        prometheus=client.url, selector=window.selector, start=_iso(window.start), end=_iso(window.end),
        step_s=grid.step, arrival_metric=metric, requests_observed=float(counts.sum()),
        requests_synthesized=len(trace), busiest_days=tuple(days[:5]), busiest_hour=hours[0] if hours else None,
        queued_share=_share_positive(queue), running_max=_stat(running, np.nanmax),
        running_mean=_stat(running, np.nanmean), queue_max=_stat(queue, np.nanmax),
        kv_usage_peak=_stat(kv, np.nanmax, on_busiest), kv_usage_max=_stat(kv, np.nanmax),
        mamba_usage_peak=_stat(mamba, np.nanmax, on_busiest), mamba_usage_max=_stat(mamba, np.nanmax),
        latency_mean_s=latency, concurrency_mean_observed=_stat(in_flight, np.nanmean),
        concurrency_mean_implied=implied,
        prefix_hit_rate_observed=hit, prefix_reuse_synthesized=prefix_reuse(trace),
        prompt_mean_observed=prompt.observed_mean,
        prompt_mean_synthesized=float(trace.column("input_tokens").mean()),
        output_mean_observed=output.observed_mean,
        output_mean_synthesized=float(trace.column("output_tokens").mean()),
        lengths_from=prompt.source if prompt.source == output.source else f"{prompt.source}/{output.source}",
        notes=tuple(notes))


def _per_period(grid: Grid, counts: np.ndarray[Any, Any], fmt: str) -> list[tuple[str, int]]:
    """Requests per calendar period (UTC), busiest first. An increment belongs to the step it closes."""
    totals: dict[str, float] = {}
    for stamp, count in zip((grid.times - grid.step / 2).tolist(), counts.tolist(), strict=True):
        if count:
            key = datetime.fromtimestamp(stamp, UTC).strftime(fmt)
            totals[key] = totals.get(key, 0.0) + count
    return sorted(((k, round(v)) for k, v in totals.items()), key=lambda kv: (-kv[1], kv[0]))


def _share_positive(values: np.ndarray[Any, Any] | None) -> float | None:
    if values is None:
        return None
    present = values[~np.isnan(values)]
    return float((present > 0).mean()) if len(present) else None


def _stat(values: np.ndarray[Any, Any] | None, fn: Any, mask: np.ndarray[Any, Any] | None = None) -> float | None:
    if values is None:
        return None
    chosen = values[mask] if mask is not None else values
    chosen = chosen[~np.isnan(chosen)]
    return float(fn(chosen)) if len(chosen) else None


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _iso(stamp: float) -> str:
    try:
        return datetime.fromtimestamp(stamp, UTC).isoformat()
    except (OverflowError, OSError, ValueError):
        return str(stamp)


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0%}"


def _num1(value: float | None) -> str:
    return "unknown" if value is None else f"{value:,.2f}"


def _num(value: float | None) -> str:
    return "unknown" if value is None else f"{value:,.0f}"
