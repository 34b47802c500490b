"""What a configuration is truly worth on a workload in the simulator, without noise.

``truth(profile, flags, env, workload)`` plans the memory, builds the performance model and runs the scheduling
core to completion on a simulated clock: no boot drift, no run noise, no cold first pass. Benchmarks use it to
score the tuner against the true optimum; the calibration tests compare the simulator with published measurements.
``TruthWorkload`` is independent of ``traffic/`` (the runtime layer must not import it): a closed loop at a
concurrency with length lists and regimes, or explicit requests with arrival times.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from elsa_tune.runtime.sim.engine import Engine, EngineCrash, RequestRejected, SimRequest, StepResult
from elsa_tune.runtime.sim.memory import MemoryPlan, plan_memory
from elsa_tune.runtime.sim.performance import PerformanceModel
from elsa_tune.runtime.sim.profile import SimProfile
from elsa_tune.search_spaces.candidate import FlagValue

SCHEMA_VERSION = 1
MAX_STEPS = 5_000_000
#: the bounds of a workload ``TruthWorkload.problem`` accepts
MAX_REQUESTS = 100_000
MAX_TOKENS = 10_000_000


@dataclass(frozen=True)
class TruthWorkload:
    """A workload for the truth. Closed loop: ``concurrency`` clients each send their next request when the last
    one finishes, ``num_requests`` in all, cycling through ``input_tokens``/``output_tokens``/``regimes`` (every
    prompt unique unless ``block_hashes`` are given per request: one tuple per request, cycled like the lengths, and two
    requests share a cached prefix as far as their leading ids agree). Open loop: ``requests`` with arrival times;
    with ``max_in_flight``, a request that arrives while that many are in flight is sent when one finishes and
    arrives then (a client's semaphore, ``sglang.bench_serving --max-concurrency``: its TTFT counts from the send).
    """

    concurrency: int = 1
    num_requests: int = 0
    input_tokens: tuple[int, ...] = (1024,)
    output_tokens: tuple[int, ...] = (1024,)
    regimes: tuple[str, ...] = ("chat",)
    requests: tuple[SimRequest, ...] = ()
    block_size: int = 512
    name: str = ""
    block_hashes: tuple[tuple[int, ...], ...] = ()
    max_in_flight: int = 0

    def problem(self) -> str | None:
        """Why this workload cannot be simulated in bounded time (``None`` when it can): every count and length a
        positive whole number within ``MAX_REQUESTS`` / ``MAX_TOKENS``."""
        counts = {"concurrency": self.concurrency, "num_requests": self.num_requests, "block_size": self.block_size,
                  "max_in_flight": self.max_in_flight}
        for name, value in counts.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                return f"{name} must be a whole number ≥ 0, not {value!r}"
        if self.concurrency < 1 or self.block_size < 1:
            return "concurrency and block_size must be at least 1"
        if max(self.num_requests, self.concurrency, len(self.requests)) > MAX_REQUESTS:
            return f"at most {MAX_REQUESTS:,} requests (and clients) are simulated in one truth"
        given = [(f"requests[{i}].{name}", (getattr(r, name),)) for i, r in enumerate(self.requests)
                 for name in ("input_tokens", "output_tokens")]
        for name, lengths in (("input_tokens", self.input_tokens), ("output_tokens", self.output_tokens), *given):
            if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TOKENS
                                  for n in lengths):
                return f"{name} must be whole numbers of tokens from 1 to {MAX_TOKENS:,}, not {list(lengths)!r}"
        return None

    def closed_loop_requests(self) -> list[SimRequest]:
        count = self.num_requests or self.concurrency * 2
        hashes = self.block_hashes
        return [SimRequest(rid=f"r{i}", input_tokens=self.input_tokens[i % len(self.input_tokens)],
                           output_tokens=self.output_tokens[i % len(self.output_tokens)],
                           regime=self.regimes[i % len(self.regimes)],
                           block_hashes=hashes[i % len(hashes)] if hashes else ()) for i in range(count)]


@dataclass(frozen=True)
class Truth:
    """The noiseless worth of one configuration on one workload, with the runtime/model/GPU it is about.

    ``output_tokens_per_s`` is completed output tokens over the makespan; ``decode_tokens_per_s`` is the median
    per-request decode rate (``(output − 1) / (finish − first token)``), the usual single-request figure.
    ``prefix_cache_hit_rate`` is cached over prompt tokens of the admitted requests.
    Every rate is ``None`` when nothing completed: a crash is never a zero.
    """

    profile: str
    runtime_version: str
    card: str
    model: str
    crashed: bool
    crash_kind: str | None
    crash_phase: str | None
    crash_reason: str | None
    output_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    kv_pool_tokens: int
    max_running_requests: int
    context_len: int
    mean_accept_length: float | None
    completed: int
    rejected: int
    aborted: int
    retractions: int
    makespan_s: float
    quality_damaged: bool
    prefix_cache_hit_rate: float | None = None
    quality_damage: tuple[str, ...] = ()
    crash_lines: tuple[str, ...] = ()
    ttft_p90_s: float | None = None
    plan: MemoryPlan | None = field(default=None, compare=False, repr=False)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "plan"}


def truth(profile: SimProfile, flags: Mapping[str, FlagValue], env: Mapping[str, str],
          workload: TruthWorkload, *, seed: int = 0) -> Truth:
    """Run ``workload`` against ``profile`` under ``flags``/``env`` on the simulated clock, noise-free."""
    plan = plan_memory(profile, flags, env)
    base = _Tally(profile, plan)
    if plan.boot_failure is not None:
        return base.crashed(plan.boot_failure.kind.value, "boot", plan.boot_failure.lines[-1],
                            tuple(plan.boot_failure.lines))
    perf = PerformanceModel(profile, plan, flags, env)
    engine = Engine(profile, plan, perf, random.Random(seed), block_size=workload.block_size)
    tally = base
    try:
        if workload.requests:
            _open_loop(engine, workload.requests, tally, workload.max_in_flight)
        else:
            _closed_loop(engine, workload, tally)
    except EngineCrash as exc:
        reason = exc.crash.lines[-1] if exc.crash.lines else exc.crash.kind.value
        return tally.crashed(exc.crash.kind.value, exc.crash.phase, reason, tuple(exc.crash.lines))
    tally.retractions = engine.retractions
    return tally.result()


class _Tally:
    def __init__(self, profile: SimProfile, plan: MemoryPlan) -> None:
        self.profile = profile
        self.plan = plan
        self.arrival: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.finish: dict[str, float] = {}
        self.outputs: dict[str, int] = {}
        self.rejected = 0
        self.aborted = 0
        self.retractions = 0
        self.accepted = 0
        self.verifies = 0
        self.cached_tokens = 0
        self.prompt_tokens: dict[str, int] = {}
        self.start = 0.0
        self.end = 0.0

    def observe(self, step_start: float, step: StepResult) -> list[str]:
        end = step_start + step.duration_s
        for rid in step.first_token:
            self.first.setdefault(rid, end)
        for rid, n in step.emitted.items():
            self.outputs[rid] = self.outputs.get(rid, 0) + n
        for rid in step.finished:
            self.finish[rid] = end
        self.aborted += len(step.aborted)
        self.cached_tokens += sum(step.cached.values())
        self.accepted += step.accepted_tokens
        self.verifies += step.verify_calls
        self.end = max(self.end, end)
        return [*step.finished, *step.aborted]

    def _base(self) -> dict[str, object]:
        p, plan = self.profile, self.plan
        return {"profile": p.name, "runtime_version": p.runtime_version, "card": p.card.name, "model": p.model.name,
                "kv_pool_tokens": plan.kv_tokens, "max_running_requests": plan.max_running_requests,
                "context_len": plan.context_len, "quality_damage": plan.quality_damage,
                "quality_damaged": bool(plan.quality_damage), "plan": plan, "rejected": self.rejected,
                "aborted": self.aborted, "retractions": self.retractions}

    def crashed(self, kind: str, phase: str, reason: str, lines: tuple[str, ...] = ()) -> Truth:
        return Truth(crashed=True, crash_kind=kind, crash_phase=phase, crash_reason=reason, crash_lines=lines,
                     output_tokens_per_s=None,
                     decode_tokens_per_s=None, ttft_p50_s=None, ttft_p99_s=None, mean_accept_length=None,
                     completed=len(self.finish), makespan_s=self.end - self.start,
                     **self._base())  # type: ignore[arg-type]

    def result(self) -> Truth:
        done = [rid for rid in self.finish if rid in self.first]
        makespan = self.end - self.start
        total = sum(self.outputs.get(rid, 0) for rid in done)
        ttfts = sorted(self.first[rid] - self.arrival.get(rid, 0.0) for rid in done)
        prompt = sum(self.prompt_tokens.get(rid, 0) for rid in done)
        rates = [(self.outputs[rid] - 1) / (self.finish[rid] - self.first[rid]) for rid in done
                 if self.outputs.get(rid, 0) > 1 and self.finish[rid] > self.first[rid]]
        return Truth(crashed=False, crash_kind=None, crash_phase=None, crash_reason=None,
                     output_tokens_per_s=total / makespan if done and makespan > 0 else None,
                     decode_tokens_per_s=statistics.median(rates) if rates else None,
                     ttft_p50_s=_quantile(ttfts, 0.5), ttft_p99_s=_quantile(ttfts, 0.99),
                     ttft_p90_s=_quantile(ttfts, 0.9),
                     mean_accept_length=self.accepted / self.verifies if self.verifies else None,
                     prefix_cache_hit_rate=self.cached_tokens / prompt if prompt else None,
                     completed=len(done), makespan_s=makespan, **self._base())  # type: ignore[arg-type]


def _submit(engine: Engine, req: SimRequest, tally: _Tally) -> bool:
    """Send ``req`` (it arrives at its ``arrival_s``); ``False`` and counted as rejected when the server refuses it."""
    try:
        engine.submit(req)
    except RequestRejected:
        tally.rejected += 1
        return False
    tally.arrival[req.rid] = req.arrival_s
    tally.prompt_tokens[req.rid] = req.input_tokens
    return True


def _closed_loop(engine: Engine, workload: TruthWorkload, tally: _Tally) -> None:
    todo = workload.closed_loop_requests()
    in_flight = 0

    def send_next() -> None:
        nonlocal in_flight
        while todo and in_flight < workload.concurrency:
            req = todo.pop(0)
            req = SimRequest(rid=req.rid, input_tokens=req.input_tokens, output_tokens=req.output_tokens,
                             regime=req.regime, block_hashes=req.block_hashes, arrival_s=engine.now)
            in_flight += _submit(engine, req, tally)

    def finished(count: int) -> None:
        nonlocal in_flight
        in_flight -= count
        send_next()

    send_next()
    _drive(engine, tally, finished, lambda: not todo)


def _open_loop(engine: Engine, requests: Sequence[SimRequest], tally: _Tally, cap: int = 0) -> None:
    pending = sorted(requests, key=lambda r: r.arrival_s)
    pending.reverse()
    in_flight = 0

    def admit() -> None:
        nonlocal in_flight
        while pending and (not cap or in_flight < cap):
            req = pending.pop()
            if req.arrival_s < engine.now:   # held by the cap: it arrives when a slot frees
                req = dataclasses.replace(req, arrival_s=engine.now)
            in_flight += _submit(engine, req, tally)

    def finished(count: int) -> None:
        nonlocal in_flight
        in_flight -= count
        admit()

    tally.start = min((r.arrival_s for r in requests), default=0.0)
    admit()
    _drive(engine, tally, finished, lambda: False)


def _drive(engine: Engine, tally: _Tally, finished: Callable[[int], None], drained: Callable[[], bool]) -> None:
    """Step ``engine`` until no event is left, or it is idle and ``drained`` says no request is left to send; after
    each step, ``finished`` is told how many requests it completed (so the caller can send more)."""
    for _ in range(MAX_STEPS):
        start = engine.now
        step = engine.step()
        if step is None:
            if engine.idle and drained():
                return
            nxt = engine.next_event
            if nxt is None:
                return
            engine.advance_to(nxt)
            continue
        finished(len(tally.observe(start, step)))
    raise RuntimeError("truth: the workload did not finish within the step budget")


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]
