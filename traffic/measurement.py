"""``RequestRecord`` and ``RunMeasurement``: what one pass of a workload measured, client side.

Successes and failures are summarised apart. Nothing here fails open: a run with no successful
output raises ``MeasurementFailed`` instead of reporting zeros (a prompt that overflows the pool
otherwise reads as a plausible table of 0.0 tok/s), percentiles of nothing are ``None``,
and a ratio without a denominator is ``None``.

Times in a record are seconds on the generator's monotonic clock, relative to the run's start.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from elsa_tune.errors import MeasurementFailed

SCHEMA_VERSION = 1
# Share of failed requests above which a run is "mostly failed" and is not a measurement.
DEFAULT_MAX_ERROR_FRACTION = 0.5


class Outcome(enum.Enum):
    OK = "ok"
    HTTP_ERROR = "http_error"          # a non-200 status before the stream started
    SERVER_ERROR = "server_error"      # an error object inside the stream, or finish_reason "abort"
    DISCONNECTED = "disconnected"      # the connection closed before ``data: [DONE]``
    TIMEOUT = "timeout"                # connect, first token, inter-token stall or the run's deadline
    CONNECT_ERROR = "connect_error"    # nothing listening, refused, reset before a response
    EMPTY = "empty"                    # a 200 stream that ended without a single token


@dataclass(frozen=True)
class RequestRecord:
    """One request as the client saw it. ``ttft_s``/``end_s`` are ``None`` when the event never came.

    ``output_tokens`` comes from the final ``usage`` chunk (``output_tokens_source == "usage"``) or,
    when the server sent none, from the number of content chunks (``"chunks"``, an undercount under
    speculative decoding). ``itl_s`` holds the gaps between content chunks, one per chunk after the
    first. ``in_flight_at_send`` counts this request.
    """

    index: int
    kind: str
    input_tokens: int                  # what was sent (exact: token ids)
    max_tokens: int                    # what was asked for
    scheduled_s: float | None          # open loop: the arrival it replays; closed loop: None
    sent_s: float
    outcome: Outcome
    ttft_s: float | None = None
    end_s: float | None = None
    output_tokens: int = 0
    output_tokens_source: str = "none"
    chunks: int = 0
    itl_s: tuple[float, ...] = ()
    prompt_tokens_reported: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    status_code: int | None = None
    error: str = ""
    timeout_phase: str | None = None   # "connect" | "first_token" | "stall" | "run_deadline"
    in_flight_at_send: int = 1
    session: str | None = None
    text: str | None = None            # the completion, when the generator was asked to keep it

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def latency_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.sent_s

    @property
    def queue_s(self) -> float | None:
        """Time the request waited on the client (the slot cap) after its scheduled arrival."""
        return None if self.scheduled_s is None else max(0.0, self.sent_s - self.scheduled_s)

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens per second after the first one; ``None`` when it cannot be told (one chunk)."""
        if self.ttft_s is None or self.end_s is None or self.chunks < 2 or self.output_tokens < 2:
            return None
        span = self.end_s - (self.sent_s + self.ttft_s)
        return (self.output_tokens - 1) / span if span > 0 else None

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["outcome"] = self.outcome.value
        data["itl_s"] = list(self.itl_s)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestRecord:
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        kwargs["outcome"] = Outcome(data["outcome"])
        kwargs["itl_s"] = tuple(data.get("itl_s", ()))
        return cls(**kwargs)


@dataclass(frozen=True)
class Percentiles:
    """Linear-interpolated percentiles of a sample; every field is ``None`` for an empty sample."""

    n: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, values: Iterable[float]) -> Percentiles:
        arr = np.fromiter(values, dtype=np.float64)
        if arr.size == 0:
            return cls(0, None, None, None, None, None)
        p50, p90, p99 = (float(v) for v in np.percentile(arr, [50, 90, 99]))
        return cls(int(arr.size), float(arr.mean()), p50, p90, p99, float(arr.max()))


@dataclass(frozen=True)
class ErrorSummary:
    """The failed requests, apart from the successes: counts by outcome and status, partial output."""

    count: int
    by_outcome: Mapping[str, int] = field(default_factory=dict)
    by_status: Mapping[str, int] = field(default_factory=dict)
    by_timeout_phase: Mapping[str, int] = field(default_factory=dict)
    partial_output_tokens: int = 0
    samples: tuple[str, ...] = ()      # the first distinct error texts, for a person

    @classmethod
    def of(cls, failed: Sequence[RequestRecord], *, max_samples: int = 5) -> ErrorSummary:
        samples: list[str] = []
        for rec in failed:
            text = f"{rec.outcome.value}" + (f" {rec.status_code}" if rec.status_code else "") + f": {rec.error}"
            if text not in samples:
                samples.append(text[:300])
            if len(samples) >= max_samples:
                break
        return cls(
            count=len(failed),
            by_outcome=dict(Counter(r.outcome.value for r in failed)),
            by_status=dict(Counter(str(r.status_code) for r in failed if r.status_code is not None)),
            by_timeout_phase=dict(Counter(r.timeout_phase for r in failed if r.timeout_phase)),
            partial_output_tokens=sum(r.output_tokens for r in failed),
            samples=tuple(samples),
        )

    def describe(self) -> str:
        parts = ", ".join(f"{n} {k}" for k, n in sorted(self.by_outcome.items()))
        status = ", ".join(f"HTTP {k}: {n}" for k, n in sorted(self.by_status.items()))
        first = f"; first: {self.samples[0]}" if self.samples else ""
        return f"{self.count} failed ({parts}{'; ' + status if status else ''}){first}"


@dataclass(frozen=True)
class KindSummary:
    """The successes of one content regime (speculative acceptance, hence decode speed, depends on it)."""

    kind: str
    requests_ok: int
    output_tokens: int
    ttft_s: Percentiles
    decode_tok_s: Percentiles


@dataclass(frozen=True)
class RunMeasurement:
    """One pass of a workload against one server. Build it with ``from_records``, which refuses bad runs.

    ``output_throughput_tok_s`` is the successful output tokens over the measurement window (first send
    to last completion), never a sum of per-request speeds (with more clients than slots that sum counts
    waiting requests as speed). ``above_slots`` says whether more requests were in flight
    than the server's running slots; ``None`` when the slots were not known.
    """

    workload_id: str
    pass_index: int
    prompts_id: str
    records: tuple[RequestRecord, ...]
    started_at: float                  # wall clock (epoch seconds)
    ended_at: float
    window_s: float
    requests_total: int
    requests_ok: int
    requests_unsent: int               # never sent because the run's deadline came first
    output_tokens: int
    output_throughput_tok_s: float
    request_throughput_rps: float
    ttft_s: Percentiles
    itl_s: Percentiles
    decode_tok_s: Percentiles
    latency_s: Percentiles
    queue_s: Percentiles
    cached_token_ratio: float | None   # cached / prompt tokens over the successes that reported both
    prompt_token_mismatches: int       # successes whose reported prompt length differs from what was sent
    max_concurrency: int
    concurrency_cap: int | None
    slots: int | None
    above_slots: bool | None
    errors: ErrorSummary
    timed_out: bool = False            # the run's own deadline ended it
    notes: tuple[str, ...] = ()
    # Which server and model answered; the GPU and runtime fingerprint is attached by the caller (history),
    # since traffic/ does not see the runtime.
    server_url: str = ""
    model: str = ""
    # True: every time and rate is in the simulated system's time (``traffic/sim_time.py``), not wall time.
    simulated: bool = False
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord], *, workload_id: str, pass_index: int, prompts_id: str,
                     started_at: float, ended_at: float, slots: int | None, concurrency_cap: int | None,
                     requests_unsent: int = 0, timed_out: bool = False, notes: Sequence[str] = (),
                     max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION, server_url: str = "",
                     model: str = "", simulated: bool = False) -> RunMeasurement:
        """Summarise a pass. Raises ``MeasurementFailed`` when nothing usable came back or most requests failed."""
        ok = [r for r in records if r.ok]
        failed = [r for r in records if not r.ok]
        errors = ErrorSummary.of(failed)
        where = f"workload {workload_id} pass {pass_index}"
        if not records:
            raise MeasurementFailed(f"{where}: no request was sent", remedy="check the workload and the run deadline")
        output = sum(r.output_tokens for r in ok)
        if not ok or output == 0:
            raise MeasurementFailed(f"{where}: no successful output from {len(records)} requests; {errors.describe()}",
                                    remedy="read the server log: an overflowed pool, a crashed server or a wrong "
                                           "endpoint returns errors or nothing, which is not a speed of 0")
        total = len(records) + requests_unsent
        if (len(failed) + requests_unsent) / total > max_error_fraction:
            raise MeasurementFailed(f"{where}: {len(failed)} of {len(records)} requests failed and {requests_unsent} "
                                    f"were never sent; {errors.describe()}",
                                    remedy="a mostly failed run is not a measurement; lower the load, raise the "
                                           "timeouts or fix the server")
        start = min(r.sent_s for r in records)
        end = max(r.end_s if r.end_s is not None else r.sent_s for r in records)
        window = end - start
        if window <= 0:
            raise MeasurementFailed(f"{where}: the measurement window is empty", remedy="use a longer workload")
        max_conc = max(r.in_flight_at_send for r in records)
        cached = [(r.cached_tokens, r.prompt_tokens_reported or r.input_tokens)
                  for r in ok if r.cached_tokens is not None]
        cached_prompt = sum(p for _, p in cached)
        return cls(
            workload_id=workload_id, pass_index=pass_index, prompts_id=prompts_id, records=tuple(records),
            started_at=started_at, ended_at=ended_at, window_s=window, requests_total=total,
            requests_ok=len(ok), requests_unsent=requests_unsent, output_tokens=output,
            output_throughput_tok_s=output / window, request_throughput_rps=len(ok) / window,
            ttft_s=Percentiles.of(r.ttft_s for r in ok if r.ttft_s is not None),
            itl_s=Percentiles.of(g for r in ok for g in r.itl_s),
            decode_tok_s=Percentiles.of(d for r in ok if (d := r.decode_tok_s) is not None),
            latency_s=Percentiles.of(lat for r in ok if (lat := r.latency_s) is not None),
            queue_s=Percentiles.of(q for r in ok if (q := r.queue_s) is not None),
            cached_token_ratio=(sum(c for c, _ in cached) / cached_prompt) if cached_prompt > 0 else None,
            prompt_token_mismatches=sum(1 for r in ok if r.prompt_tokens_reported not in (None, r.input_tokens)),
            max_concurrency=max_conc, concurrency_cap=concurrency_cap, slots=slots,
            above_slots=None if slots is None else max_conc > slots,
            errors=errors, timed_out=timed_out, notes=tuple(notes), server_url=server_url, model=model,
            simulated=simulated,
        )

    def by_kind(self) -> dict[str, KindSummary]:
        """Successes per content regime (``chat``, ``code``, ``tool``, …), derived from the records."""
        kinds: dict[str, list[RequestRecord]] = {}
        for rec in self.records:
            if rec.ok:
                kinds.setdefault(rec.kind, []).append(rec)
        return {kind: KindSummary(kind, len(recs), sum(r.output_tokens for r in recs),
                                  Percentiles.of(r.ttft_s for r in recs if r.ttft_s is not None),
                                  Percentiles.of(d for r in recs if (d := r.decode_tok_s) is not None))
                for kind, recs in sorted(kinds.items())}

    def describe(self) -> str:
        """One line for a log: throughput, TTFT, errors and whether it ran above the slot limit."""

        def ms(v: float | None) -> str:
            return "n/a" if v is None else f"{v * 1000:.0f} ms"

        slots = ("slots unknown" if self.slots is None
                 else f"max {self.max_concurrency} in flight / {self.slots} slots"
                 + (" — ABOVE THE RUNNING LIMIT" if self.above_slots else ""))
        return (f"pass {self.pass_index}: {self.output_throughput_tok_s:,.1f} tok/s, {self.requests_ok}/"
                f"{self.requests_total} ok, TTFT p50 {ms(self.ttft_s.p50)} p99 {ms(self.ttft_s.p99)}, "
                f"ITL p50 {ms(self.itl_s.p50)}, {slots}" + (" (simulated time)" if self.simulated else "")
                + (f"; {self.errors.describe()}" if self.errors.count else ""))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["records"] = [r.to_dict() for r in self.records]
        for name in ("ttft_s", "itl_s", "decode_tok_s", "latency_s", "queue_s"):
            data[name] = vars(getattr(self, name)).copy()
        data["errors"] = {**vars(self.errors), "by_outcome": dict(self.errors.by_outcome),
                          "by_status": dict(self.errors.by_status),
                          "by_timeout_phase": dict(self.errors.by_timeout_phase), "samples": list(self.errors.samples)}
        data["notes"] = list(self.notes)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunMeasurement:
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        kwargs["records"] = tuple(RequestRecord.from_dict(r) for r in data["records"])
        for name in ("ttft_s", "itl_s", "decode_tok_s", "latency_s", "queue_s"):
            kwargs[name] = Percentiles(**data[name])
        err = dict(data["errors"])
        err["samples"] = tuple(err.get("samples", ()))
        kwargs["errors"] = ErrorSummary(**err)
        kwargs["notes"] = tuple(data.get("notes", ()))
        return cls(**kwargs)
