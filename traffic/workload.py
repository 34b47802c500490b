"""``Workload``: a slice of a trace with a replay mode, the thing the load generator runs.

Three ways to derive one from a ``Trace``:

* ``busiest_window(trace, duration_s, compress)`` — the busiest stretch of ``duration_s * compress``
  trace seconds, time-compressed into ``duration_s``, so the bursts keep the shape of the busiest day
  (the load that decides how many running slots pay);
* ``closed_loop(trace, concurrency, n_requests)`` — the trace's requests in order at a fixed number in
  flight;
* ``open_loop(trace, speed)`` — the arrivals replayed as recorded (``speed`` > 1 replays faster).

and two synthetic ones for probes: ``synthetic`` (fixed lengths, optional shared prefix) and
``context_target`` (requests of an exact prompt length, shared with nothing).

Concurrency is never above the server's running slots unless the workload says so
(``allow_above_slots=True``); the generator enforces it and the measurement says when it was not
(above the running limit a load generator that sums per-request speeds over-reports). A workload is
immutable and has a stable ``id`` so both arms of an A/B provably ran the same requests.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

import numpy as np

from elsa_tune.errors import ConfigError, TrafficError
from elsa_tune.traffic.trace import Trace, TraceRequest, prefix_reuse_curve

SCHEMA_VERSION = 1
_MASK64 = (1 << 64) - 1


class ReplayMode(enum.Enum):
    OPEN_LOOP = "open_loop"            # send at the recorded arrival times (scaled)
    CLOSED_LOOP = "closed_loop"        # keep ``concurrency`` requests in flight, in order


@dataclass(frozen=True)
class RequestSpec:
    """One request to send. ``arrival_s`` is the send time in an open loop, ``None`` in a closed loop."""

    index: int
    arrival_s: float | None
    input_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...]
    kind: str = "chat"
    session: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    ignore_eos: bool = True            # force exactly ``output_tokens`` tokens

    def to_list(self) -> list[Any]:
        return [self.index, self.arrival_s, self.input_tokens, self.output_tokens, list(self.block_hashes),
                self.kind, self.session, self.temperature, self.top_p, self.top_k, self.ignore_eos]

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> RequestSpec:
        index, arrival, inp, out, hashes, kind, session, temperature, top_p, top_k, ignore_eos = row
        return cls(index, arrival, inp, out, tuple(hashes), kind, session, temperature, top_p, top_k, ignore_eos)


@dataclass(frozen=True)
class Workload:
    """Request specs plus how to replay them. ``params`` records how it was derived (window, compression…).

    ``concurrency`` is the fixed number in flight for a closed loop and an optional cap for an open
    loop; the generator further caps it at the server's slots unless ``allow_above_slots``.
    """

    mode: ReplayMode
    requests: tuple[RequestSpec, ...]
    block_size: int
    concurrency: int | None = None
    allow_above_slots: bool = False
    source: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if not self.requests:
            raise TrafficError("the workload has no requests", remedy="pick a wider window or a larger trace")
        if self.mode is ReplayMode.CLOSED_LOOP and (self.concurrency is None or self.concurrency < 1):
            raise ConfigError(f"a closed loop needs a concurrency >= 1, got {self.concurrency}",
                              remedy="pass concurrency=N")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {self.concurrency}", remedy="pass a positive cap")
        if self.mode is ReplayMode.OPEN_LOOP and any(r.arrival_s is None for r in self.requests):
            raise TrafficError("an open-loop workload needs an arrival time on every request",
                               remedy="derive it with open_loop() or busiest_window()")
        object.__setattr__(self, "params", MappingProxyType(dict(sorted(self.params.items()))))

    def __len__(self) -> int:
        return len(self.requests)

    @cached_property
    def id(self) -> str:
        """Stable hash of everything that decides what is sent and when (not ``source``/``notes``)."""
        digest = hashlib.sha256()
        head = {"v": self.schema_version, "mode": self.mode.value, "block_size": self.block_size,
                "concurrency": self.concurrency, "allow_above_slots": self.allow_above_slots,
                "params": dict(self.params)}
        digest.update(json.dumps(head, sort_keys=True, default=str).encode())
        for spec in self.requests:
            digest.update(json.dumps(spec.to_list()).encode())
        return digest.hexdigest()[:16]

    def prefix_reuse_curve(self) -> list[float]:
        """After each request, in the order they are sent, the share of the prompt tokens so far an earlier request
        already had (``trace.prefix_reuse_curve``)."""
        return prefix_reuse_curve(((r.block_hashes, r.input_tokens) for r in self.requests), self.block_size)

    @property
    def duration_s(self) -> float | None:
        """Span of the arrivals (open loop); ``None`` for a closed loop, whose length the server decides."""
        if self.mode is ReplayMode.CLOSED_LOOP:
            return None
        return max(r.arrival_s or 0.0 for r in self.requests)

    def kinds(self) -> tuple[str, ...]:
        return tuple(sorted({r.kind for r in self.requests}))

    def describe(self) -> str:
        n_in = sum(r.input_tokens for r in self.requests)
        n_out = sum(r.output_tokens for r in self.requests)
        cap = f", cap {self.concurrency}" if self.concurrency else ""
        how = (f"closed loop at {self.concurrency}" if self.mode is ReplayMode.CLOSED_LOOP
               else f"open loop over {self.duration_s:.1f} s{cap}")
        return (f"workload {self.id}: {len(self)} requests, {how}, {n_in:,} prompt / {n_out:,} output tokens"
                + (", ABOVE SLOTS ALLOWED" if self.allow_above_slots else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "id": self.id, "mode": self.mode.value,
                "block_size": self.block_size, "concurrency": self.concurrency,
                "allow_above_slots": self.allow_above_slots, "source": self.source, "params": dict(self.params),
                "notes": list(self.notes), "requests": [r.to_list() for r in self.requests]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Workload:
        if data.get("schema_version") != SCHEMA_VERSION:
            raise TrafficError(f"workload schema version {data.get('schema_version')}, expected {SCHEMA_VERSION}",
                               remedy="derive the workload again from its trace")
        specs = tuple(RequestSpec.from_list(r) for r in data["requests"])
        workload = cls(mode=ReplayMode(data["mode"]), requests=specs,
                       block_size=data["block_size"], concurrency=data["concurrency"],
                       allow_above_slots=data["allow_above_slots"], source=data.get("source", ""),
                       params=data.get("params", {}), notes=tuple(data.get("notes", ())))
        if "id" in data and data["id"] != workload.id:
            raise TrafficError(f"workload id {data['id']} does not match its content ({workload.id})",
                               remedy="the file was edited or corrupted; derive the workload again")
        return workload


# ---- derivations from a trace --------------------------------------------------------------------


def open_loop(trace: Trace, speed: float = 1.0, *, start_s: float = 0.0, end_s: float | None = None,
              max_requests: int | None = None, concurrency: int | None = None, allow_above_slots: bool = False,
              temperature: float | None = None, ignore_eos: bool = True) -> Workload:
    """Replay the arrivals in ``[start_s, end_s)`` of ``trace``, ``speed`` times faster than recorded."""
    if speed <= 0:
        raise ConfigError(f"speed must be positive, got {speed}", remedy="use e.g. 1.0 (as recorded) or 10 (10x)")
    sliced = trace.window(start_s, trace.duration_s + 1.0 if end_s is None else end_s)
    reqs = list(sliced.requests())[:max_requests]
    specs = _specs(reqs, arrival_scale=1.0 / speed, temperature=temperature, ignore_eos=ignore_eos)
    params = {"start_s": start_s, "end_s": end_s, "speed": speed, "max_requests": max_requests}
    return Workload(ReplayMode.OPEN_LOOP, specs, trace.metadata.block_size, concurrency=concurrency,
                    allow_above_slots=allow_above_slots, source=trace.metadata.source, params=params,
                    notes=_notes(reqs, len(sliced)))


def busiest_window(trace: Trace, duration_s: float, compress: float = 1.0, *, by: str = "requests",
                   max_requests: int | None = None, concurrency: int | None = None, allow_above_slots: bool = False,
                   temperature: float | None = None, ignore_eos: bool = True) -> Workload:
    """The busiest ``duration_s * compress`` seconds of the trace, replayed in ``duration_s``.

    ``by="requests"`` finds the window with the most arrivals, ``by="tokens"`` the one with the most
    prompt + output tokens. ``compress=144`` replays the busiest day in ten minutes with the day's shape.
    """
    if duration_s <= 0 or compress <= 0:
        raise ConfigError(f"duration_s and compress must be positive, got {duration_s} and {compress}",
                          remedy="e.g. duration_s=600, compress=144 for the busiest day in ten minutes")
    if len(trace) == 0:
        raise TrafficError("the trace is empty", remedy="record or import a trace with requests in it")
    span = duration_s * compress
    start, count = _busiest_start(trace, span, by)
    window = trace.window(start, start + span)
    reqs = list(window.requests())[:max_requests]
    specs = _specs(reqs, arrival_scale=1.0 / compress, temperature=temperature, ignore_eos=ignore_eos)
    params = {"window_start_s": start, "window_s": span, "compress": compress, "duration_s": duration_s, "by": by,
              "max_requests": max_requests}
    notes = _notes(reqs, len(window))
    if trace.duration_s < span:
        notes += (f"the trace spans only {trace.duration_s:.0f} s, less than the {span:.0f} s window: all of it is "
                  "replayed",)
    return Workload(ReplayMode.OPEN_LOOP, specs, trace.metadata.block_size, concurrency=concurrency,
                    allow_above_slots=allow_above_slots, source=trace.metadata.source, params=params,
                    notes=(f"busiest window starts at {start:.1f} s with {count:,} {by}", *notes))


def closed_loop(trace: Trace, concurrency: int, n_requests: int, *, start_index: int = 0,
                allow_above_slots: bool = False, temperature: float | None = None,
                ignore_eos: bool = True) -> Workload:
    """``n_requests`` of the trace in arrival order from ``start_index``, ``concurrency`` in flight.

    When the trace is shorter it is cycled; each cycle's block hashes are remapped so that cycles
    share nothing with each other while each keeps the trace's own prefix structure.
    """
    if n_requests < 1:
        raise ConfigError(f"n_requests must be >= 1, got {n_requests}", remedy="ask for at least one request")
    if len(trace) == 0:
        raise TrafficError("the trace is empty", remedy="record or import a trace with requests in it")
    all_reqs = list(trace.requests())
    picked: list[TraceRequest] = []
    position = start_index % len(all_reqs)
    cycle = 0
    while len(picked) < n_requests:
        req = all_reqs[position]
        if cycle:
            req = TraceRequest(req.arrival_s, req.input_tokens, req.output_tokens,
                               tuple(_remap(h, cycle) for h in req.block_hashes), req.session, req.kind,
                               req.temperature, req.top_p, req.top_k, req.images)
        picked.append(req)
        position += 1
        if position == len(all_reqs):
            position, cycle = 0, cycle + 1
    specs = _specs(picked, arrival_scale=None, temperature=temperature, ignore_eos=ignore_eos)
    params = {"start_index": start_index, "n_requests": n_requests}
    notes = _notes(picked, len(picked))
    if cycle and n_requests > len(all_reqs):
        notes += (f"the trace has {len(all_reqs)} requests; it was cycled with fresh prefixes per cycle",)
    return Workload(ReplayMode.CLOSED_LOOP, specs, trace.metadata.block_size, concurrency=concurrency,
                    allow_above_slots=allow_above_slots, source=trace.metadata.source, params=params, notes=notes)


# ---- synthetic workloads for probes --------------------------------------------------------------


def synthetic(n_requests: int, input_tokens: int, output_tokens: int, concurrency: int, *,
              shared_prefix_tokens: int = 0, block_size: int = 512, kind: str = "chat",
              temperature: float | None = None, top_k: int | None = None, allow_above_slots: bool = False,
              ignore_eos: bool = True, tag: str = "synthetic") -> Workload:
    """Closed loop of identical-length requests. They share ``shared_prefix_tokens`` (rounded down to
    whole blocks) and nothing else; ``tag`` keeps workloads with different purposes from sharing blocks."""
    if n_requests < 1 or input_tokens < 1 or output_tokens < 1:
        raise ConfigError("n_requests, input_tokens and output_tokens must all be >= 1",
                          remedy="pass positive sizes")
    n_blocks = -(-input_tokens // block_size)
    n_shared = min(shared_prefix_tokens // block_size, input_tokens // block_size)
    base = _tag_key(tag)
    shared = tuple(_remap(base, i) for i in range(n_shared))
    specs = tuple(
        RequestSpec(index=i, arrival_s=None, input_tokens=input_tokens, output_tokens=output_tokens,
                    block_hashes=shared + tuple(_remap(base ^ (i + 1), n_shared + j + 1)
                                                for j in range(n_blocks - n_shared)),
                    kind=kind, temperature=temperature, top_k=top_k, ignore_eos=ignore_eos)
        for i in range(n_requests))
    params = {"tag": tag, "input_tokens": input_tokens, "output_tokens": output_tokens,
              "shared_prefix_tokens": n_shared * block_size, "n_requests": n_requests}
    return Workload(ReplayMode.CLOSED_LOOP, specs, block_size, concurrency=concurrency,
                    allow_above_slots=allow_above_slots, source=tag, params=params)


def context_target(input_tokens: int, output_tokens: int = 1, *, n_requests: int = 1, concurrency: int = 1,
                   block_size: int = 512, kind: str = "chat", temperature: float | None = None) -> Workload:
    """``n_requests`` prompts of exactly ``input_tokens`` tokens sharing nothing: a context-length probe."""
    return synthetic(n_requests, input_tokens, output_tokens, concurrency, block_size=block_size, kind=kind,
                     temperature=temperature, tag=f"context-target-{input_tokens}")


# ---- internals -----------------------------------------------------------------------------------


def _specs(reqs: Iterable[TraceRequest], *, arrival_scale: float | None, temperature: float | None,
           ignore_eos: bool) -> tuple[RequestSpec, ...]:
    return tuple(
        RequestSpec(index=i, arrival_s=None if arrival_scale is None else r.arrival_s * arrival_scale,
                    input_tokens=r.input_tokens, output_tokens=r.output_tokens, block_hashes=r.block_hashes,
                    kind=r.kind, session=r.session, temperature=r.temperature if r.temperature is not None
                    else temperature, top_p=r.top_p, top_k=r.top_k, ignore_eos=ignore_eos)
        for i, r in enumerate(reqs))


def _notes(reqs: Sequence[TraceRequest], available: int) -> tuple[str, ...]:
    notes: list[str] = []
    if len(reqs) < available:
        notes.append(f"capped at {len(reqs)} of {available} requests")
    with_images = [r.images for r in reqs if r.images]
    if with_images:
        notes.append(f"{len(with_images)} requests carried {sum(with_images)} images; only their text is replayed")
    return tuple(notes)


def _busiest_start(trace: Trace, span: float, by: str) -> tuple[float, int]:
    arrivals = trace.arrivals()
    if by == "requests":
        weights = np.ones(arrivals.size, dtype=np.int64)
    elif by == "tokens":
        weights = (trace.column("input_tokens").astype(np.int64) + trace.column("output_tokens").astype(np.int64))
    else:
        raise ConfigError(f"busiest by {by!r}?", remedy="use by='requests' or by='tokens'")
    cum = np.concatenate([[0], np.cumsum(weights)])
    ends = np.searchsorted(arrivals, arrivals + span, side="left")
    totals = cum[ends] - cum[np.arange(arrivals.size)]
    best = int(np.argmax(totals))
    return float(arrivals[best]), int(totals[best])


def _remap(block_hash: int, salt: int) -> int:
    """splitmix64 of (hash, salt) as a signed int64, like the trace's own hashes."""
    z = ((block_hash & _MASK64) + 0x9E3779B97F4A7C15 * (salt + 1)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return z - (1 << 64) if z >= 1 << 63 else z


def _tag_key(tag: str) -> int:
    return int.from_bytes(hashlib.sha256(tag.encode()).digest()[:8], "little")
