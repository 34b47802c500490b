"""Recording traffic from token counters alone: a server with no request counter and no length histograms.

llama.cpp's ``llama-server`` exports token counters and two gauges, nothing per request. What they give:

- **Token rates.** Prompt tokens per step are the processed ones plus those reused from the prefix cache (the
  processed counter excludes them; where the runtime's prompt counter counts them too, as vLLM's, it alone);
  generation tokens per step from their own counter. A counter absent under its name is read under the name an
  older version of the runtime gave it (``TokenSeries.renamed``), with a note.
- **Arrivals.** Requests per step are the generation tokens of the step divided by the mean output length the
  user gives, rounded at random and placed uniformly inside the step (``recording._arrivals``). The counter grows
  when a request finishes, so the arrivals lag by each request's time in the server. The prompt tokens divided
  by the given mean input length count the requests a second way; the report gives the disagreement, and the
  mean prompt length the series imply if the first count is right.
- **Lengths.** Exponential around the two given means: the series hold no distribution.
- **Prefix reuse.** Cached ÷ all prompt tokens; the trace shares prefixes to that rate (``shared_prefix_blocks``).
- **Concurrency and queue, draft acceptance.** The running and waiting gauges, accepted ÷ drafted tokens: measured
  and reported, not imposed on the trace. Little's law turns the mean in flight and the derived arrival rate
  into a mean time in the server; no latency is measured.

Series names come from the caller (``runtime.family.MetricNames`` fits ``TokenSeries``): this module names none.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import NoReturn, Protocol

import numpy as np
import numpy.typing as npt

from elsa_tune.errors import TrafficError
from elsa_tune.traffic.prometheus import Grid, PrometheusClient, counter_increments, selector_matchers
from elsa_tune.traffic.prometheus import with_matchers as sel
from elsa_tune.traffic.recording import (
    RecordWindow,
    _arrivals,
    _finite,
    _gauge,
    _iso,
    _num,
    _num1,
    _pct,
    _per_period,
    _share_positive,
    _stat,
    _step_note,
    _synthesised,
    _with_provenance,
    exponential_lengths,
)
from elsa_tune.traffic.summary import prefix_reuse
from elsa_tune.traffic.trace import DEFAULT_BLOCK_SIZE, Trace

REPORT_VERSION = 1
#: Within this relative difference the two counts of requests (generation and prompt tokens) agree.
LENGTHS_AGREE = 0.15


class TokenSeries(Protocol):
    """The series a token recording reads, under elsa-tune's names; ``None`` where the server exports none."""

    @property
    def prefix(self) -> str: ...
    @property
    def prompt_tokens(self) -> str | None: ...
    @property
    def generation_tokens(self) -> str | None: ...
    @property
    def cached_prompt_tokens(self) -> str | None: ...
    @property
    def running(self) -> str | None: ...
    @property
    def waiting(self) -> str | None: ...
    @property
    def spec_draft_tokens(self) -> str | None: ...
    @property
    def spec_accepted_tokens(self) -> str | None: ...
    @property
    def missing(self) -> str: ...
    @property
    def renamed(self) -> Mapping[str, str]: ...
    @property
    def prompt_includes_cached(self) -> bool: ...


@dataclass(frozen=True)
class GivenLengths:
    """The mean prompt and output lengths, in tokens, that the user gives where the series carry none."""

    mean_input_tokens: float
    mean_output_tokens: float

    def __post_init__(self) -> None:
        for flag, value in (("--mean-input-tokens", self.mean_input_tokens),
                            ("--mean-output-tokens", self.mean_output_tokens)):
            if not (math.isfinite(value) and value >= 1):
                raise TrafficError(f"{flag} must be a number of tokens of at least 1, got {value:g}",
                                   remedy=f"pass {flag} N with the mean length of your requests, e.g. {flag} 800")


@dataclass(frozen=True)
class TokenRecordingReport:
    """What the token counters and gauges said, what was derived from them with the given means, and what no
    series says. Token totals are over the window; rates are per second, the peak over one step."""

    runtime: str
    prometheus: str
    selector: str
    start: str
    end: str
    step_s: float
    arrival_metric: str
    mean_input_tokens_given: float
    mean_output_tokens_given: float
    prompt_tokens: float  # processed + cached
    cached_prompt_tokens: float | None
    generation_tokens: float
    prompt_tokens_per_s: float
    prompt_tokens_per_s_peak: float
    generation_tokens_per_s: float
    generation_tokens_per_s_peak: float
    requests_observed: float  # generation tokens / the given mean output length
    requests_from_prompt: float  # prompt tokens / the given mean input length
    prompt_mean_implied: float  # prompt tokens / requests_observed
    requests_synthesized: int
    busiest_days: tuple[tuple[str, int], ...]
    busiest_hour: tuple[str, int] | None
    queued_share: float | None
    running_max: float | None
    running_mean: float | None
    queue_max: float | None
    concurrency_mean_observed: float | None
    time_in_server_implied_s: float | None  # Little's law: mean in flight / derived arrival rate
    prefix_hit_rate_observed: float | None
    prefix_reuse_synthesized: float
    draft_acceptance: float | None
    prompt_mean_synthesized: float
    output_mean_synthesized: float
    recovered: tuple[str, ...]
    assumed: tuple[str, ...]
    not_recovered: tuple[str, ...]
    notes: tuple[str, ...] = ()
    schema_version: int = REPORT_VERSION

    @property
    def lengths_disagreement(self) -> float:
        """How far the prompt tokens' count of requests is from the generation tokens' (0: they agree)."""
        return self.requests_from_prompt / self.requests_observed - 1.0

    def to_json(self) -> str:
        return json.dumps(_finite(asdict(self)), sort_keys=True)

    def lines(self) -> list[str]:
        """The human summary ``elsa-tune record`` prints: numbers first, then the sentences."""
        days = ", ".join(f"{day} {n:,}" for day, n in self.busiest_days[:3]) or "none"
        out = [f"recorded   {self.start} → {self.end} from {self.prometheus} {self.selector or '(all series)'}, "
               f"{self.runtime}'s series",
               f"tokens     prompt {self.prompt_tokens_per_s:,.1f}/s (peak {self.prompt_tokens_per_s_peak:,.0f}/s), "
               f"{_pct(self.prefix_hit_rate_observed)} from the prefix cache; generation "
               f"{self.generation_tokens_per_s:,.1f}/s (peak {self.generation_tokens_per_s_peak:,.0f}/s)",
               f"requests   {self.requests_synthesized:,} synthesised from {self.arrival_metric} "
               f"({self.requests_observed:,.0f} derived; the prompt tokens give {self.requests_from_prompt:,.0f})",
               f"busiest    days: {days}"]
        if self.busiest_hour:
            out.append(f"           hour: {self.busiest_hour[0]} with {self.busiest_hour[1]:,} requests")
        out.append(f"queued     {_pct(self.queued_share)} of the time with requests waiting; running max "
                   f"{_num(self.running_max)}, mean {_num1(self.running_mean)}; queue max {_num(self.queue_max)}")
        out.append(f"in flight  {_num1(self.concurrency_mean_observed)} on average (running + waiting); mean time in "
                   f"the server {_num1(self.time_in_server_implied_s)} s (Little's law with the derived arrivals)")
        out.append(f"drafts     {_pct(self.draft_acceptance)} of drafted tokens accepted")
        out.append(f"lengths    prompt mean {self.mean_input_tokens_given:,.0f} given → "
                   f"{self.prompt_mean_synthesized:,.0f}, output mean {self.mean_output_tokens_given:,.0f} given → "
                   f"{self.output_mean_synthesized:,.0f} (exponential)")
        for label, sentences in (("recovered", self.recovered), ("assumed", self.assumed),
                                 ("unknown", self.not_recovered), ("note", self.notes)):
            out.extend(f"{label if i == 0 else '':<10} {sentence}" for i, sentence in enumerate(sentences))
        return out


@dataclass(frozen=True)
class TokenRecording:
    trace: Trace
    report: TokenRecordingReport


def holds_series(client: PrometheusClient, window: RecordWindow, prefix: str, *, now: float | None = None) -> bool:
    """Whether Prometheus holds a series named ``prefix…`` under the window's selector inside the window."""
    checked = window.checked(time.time() if now is None else now)
    name = f'__name__=~"{re.escape(prefix)}.+"'
    query = f"count(last_over_time({sel('', name, selector_matchers(window.selector))}"
    rows = client.query(f"{query}[{round(checked.end - checked.start)}s]))", checked.end)
    return bool(rows) and rows[0][1] > 0


def record_tokens(client: PrometheusClient, window: RecordWindow, series: TokenSeries, lengths: GivenLengths, *,
                  runtime: str, seed: int = 0, scale: float = 1.0, block_size: int = DEFAULT_BLOCK_SIZE,
                  now: float | None = None, notes: Sequence[str] = ()) -> TokenRecording:
    """Query ``series`` over ``window`` and synthesise a trace whose token rates match them, with arrivals and
    lengths from the given means (see the module). Nothing is written."""
    window = window.checked(time.time() if now is None else now)
    if scale <= 0:
        raise TrafficError(f"--scale must be positive, got {scale}", remedy="use e.g. --scale 0.1 to thin traffic")
    if series.generation_tokens is None or series.prompt_tokens is None:
        raise TrafficError(f"{runtime}'s series have no token counters to record from",
                           remedy="record it with --runtime set to a runtime that exports them")
    assert window.step is not None   # checked() chose it
    grid = Grid.spanning(window.start, window.end, window.step)
    matchers = selector_matchers(window.selector)
    client.query("vector(1)", window.end)  # reachability and a sane answer, before anything else
    rng = np.random.default_rng(seed)
    found = list(notes)
    generated = _increments(client, series.generation_tokens, matchers, grid, series.renamed, found)
    if generated is None:
        _explain_absent(client, series.generation_tokens, window)
    processed = _increments(client, series.prompt_tokens, matchers, grid, series.renamed, found)
    cached = _increments(client, series.cached_prompt_tokens, matchers, grid, series.renamed, found)
    prompt = (processed if processed is not None else np.zeros(grid.points)) + (
        cached if cached is not None and not series.prompt_includes_cached else 0.0)
    requests = generated / lengths.mean_output_tokens
    metric = f"{series.generation_tokens} ÷ {lengths.mean_output_tokens:g} tokens"
    step_note = _step_note(client, sel(series.generation_tokens, matchers), generated, grid)
    if step_note:
        found.append(step_note)
    arrivals, _ = _arrivals(requests * scale, grid, rng, series.generation_tokens, window)
    prompts = exponential_lengths(lengths.mean_input_tokens, len(arrivals), rng)
    outputs = exponential_lengths(lengths.mean_output_tokens, len(arrivals), rng)
    hit = float(cached.sum() / prompt.sum()) if cached is not None and prompt.sum() > 0 else None
    trace = _synthesised(client.url, window, arrivals, prompts, outputs, hit, block_size, rng,
                         "synthesised from Prometheus token counters: token rates and prefix reuse match the series; "
                         "arrivals are generation tokens ÷ the given mean output length, lengths are drawn around "
                         "the given means; individual requests are samples")
    observed = _Observed(grid=grid, generated=generated, prompt=prompt, cached=cached, requests=requests,
                         running=_gauge(client, "sum", series.running, matchers, grid) if series.running else None,
                         waiting=_gauge(client, "sum", series.waiting, matchers, grid) if series.waiting else None,
                         acceptance=_acceptance(client, series, matchers, grid))
    report = _report(client.url, window, series, lengths, runtime, metric, observed, trace, hit, found)
    provenance = (f"elsa-tune record --prometheus {client.url} --runtime {runtime} "
                  f"--mean-input-tokens {lengths.mean_input_tokens:g} "
                  f"--mean-output-tokens {lengths.mean_output_tokens:g}")
    return TokenRecording(trace=_with_provenance(trace, window, seed, scale, report.to_json(), provenance),
                          report=report)


@dataclass(frozen=True)
class _Observed:
    """The series on the grid: token increments per step, derived requests per step, the gauges."""

    grid: Grid
    generated: npt.NDArray[np.float64]
    prompt: npt.NDArray[np.float64]  # processed + cached
    cached: npt.NDArray[np.float64] | None
    requests: npt.NDArray[np.float64]
    running: npt.NDArray[np.float64] | None
    waiting: npt.NDArray[np.float64] | None
    acceptance: float | None


def _increments(client: PrometheusClient, name: str | None, matchers: str, grid: Grid,
                renamed: Mapping[str, str] | None = None,
                notes: list[str] | None = None) -> npt.NDArray[np.float64] | None:
    """Per-step increments of the counter ``name`` summed over its series; ``None`` when it has none. Without a
    series under ``name``, the older names ``renamed`` maps to it are tried, and the one read goes into ``notes``."""
    if name is None:
        return None
    older = [old for old, new in (renamed or {}).items() if new == name]
    for candidate in (name, *older):
        found = client.query_range(sel(candidate, matchers), grid)
        if found:
            if candidate != name and notes is not None:
                notes.append(f"no {name} in the window: read {candidate}, its name in older versions")
            return counter_increments(found)
    return None


def _explain_absent(client: PrometheusClient, name: str, window: RecordWindow) -> NoReturn:
    """Raise the error for a window without the generation counter: the selector, or no data at all."""
    where = f"between {_iso(window.start)} and {_iso(window.end)}"
    span = f"{round(window.end - window.start)}s"
    if window.selector:
        others = client.query(f"count by (job, instance) (last_over_time({name}[{span}]))", window.end)
        if others:
            labels = "; ".join(", ".join(f'{k}="{v}"' for k, v in sorted(found.items())) or "(no labels)"
                               for found, _ in others[:5])
            raise TrafficError(f"the selector {window.selector} matches no {name} {where}; it exists with: {labels}",
                               remedy="pass a --selector that matches one of them, e.g. '{job=\"<job above>\"}'")
    raise TrafficError(f"no {name} {where}",
                       remedy="start the server with --metrics, make Prometheus scrape its /metrics, and record a "
                              "window (--since/--start/--end) in which it served requests")


def _acceptance(client: PrometheusClient, series: TokenSeries, matchers: str, grid: Grid) -> float | None:
    """Accepted ÷ drafted tokens over the window; ``None`` without draft counters or drafts."""
    drafted = _increments(client, series.spec_draft_tokens, matchers, grid)
    accepted = _increments(client, series.spec_accepted_tokens, matchers, grid)
    if drafted is None or accepted is None or drafted.sum() <= 0:
        return None
    return float(accepted.sum() / drafted.sum())


def _report(url: str, window: RecordWindow, series: TokenSeries, lengths: GivenLengths, runtime: str, metric: str,
            seen: _Observed, trace: Trace, hit: float | None, notes: list[str]) -> TokenRecordingReport:
    grid = seen.grid
    span = window.end - window.start
    in_flight = (seen.running + np.nan_to_num(seen.waiting) if seen.running is not None and seen.waiting is not None
                 else seen.running)
    covered = ~np.isnan(in_flight) if in_flight is not None else np.ones(grid.points, dtype=bool)
    rate = float(seen.requests[covered].mean()) / grid.step if covered.any() else 0.0
    concurrency = _stat(in_flight, np.nanmean)
    requests = float(seen.requests.sum())
    from_prompt = float(seen.prompt.sum()) / lengths.mean_input_tokens
    implied_prompt = float(seen.prompt.sum()) / requests
    acceptance = seen.acceptance
    return TokenRecordingReport(
        runtime=runtime, prometheus=url, selector=window.selector, start=_iso(window.start), end=_iso(window.end),
        step_s=grid.step, arrival_metric=metric, mean_input_tokens_given=lengths.mean_input_tokens,
        mean_output_tokens_given=lengths.mean_output_tokens, prompt_tokens=float(seen.prompt.sum()),
        cached_prompt_tokens=float(seen.cached.sum()) if seen.cached is not None else None,
        generation_tokens=float(seen.generated.sum()), prompt_tokens_per_s=float(seen.prompt.sum()) / span,
        prompt_tokens_per_s_peak=float(seen.prompt.max()) / grid.step,
        generation_tokens_per_s=float(seen.generated.sum()) / span,
        generation_tokens_per_s_peak=float(seen.generated.max()) / grid.step, requests_observed=requests,
        requests_from_prompt=from_prompt, prompt_mean_implied=implied_prompt, requests_synthesized=len(trace),
        busiest_days=tuple(_per_period(grid, seen.requests, "%Y-%m-%d")[:5]),
        busiest_hour=next(iter(_per_period(grid, seen.requests, "%Y-%m-%dT%H:00Z")), None),
        queued_share=_share_positive(seen.waiting), running_max=_stat(seen.running, np.nanmax),
        running_mean=_stat(seen.running, np.nanmean), queue_max=_stat(seen.waiting, np.nanmax),
        concurrency_mean_observed=concurrency,
        time_in_server_implied_s=concurrency / rate if concurrency is not None and rate > 0 else None,
        prefix_hit_rate_observed=hit, prefix_reuse_synthesized=prefix_reuse(trace), draft_acceptance=acceptance,
        prompt_mean_synthesized=float(trace.column("input_tokens").mean()),
        output_mean_synthesized=float(trace.column("output_tokens").mean()),
        recovered=_recovered(series, seen, hit), assumed=_assumed(series, lengths, requests, from_prompt,
                                                                  implied_prompt),
        not_recovered=_not_recovered(series, seen), notes=tuple(notes))


def _recovered(series: TokenSeries, seen: _Observed, hit: float | None) -> tuple[str, ...]:
    """What the series say, in sentences."""
    prompt = " + ".join(name for name in (series.prompt_tokens, series.cached_prompt_tokens) if name)
    out = [f"Prompt and generation token rates, step by step, from {prompt} and {series.generation_tokens}."]
    gauges = [name for name, values in ((series.running, seen.running), (series.waiting, seen.waiting))
              if name and values is not None]
    if gauges:
        out.append(f"Concurrency and queueing over time from {' and '.join(gauges)}.")
    if hit is not None:
        out.append(f"Prefix-cache hits: {hit:.0%} of prompt tokens came from the cache ({series.cached_prompt_tokens} "
                   "÷ all prompt tokens); the trace shares prefixes to that rate.")
    if seen.acceptance is not None:
        out.append(f"Draft acceptance: {seen.acceptance:.0%} of drafted tokens were accepted "
                   f"({series.spec_accepted_tokens} ÷ {series.spec_draft_tokens}).")
    return tuple(out)


def _assumed(series: TokenSeries, lengths: GivenLengths, requests: float, from_prompt: float,
             implied_prompt: float) -> tuple[str, ...]:
    """What was derived from the given means, in sentences, with the check of one mean against the other."""
    gap = from_prompt / requests - 1.0
    verdict = ("the given means agree with the series" if abs(gap) <= LENGTHS_AGREE else
               "the given means disagree with the series: check --mean-input-tokens and --mean-output-tokens, "
               "since one of them is off by about that factor if the other is right")
    return (f"Request arrivals are {series.generation_tokens} per step ÷ the given mean output length "
            f"({lengths.mean_output_tokens:g} tokens); the counter grows when a request finishes, so arrivals lag by "
            "each request's time in the server.",
            f"Prompt tokens ÷ the given mean input length ({lengths.mean_input_tokens:g} tokens) count "
            f"{from_prompt:,.0f} requests against {requests:,.0f} ({gap:+.0%}); with the derived arrivals the mean "
            f"prompt is {implied_prompt:,.0f} tokens: {verdict}.",
            f"Prompt and output lengths are exponential around the given means ({lengths.mean_input_tokens:g} and "
            f"{lengths.mean_output_tokens:g} tokens): their distributions are not in the series.")


def _not_recovered(series: TokenSeries, seen: _Observed) -> tuple[str, ...]:
    """What no series says, in sentences: the family's own account, then what this window lacked."""
    out = [series.missing.rstrip(".") + "."] if series.missing else []
    out.append("The mean time in the server is Little's law applied to the derived arrivals, not a measured latency.")
    if seen.running is None:
        out.append(f"Concurrency is unknown: no {series.running or 'running-requests gauge'} in the window.")
    if seen.waiting is None:
        out.append(f"Queueing is unknown: no {series.waiting or 'waiting-requests gauge'} in the window.")
    if seen.cached is None:
        out.append("Prefix reuse is unknown (no cached-token counter), so the trace shares no prefixes.")
    if seen.acceptance is None:
        out.append("Draft acceptance is unknown: no speculative decoding ran in the window"
                   + ("." if series.spec_draft_tokens else " (the server exports no draft counters)."))
    return tuple(out)
