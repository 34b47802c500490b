"""The replay load generator: asyncio + one httpx ``AsyncClient``, streaming ``/v1/completions``.

``LoadGenerator(base_url, prompts, slots=...).run(workload, pass_index)`` sends the workload's requests
in a fixed order with token-id prompts from ``PromptSynth`` (so both arms of an A/B send byte-identical
requests), parses the server-sent events itself, and returns a ``RunMeasurement``.

What it guarantees:

* In flight never exceeds the server's running slots (``slots``, from the BootReport's
  ``max_running_requests``) unless the workload allows it; the measurement says when it did.
* Exact lengths: prompts are token ids, ``max_tokens`` with ``ignore_eos`` forces the output length,
  ``stream_options.include_usage`` returns the server's own token counts (chunk counts otherwise).
* Every wait has a deadline: connect, first token, inter-token stall, the whole run. A request that
  fails is a record with its outcome, status, error text and partial tokens; a run that is empty or
  mostly failed raises ``MeasurementFailed`` (``RunMeasurement.from_records``).
* Passes on one boot get fresh prompts with the same prefix structure (``pass_index`` salts the
  synthesis), so a warm-up pass does not turn the measured pass into prefix-cache hits.
* Client timing is honest: TTFT runs from when the request's bytes were handed to the socket (the
  transport stamps it), bodies are built and connections opened before the clock starts, and
  throughput is output tokens over the window, never a sum of per-request speeds.
* Cancelling ``run`` cancels every request and closes every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from elsa_tune.errors import ConfigError, MeasurementFailed
from elsa_tune.traffic.measurement import DEFAULT_MAX_ERROR_FRACTION, Outcome, RequestRecord, RunMeasurement
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.traffic.sim_time import (
    ACK_HEADER,
    ACK_PATH,
    CLOCK_PATH,
    FOLLOW_UP_HEADER,
    FOLLOWS_HEADER,
    SENT_AT_HEADER,
    SIM_AT_HEADER,
    SimTime,
)
from elsa_tune.traffic.sse import CompletionStream
from elsa_tune.traffic.transport import SENT_AT, StreamingTransport
from elsa_tune.traffic.workload import ReplayMode, RequestSpec, Workload

log = logging.getLogger(__name__)

COMPLETIONS_PATH = "/v1/completions"
_MASK64 = (1 << 64) - 1
_JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class Timeouts:
    """Seconds. ``first_token_s`` runs from the send to the first content chunk (connect included);
    ``stall_s`` is the longest silence allowed after it; ``run_s`` bounds the whole pass."""

    connect_s: float = 10.0
    first_token_s: float = 300.0
    stall_s: float = 60.0
    run_s: float = 3600.0


@dataclass(frozen=True)
class LoadgenSettings:
    timeouts: Timeouts = field(default_factory=Timeouts)
    max_in_flight: int = 512               # hard bound when neither the workload nor the slots cap it
    max_requests: int = 200_000            # a workload larger than this is refused, not truncated
    max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION
    fresh_prompts_per_pass: bool = True
    model: str | None = None               # None: ask ``/v1/models`` once per run
    error_body_bytes: int = 2000           # how much of an error response is kept
    # "streaming": elsa-tune's lean HTTP/1.1 transport (traffic/transport.py); "httpx": httpx's default
    # (httpcore + h11), 3-7x more CPU per streamed token (benchmarks/loadgen). Both are httpx.AsyncClient.
    http_transport: str = "streaming"
    # Request bodies are built before the clock starts while their prompts total at most this many
    # tokens (about 6 bytes each in memory); later ones are built just before they are sent.
    prebuild_tokens: int = 4_000_000
    # Header naming each request's content regime (its trace ``kind``) for the simulated runtime, whose
    # speculative acceptance depends on it; real SGLang ignores unknown headers. None: not sent.
    regime_header: str | None = "x-sim-regime"
    # Keep each response's text on its record (to bootstrap a real-text corpus from a baseline's outputs:
    # ``CorpusTokens.from_outputs``). Costs a JSON parse per chunk.
    keep_text: bool = False


class LoadGenerator:
    """Replays workloads against one OpenAI-compatible server (SGLang's ``/v1/completions``).

    ``slots`` is the server's effective running-request limit; ``None`` when unknown (the measurement
    then cannot say whether it ran above the limit, and says so). ``transport_factory(cap)`` builds a
    custom httpx transport for each run (the client closes it at the end of the run); by default
    ``settings.http_transport`` decides.
    """

    def __init__(self, base_url: str, prompts: PromptSynth, *, slots: int | None,
                 settings: LoadgenSettings | None = None,
                 transport_factory: Callable[[int], httpx.AsyncBaseTransport] | None = None) -> None:
        if slots is not None and slots < 1:
            raise ConfigError(f"slots must be >= 1 or None, got {slots}",
                              remedy="pass the BootReport's max_running_requests")
        self.base_url = base_url.rstrip("/")
        self.prompts = prompts
        self.slots = slots
        self.settings = settings or LoadgenSettings()
        if self.settings.http_transport not in ("streaming", "httpx"):
            raise ConfigError(f"unknown http_transport {self.settings.http_transport!r}",
                              remedy="use 'streaming' (default) or 'httpx'")
        self._transport_factory = transport_factory

    def concurrency_cap(self, workload: Workload) -> tuple[int, tuple[str, ...]]:
        """The most requests this run will keep in flight, and notes on how it was decided."""
        notes: list[str] = []
        if workload.mode is ReplayMode.CLOSED_LOOP:
            assert workload.concurrency is not None  # Workload validates it
            want = workload.concurrency
        else:
            want = workload.concurrency or self.settings.max_in_flight
        cap = want
        if self.slots is None:
            notes.append("server slots unknown: concurrency was not checked against the running limit")
        elif want > self.slots:
            if workload.allow_above_slots:
                notes.append(f"workload allows {want} in flight above the server's {self.slots} slots")
            else:
                cap = self.slots
                notes.append(f"concurrency capped at the server's {self.slots} slots (workload asked {want})")
        if cap > self.settings.max_in_flight:
            cap = self.settings.max_in_flight
            notes.append(f"concurrency capped at the generator's max_in_flight {cap}")
        return cap, tuple(notes)

    def measure(self, workload: Workload, pass_index: int) -> RunMeasurement:
        """Blocking ``run`` for callers without an event loop."""
        return asyncio.run(self.run(workload, pass_index))

    async def run(self, workload: Workload, pass_index: int) -> RunMeasurement:
        """One pass of ``workload``. Raises ``MeasurementFailed`` when the pass is not a measurement."""
        if workload.block_size != self.prompts.block_size:
            raise ConfigError(f"workload block size {workload.block_size} != prompt synthesiser's "
                              f"{self.prompts.block_size}", remedy="build PromptSynth with the trace's block_size")
        if len(workload) > self.settings.max_requests:
            raise ConfigError(f"workload has {len(workload):,} requests, more than max_requests "
                              f"{self.settings.max_requests:,}", remedy="cap it (max_requests=) or raise the bound")
        cap, notes = self.concurrency_cap(workload)
        t = self.settings.timeouts
        limits = httpx.Limits(max_connections=cap, max_keepalive_connections=cap)
        timeout = httpx.Timeout(connect=t.connect_s, read=None, write=t.stall_s, pool=None)
        salt = pass_index if self.settings.fresh_prompts_per_pass else 0
        for kind in workload.kinds():   # a corpus without this regime fails here, before anything is sent
            self.prompts.prompt_array((), 1, unique_key=0, kind=kind)
        transport: httpx.AsyncBaseTransport | None = None
        if self._transport_factory is not None:
            transport = self._transport_factory(cap)
        elif self.settings.http_transport == "streaming":
            transport = StreamingTransport(max_connections=cap)
        async with httpx.AsyncClient(base_url=self.base_url, limits=limits, timeout=timeout,
                                     transport=transport) as client:
            model = self.settings.model or await self._model(client)
            clock = await self._sim_time(client)
            run = _Run(self, client, workload, salt, model, clock)
            run.prebuild(self.settings.prebuild_tokens)
            if isinstance(transport, StreamingTransport):
                await transport.preconnect(self.base_url, min(cap, len(workload)), t.connect_s)
            started_at = time.time()
            timed_out = False
            try:
                async with asyncio.timeout(t.run_s):
                    await run.drive(cap)
            except TimeoutError:
                timed_out = True
            ended_at = time.time()
        records = [r for r in run.records if r is not None]
        if clock is not None:
            clock = await self._clock_knots(clock, run.t0)
            records = [clock.record(r, run.t0, run.sim0, run.sent_sim.get(r.index)) for r in records]
            notes += (clock.describe(),)
        if timed_out:
            notes += (f"the run deadline ({t.run_s:.0f} s) ended the pass",)
            log.warning("workload %s pass %d: run deadline after %.0f s; %d requests never sent",
                        workload.id, pass_index, t.run_s, len(workload) - len(records))
        measurement = RunMeasurement.from_records(
            records, workload_id=workload.id, pass_index=pass_index, prompts_id=self.prompts.id,
            started_at=started_at, ended_at=ended_at, slots=self.slots, concurrency_cap=cap,
            requests_unsent=len(workload) - len(records), timed_out=timed_out, notes=notes + workload.notes,
            max_error_fraction=self.settings.max_error_fraction, server_url=self.base_url, model=run.model,
            simulated=clock is not None)
        log.info("workload %s %s", workload.id, measurement.describe())
        return measurement

    async def _sim_time(self, client: httpx.AsyncClient) -> SimTime | None:
        """The clock a simulated server declares (its requests are then stamped and its records converted)."""
        try:
            resp = await client.get("/server_info", timeout=self.settings.timeouts.connect_s)
            return SimTime.of_server_info(resp.json()) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.debug("GET /server_info failed (%s); measuring in wall-clock time", exc)
            return None

    async def _clock_knots(self, clock: SimTime, since: float) -> SimTime:
        """The simulated clock's knots over the run (a fresh client: the run's own is closed by now)."""
        url = f"{self.base_url}{CLOCK_PATH}?since={since - 1.0:.6f}"
        try:
            async with httpx.AsyncClient(timeout=self.settings.timeouts.connect_s) as client:
                resp = await client.get(url)
            declared = SimTime.of_clock(resp.json()) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise MeasurementFailed(f"the simulated server's clock could not be read ({exc})",
                                    remedy="the server went away after the pass; rerun it") from exc
        if declared is None:
            raise MeasurementFailed(f"GET {url} gave no clock (status {resp.status_code})",
                                    remedy="use a simulated server of this elsa-tune version")
        return clock.with_knots(declared.knots, declared.rate)

    async def _model(self, client: httpx.AsyncClient) -> str:
        try:
            resp = await client.get("/v1/models", timeout=self.settings.timeouts.connect_s)
            data = resp.json().get("data") or []
            if resp.status_code == 200 and data and isinstance(data[0].get("id"), str):
                return str(data[0]["id"])
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.debug("GET /v1/models failed (%s); sending model 'default'", exc)
        return "default"


class _Run:
    """The state of one pass: the records slot per request, the in-flight count, the clock origin."""

    def __init__(self, gen: LoadGenerator, client: httpx.AsyncClient, workload: Workload, salt: int,
                 model: str, clock: SimTime | None = None) -> None:
        self.gen = gen
        self.clock = clock
        self.line: _ClockLine | None = None
        self.sim0 = 0.0
        self.sent_sim: dict[int, float] = {}   # simulated send instants the client named (SIM_AT_HEADER)
        self.acks: set[asyncio.Task[None]] = set()
        self.follow_ups: set[int] = set()      # closed loop: requests whose worker sends another when they end
        self.last_end: float | None = None     # when the last request ended (freeing its slot)
        self.client = client
        self.workload = workload
        self.salt = salt
        self.model = model
        self.records: list[RequestRecord | None] = [None] * len(workload)
        self.bodies: list[bytes | None] = [None] * len(workload)
        self.in_flight = 0
        self.next_index = 0
        self.t0 = time.perf_counter()
        self.uid_base = int(workload.id, 16)
        self.timeouts = gen.settings.timeouts
        self.url = httpx.URL(gen.base_url + COMPLETIONS_PATH)   # parsed once, not per request

    async def drive(self, cap: int) -> None:
        if self.clock is not None:
            async with httpx.AsyncClient(base_url=self.gen.base_url, timeout=self.timeouts.connect_s,
                                         transport=StreamingTransport(max_connections=8)) as side:
                self.line = _ClockLine(self.clock, side)
                await self.line.read()
                self.t0 = time.perf_counter()
                self.sim0 = self.line.sim(self.t0)
                await self._drive(cap)
                await asyncio.gather(*self.acks)
            return
        self.t0 = time.perf_counter()
        await self._drive(cap)

    async def _drive(self, cap: int) -> None:
        async with asyncio.TaskGroup() as tg:
            if self.workload.mode is ReplayMode.CLOSED_LOOP:
                for _ in range(min(cap, len(self.workload))):
                    tg.create_task(self._worker())
            else:
                slots = asyncio.Semaphore(cap)
                for spec in self.workload.requests:
                    assert spec.arrival_s is not None
                    due = await self._until(spec.arrival_s)
                    # A send held back only by this client's own slowness happened, in the simulation, at its
                    # scheduled instant; one that waited for a free slot reacted to a finish (stamped when sent).
                    at = due if not slots.locked() else None
                    await slots.acquire()
                    # a send that waited for a slot reacts to the end that freed it
                    trigger = self.last_end if at is None else None
                    tg.create_task(self._send(spec, spec.arrival_s, slots, trigger, sim_at=at))

    async def _until(self, arrival_s: float) -> float | None:
        """Sleep until ``arrival_s`` into the run. On a simulated server that is ``arrival_s × speedup``
        simulated seconds in, on its clock (which slows when its host is busy), and that instant is returned."""
        if self.line is None:
            delay = self.t0 + arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            return None
        target = self.sim0 + arrival_s * self.line.clock.speedup
        while True:
            delay = self.line.wall(target) - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if not await self.line.refresh():
                return target

    async def _worker(self) -> None:
        trigger: float | None = None
        spec = self._claim()
        while spec is not None:
            follow = self._claim()   # claimed now, so that the server can be told a follow-up comes
            if follow is not None:
                self.follow_ups.add(spec.index)
            # the first send of each worker is at the run's start, later ones react to the last end
            await self._send(spec, None, None, trigger, sim_at=self.sim0 if trigger is None else None)
            record = self.records[spec.index]
            trigger = None if record is None or record.end_s is None else self.t0 + record.end_s
            spec = follow

    def _claim(self) -> RequestSpec | None:
        if self.next_index >= len(self.workload.requests):
            return None
        self.next_index += 1
        return self.workload.requests[self.next_index - 1]

    def _headers(self, spec: RequestSpec, base: dict[str, str]) -> dict[str, str]:
        name = self.gen.settings.regime_header
        return {**base, name: spec.kind} if name else base

    def _sim_headers(self, spec: RequestSpec, stamp: float, sim_at: float | None) -> dict[str, str]:
        """The simulated server's clock headers: the send's simulated instant when the client's own schedule
        names it, else its wall stamp (``time.perf_counter()`` is CLOCK_MONOTONIC, the server's
        ``time.monotonic()``); in a closed loop, whether a follow-up comes and whether this is one."""
        headers = {**_JSON, SENT_AT_HEADER: f"{stamp:.6f}", ACK_HEADER: f"{self.uid_base:x}-{spec.index}"}
        if sim_at is not None:
            headers[SIM_AT_HEADER] = f"{sim_at:.6f}"
        if self.workload.mode is ReplayMode.CLOSED_LOOP:
            if spec.index in self.follow_ups:
                headers[FOLLOW_UP_HEADER] = "1"
            if sim_at is None:
                headers[FOLLOWS_HEADER] = "1"
        return headers

    def prebuild(self, max_tokens: int) -> None:
        total = 0
        for spec in self.workload.requests:
            total += spec.input_tokens
            if total > max_tokens:
                break
            self.bodies[spec.index] = self._body(spec)

    def _body(self, spec: RequestSpec) -> bytes:
        prompt = self.gen.prompts.prompt_array(spec.block_hashes, spec.input_tokens, kind=spec.kind, salt=self.salt,
                                               unique_key=(self.uid_base ^ (spec.index * 0x9E3779B97F4A7C15)) & _MASK64)
        body: dict[str, Any] = {"model": self.model, "prompt": prompt.tolist(), "max_tokens": spec.output_tokens,
                                "stream": True, "stream_options": {"include_usage": True}}
        if spec.ignore_eos:
            body["ignore_eos"] = True
        for name in ("temperature", "top_p", "top_k"):
            value = getattr(spec, name)
            if value is not None:
                body[name] = value
        return json.dumps(body, separators=(",", ":")).encode()

    def _ack(self, key: str) -> None:
        """Tell the simulated server this client has the first token, or the end, of the request it tagged
        ``key`` (the end of a request a follow-up comes after needs none: the follow-up says it arrived)."""
        if self.line is not None:
            task = asyncio.get_running_loop().create_task(self.line.ack(key))
            self.acks.add(task)
            task.add_done_callback(self.acks.discard)

    async def _send(self, spec: RequestSpec, scheduled: float | None, slots: asyncio.Semaphore | None,
                    trigger: float | None = None, *, sim_at: float | None = None) -> None:
        try:
            body = self.bodies[spec.index] or self._body(spec)
            self.bodies[spec.index] = None
            self.in_flight += 1
            try:
                self.records[spec.index] = await self._stream(spec, body, scheduled, trigger, sim_at)
            finally:
                self.in_flight -= 1
                self.last_end = time.perf_counter()
        finally:
            if slots is not None:
                slots.release()

    async def _stream(self, spec: RequestSpec, body: bytes, scheduled: float | None,
                      trigger: float | None = None, sim_at: float | None = None) -> RequestRecord:
        """One request. On a simulated server, ``sim_at`` is the simulated instant of a send on the client's own
        schedule, ``trigger`` the wall instant the event a reacting send reacts to arrived (the last end)."""
        loop = asyncio.get_running_loop()
        t = self.timeouts
        stall_slack = t.stall_s / 8   # re-arm the stall deadline at most this often (it fires within 7/8..1 of it)
        in_flight = self.in_flight
        stream = CompletionStream(keep_text=self.gen.settings.keep_text, error_limit=self.gen.settings.error_body_bytes)
        chunk_times = stream.chunk_times
        status: int | None = None
        error = ""
        outcome = Outcome.OK
        phase: str | None = None
        ack: str | None = None
        sent = time.perf_counter()
        end: float | None = None
        try:
            async with asyncio.timeout(t.first_token_s) as deadline:
                headers = _JSON
                if self.clock is not None:
                    sent = self.clock.send_stamp(sent, trigger)
                    headers = self._sim_headers(spec, sent, sim_at)
                    ack = headers.get(ACK_HEADER)
                    if sim_at is not None:
                        self.sent_sim[spec.index] = sim_at
                headers = self._headers(spec, headers)
                async with self.client.stream("POST", self.url, content=body, headers=headers) as resp:
                    if self.clock is None:   # when the bytes left, if the transport knows; else the stamp sent
                        sent = resp.request.extensions.get(SENT_AT, sent)
                    status = resp.status_code
                    if status != 200:
                        outcome, error = Outcome.HTTP_ERROR, await _error_text(resp, self.gen.settings.error_body_bytes)
                        end = time.perf_counter()
                    else:
                        rearmed = 0.0
                        async for raw in resp.aiter_raw():
                            if end is not None:
                                continue  # after [DONE]: drain to the end of the body so the connection is reused
                            now = time.perf_counter()
                            had = len(chunk_times)
                            stream.feed(raw, now)
                            if ack is not None and chunk_times and not had:
                                self._ack(ack)
                            if ack is not None and stream.done and spec.index not in self.follow_ups:
                                self._ack(ack)
                            if chunk_times and now - rearmed > stall_slack:
                                deadline.reschedule(loop.time() + t.stall_s)
                                rearmed = now
                            if stream.done:
                                end = now
                        if not stream.done:
                            outcome, error = Outcome.DISCONNECTED, "the stream ended without data: [DONE]"
        except TimeoutError:
            outcome = Outcome.TIMEOUT
            phase = "stall" if chunk_times else "first_token"
            error = f"no {'token' if chunk_times else 'first token'} within " \
                    f"{t.stall_s if chunk_times else t.first_token_s:g} s"
        except httpx.ConnectTimeout as exc:
            outcome, phase, error = Outcome.TIMEOUT, "connect", f"connect timeout: {exc}"
        except httpx.ConnectError as exc:
            outcome, error = Outcome.CONNECT_ERROR, f"{type(exc).__name__}: {exc}"
        except httpx.HTTPError as exc:   # RemoteProtocolError, ReadError, WriteError: the peer went away
            outcome, error = Outcome.DISCONNECTED, f"{type(exc).__name__}: {exc}"
        except json.JSONDecodeError as exc:
            outcome, error = Outcome.SERVER_ERROR, f"undecodable stream chunk: {exc}"
        except asyncio.CancelledError:
            # The run deadline (or the caller) cancelled us: leave a record, then let it propagate.
            self.records[spec.index] = self._record(spec, scheduled, sent, in_flight, stream, status, Outcome.TIMEOUT,
                                                    "cancelled before the end of the stream", "run_deadline", None)
            raise
        if outcome is Outcome.OK:
            if stream.error or stream.finish_reason == "abort":
                outcome = Outcome.SERVER_ERROR
                error = stream.error or "finish_reason abort"
            elif not chunk_times:
                outcome, error = Outcome.EMPTY, "the stream carried no tokens"
        if outcome is not Outcome.OK:
            log.debug("request %d: %s %s %s", spec.index, outcome.value, status or "", error)
        return self._record(spec, scheduled, sent, in_flight, stream, status, outcome, error, phase, end)

    def _record(self, spec: RequestSpec, scheduled: float | None, sent: float, in_flight: int,
                stream: CompletionStream, status: int | None, outcome: Outcome, error: str, phase: str | None,
                end: float | None) -> RequestRecord:
        t0 = self.t0
        chunk_times, usage = stream.chunk_times, stream.usage
        completion = usage.get("completion_tokens") if usage else None
        details = (usage or {}).get("prompt_tokens_details") or {}
        return RequestRecord(
            index=spec.index, kind=spec.kind, input_tokens=spec.input_tokens, max_tokens=spec.output_tokens,
            scheduled_s=scheduled, sent_s=sent - t0, outcome=outcome,
            ttft_s=chunk_times[0] - sent if chunk_times else None,
            end_s=None if end is None else end - t0,
            output_tokens=int(completion) if isinstance(completion, int) else len(chunk_times),
            output_tokens_source="usage" if isinstance(completion, int) else ("chunks" if chunk_times else "none"),
            chunks=len(chunk_times),
            itl_s=tuple(b - a for a, b in itertools.pairwise(chunk_times)),
            prompt_tokens_reported=usage.get("prompt_tokens") if usage else None,
            cached_tokens=details.get("cached_tokens") if isinstance(details, dict) else None,
            finish_reason=stream.finish_reason, status_code=status, error=error, timeout_phase=phase,
            in_flight_at_send=in_flight, session=spec.session,
            text=stream.text if self.gen.settings.keep_text else None)


class _ClockLine:
    """The simulated server's clock as of the last read: the line through its last anchor (``/sim/clock``),
    re-read at most every ``CLOCK_REFRESH_S`` on a connection of its own (the run's are busy streaming)."""

    def __init__(self, clock: SimTime, client: httpx.AsyncClient) -> None:
        self.clock = clock
        self.client = client
        self.anchor = (0.0, 0.0)
        self.read_at = -1.0

    async def read(self) -> None:
        resp = await self.client.get(f"{CLOCK_PATH}?since=1e18")
        knots = resp.json().get("knots") or [[0.0, 0.0]]
        self.anchor = (float(knots[-1][0]), float(knots[-1][1]))
        self.read_at = time.perf_counter()

    async def ack(self, key: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self.client.get(f"{ACK_PATH}?key={key}")

    async def refresh(self) -> bool:
        """Re-read the clock if the last read is stale; ``True`` when the line moved by more than 0.1 ms."""
        if time.perf_counter() - self.read_at < CLOCK_REFRESH_S:
            return False
        before = self.wall(0.0)
        await self.read()
        return abs(self.wall(0.0) - before) > 1e-4

    def sim(self, wall: float) -> float:
        return self.anchor[1] + (wall - self.anchor[0]) * self.clock.speedup

    def wall(self, sim: float) -> float:
        return self.anchor[0] + (sim - self.anchor[1]) / self.clock.speedup


#: How often (wall seconds) an open loop re-reads a simulated server's clock while it waits for a send.
CLOCK_REFRESH_S = 0.005


async def _error_text(resp: httpx.Response, limit: int) -> str:
    chunks: list[bytes] = []
    size = 0
    async for part in resp.aiter_raw():
        chunks.append(part)
        size += len(part)
        if size >= limit:
            break
    return b"".join(chunks)[:limit].decode("utf-8", errors="replace")
