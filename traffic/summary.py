"""What a trace looks like, for ``elsa-tune traffic show``: a versioned record and its terminal rendering.

The prefix-reuse rate is the theoretical prefix-cache hit rate: the share of prompt tokens whose
leading blocks an earlier request already had, as if the cache were infinite and nothing were ever
evicted. A real server's rate is lower; a trace whose reuse is low cannot be saved by cache tuning.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from elsa_tune.errors import TrafficError
from elsa_tune.traffic.breakers import Breaker, breakers_from_json
from elsa_tune.traffic.trace import Trace, prefix_reuse_curve

SCHEMA_VERSION = 1
SPARK = "▁▂▃▄▅▆▇█"
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Lengths:
    """A token-length distribution."""

    mean: float
    p50: float
    p90: float
    p99: float
    max: int
    total: int


@dataclass(frozen=True)
class RateCurve:
    """Requests per second in consecutive bins of ``bin_s`` from the start of the trace."""

    bin_s: float
    rates: tuple[float, ...]

    @property
    def sparkline(self) -> str:
        return sparkline(self.rates)


@dataclass(frozen=True)
class BusiestWindow:
    """The window of ``window_s`` with the most arrivals."""

    window_s: float
    start_s: float
    requests: int
    rate: float  # requests per second inside the window
    ratio_to_mean: float  # its rate over the trace's mean rate


@dataclass(frozen=True)
class TraceSummary:
    """Everything ``traffic show`` prints; ``to_dict`` is the ``--json`` record."""

    source: str
    synthesized: bool
    start: str | None
    end: str | None
    block_size: int
    requests: int
    span_s: float
    mean_rate: float
    rate: RateCurve
    busiest: BusiestWindow | None
    input_tokens: Lengths
    output_tokens: Lengths
    prefix_reuse: float  # share of prompt tokens an infinite prefix cache would have served
    sessions: int
    requests_in_sessions: int
    kinds: Mapping[str, int]
    sampled_share: float  # requests with temperature > 0 among those that say
    requests_with_images: int
    breakers: tuple[Breaker, ...] = ()
    recording: Mapping[str, Any] = field(default_factory=dict)
    notes: str = ""
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rate"]["sparkline"] = self.rate.sparkline
        out["breakers"] = [{**asdict(b), "remedy": b.remedy} for b in self.breakers]
        out["kinds"] = dict(self.kinds)
        out["recording"] = dict(self.recording)
        clean: dict[str, Any] = _without_nan(out)
        return clean


def summarize(trace: Trace, *, bins: int = 60, window_s: float | None = None) -> TraceSummary:
    """Summarise ``trace``; ``window_s`` is the busiest-window length (default: a day, an hour or a minute)."""
    if len(trace) == 0:
        raise TrafficError("the trace has no requests", remedy="import or record a trace with traffic in it")
    arrivals = trace.arrivals()
    span = float(arrivals[-1] - arrivals[0])
    inp = trace.column("input_tokens").astype(np.int64)
    out = trace.column("output_tokens").astype(np.int64)
    sessions = [s for s in trace.table.column("session").to_pylist() if s is not None]
    temperatures = [t for t in trace.table.column("temperature").to_pylist() if t is not None]
    recording = trace.metadata.extra.get("recording")
    return TraceSummary(
        source=trace.metadata.source,
        synthesized=trace.metadata.synthesized,
        start=trace.metadata.start,
        end=trace.metadata.end,
        block_size=trace.metadata.block_size,
        requests=len(trace),
        span_s=span,
        mean_rate=len(trace) / span if span > 0 else float("nan"),
        rate=rate_curve(arrivals, bins),
        busiest=busiest_window(arrivals, window_s if window_s is not None else default_window(span)),
        input_tokens=lengths(inp),
        output_tokens=lengths(out),
        prefix_reuse=prefix_reuse(trace),
        sessions=len(set(sessions)),
        requests_in_sessions=len(sessions),
        kinds=dict(Counter(str(k) for k in trace.table.column("kind").to_pylist()).most_common()),
        sampled_share=(sum(t > 0 for t in temperatures) / len(temperatures)) if temperatures else float("nan"),
        requests_with_images=int((trace.column("images") > 0).sum()),
        breakers=tuple(breakers_from_json(trace.metadata.extra.get("breakers"))),
        recording=json.loads(recording) if recording else {},
        notes=trace.metadata.notes,
    )


def lengths(values: np.ndarray[Any, np.dtype[np.int64]]) -> Lengths:
    p50, p90, p99 = (float(v) for v in np.percentile(values, PERCENTILES))
    return Lengths(mean=float(values.mean()), p50=p50, p90=p90, p99=p99, max=int(values.max()),
                   total=int(values.sum()))


def default_window(span_s: float) -> float:
    """A day for traces of two days or more, an hour for two hours or more, else a minute."""
    if span_s >= 2 * 86_400:
        return 86_400.0
    if span_s >= 2 * 3_600:
        return 3_600.0
    return 60.0


def rate_curve(arrivals: np.ndarray[Any, np.dtype[np.float64]], bins: int) -> RateCurve:
    span = float(arrivals[-1] - arrivals[0]) if len(arrivals) else 0.0
    if span <= 0:
        return RateCurve(bin_s=0.0, rates=(float(len(arrivals)),))
    width = span / bins
    counts, _ = np.histogram(arrivals, bins=bins, range=(float(arrivals[0]), float(arrivals[0]) + span))
    return RateCurve(bin_s=width, rates=tuple(float(c) / width for c in counts))


def busiest_window(arrivals: np.ndarray[Any, np.dtype[np.float64]], window_s: float) -> BusiestWindow | None:
    """The ``window_s`` window with the most arrivals; it starts at an arrival. None for traces shorter than it."""
    span = float(arrivals[-1] - arrivals[0]) if len(arrivals) else 0.0
    if window_s <= 0 or span < window_s:
        return None
    # Windows start at an arrival and must end inside the trace, so a half-empty tail never wins.
    last_start = int(np.searchsorted(arrivals, arrivals[-1] - window_s, side="right"))
    starts = arrivals[:max(last_start, 1)]
    counts = np.searchsorted(arrivals, starts + window_s, side="left") - np.arange(len(starts))
    best = int(np.argmax(counts))
    rate = float(counts[best]) / window_s
    return BusiestWindow(window_s=window_s, start_s=float(starts[best]), requests=int(counts[best]), rate=rate,
                         ratio_to_mean=rate / (len(arrivals) / span))


def prefix_reuse(trace: Trace) -> float:
    """Share of prompt tokens whose blocks an earlier request already had (an infinite cache's hit rate)."""
    curve = prefix_reuse_curve(zip(trace.table.column("block_hashes").to_pylist(),
                                   trace.table.column("input_tokens").to_pylist(), strict=True),
                               trace.metadata.block_size)
    return curve[-1] if curve else float("nan")


def sparkline(values: Sequence[float]) -> str:
    """Unicode block characters, the tallest for the largest value (blank-free: zero is the lowest block)."""
    top = max(values, default=0.0)
    if top <= 0:
        return SPARK[0] * len(values)
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] for v in values)


def render_text(summary: TraceSummary) -> str:
    """The human view of ``traffic show``."""
    s = summary
    lines = [f"trace      {s.source}" + ("  (synthesised from aggregates)" if s.synthesized else "")]
    if s.start:
        lines.append(f"window     {s.start} → {s.end or '?'}")
    if s.span_s > 0:
        lines.append(f"requests   {s.requests:,} over {_duration(s.span_s)}, {s.mean_rate:.3g} req/s on average")
        lines.append(f"rate       {s.rate.sparkline}  peak bin {max(s.rate.rates):.3g} req/s "
                     f"(bins of {_duration(s.rate.bin_s)})")
    else:
        lines.append(f"requests   {s.requests:,}, all arriving at one instant (no rate over time)")
    if s.busiest:
        b = s.busiest
        lines.append(f"busiest    {_duration(b.window_s)} from +{_duration(b.start_s)}: {b.requests:,} requests, "
                     f"{b.rate:.3g} req/s ({b.ratio_to_mean:.1f}× the mean)")
    for name, d in (("input", s.input_tokens), ("output", s.output_tokens)):
        lines.append(f"{name:<10} mean {d.mean:,.0f}  p50 {d.p50:,.0f}  p90 {d.p90:,.0f}  p99 {d.p99:,.0f}  "
                     f"max {d.max:,} tokens")
    lines.append(f"prefix     {s.prefix_reuse:.1%} of prompt tokens reusable from earlier requests "
                 f"(infinite cache, blocks of {s.block_size})")
    kinds = ", ".join(f"{k} {v:,}" for k, v in s.kinds.items())
    lines.append(f"kinds      {kinds}")
    if s.sessions:
        lines.append(f"sessions   {s.sessions:,} ({s.requests_in_sessions / s.requests:.0%} of requests, "
                     f"{s.requests_in_sessions / s.sessions:.1f} per session)")
    if s.sampled_share == s.sampled_share:  # not NaN: some requests logged their temperature
        lines.append(f"sampling   {s.sampled_share:.0%} sampled (temperature > 0)")
    if s.requests_with_images:
        lines.append(f"images     {s.requests_with_images:,} requests carry images")
    if s.recording:
        lines.extend(_recording_lines(s.recording))
    if s.breakers:
        lines.append("prefix-cache breakers (volatile content early in shared prompts):")
        for br in s.breakers:
            lines.append(f"  {br.pattern:<9} after {br.label!r:<24} e.g. {br.example!r}: {br.requests:,} requests "
                         f"({br.share_of_requests:.0%}), ~{br.tokens_lost_mean:,.0f} prompt tokens recomputed each, "
                         f"at token {br.position_tokens_median:,.0f} of {br.prompt_tokens_median:,.0f}")
            lines.append(f"            remedy: {br.remedy}")
    if s.notes:
        lines.append(f"notes      {s.notes}")
    return "\n".join(lines)


def _without_nan(value: Any) -> Any:
    """JSON has no NaN: a statistic with no data is null, never 0."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _without_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nan(v) for v in value]
    return value


def _recording_lines(report: Mapping[str, Any]) -> list[str]:
    """What a Prometheus recording saw before the synthesis (see ``recording.RecordingReport``)."""
    def pct(key: str) -> str:
        value = report.get(key)
        return "unknown" if value is None else f"{value:.0%}"

    days = ", ".join(f"{day} {count:,}" for day, count in report.get("busiest_days", [])[:3]) or "none"
    unknown = [f"           unknown: {sentence}" for sentence in report.get("not_recovered", [])]
    return [f"recorded   {report.get('start')} → {report.get('end')} {report.get('selector') or '(all series)'}, "
            f"arrivals from {report.get('arrival_metric')}",
            f"           busiest days {days}; queued {pct('queued_share')} of the time",
            f"           at peak: KV usage {pct('kv_usage_peak')}, Mamba usage {pct('mamba_usage_peak')}; "
            f"prefix hit rate {pct('prefix_hit_rate_observed')}", *unknown]


def _duration(seconds: float) -> str:
    if seconds >= 86_400:
        return f"{seconds / 86_400:.1f} d"
    if seconds >= 3_600:
        return f"{seconds / 3_600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.3g} s"
