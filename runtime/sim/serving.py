"""The real-time serving loop: drive the scheduling core step by step at the card's pace.

``Serving`` owns the requests in flight. Each iteration asks the scheduling core (``StepSource``, the seam to
``engine.py``) for one step, sleeps for ``duration_s × noise / speedup`` against an accumulated deadline (so
sleep overshoot never adds up), then delivers the step's tokens to the open streams, counts the metrics and
prints SGLang's runtime lines at a bounded rate. Faults that strike while serving (a crash after N requests,
the first generation's OOM, a hang) happen here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.sim.engine import StepResult
from elsa_tune.runtime.sim.faults import Crash, Faults, serve_oom_crash, watchdog_crash
from elsa_tune.runtime.sim.metrics import SglangMetrics
from elsa_tune.runtime.sim.noise import ServingNoise
from elsa_tune.runtime.sim.startup import ServerLog, runtime_line
from elsa_tune.runtime.sim.tokens import Completion

log = logging.getLogger(__name__)

#: At most this many runtime log lines (each of prefill and decode) per wall-clock second.
LOG_LINES_PER_S = 4.0
#: An idle gap at least this long (wall seconds) starts a new measurement pass with its own run noise.
NEW_PASS_IDLE_S = 1.0
#: When the loop falls further behind its deadline than this, it stops trying to catch up.
MAX_LAG_S = 0.25


@dataclass(frozen=True)
class JobSpec:
    """What the scheduling core needs to know about a request."""

    rid: str
    input_tokens: int
    block_hashes: tuple[int, ...]
    output_tokens: int            # exactly this many tokens will be generated (EOS already decided)
    regime: str


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

    def step(self) -> StepResult | None:
        """The next step, or ``None`` when there is nothing to run; raises ``StepCrash`` when the scheduler dies."""

    def flush_cache(self) -> bool: ...


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
    first_token_at: float | None = None
    last_token_at: float | None = None
    error: str | None = None
    cache_hit_damage: float = 0.0     # share of answers spoiled when served from a prefix-cache hit (seed 002)
    damage_salt: str = ""
    host_hit_damage: float = 0.0      # share spoiled when part of the prefix comes back from the host tier
    host_restorable_tokens: int = 0   # leading prompt tokens the host tier holds (answers.HostTier)


class Pacing:
    """How well the loop keeps to its deadlines: intended step time, and lateness of each delivery."""

    def __init__(self, keep: int = 20_000) -> None:
        self.steps = 0
        self.intended_s = 0.0
        self.late: list[float] = []
        self.keep = keep

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

        return {"steps": self.steps, "intended_s": round(self.intended_s, 4), "late_p50_ms": pick(0.5) * 1e3,
                "late_p99_ms": pick(0.99) * 1e3, "late_max_ms": ordered[-1] * 1e3}


class Serving:
    """Runs the loop as an asyncio task. ``on_crash`` is called (then the process dies) for a fatal fault."""

    def __init__(self, source: StepSource, *, noise: ServingNoise, metrics: SglangMetrics, server_log: ServerLog,
                 faults: Faults, speedup: float, decode_log_interval: int, hybrid: bool,
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
        self._wake = asyncio.Event()
        self._decode_steps = 0
        self._window_tokens = 0
        self._window_verify = 0
        self._window_accepted = 0
        self._window_start = time.monotonic()
        self._last_log = {"prefill": 0.0, "decode": 0.0}
        self._hung = faults.hang_after_requests == 0
        self._hung_since = time.monotonic()

    # ---- requests -----------------------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Hand a request to the scheduler; raises ``JobRejected`` (HTTP 400) when it refuses it."""
        self.source.submit(job.spec)
        self.jobs[job.spec.rid] = job
        self._wake.set()

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
        deadline = loop.time()
        while True:
            if self._hung:
                # A hung forward: nothing moves, /health still answers, the watchdog fires in real seconds.
                await asyncio.sleep(min(1.0, self.watchdog_timeout_s))
                if (self.jobs or self._warming) and time.monotonic() - self._hung_since >= self.watchdog_timeout_s:
                    self._die(watchdog_crash(self.watchdog_timeout_s))
                continue
            try:
                step = self.source.step()
            except StepCrash as exc:
                if exc.crash.kind is FailureKind.HANG:
                    # a forward that never returns is not a death: the process lives on until the watchdog
                    self._hung, self._hung_since = True, time.monotonic()
                    continue
                self._die(exc.crash)
                return
            if step is None:
                self._wake.clear()
                idle_from = loop.time()
                await self._wake.wait()
                deadline = loop.time()
                if deadline - idle_from >= NEW_PASS_IDLE_S:
                    self.noise.new_pass()
                continue
            wall = step.duration_s * self.noise.factor(self.sim_time_s) / self.speedup
            self.sim_time_s += step.duration_s
            deadline += wall
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self.pacing.record(wall, loop.time() - deadline)
            if delay < -MAX_LAG_S:
                deadline = loop.time()
            self._deliver(step, loop.time())

    def _deliver(self, step: StepResult, now: float) -> None:
        m = self.metrics
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
                    job.first_token_at = now
                    if job.cache_hit_damage and job.cached_tokens > 0:
                        job.completion = job.completion.with_damage(job.cache_hit_damage, job.damage_salt)
                    elif job.host_hit_damage and job.host_restorable_tokens > job.cached_tokens:
                        job.completion = job.completion.with_damage(job.host_hit_damage, job.damage_salt)
                    m.ttft.observe({**m.tok, "is_streaming": _flag(job.streaming)}, now - job.created)
                    m.queue_time.observe(m.sched, max(0.0, now - job.created - step.duration_s / self.speedup))
                else:
                    m.itl.observe(m.tok, (now - (job.last_token_at or now)) / n, weight=n)
                job.last_token_at = now
                job.generated += n
                job.deliveries.put_nowait((n, False))
            if step.verify_calls:
                self.spec_forwards += step.verify_calls
                self.spec_accepted += step.accepted_tokens
                self._window_verify += step.verify_calls
                self._window_accepted += step.accepted_tokens
                m.spec_verify.inc(m.sched, step.verify_calls)
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
        job = self.jobs.pop(rid, None)
        if job is None:
            return
        job.deliveries.put_nowait((0, True))
        m = self.metrics
        streaming = {**m.tok, "is_streaming": _flag(job.streaming)}
        with m.lock:
            m.prompt_tokens.inc(streaming, job.spec.input_tokens)
            m.generation_tokens.inc(streaming, job.generated)
            m.num_requests.inc(streaming)
            m.cached_tokens.inc({**m.tok, "cache_source": "device"}, job.cached_tokens)
            m.cached_tokens.inc({**m.tok, "cache_source": "total"}, job.cached_tokens)
            m.e2e.observe(streaming, now - job.created)
            if job.generated > 1 and job.first_token_at is not None:
                m.tpot.observe(streaming, (now - job.first_token_at) / (job.generated - 1))
            m.prompt_hist.observe(m.sched, job.spec.input_tokens)
            m.uncached_hist.observe(m.sched, job.spec.input_tokens - job.cached_tokens)
            m.generation_hist.observe(m.sched, job.generated)
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
        refresh = step.kind == "prefill"
        if step.kind == "decode":
            self._decode_steps += 1
            refresh = self._decode_steps % self.decode_log_interval == 0
        if not refresh:
            return
        elapsed = max(1e-9, now - self._window_start)
        if step.kind == "decode":
            self.last_gen_throughput = self._window_tokens / elapsed
            self._window_tokens = 0
            self._window_start = now
        # like SGLang's gauge and log line: the average over the last decode-log window, not since start
        accept = self._window_accepted / self._window_verify if self._window_verify else self.avg_spec_accept_length
        if step.kind == "decode":
            self._window_verify = self._window_accepted = 0
        gauges = {"num_running_reqs": step.running, "num_queue_reqs": step.queued, "token_usage": usage,
                  "full_token_usage": usage, "num_used_tokens": step.used_tokens,
                  "kv_used_tokens": step.used_tokens, "kv_available_tokens": step.token_capacity - step.used_tokens,
                  "gen_throughput": self.last_gen_throughput, "mamba_usage": mamba_usage,
                  "mamba_used_tokens": step.mamba_used,
                  "mamba_available_tokens": max(0, step.mamba_capacity - step.mamba_used),
                  "num_retracted_reqs": len(step.retracted)}
        if step.kind == "prefill":
            total = step.new_tokens + sum(step.cached.values())
            gauges["cache_hit_rate"] = sum(step.cached.values()) / total if total else 0.0
        if step.verify_calls:
            gauges["spec_accept_length"] = accept
            gauges["spec_accept_rate"] = min(1.0, max(0.0, (accept - 1) / max(1, self._draft_tokens - 1)))
        self.metrics.set_gauges(gauges)
        if now - self._last_log[step.kind] < 1.0 / LOG_LINES_PER_S:
            return
        self._last_log[step.kind] = now
        usage_part: list[tuple[str, object]] = (
            [("#full token", step.used_tokens), ("full token usage", usage), ("mamba num", step.mamba_used),
             ("mamba usage", mamba_usage)] if self.hybrid else [("#token", step.used_tokens), ("token usage", usage)])
        if step.kind == "prefill":
            throughput = step.new_tokens / max(1e-9, step.duration_s)
            self.log.info(runtime_line("Prefill", [
                ("#new-seq", step.new_seqs), ("#new-token", step.new_tokens),
                ("#cached-token", sum(step.cached.values())), *usage_part, ("#running-req", step.running),
                ("#queue-req", step.queued), ("#pending-token", 0), ("cuda graph", False),
                ("input throughput (token/s)", f"{throughput:.2f}")]))
        else:
            spec_part: list[tuple[str, object]] = []
            if step.verify_calls:
                rate = min(1.0, max(0.0, (accept - 1) / max(1, self._draft_tokens - 1)))
                spec_part = [("accept len", f"{accept:.2f}"), ("accept rate", f"{rate:.2f}")]
            self.log.info(runtime_line("Decode", [
                ("#running-req", step.running), *usage_part, *spec_part, ("cuda graph", True),
                ("gen throughput (token/s)", f"{self.last_gen_throughput:.2f}"), ("#queue-req", step.queued)]))
        if step.retracted:
            self.log.info(f"KV cache pool is full. Retract requests. #retracted_reqs: {len(step.retracted)}, "
                          f"#new_tokens_gained: {step.token_capacity - step.used_tokens}, "
                          "#new_token_ratio: 0.7000 -> 1.0000")

    def _die(self, crash: Crash) -> None:
        self.on_crash(crash)


def _flag(value: bool) -> str:
    return "true" if value else "false"
