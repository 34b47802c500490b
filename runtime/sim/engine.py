"""The deterministic scheduling core of the simulated SGLang: continuous batching on a simulated clock.

``Engine`` knows nothing of wall time: each ``step()`` is one scheduler iteration, returned with its duration
from the performance model. The server paces steps in real time and adds noise; ``truth()`` runs them as fast as
it can. What it models, after SGLang's scheduler:

- **admission**: FCFS from the queue while running slots (the effective ``max_running_requests``) and KV room
  last; KV room keeps a reserve for the running requests' future tokens (``new_token_ratio``, 0.7 decaying to
  0.1, bumped on retraction);
- **chunked prefill**: at most ``chunked_prefill_size`` prompt tokens per prefill step, one chunked request at a
  time; decode pauses during prefill steps (mixed chunking is off with speculative decoding);
- **radix prefix cache** keyed on the prompt's block hashes (two prompts share a prefix exactly as long as
  their leading hashes agree), matched at page granularity, with LRU eviction of unlocked blocks;
- **retraction** when decode outgrows the KV pool: the newest request goes back to the queue front and its
  tokens are recomputed later;
- **speculative decoding**: each request emits a chain of accepted draft tokens plus the bonus token per step.

Faults are the server's; a profile's crash under load is raised here as ``EngineCrash``.
"""

from __future__ import annotations

import bisect
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.sim.memory import MemoryPlan, SimCrash
from elsa_tune.runtime.sim.performance import PerformanceModel
from elsa_tune.runtime.sim.profile import SimProfile
from elsa_tune.runtime.sim.radix_cache import MambaStates, RadixCache

NEW_TOKEN_RATIO_INIT = 0.7
NEW_TOKEN_RATIO_MIN = 0.1
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RESERVE_CAP_TOKENS = 4096


class RequestRejected(ValueError):
    """SGLang refuses the request with HTTP 400; the message is SGLang's text."""


class EngineCrash(RuntimeError):
    """The scheduler died while serving; ``crash`` carries the kind and SGLang's lines."""

    def __init__(self, crash: SimCrash) -> None:
        super().__init__(crash.lines[-1] if crash.lines else crash.kind.value)
        self.crash = crash


@dataclass(frozen=True)
class SimRequest:
    """A request as the scheduling core sees it. ``output_tokens`` is exactly what will be generated."""

    rid: str
    input_tokens: int
    output_tokens: int
    regime: str = "chat"
    block_hashes: tuple[int, ...] = ()
    arrival_s: float = 0.0


@dataclass(frozen=True)
class StepResult:
    """One scheduler iteration: its kind and duration, what each request got, and the pool's state after it."""

    duration_s: float
    kind: str                                        # "prefill" or "decode" ("idle": ``Engine.pool_state``)
    emitted: Mapping[str, int]
    first_token: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()
    retracted: tuple[str, ...] = ()
    aborted: Mapping[str, str] = field(default_factory=dict)
    cached: Mapping[str, int] = field(default_factory=dict)
    new_tokens: int = 0
    new_seqs: int = 0
    running: int = 0
    queued: int = 0
    # SGLang's pool accounting (``scheduler_components/pool_stats_observer.py``, ``_get_token_info``): used is
    # ``capacity − (available + evictable)``, so prompts the radix cache keeps unlocked are not used.
    used_tokens: int = 0
    evictable_tokens: int = 0
    token_capacity: int = 1
    mamba_used: int = 0                              # slots of the running requests (``_get_mamba_token_info``)
    mamba_evictable: int = 0                         # slots holding cached prompts' states
    mamba_capacity: int = 0
    verify_calls: int = 0
    accepted_tokens: int = 0
    started_at: float = 0.0
    transient_gb: float = 0.0                        # temporaries outside the pools during this step (GiB)

    @property
    def token_usage(self) -> float:
        return self.used_tokens / max(1, self.token_capacity)

    @property
    def mamba_usage(self) -> float:
        return self.mamba_used / max(1, self.mamba_capacity)


@dataclass
class _Live:
    req: SimRequest
    prefill_target: int = 0       # tokens that must be in KV before decoding (prompt, plus output after retraction)
    prefilled: int = 0            # of those, in KV now (cached or computed)
    cached: int = 0
    generated: int = 0
    held: int = 0                 # private KV tokens this request holds (not in the shared tree)
    path: tuple[int, ...] = ()    # tree nodes this request locks
    first_token_sent: bool = False

    @property
    def prefilling(self) -> bool:
        return self.prefilled < self.prefill_target


class Engine:
    """Continuous batching for one boot of ``profile`` under ``plan``; deterministic for a given ``rng`` seed."""

    def __init__(self, profile: SimProfile, plan: MemoryPlan, perf: PerformanceModel, rng: random.Random,
                 *, block_size: int = 512, prefix_cache: bool = True) -> None:
        self.profile = profile
        self.plan = plan
        self.perf = perf
        self.rng = rng
        self.capacity: int = max(1, int(plan.kv_tokens))
        self.slots: int = max(1, int(plan.max_running_requests))
        self.cache = RadixCache(block_size) if prefix_cache else None
        self.states: MambaStates | None = None
        if self.cache is not None and profile.model.is_hybrid and plan.mamba_slots > 0:
            interval = int(plan.resolved_server_args.get("mamba_track_interval") or 256)
            self.states = MambaStates(max(1, interval // block_size))
            self.cache.on_evict = self.states.forget
        self.block_size = block_size
        self.now = 0.0
        self.pending: list[SimRequest] = []                 # arrivals in the future
        self.queue: deque[_Live] = deque()
        self.running: list[_Live] = []                      # admitted: prefilling or decoding
        self.new_token_ratio = NEW_TOKEN_RATIO_INIT
        self.crashed: SimCrash | None = None
        self.generations = 0
        self.retractions = 0
        self.slowdown = 1.0        # the serving loop's noise: every step's duration is multiplied by it

    # ---- requests --------------------------------------------------------------------------------------

    def submit(self, req: SimRequest) -> None:
        """Queue ``req`` (at ``req.arrival_s`` if that is later than now); SGLang's 400s raise ``RequestRejected``."""
        limit = self.plan.context_len
        if req.input_tokens >= limit:
            raise RequestRejected(f"The input ({req.input_tokens} tokens) is longer than the model's context length "
                                  f"({limit} tokens).")
        if req.input_tokens + req.output_tokens > limit:
            raise RequestRejected(f"Requested token count exceeds the model's maximum context length of {limit} "
                                  f"tokens. You requested a total of {req.input_tokens + req.output_tokens} tokens: "
                                  f"{req.input_tokens} tokens from the input messages and {req.output_tokens} tokens "
                                  "for the completion. Please reduce the number of tokens in the input messages or "
                                  "the completion to fit within the limit.")
        if req.arrival_s > self.now:
            bisect.insort(self.pending, req, key=lambda r: r.arrival_s)
        else:
            self.queue.append(_Live(req))

    def abort(self, rid: str) -> None:
        for live in list(self.queue):
            if live.req.rid == rid:
                self.queue.remove(live)
        for live in list(self.running):
            if live.req.rid == rid:
                self._release(live, cache_prompt=False)
                self.running.remove(live)
        self.pending = [r for r in self.pending if r.rid != rid]

    def flush_cache(self) -> bool:
        """``/flush_cache``: only when nothing is running or waiting (else SGLang answers 400)."""
        if self.running or self.queue or self.cache is None:
            return not (self.running or self.queue)
        return bool(self.cache.clear())

    @property
    def idle(self) -> bool:
        return not (self.running or self.queue or self.pending)

    @property
    def next_event(self) -> float | None:
        """Simulated time of the next arrival, or ``None``."""
        return self.pending[0].arrival_s if self.pending else None

    def advance_to(self, t: float) -> None:
        """Move the idle clock forward (never backwards) and release arrivals up to ``t``."""
        self.now = max(self.now, t)
        self._arrive()

    # ---- the scheduler iteration ------------------------------------------------------------------------

    def step(self) -> StepResult | None:
        """Run one iteration at ``now``; ``None`` when nothing is runnable yet (see ``next_event``)."""
        self._arrive()
        aborted, cached = self._admit()
        prefilling = [live for live in self.running if live.prefilling]
        if prefilling:
            return self._prefill(prefilling, cached, aborted)
        if self.running:
            return self._decode(aborted)
        if aborted:
            return self._result("prefill", 0.0, {}, aborted=aborted)
        return None

    def _arrive(self) -> None:
        while self.pending and self.pending[0].arrival_s <= self.now:
            self.queue.append(_Live(self.pending.pop(0)))

    def _used(self) -> int:
        private = sum(live.held for live in self.running)
        return private + (self.cache.tokens if self.cache else 0)

    def _free(self) -> int:
        evictable = self.cache.evictable() if self.cache else 0
        return self.capacity - self._used() + evictable

    def _reserve(self) -> int:
        left = sum(min(RESERVE_CAP_TOKENS, live.req.output_tokens - live.generated) for live in self.running)
        return int(left * self.new_token_ratio)

    def _admit(self) -> tuple[dict[str, str], dict[str, int]]:
        aborted: dict[str, str] = {}
        cached: dict[str, int] = {}
        while self.queue and len(self.running) < self.slots:
            live = self.queue[0]
            need_total = live.req.input_tokens + live.generated
            if need_total >= self.capacity:
                self.queue.popleft()
                aborted[live.req.rid] = (f"Prefill out of memory. Try to lower your batch size.\nTry to allocate "
                                         f"{need_total} tokens.\nAvailable tokens: {self.capacity}")
                continue
            keys = self._keys(live.req)
            matched = self.cache.match(keys) if self.cache is not None else []
            if self.states is not None:
                matched = matched[: self.states.usable(matched)]
            page = max(1, self.plan.page_size)
            hit = min(len(matched) * self.block_size, live.req.input_tokens - 1) // page * page
            allocate = need_total - hit + (0 if live.first_token_sent else 1)
            need = allocate + min(RESERVE_CAP_TOKENS, live.req.output_tokens) * self.new_token_ratio
            if self.running and self._free() - self._reserve() < need:
                break
            if not self._make_room(allocate):
                break
            self.queue.popleft()
            live.held = allocate
            if self.cache is not None:
                path = matched[: hit // self.block_size]
                self.cache.lock(path, +1)
                live.path = tuple(path)
            live.cached = hit
            live.prefilled = hit
            live.prefill_target = need_total
            self.running.append(live)
            self._trim_states()
            if live.generated == 0:
                cached[live.req.rid] = hit
        return aborted, cached

    def _keys(self, req: SimRequest) -> list[int]:
        full_blocks = req.input_tokens // self.block_size
        keys: list[int] = RadixCache.keys(req.block_hashes[:full_blocks])
        return keys

    def _make_room(self, tokens: int) -> bool:
        short = self._used() + tokens - self.capacity
        if short > 0 and self.cache is not None:
            self.cache.evict(short)
        return self._used() + tokens <= self.capacity

    def _prefill(self, prefilling: list[_Live], cached: dict[str, int], aborted: dict[str, str]) -> StepResult:
        self._serve_crash(first_generation=True)
        chunk_limit = self.plan.chunked_prefill_size if self.plan.chunked_prefill_size > 0 else 1 << 40
        budget = max(self.plan.max_prefill_tokens, min(chunk_limit, 1 << 40))
        seconds, computed, new_seqs, transient = 0.0, 0, 0, 0.0
        emitted: dict[str, int] = {}
        first: list[str] = []
        for live in prefilling:
            left = live.prefill_target - live.prefilled
            chunk = min(left, budget, chunk_limit)
            if chunk <= 0:
                break
            transient = max(transient, self._long_prefill_check(live.prefilled + chunk))
            seconds += self.perf.chunk_s(chunk, live.prefilled)
            new_seqs += live.prefilled == live.cached
            live.prefilled += chunk               # KV for the whole prompt was allocated at admission
            computed += chunk
            budget -= chunk
            if live.prefilling:
                break                      # the one chunked request of this batch
            self._cache_prompt(live)
            if not live.first_token_sent:
                live.first_token_sent = True
                live.generated += 1
                emitted[live.req.rid] = 1
                first.append(live.req.rid)
        self.generations += len(first)
        finished = self._finish()
        seconds *= self.slowdown
        self.now += seconds
        return self._result("prefill", seconds, emitted, first_token=tuple(first), finished=finished, cached=cached,
                            new_tokens=computed, new_seqs=new_seqs, aborted=aborted, transient_gb=transient)

    def _decode(self, aborted: dict[str, str]) -> StepResult:
        self._serve_crash(first_generation=False)
        batch = list(self.running)
        contexts = [live.req.input_tokens + live.generated for live in batch]
        seconds = self.perf.decode_step_s(len(batch), contexts)
        multiplier = sum(self.perf.regime_multiplier(live.req.regime) for live in batch) / len(batch)
        seconds *= self.slowdown / multiplier
        emitted: dict[str, int] = {}
        for live in batch:
            n = min(self.perf.sample_accepted(live.req.regime, self.rng), live.req.output_tokens - live.generated)
            emitted[live.req.rid] = max(0, n)
        retracted = self._grow(emitted)
        if not self._make_room(sum(emitted.values())):
            lone = self.running.pop()
            self._release(lone, cache_prompt=False)
            emitted.pop(lone.req.rid, None)
            aborted[lone.req.rid] = (f"Decode out of memory. Try to lower your batch size.\nTry to allocate "
                                     f"{lone.req.input_tokens + lone.generated + 1} tokens.\nAvailable tokens: "
                                     f"{self.capacity}")
        for live in batch:
            if live.req.rid in retracted or live.req.rid in aborted:
                emitted.pop(live.req.rid, None)
                continue
            live.generated += emitted[live.req.rid]
            live.held += emitted[live.req.rid]
        decay = (NEW_TOKEN_RATIO_INIT - NEW_TOKEN_RATIO_MIN) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = max(NEW_TOKEN_RATIO_MIN, self.new_token_ratio - decay)
        finished = self._finish()
        self.now += seconds
        verify = len(emitted) if self.perf.uses_draft else 0
        return self._result("decode", seconds, emitted, finished=finished, retracted=tuple(retracted),
                            verify_calls=verify, accepted_tokens=sum(emitted.values()) if verify else 0,
                            aborted=aborted)

    def _grow(self, emitted: dict[str, int]) -> list[str]:
        """Make room for this step's tokens, retracting the newest requests when the pool runs out."""
        retracted: list[str] = []
        while not self._make_room(sum(emitted.values())) and len(self.running) > 1:
            victim = self.running[-1]
            emitted.pop(victim.req.rid, None)
            self._retract(victim)
            retracted.append(victim.req.rid)
        if retracted:
            self.retractions += len(retracted)
            self.new_token_ratio = min(1.0, self.new_token_ratio + 0.1 * len(retracted))
        return retracted

    def _retract(self, victim: _Live) -> None:
        self.running.remove(victim)
        self._release(victim, cache_prompt=False)
        victim.prefilled, victim.cached, victim.path = 0, 0, ()
        self.queue.appendleft(victim)

    def _finish(self) -> tuple[str, ...]:
        done = [live for live in self.running
                if not live.prefilling and live.generated >= live.req.output_tokens]
        for live in done:
            self.running.remove(live)
            self._release(live, cache_prompt=True)
        return tuple(live.req.rid for live in done)

    def _cache_prompt(self, live: _Live) -> None:
        """``cache_unfinished_req``: a prefilled prompt's full blocks join the tree (locked) for others to share."""
        if self.cache is None:
            return
        keys = self._keys(live.req)
        if not keys:
            return
        self.cache.insert(keys)
        self.cache.lock(live.path, -1)
        self.cache.lock(keys, +1)
        live.held -= max(0, len(keys) * self.block_size - live.cached)   # duplicates of shared blocks are freed
        live.path = tuple(keys)
        self._keep_state(keys)

    def _keep_state(self, keys: Sequence[int]) -> None:
        if self.states is not None:
            self.states.add(keys)
            self._trim_states()

    def _trim_states(self) -> None:
        """Cached prompts keep their recurrent state only in the Mamba slots the running requests leave free."""
        if self.states is not None:
            spare = self.plan.mamba_slots - len(self.running) * self.plan.slots_per_request
            cap = self.profile.memory_rules.cached_state_sets_max
            self.states.trim(spare if cap is None else min(spare, cap))

    def _release(self, live: _Live, *, cache_prompt: bool) -> None:
        if self.cache is not None:
            self.cache.lock(live.path, -1)
            if cache_prompt:
                keys = self._keys(live.req)
                self.cache.insert(keys)
                self._make_room(0)
                self._keep_state(keys)
        live.held = 0

    def _serve_crash(self, *, first_generation: bool) -> None:
        crash = self.plan.serve_crash
        if crash is None:
            return
        if crash.phase == "first_generation" or (crash.phase == "under_load" and not first_generation
                                                  and len(self.running) >= 1 and self.generations >= 1):
            self.crashed = crash
            raise EngineCrash(crash)

    def _long_prefill_check(self, context: int) -> float:
        """GiB of temporaries a prefill chunk at ``context`` needs outside the pools; dies when they do not fit."""
        draft = self.profile.model.draft
        if draft is None or not self.perf.uses_draft:
            return 0.0
        need = float(draft.prefill_workspace_gb_per_100k * context / 100_000)
        if need > self.plan.headroom_gb:
            crash = SimCrash(FailureKind.OOM_UNDER_LOAD, "under_load", (
                "Scheduler hit an exception: Traceback (most recent call last):",
                f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need * 1024:.2f} MiB. GPU 0 has a "
                f"total capacity of {self.plan.total_gb:.2f} GiB of which {max(0.0, self.plan.headroom_gb) * 1024:.2f}"
                " MiB is free."))
            self.crashed = crash
            raise EngineCrash(crash)
        return need

    def pool_state(self) -> StepResult:
        """A zero-length ``"idle"`` step: the pools and queues as they are now."""
        return self._result("idle", 0.0, {})

    def _result(self, kind: str, seconds: float, emitted: Mapping[str, int], **extra: object) -> StepResult:
        evictable = self.cache.evictable() if self.cache else 0
        used = min(self._used(), self.capacity) - evictable
        mamba_cap = self.plan.mamba_slots
        mamba_used = min(mamba_cap, len(self.running) * self.plan.slots_per_request) if mamba_cap else 0
        cached_sets = len(self.states.sets) if self.states is not None else 0
        return StepResult(duration_s=seconds, kind=kind, emitted=dict(emitted), running=len(self.running),
                          queued=len(self.queue) + len(self.pending), used_tokens=max(0, used),
                          evictable_tokens=evictable, token_capacity=self.capacity, mamba_used=mamba_used,
                          mamba_evictable=min(max(0, mamba_cap - mamba_used), cached_sets),
                          mamba_capacity=mamba_cap, started_at=self.now - seconds, **extra)  # type: ignore[arg-type]

