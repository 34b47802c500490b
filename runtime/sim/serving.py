"""The real-time serving loop: drive the scheduling core step by step at the card's pace.

``Serving`` owns the requests in flight. Each iteration asks the scheduling core (``StepSource``, the seam to
``engine.py``) for one step, sleeps for ``duration_s × noise / speedup`` against an accumulated deadline (so
sleep overshoot never adds up), then delivers the step's tokens to the open streams, counts the metrics and
prints SGLang's runtime lines at a bounded rate. Faults that strike while serving (a crash after N requests,
the first generation's OOM, a hang) happen here.

The simulated clock (``SimClock``) runs ``speedup`` times faster than ``time.monotonic()`` and ``lag_s`` wall
seconds behind it: a step that ends at simulated time *T* is delivered at wall ``clock.wall_at(T) + lag_s``, and a
request stamped by its client with the monotonic instant it was sent (header ``x-elsa-sent-at``; the client must
run on the same host) arrives in the simulation at that instant, not when the server got round to parsing it.
The lag absorbs the host's own request overhead (client write, parse, hashing) as long as it stays under
``lag_s``. A client that will send its next request as soon as one ends (a closed loop) says so on the request
(``Job.follow_up``); after a step that finished such requests the loop waits, at most ``REACTION_S``, until their
follow-ups have arrived (``Job.follows``), so that they join the step SGLang would have admitted them to. A client
that acknowledges receipts (``Job.ack_key``, ``/sim/ack``) has the clock stand still after a first token or an end
(of a request no follow-up comes after) until it has the bytes, so that its readings carry none of the host's
delivery latency. When the host cannot keep pace the clock slows instead of skipping, and says where
(``/sim/clock``'s knots). A client that knows the clock (``traffic/sim_time.py``) converts its own wall-clock
readings into simulated time and measures the simulated system without the host's overhead multiplied by the
speed-up.

A pass (requests from an idle server until it is idle again) that begins with a request of a client that does not
stamp is a plain pass: the clock is retimed to the plain speed-up (``plain_speed.py``) at the instant that request
was read, and stays a straight line (late deliveries come late instead of stopping the clock, since such a
client's schedule is in wall time); a request its client stamps, or a ``/sim/clock`` read, on an idle server
retimes it back to ``speedup``; so does a request with ``x-elsa-pace: full`` (a client that times deadlines, not
latencies: elsa-tune's probes). Every retime is a knot of the declared clock.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.sim.engine import StepResult
from elsa_tune.runtime.sim.faults import Crash, Faults, serve_oom_crash, watchdog_crash
from elsa_tune.runtime.sim.metrics import SglangMetrics
from elsa_tune.runtime.sim.noise import ServingNoise
from elsa_tune.runtime.sim.plain_speed import PlainSpeed
from elsa_tune.runtime.sim.startup import ServerLog
from elsa_tune.runtime.sim.tokens import Completion
from elsa_tune.runtime.sim.vllm_metrics import VllmMetrics

log = logging.getLogger(__name__)

#: At most this many runtime log lines (each of prefill and decode) per wall-clock second.
LOG_LINES_PER_S = 4.0
#: An idle gap at least this long (wall seconds) starts a new measurement pass with its own run noise.
NEW_PASS_IDLE_S = 1.0
#: Wall seconds the simulation runs behind the wall clock, to absorb a request's host overhead (see above).
CLOCK_LAG_S = 0.050
#: A stream gets its tokens at most this often (wall seconds), besides its first and last: at a high speed-up a
#: decode step lasts a fraction of a millisecond, and a write per stream per step would saturate the host (the
#: clients then read the queueing, multiplied by the speed-up, as latency). Like a slow reader, a stream gets
#: the tokens of several steps in one chunk; its first token and its end keep their exact instants.
STREAM_FLUSH_S = 0.002
#: After a step that finished requests whose clients announced a follow-up, the simulation waits at most this long
#: (wall seconds) for the follow-ups before it composes the next step; the clock slows for the wait (``SimClock``),
#: so simulated time does not move.
REACTION_S = 0.250
#: A delivery later than this (wall seconds) slows the clock; a smaller lateness (a sleep's overshoot) does not
#: add up, since the next step's deadline comes from the clock's line.
LATE_TOLERANCE_S = 0.002
#: A step end this far (wall seconds) off the clock's line starts a new knot (see ``SimClock``).
KNOT_TOLERANCE_S = 0.0001
#: A plain pass keeps its speed-up across idle gaps shorter than this (wall seconds): an open-loop client leaves
#: the server idle between requests, and its run must stay on one line to be converted.
PLAIN_PASS_IDLE_S = 5.0
#: A client stamp further in the past than this (wall seconds) is not trusted (another host's clock?).
MAX_STAMP_AGE_S = 1.0


class SimClock:
    """Simulated time as a function of ``time.monotonic()``, piecewise linear through its knots.

    It runs ``speedup`` simulated seconds per wall second while the host keeps pace; when a step is delivered
    late (the host was busy), the clock slows instead of skipping: the step's end is re-anchored at the wall
    instant it really reached the streams, and the two ends of that slower stretch become knots. Deliveries
    happen ``lag_s`` after their simulated instant's wall time, so a client converts a wall instant *t* it
    received something at with ``sim_at(t − lag_s)``, and an instant it sent something at with ``sim_at(t)``.
    """

    def __init__(self, speedup: float, lag_s: float, wall0: float, *, keep: int = 200_000) -> None:
        self.speedup = speedup       # the declared speed-up: what a client that stamps is served at
        self.rate = speedup          # the current line's slope (``retime``: lower for a client that does not)
        self.lag_s = lag_s
        self.knots: list[tuple[float, float]] = [(wall0, 0.0)]
        self.anchor = (wall0, 0.0)     # the last step's end (or the start): the line extrapolates from it
        self.keep = keep

    def sim_at(self, wall: float) -> float:
        """The simulated instant of monotonic wall time ``wall`` on the current line (no lag applied)."""
        w0, s0 = self.anchor
        return s0 + (wall - w0) * self.rate

    def wall_at(self, sim: float) -> float:
        """The monotonic wall time of simulated instant ``sim`` on the current line (deliveries add the lag)."""
        w0, s0 = self.anchor
        return w0 + (sim - s0) / self.rate

    def move(self, wall: float, sim: float, since: float | None = None) -> None:
        """Anchor the line at ``(wall, sim)``, the end of a stretch that began at simulated ``since`` on the
        current line (default: the last anchor); a point off the line of the last knot makes knots."""
        last_w, last_s = self.knots[-1]
        if abs(wall - (last_w + (sim - last_s) / self.rate)) > KNOT_TOLERANCE_S:
            start = self.anchor if since is None else (self.wall_at(since), since)
            if self.knots[-1] != start:
                self.knots.append(start)
            self.knots.append((wall, sim))
            if len(self.knots) > self.keep:
                del self.knots[: self.keep // 2]
        self.anchor = (wall, sim)

    def retime(self, wall: float, rate: float) -> None:
        """From monotonic wall instant ``wall`` on, run at ``rate`` simulated seconds per wall second; a knot
        keeps the line continuous. Only while nothing is in flight (a step's deadline is on the old line)."""
        if rate == self.rate:
            return
        wall = max(wall, self.anchor[0])
        point = (wall, self.sim_at(wall))
        if self.knots[-1] != self.anchor:
            self.knots.append(self.anchor)
        self.knots.append(point)
        self.anchor, self.rate = point, rate

    def describe(self, since: float | None = None) -> dict[str, object]:
        """The clock as ``/server_info`` (``since`` None: no knots) and ``/sim/clock?since=WALL`` declare it:
        ``speedup`` (a stamping client's), ``rate`` (the line's slope now, past the last knot), ``lag_s``."""
        out: dict[str, object] = {"speedup": self.speedup, "rate": self.rate, "lag_s": self.lag_s}
        if since is not None:
            first = max(0, bisect.bisect_left(self.knots, (since, -math.inf)) - 1)
            out["knots"] = [[w, s] for w, s in (*self.knots[first:], self.anchor)]
        return out


@dataclass(frozen=True)
class JobSpec:
    """What the scheduling core needs to know about a request."""

    rid: str
    input_tokens: int
    block_hashes: tuple[int, ...]
    output_tokens: int            # exactly this many tokens will be generated (EOS already decided)
    regime: str
    arrival_s: float | None = None  # simulated arrival; None: the scheduler's current time


class JobRejected(ValueError):
    """The scheduling core refuses a request (HTTP 400); the message is SGLang's."""


class StepCrash(Exception):
    """The scheduling core died while serving; ``crash`` says how SGLang reports it."""

    def __init__(self, crash: Crash) -> None:
        super().__init__(crash.kind.value)
        self.crash = crash


class StepSource(Protocol):
    """The scheduling core as the serving loop sees it (``engine.py`` behind an adapter)."""

    def submit(self, job: JobSpec) -> None:
        """Queue a request; raises ``JobRejected`` for a request SGLang answers with 400."""

    def abort(self, rid: str) -> None: ...

    def step(self, slowdown: float = 1.0) -> StepResult | None:
        """The next step, its duration multiplied by ``slowdown`` (the run's noise), or ``None`` when there is
        nothing to run; raises ``StepCrash`` when the scheduler dies."""

    def flush_cache(self) -> bool: ...

    @property
    def now(self) -> float:
        """The scheduler's simulated time (the end of the last step, or the last arrival it moved to)."""

    def next_arrival(self) -> float | None:
        """Simulated time of the earliest request queued for a later arrival, or ``None``."""

    def pool_state(self) -> StepResult:
        """A zero-length ``"idle"`` step: the pools and queues as they are now."""

    def advance_to(self, t: float) -> None:
        """Move an idle scheduler's clock forward to ``t`` (never backwards), releasing arrivals up to it."""


@dataclass
class Job:
    """A request in flight: its spec, completion text and the timings its metrics need."""

    spec: JobSpec
    completion: Completion
    finish_reason: str
    streaming: bool
    created: float
    deliveries: asyncio.Queue[tuple[int, bool]] = field(default_factory=asyncio.Queue)
    generated: int = 0
    cached_tokens: int = 0
    first_token_at: float | None = None   # simulated instants (the Prometheus histograms are in simulated time)
    last_token_at: float | None = None
    error: str | None = None
    sent_at: float | None = None      # the client's x-elsa-sent-at stamp (time.monotonic() on this host)
    sim_at: float | None = None       # the simulated instant its client named (x-elsa-sim-at)
    ack_key: str | None = None        # its client acknowledges the first token and the end (x-elsa-ack)
    received_at: float = 0.0          # when the server had read it (monotonic); 0: when submitted
    first_due: float = 0.0            # wall instant its first token was due at the socket (lag included)
    full_pace: bool = False           # its client asked for the full speed-up (x-elsa-pace: full)
    arrival_sim: float = 0.0          # simulated instant it arrived (the clock at its client's send stamp)
    follow_up: bool = False           # its client sends another request as soon as this one ends
    follows: bool = False             # it is such a request
    unsent: int = 0                   # tokens generated but not yet handed to the stream (STREAM_FLUSH_S)
    flushed_at: float = 0.0
    cache_hit_damage: float = 0.0     # share of answers spoiled when served from a prefix-cache hit
    damage_salt: str = ""
    host_hit_damage: float = 0.0      # share spoiled when part of the prefix comes back from the host tier
    host_restorable_tokens: int = 0   # leading prompt tokens the host tier holds (answers.HostTier)

    @property
    def stamped(self) -> bool:
        """Its client knows the clock (it stamps sends or acknowledges receipts, ``traffic/sim_time.py``) or
        asked for the full speed-up: it is not served at the plain one."""
        return self.sent_at is not None or self.sim_at is not None or self.ack_key is not None or self.full_pace


class Pacing:
    """How well the loop keeps to its deadlines: intended step time, and lateness of each delivery."""

    def __init__(self, keep: int = 20_000) -> None:
        self.steps = 0
        self.intended_s = 0.0
        self.late: list[float] = []
        self.keep = keep
        self.paused_s = 0.0        # wall seconds the clock stood still (a late step, a wait for clients)
        self.unanswered = 0        # follow-ups and receipts clients announced that did not come in time

    def record(self, intended_s: float, late_s: float) -> None:
        self.steps += 1
        self.intended_s += intended_s
        if len(self.late) >= self.keep:
            self.late = self.late[self.keep // 2:]
        self.late.append(late_s)

    def summary(self) -> dict[str, float]:
        if not self.late:
            return {"steps": 0}
        ordered = sorted(self.late)

        def pick(q: float) -> float:
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

        return {"steps": self.steps, "intended_s": round(self.intended_s, 4), "paused_s": round(self.paused_s, 4),
                "unanswered": self.unanswered, "late_p50_ms": pick(0.5) * 1e3,
                "late_p99_ms": pick(0.99) * 1e3, "late_max_ms": ordered[-1] * 1e3}


class Serving:
    """Runs the loop as an asyncio task. ``on_crash`` is called (then the process dies) for a fatal fault."""

    def __init__(self, source: StepSource, *, noise: ServingNoise, metrics: SglangMetrics | VllmMetrics,
                 server_log: ServerLog, faults: Faults, speedup: float, decode_log_interval: int, hybrid: bool,
                 on_crash: Callable[[Crash], None], watchdog_timeout_s: float = 300.0, draft_tokens: int = 0) -> None:
        self.source = source
        self.noise = noise
        self.metrics = metrics
        self.log = server_log
        self.faults = faults
        self.speedup = max(speedup, 1e-6)
        self.decode_log_interval = max(1, decode_log_interval)
        self.hybrid = hybrid
        self._warming = False
        self.on_crash = on_crash
        self.watchdog_timeout_s = watchdog_timeout_s
        self._draft_tokens = draft_tokens
        self.jobs: dict[str, Job] = {}
        self.finished_requests = 0
        self.sim_time_s = 0.0
        self.spec_forwards = 0
        self.spec_accepted = 0
        self.last_gen_throughput = 0.0
        self.pacing = Pacing()
        self.clock = SimClock(self.speedup, CLOCK_LAG_S, time.monotonic())
        self.plain = PlainSpeed(self.speedup)
        self._idle_waiting = False        # nothing in flight or queued: the clock may be retimed
        self._plain_pass = False          # the pass began with a client that does not stamp
        self._idle_from = time.monotonic()
        self._wake = asyncio.Event()
        self._reacted = asyncio.Event()
        self._awaited = 0                 # follow-ups announced by requests that finished, not yet arrived
        self._holding: list[Job] | None = None   # requests received while a step is in flight
        self._acks: dict[str, int] = {}   # deliveries awaiting their client's receipt, by ack key
        self._decode_steps = 0
        self._window_tokens = 0
        self._window_verify = 0
        self._window_accepted = 0
        self._window_start = 0.0         # simulated time the current decode-log window began
        self._last_log = {"prefill": 0.0, "decode": 0.0}
        self._hung = faults.hang_after_requests == 0
        self._hung_since = time.monotonic()

    # ---- requests -----------------------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Hand a request to the scheduler; raises ``JobRejected`` (HTTP 400) when it refuses it. While a step
        is in flight the request is held until the step's end is placed on the clock, then enters (a refusal
        then ends its stream with the error)."""
        job.received_at = job.received_at or time.monotonic()
        if not self.jobs and self._idle_waiting:
            # a pass begins: a client that does not stamp is served at the plain speed-up (plain_speed.py)
            rate = self.plain_pace(job.received_at) if not job.stamped else self.speedup
            self._plain_pass = not job.stamped
            self.clock.retime(job.received_at, rate)
        self.jobs[job.spec.rid] = job
        if job.follows and self._awaited:
            self._awaited -= 1
            self._reacted.set()
        if self._holding is not None:
            self._holding.append(job)
            return
        try:
            self._enter(job)
        except JobRejected:
            self.jobs.pop(job.spec.rid, None)
            raise

    def _enter(self, job: Job) -> None:
        """Queue ``job`` at the simulated instant its client named, or that of its send stamp, or of its receipt."""
        stamp = job.sent_at
        if stamp is None or not 0.0 <= job.received_at - stamp <= MAX_STAMP_AGE_S:
            stamp = job.received_at
        at = self.clock.sim_at(stamp) if job.sim_at is None else job.sim_at
        job.spec = dataclasses.replace(job.spec, arrival_s=max(self.source.now, at))
        self.source.submit(job.spec)
        job.arrival_sim = job.spec.arrival_s or 0.0
        self._wake.set()

    def _release(self) -> None:
        held, self._holding = self._holding or [], None
        for job in held:
            if job.spec.rid not in self.jobs:
                continue   # aborted while held
            try:
                self._enter(job)
            except JobRejected as exc:
                self.jobs.pop(job.spec.rid, None)
                job.error = str(exc)
                job.deliveries.put_nowait((0, True))

    async def warmup(self, seconds: float) -> None:
        """SGLang's warm-up generate before the ready line; a hung scheduler hangs it (the watchdog ends it)."""
        if self._hung:
            self._warming = True
            await asyncio.Event().wait()
        await asyncio.sleep(seconds)

    def abort(self, rid: str) -> None:
        job = self.jobs.pop(rid, None)
        if job is None:
            return
        self.source.abort(rid)
        with self.metrics.lock:
            self.metrics.aborted.inc(self.metrics.tok)

    @property
    def busy(self) -> bool:
        return bool(self.jobs)

    @property
    def avg_spec_accept_length(self) -> float:
        return self.spec_accepted / self.spec_forwards if self.spec_forwards else 0.0

    def flush_cache(self) -> bool:
        return not self.jobs and self.source.flush_cache()

    # ---- the loop -----------------------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.clock.move(loop.time() - self.clock.lag_s, self.source.now)
        while True:
            if self._hung:
                # A hung forward: nothing moves, /health still answers, the watchdog fires in real seconds.
                await asyncio.sleep(min(1.0, self.watchdog_timeout_s))
                if (self.jobs or self._warming) and time.monotonic() - self._hung_since >= self.watchdog_timeout_s:
                    self._die(watchdog_crash(self.watchdog_timeout_s))
                continue
            began = self.source.now
            self._holding = []
            try:
                step = self.source.step(self.noise.factor(self.sim_time_s))
            except StepCrash as exc:
                self._release()
                if exc.crash.kind is FailureKind.HANG:
                    # a forward that never returns is not a death: the process lives on until the watchdog
                    self._hung, self._hung_since = True, time.monotonic()
                    continue
                self._die(exc.crash)
                return
            if step is None:
                self._release()
                await self._idle(loop)
                continue
            wall = step.duration_s / self.clock.rate
            self.sim_time_s += step.duration_s
            deadline = self.clock.wall_at(began) + wall
            delay = deadline + self.clock.lag_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            now = loop.time()
            self.pacing.record(wall, now - deadline - self.clock.lag_s)
            self._pause(now, deadline)
            self._deliver(step, now, deadline + self.clock.lag_s)
            if self._awaited:
                waited_from = self.clock.anchor[0]
                await self._follow_ups(loop)
                self._pause(loop.time(), waited_from, tolerance=0.0)
            self._release()

    def _await_ack(self, job: Job) -> None:
        if job.ack_key is not None:
            self._acks[job.ack_key] = self._acks.get(job.ack_key, 0) + 1
            self._awaited += 1

    def ack(self, key: str) -> bool:
        """A client says it has received the first token, or the end, of its request ``key``."""
        if not self._acks.get(key):
            return False
        self._acks[key] -= 1
        if not self._acks[key]:
            del self._acks[key]
        if self._awaited:
            self._awaited -= 1
            self._reacted.set()
        return True

    def _pause(self, now: float, due: float, tolerance: float = LATE_TOLERANCE_S) -> None:
        """The scheduler is at ``source.now``, which the clock's line reaches at wall ``due``; at ``now`` (a
        late delivery, a wait for follow-ups) the clock stands still from ``due`` to ``now − lag`` (a busy host
        slows the simulation; it never skips time). Lateness up to ``tolerance`` (a sleep's overshoot) is not
        added up; a wait for clients' receipts and follow-ups has none (a receipt a millisecond after its
        delivery is 40 simulated milliseconds at 40×)."""
        late = now - self.clock.lag_s - due
        if self._plain_pass:
            late = 0.0   # a plain client's schedule is in wall time: the line stays straight, late tokens come late
        if late > tolerance:
            self.pacing.paused_s += late
        t = self.source.now
        self.clock.move(due + late if late > tolerance else due, t, since=t)

    async def _follow_ups(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait (at most ``REACTION_S``) for the follow-ups and receipts clients announced."""
        until = loop.time() + REACTION_S
        while self._awaited and loop.time() < until:
            self._reacted.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reacted.wait(), until - loop.time())
        self.pacing.unanswered += self._awaited
        self._awaited = 0
        self._acks.clear()

    async def _idle(self, loop: asyncio.AbstractEventLoop) -> None:
        """Nothing to run: wait for the next queued arrival's instant, or for a request."""
        self._wake.clear()
        nxt = self.source.next_arrival()
        if nxt is None:
            # the pool as an idle scheduler reports it (the radix cache's unlocked prompts are not used)
            self._gauges_and_log(self.source.pool_state(), loop.time())
            idle_from = self._idle_from = loop.time()
            self._idle_waiting = True
            try:
                await self._wake.wait()
            finally:
                self._idle_waiting = False
            if loop.time() - idle_from >= NEW_PASS_IDLE_S:
                self.noise.new_pass()
            return
        due = self.clock.wall_at(nxt) + self.clock.lag_s
        if due > loop.time():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), due - loop.time())
        if loop.time() >= due:
            self.source.advance_to(nxt)
            self._pause(loop.time(), due - self.clock.lag_s)

    def plain_pace(self, now: float) -> float:
        """The speed-up a request of a client that does not stamp would begin (or continue) a pass at now."""
        if self._plain_pass and (self.jobs or now - self._idle_from < PLAIN_PASS_IDLE_S):
            return self.clock.rate
        return self.plain.speedup()

    def clock_read(self, now: float) -> None:
        """A client reads the clock (``/sim/clock``: only clients that stamp do): an idle server goes back to
        the declared speed-up, so the line it is given is the one its requests will run on."""
        if not self.jobs and self._idle_waiting:
            self._plain_pass = False
            self.clock.retime(now, self.speedup)

    def first_token_written(self, job: Job, at: float) -> None:
        """The server wrote ``job``'s first token at wall ``at``: the host's lateness is measured."""
        if job.first_due:
            self.plain.observe_overhead(at - job.first_due)

    def _deliver(self, step: StepResult, now: float, due: float = 0.0) -> None:
        """Hand ``step``'s tokens to the streams (``now``: wall, ``due``: when it was due) and count them (at its
        simulated end)."""
        m = self.metrics
        t = self.source.now
        for rid, message in step.aborted.items():
            job = self.jobs.pop(rid, None)
            if job is not None:
                job.error = message
                job.deliveries.put_nowait((0, True))
                with m.lock:
                    m.aborted.inc(m.tok)
        with m.lock:
            for rid, cached in step.cached.items():
                job = self.jobs.get(rid)
                if job is not None:
                    job.cached_tokens = cached
            emitted_total = 0
            for rid, n in step.emitted.items():
                job = self.jobs.get(rid)
                if job is None or n <= 0:
                    continue
                n = min(n, job.spec.output_tokens - job.generated)
                if n <= 0:
                    continue
                emitted_total += n
                if job.first_token_at is None:
                    job.first_token_at, job.first_due = t, due or now
                    self.plain.observe_ttft(t - job.arrival_sim)
                    self._await_ack(job)
                    if job.cache_hit_damage and job.cached_tokens > 0:
                        job.completion = job.completion.with_damage(job.cache_hit_damage, job.damage_salt)
                    elif job.host_hit_damage and job.host_restorable_tokens > job.cached_tokens:
                        job.completion = job.completion.with_damage(job.host_hit_damage, job.damage_salt)
                    m.ttft.observe({**m.tok, "is_streaming": _flag(job.streaming)}, t - job.arrival_sim)
                    m.queue_time.observe(m.sched, max(0.0, t - job.arrival_sim - step.duration_s))
                else:
                    m.itl.observe(m.tok, (t - (job.last_token_at or t)) / n, weight=n)
                job.last_token_at = t
                job.generated += n
                job.unsent += n
                if job.generated == n or now - job.flushed_at >= STREAM_FLUSH_S:
                    job.deliveries.put_nowait((job.unsent, False))
                    job.unsent, job.flushed_at = 0, now
            if step.verify_calls:
                self.spec_forwards += step.verify_calls
                self.spec_accepted += step.accepted_tokens
                self._window_verify += step.verify_calls
                self._window_accepted += step.accepted_tokens
                m.spec_step(step.verify_calls, step.verify_calls * max(0, self._draft_tokens - 1),
                            max(0, step.accepted_tokens - step.verify_calls))
            m.realtime_tokens.inc({**m.sched, "mode": "decode"}, emitted_total)
            if step.kind == "prefill":
                m.realtime_tokens.inc({**m.sched, "mode": "prefill_compute"}, step.new_tokens)
                m.realtime_tokens.inc({**m.sched, "mode": "prefill_cache"}, sum(step.cached.values()))
            if step.retracted:
                m.retracted_total.inc(m.sched, len(step.retracted))
            self._window_tokens += emitted_total
        for rid in step.finished:
            self._finish(rid, now)
        self._gauges_and_log(step, now)

    def _finish(self, rid: str, now: float) -> None:
        t = self.source.now
        job = self.jobs.pop(rid, None)
        if job is None:
            return
        job.deliveries.put_nowait((job.unsent, True))
        job.unsent = 0
        self._awaited += job.follow_up
        if not job.follow_up:
            self._await_ack(job)
        m = self.metrics
        streaming = {**m.tok, "is_streaming": _flag(job.streaming)}
        with m.lock:
            m.prompt_tokens.inc(streaming, job.spec.input_tokens)
            m.generation_tokens.inc(streaming, job.generated)
            m.num_requests.inc(streaming)
            m.cached_tokens.inc({**m.tok, "cache_source": "device"}, job.cached_tokens)
            m.cached_tokens.inc({**m.tok, "cache_source": "total"}, job.cached_tokens)
            m.e2e.observe(streaming, t - job.arrival_sim)
            if job.generated > 1 and job.first_token_at is not None:
                m.tpot.observe(streaming, (t - job.first_token_at) / (job.generated - 1))
            m.prompt_hist.observe(m.tok, job.spec.input_tokens)
            m.uncached_hist.observe(m.tok, job.spec.input_tokens - job.cached_tokens)
            m.generation_hist.observe(m.tok, job.generated)
        self.finished_requests += 1
        self.noise.request_finished()
        f = self.faults
        if f.crash_after_requests is not None and self.finished_requests >= f.crash_after_requests:
            self._die(serve_oom_crash())
        if f.hang_after_requests is not None and self.finished_requests >= f.hang_after_requests and not self._hung:
            self._hung = True
            self._hung_since = time.monotonic()

    def _gauges_and_log(self, step: StepResult, now: float) -> None:
        usage = round(step.used_tokens / max(1, step.token_capacity), 2)
        mamba_usage = round(step.mamba_used / step.mamba_capacity, 2) if step.mamba_capacity else 0.0
        refresh = step.kind in ("prefill", "idle")
        if step.kind == "decode":
            self._decode_steps += 1
            refresh = self._decode_steps % self.decode_log_interval == 0
        if not refresh:
            return
        # in simulated seconds: a sped-up server's wall-clock rate is not the simulated system's
        elapsed = max(1e-9, self.source.now - self._window_start)
        if step.kind == "decode":
            self.last_gen_throughput = self._window_tokens / elapsed
            self._window_tokens = 0
            self._window_start = self.source.now
        # like SGLang's gauge and log line: the average over the last decode-log window, not since start
        accept = self._window_accepted / self._window_verify if self._window_verify else self.avg_spec_accept_length
        if step.kind == "decode":
            self._window_verify = self._window_accepted = 0
        gauges = {"num_running_reqs": step.running, "num_queue_reqs": step.queued, "token_usage": usage,
                  "full_token_usage": usage, "num_used_tokens": step.used_tokens,
                  "kv_used_tokens": step.used_tokens, "kv_evictable_tokens": step.evictable_tokens,
                  "kv_available_tokens": step.token_capacity - step.used_tokens - step.evictable_tokens,
                  "gen_throughput": self.last_gen_throughput, "mamba_usage": mamba_usage,
                  "mamba_used_tokens": step.mamba_used,
                  "mamba_evictable_tokens": step.mamba_evictable,
                  "mamba_available_tokens": max(0, step.mamba_capacity - step.mamba_used - step.mamba_evictable),
                  "num_retracted_reqs": len(step.retracted)}
        if step.kind == "prefill":
            total = step.new_tokens + sum(step.cached.values())
            gauges["cache_hit_rate"] = sum(step.cached.values()) / total if total else 0.0
        if step.verify_calls:
            gauges["spec_accept_length"] = accept
            gauges["spec_accept_rate"] = min(1.0, max(0.0, (accept - 1) / max(1, self._draft_tokens - 1)))
        self.metrics.set_gauges(gauges)
        if step.kind == "idle" or now - self._last_log[step.kind] < 1.0 / LOG_LINES_PER_S:
            return
        self._last_log[step.kind] = now
        usage_part: list[tuple[str, object]] = (
            [("#full token", step.used_tokens), ("full token usage", usage), ("mamba num", step.mamba_used),
             ("mamba usage", mamba_usage)] if self.hybrid else [("#token", step.used_tokens), ("token usage", usage)])
        if step.kind == "prefill":
            throughput = step.new_tokens / max(1e-9, step.duration_s)
            self.log.batch("Prefill", [
                ("#new-seq", step.new_seqs), ("#new-token", step.new_tokens),
                ("#cached-token", sum(step.cached.values())), *usage_part, ("#running-req", step.running),
                ("#queue-req", step.queued), ("#pending-token", 0), ("cuda graph", False),
                ("input throughput (token/s)", f"{throughput:.2f}")])
        else:
            spec_part: list[tuple[str, object]] = []
            if step.verify_calls:
                rate = min(1.0, max(0.0, (accept - 1) / max(1, self._draft_tokens - 1)))
                spec_part = [("accept len", f"{accept:.2f}"), ("accept rate", f"{rate:.2f}")]
            self.log.batch("Decode", [
                ("#running-req", step.running), *usage_part, *spec_part, ("cuda graph", True),
                ("gen throughput (token/s)", f"{self.last_gen_throughput:.2f}"), ("#queue-req", step.queued)])
        if step.retracted:
            self.log.info(f"KV cache pool is full. Retract requests. #retracted_reqs: {len(step.retracted)}, "
                          f"#new_tokens_gained: {step.token_capacity - step.used_tokens}, "
                          "#new_token_ratio: 0.7000 -> 1.0000")

    def _die(self, crash: Crash) -> None:
        self.on_crash(crash)


def _flag(value: bool) -> str:
    return "true" if value else "false"
