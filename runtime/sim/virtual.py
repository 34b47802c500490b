"""``VirtualServer``: the simulated server (SGLang or vLLM) without processes, sockets or a wall clock.

A virtual launch goes through the same pieces as ``elsa-tune sim serve``: the candidate's command line is read by
the family's dialect (``dialect.py``: the simulator's copy of the runtime's argument parser, then the engine's
knobs), the card's memory is planned (``memory.plan_memory``), the boot log is printed phase by phase into memory,
and what a runtime would read from it is read by the family's real readers: its ``boot_report`` (pools, slots,
silent clamps and ignored flags) and ``classify`` (the failure kind of a boot or a dead server). Serving a
workload runs the scheduling engine to completion on the simulated clock (``truth.truth``); a crash under load
prints the family's lines after the boot log and is classified the same way.

Everything is in the simulated system's time: ``VirtualLaunch.boot_s`` is how long the boot takes on the simulated
card, a ``Truth``'s makespan how long the workload takes there. A configuration's launch and noiseless serving are
deterministic and cached per candidate (and workload).

``VirtualServer`` is a ``Runtime``: ``start`` boots a candidate in simulated time (it spends the boot's seconds on its
clock, writes the boot log into the boot folder, raises ``BootFailed`` with the classified failure of a launch that
never becomes ready, and draws the boot's drift from the seed in the boot folder, ``runtime/boot_seed.py``);
``check`` says whether a server died while serving; ``stop`` spends the stop's seconds. What a ready server does
with a workload (``serve_on``: a probe's requests; ``run_pass``: a measured pass with the boot's drift, the run
noise and a cold first pass, ``noise.py``; ``send_image``: the largest image to the vision encoder) is the
scheduling engine's truth on the simulated clock; a crash there kills the server, classified from the family's
lines.
"""

from __future__ import annotations

import argparse
import io
import itertools
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from elsa_tune.errors import BootFailed, RuntimeUnavailable
from elsa_tune.runtime.boot_report import BootReport
from elsa_tune.runtime.boot_seed import read_boot_seed
from elsa_tune.runtime.failure import Failure, FailureHints, FailureKind
from elsa_tune.runtime.family import RuntimeFamily
from elsa_tune.runtime.flags import FlagSet
from elsa_tune.runtime.gpu import GpuMemory, GpuState
from elsa_tune.runtime.protocol import Exit, Health, HealthState, Server
from elsa_tune.runtime.sim.dialect import Dialect, Reading, dialect
from elsa_tune.runtime.sim.faults import Crash, watchdog_crash
from elsa_tune.runtime.sim.memory import MemoryPlan, SimCrash
from elsa_tune.runtime.sim.noise import boot_drift
from elsa_tune.runtime.sim.profile import NoiseProfile, SimProfile, load_profile
from elsa_tune.runtime.sim.source import crash_of
from elsa_tune.runtime.sim.truth import Truth, TruthWorkload, truth
from elsa_tune.search_spaces.candidate import Candidate, FlagValue

SCHEMA_VERSION = 1
#: Simulated seconds of a launch before the boot log's first phase (interpreter, imports, tokenizer) and of a stop.
PROCESS_START_S = 20.0
STOP_S = 5.0
#: SGLang's warm-up generate before the ready line.
WARMUP_S = 1.0
GIB = 1024**3
SERVER_LOG = "server.log"


class SimulatedTime(Protocol):
    """The clock a virtual runtime spends: simulated seconds since the study began (``tuner.night.StudyClock``)."""

    def now(self) -> float: ...

    def advance(self, seconds: float) -> None: ...


class VirtualClock:
    """A ``SimulatedTime`` of its own, for a virtual runtime used outside a study."""

    def __init__(self) -> None:
        self._seconds = 0.0

    def now(self) -> float:
        return self._seconds

    def advance(self, seconds: float) -> None:
        self._seconds += max(0.0, seconds)


@dataclass(frozen=True)
class VirtualPass:
    """One measured pass on a virtual server: the noiseless truth and this pass's noise.

    ``factor`` multiplies the truth's durations (the boot's drift, the run noise, the wander, a cold first pass);
    ``tail`` multiplies its tail TTFTs on top; ``seconds`` is what the pass took on the simulated card.
    """

    truth: Truth
    factor: float
    tail: float
    seconds: float


@dataclass
class _Booted:
    """A ready virtual server: its candidate, the boot's noise, and the failure it died of (``None``: alive)."""

    candidate: Candidate
    launch: VirtualLaunch
    noise: NoiseProfile
    rng: random.Random
    drift: float
    wander: float = 0.0
    died: Failure | None = None


@dataclass(frozen=True)
class VirtualLaunch:
    """One candidate's launch: its boot log, what a runtime reads from it, and how long it takes (simulated s).

    ``failure`` is set when the launch never becomes ready (the classified failure of its log); ``report`` when it
    does. ``plan`` is the simulator's memory plan behind both.
    """

    candidate_key: str
    log_text: str
    boot_s: float
    report: BootReport | None
    failure: Failure | None
    plan: MemoryPlan | None
    schema_version: int = SCHEMA_VERSION


class VirtualGpu:
    """The ``GpuView`` of a virtual study's card: the profile's card, idle, at its power cap; nothing else on it."""

    def __init__(self, profile: SimProfile) -> None:
        card = profile.card
        self._state = GpuState(index=0, uuid=f"GPU-virtual-{card.name.lower().replace(' ', '-')}", name=card.name,
                               driver="simulated", cuda_driver=None, memory_total=int(card.memory_gb * GIB),
                               power_limit_w=card.power_limit_w, power_default_limit_w=card.default_power_w,
                               temperature_c=None, sm_clock_mhz=None, mem_clock_mhz=None, max_sm_clock_mhz=None,
                               persistence_mode=True)

    @property
    def uuid(self) -> str:
        return self._state.uuid

    def memory(self) -> GpuMemory:
        total = self._state.memory_total
        return GpuMemory(total=total, used=0, free=total, at=0.0)

    def state(self) -> GpuState:
        return self._state


class VirtualServer:
    """The ``Runtime`` of ``profile``'s simulated server of family ``family_name`` (``sglang``, ``vllm``) in simulated
    time; launches and noiseless serving are cached per candidate.

    ``clock`` is the simulated time every boot, request and stop spends (a study passes its own clock); ``epoch``
    the unix second its zero stands for (a server's ``started_at`` and ``ready_at`` are ``epoch`` plus simulated
    seconds); ``noise`` replaces the profile's noise for every boot (``None``: the profile's).
    """

    def __init__(self, profile: SimProfile | str | Path, *, model_path: str | None = None,
                 clock: SimulatedTime | None = None, epoch: float | None = None,
                 noise: NoiseProfile | None = None, family_name: str = "sglang") -> None:
        self.dialect: Dialect = dialect(family_name)
        self.family: RuntimeFamily = self.dialect.family()
        self.name = f"{family_name}-sim-virtual"
        self.profile = profile if isinstance(profile, SimProfile) else load_profile(profile)
        self.model_path = model_path or self.profile.model.served_name
        self.clock: SimulatedTime = clock if clock is not None else VirtualClock()
        self.epoch = time.time() if epoch is None else epoch
        self.noise = noise or self.profile.noise
        self.gpu = VirtualGpu(self.profile)
        self._handles = itertools.count(1)
        self._seeds = itertools.count(0)
        self._servers: dict[str, _Booted] = {}
        self._parser = self.dialect.parser(add_help=False)
        self._launches: dict[str, VirtualLaunch] = {}
        self._flags: dict[str, dict[str, FlagValue]] = {}
        self._served: dict[tuple[str, str], Truth] = {}

    # ---- what a runtime offers ---------------------------------------------------------------------------

    @property
    def version(self) -> str:
        return self.dialect.endpoints(self.profile).version

    @property
    def launch_command(self) -> tuple[str, ...]:
        return ("elsa-tune", "sim", "serve", "--family", self.dialect.name, "--virtual", "--sim-profile",
                self.profile.name)

    def flag_set(self) -> FlagSet:
        """The simulated runtime's own flag list, read from its ``--help`` text by its family (no process)."""
        return self.family.parse_help(self.dialect.parser().format_help(),
                                      source=f"simulated {self.dialect.name} (virtual)")

    def now(self) -> float:
        """Unix seconds in the simulated system's time."""
        return self.epoch + self.clock.now()

    def start(self, candidate: Candidate, boot_dir: Path) -> Server:
        """Boot ``candidate``: spend its boot seconds, write its log, and return the ready server.

        Raises ``BootFailed`` (after the launch and the stop of the dead process are spent) when it never becomes
        ready. The boot's drift is drawn from the seed in ``boot_dir`` (else the next of this runtime's own).
        """
        seed = read_boot_seed(boot_dir)
        seed = next(self._seeds) if seed is None else seed
        started = self.clock.now()
        launch = self.launch(candidate)
        boot_dir.mkdir(parents=True, exist_ok=True)
        log_path = boot_dir / SERVER_LOG
        log_path.write_text(launch.log_text, encoding="utf-8")
        self.clock.advance(launch.boot_s)
        if launch.failure is not None or launch.report is None:
            self.clock.advance(STOP_S)
            failure = launch.failure or Failure(FailureKind.UNKNOWN_CRASH, "the server never became ready",
                                                "read the boot's server log")
            raise BootFailed(failure, log_path=str(log_path))
        # keyed like the HTTP simulator's ``ServingNoise``: the profile's own noise seed, then the boot's
        rng = random.Random(f"elsa-virtual:{self.profile.noise.seed * 1_000_003 + seed}")
        drift = boot_drift(self.noise, rng, started)
        handle = str(next(self._handles))
        self._servers[handle] = _Booted(candidate, launch, self.noise, rng, drift)
        return Server(candidate=candidate, base_url=f"virtual://{self.profile.name}/{handle}", port=0,
                      boot_dir=boot_dir, log_path=log_path, report=launch.report, started_at=self.epoch + started,
                      ready_at=self.now(), handle=handle, gpu_uuid=self.gpu.uuid)

    def check(self, server: Server) -> Health:
        booted = self._servers.get(server.handle)
        if booted is None:
            return Health(HealthState.DEAD, "stopped")
        if booted.died is not None:
            return Health(HealthState.DEAD, booted.died.summary, booted.died)
        return Health(HealthState.HEALTHY, "ready")

    def stop(self, server: Server) -> Exit:
        """Stop ``server`` (idempotent): spends the stop's seconds; ``failure`` when it had died on its own."""
        booted = self._servers.pop(server.handle, None)
        if booted is None:
            return Exit(returncode=0, killed=False, gpu_memory_released=True, seconds=0.0, detail="already stopped")
        self.clock.advance(STOP_S)
        died = booted.died
        return Exit(returncode=-9 if died else 0, killed=False, gpu_memory_released=True, seconds=STOP_S,
                    failure=died, detail=died.summary if died else "")

    # ---- a ready server under load -------------------------------------------------------------------------

    def headroom_bytes(self, server: Server) -> int | None:
        """The card's memory left outside the pools while ``server`` serves (the memory plan's headroom)."""
        plan = self._booted(server).launch.plan
        return int(plan.headroom_gb * GIB) if plan is not None else None

    def serve_on(self, server: Server, workload: TruthWorkload, *, hang_wait_s: float = 0.0) -> Truth:
        """Run ``workload`` on the ready ``server``: spends its makespan times the boot's drift (and ``hang_wait_s``
        more when it hangs: the client's wait for a token); a crash kills the server."""
        booted = self._alive(server)
        served = self.serve(booted.candidate, workload)
        self.clock.advance(served.makespan_s * booted.drift)
        if served.crashed:
            self._die(booted, served, hang_wait_s)
        return served

    def run_pass(self, server: Server, workload: TruthWorkload, pass_index: int, *,
                 hang_wait_s: float = 0.0) -> VirtualPass:
        """Measured pass ``pass_index`` of ``workload`` on ``server``, with the boot's noise; a crash kills it.

        The noise of pass ``i`` (in order from 0): a run factor ``exp(N(0, run_sigma))`` on the boot's drift, a
        mean-reverting wander, a cold share ``(warm_requests − i·n)/n`` of the first passes slowed by
        ``first_pass_slowdown``; the tail TTFTs get one more ``exp(N(0, 2·run_sigma))``.
        """
        booted = self._alive(server)
        served = self.serve(booted.candidate, workload)
        if served.crashed:
            self.clock.advance(served.makespan_s * booted.drift)
            self._die(booted, served, hang_wait_s)
            return VirtualPass(served, booted.drift, 1.0, served.makespan_s * booted.drift)
        noise, rng = booted.noise, booted.rng
        n = max(1, served.completed + served.rejected + served.aborted)
        cold_share = min(1.0, max(0.0, (noise.warm_requests - pass_index * n) / n))
        factor = booted.drift * math.exp(rng.gauss(0.0, noise.run_sigma)) if noise.run_sigma > 0 else booted.drift
        booted.wander = 0.5 * booted.wander + noise.run_sigma / 3 * math.sqrt(0.75) * rng.gauss(0.0, 1.0)
        factor *= math.exp(booted.wander) * (1.0 + noise.first_pass_slowdown * cold_share)
        tail = math.exp(rng.gauss(0.0, 2 * noise.run_sigma)) if noise.run_sigma > 0 else 1.0
        seconds = served.makespan_s * factor
        self.clock.advance(seconds)
        return VirtualPass(served, factor, tail, seconds)

    def send_image(self, server: Server, image_tokens: int) -> Failure | None:
        """The vision encoder takes an image of ``image_tokens`` tokens: its temporaries live outside the pools,
        and an image whose temporaries do not fit the headroom kills the server (``None``: it fit)."""
        booted = self._alive(server)
        model = self.profile.model
        plan = booted.launch.plan
        if not model.is_vision or plan is None:
            return None
        tokens = min(image_tokens, model.image_max_tokens)
        need = model.image_workspace_gb * tokens / max(1, model.image_max_tokens)
        if need <= plan.headroom_gb:
            return None
        crash = SimCrash(FailureKind.OOM_UNDER_LOAD, "under_load", (
            "Scheduler hit an exception: Traceback (most recent call last):",
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need * 1024:.2f} MiB. GPU 0 has "
            f"{max(0.0, plan.headroom_gb) * 1024:.2f} MiB free (vision encoder, {tokens} image tokens)."))
        booted.died = self._classify_serving(booted.launch, crash)
        return booted.died

    @property
    def vision(self) -> bool:
        """Whether the simulated model takes images."""
        return self.profile.model.is_vision

    def _booted(self, server: Server) -> _Booted:
        booted = self._servers.get(server.handle)
        if booted is None:
            raise RuntimeUnavailable(f"virtual server {server.handle} is not running",
                                     remedy="load only a server this runtime started and has not stopped")
        return booted

    def _alive(self, server: Server) -> _Booted:
        booted = self._booted(server)
        if booted.died is not None:
            raise RuntimeUnavailable(f"virtual server {server.handle} died: {booted.died.summary}",
                                     remedy="check a server before loading it again")
        return booted

    def _die(self, booted: _Booted, served: Truth, hang_wait_s: float) -> None:
        booted.died = self.serve_failure(booted.candidate, served)
        if booted.died.kind is FailureKind.HANG:
            self.clock.advance(hang_wait_s)

    # ---- launches --------------------------------------------------------------------------------------

    def launch(self, candidate: Candidate) -> VirtualLaunch:
        """The candidate's boot (cached): its log, boot report or classified failure, and its simulated seconds."""
        key = candidate.key()
        if key not in self._launches:
            self._launches[key] = self._launch(candidate)
        return self._launches[key]

    def _launch(self, candidate: Candidate) -> VirtualLaunch:
        key = candidate.key()
        given_ns, unknown = self._parse(self._argv(candidate))
        speaks = self.dialect
        if unknown is not None:
            text = speaks.usage_error(unknown)
            failure = self.family.classify(text, FailureHints(exit_code=2, became_ready=False))
            return VirtualLaunch(key, text, PROCESS_START_S, None, failure, None)
        reading = speaks.read(self.profile, speaks.given(given_ns), dict(candidate.env))
        plan = reading.plan
        self._flags[key] = dict(reading.knobs)
        out = io.StringIO()
        log = speaks.log(out)
        if reading.refused is not None:
            speaks.refuse(log, reading)
            failure = self.family.classify(out.getvalue(), FailureHints(exit_code=1, became_ready=False))
            return VirtualLaunch(key, out.getvalue(), PROCESS_START_S, None, failure, None)
        boot_failure = reading.boot_failure
        plan_crash = crash_of(boot_failure) if boot_failure is not None else None
        first_generation = plan.serve_crash if plan.serve_crash is not None and \
            plan.serve_crash.phase == "first_generation" and speaks.warms_up else None

        def crash_at(phase: str) -> Crash | None:
            return plan_crash if plan_crash is not None and plan_crash.phase == phase else None

        walk = speaks.boot(log, self.profile, reading, lambda _s: None, crash_at, lambda _gb: None)
        crash = walk.run()
        seconds = PROCESS_START_S + sum(walk.seconds.values())
        if crash is not None:
            log.crash(crash, serving=False)
            code = crash.exit_code if speaks.boot_exit_code is None else speaks.boot_exit_code
            failure = self.family.classify(out.getvalue(), FailureHints(exit_code=code, became_ready=False))
            return VirtualLaunch(key, out.getvalue(), seconds, None, failure, plan)
        speaks.started(log, walk, reading.host, reading.port)
        if first_generation is not None:
            # SGLang's warm-up generate is the first generation: the server dies before its ready line
            log.crash(crash_of(first_generation), serving=True)
            failure = self.family.classify(out.getvalue(), FailureHints(exit_code=-9, became_ready=False))
            return VirtualLaunch(key, out.getvalue(), seconds + WARMUP_S, None, failure, plan)
        speaks.ready(log)
        report = self.family.boot_report(out.getvalue(), candidate, self._info(reading))
        return VirtualLaunch(key, out.getvalue(), seconds + (WARMUP_S if speaks.warms_up else 0.0), report, None,
                             plan)

    def _info(self, reading: Reading) -> dict[str, Any] | None:
        """What the family's own ``server_info`` reads from the server's endpoints right after boot: ``/metrics``
        (when the family serves it without a flag) and ``/v1/models``, answered in memory."""
        endpoints = self.dialect.endpoints(self.profile)
        metrics = self.dialect.metrics(reading).render() if endpoints.metrics_on else None
        models = {"object": "list", "data": [{"id": reading.served_name, "object": "model", "owned_by": endpoints.owner,
                                              "root": reading.model, "max_model_len": reading.plan.context_len}]}

        def answer(request: httpx.Request) -> httpx.Response:
            path = request.url.path
            if path == "/metrics" and metrics is not None:
                return httpx.Response(200, text=metrics)
            if path == "/v1/models":
                return httpx.Response(200, json=models)
            return httpx.Response(404, json={"detail": "Not Found"})

        with httpx.Client(transport=httpx.MockTransport(answer)) as client:
            return self.family.server_info(client, "http://virtual", 1.0)

    def _parse(self, argv: list[str]) -> tuple[dict[str, Any], str | None]:
        try:
            namespace, rest = self._parser.parse_known_args(argv)
        except SystemExit:
            return {}, f"argument error in: {' '.join(argv)}"
        except argparse.ArgumentError as exc:
            return {}, str(exc)
        if rest:
            return {}, f"unrecognized arguments: {' '.join(rest)}"
        return vars(namespace), None

    # ---- serving -----------------------------------------------------------------------------------------

    def serve(self, candidate: Candidate, workload: TruthWorkload) -> Truth:
        """The noiseless run of ``workload`` on the booted candidate (cached by candidate and ``workload.name``)."""
        cache_key = (candidate.key(), workload.name or repr(hash(workload)))
        if cache_key not in self._served:
            launch = self.launch(candidate)
            if launch.failure is not None:
                raise RuntimeUnavailable(f"{candidate.label or candidate.key()} never became ready",
                                         remedy="serve only a candidate whose launch has no failure")
            flags = self._flags[candidate.key()]
            self._served[cache_key] = truth(self.profile, flags, dict(candidate.env), workload)
        return self._served[cache_key]

    def serve_failure(self, candidate: Candidate, served: Truth) -> Failure:
        """The classified failure of a server that died (or hung) while serving: its log, then SGLang's lines."""
        kind = FailureKind(served.crash_kind) if served.crash_kind else FailureKind.UNKNOWN_CRASH
        return self._classify_serving(self.launch(candidate),
                                      SimCrash(kind, served.crash_phase or "under_load", served.crash_lines))

    def _classify_serving(self, launch: VirtualLaunch, crash: SimCrash) -> Failure:
        out = io.StringIO()
        log = self.dialect.log(out)
        if crash.kind is FailureKind.HANG:
            log.crash(watchdog_crash(300.0), serving=True)
            hints = FailureHints(exit_code=-9, became_ready=True, timed_out=True)
        else:
            log.crash(crash_of(crash), serving=True)
            hints = FailureHints(exit_code=-9, became_ready=True)
        return self.family.classify(launch.log_text + out.getvalue(), hints)

    def _argv(self, candidate: Candidate) -> list[str]:
        flag = self.dialect.model_flag
        return [*candidate.argv(), f"--{flag}", self.model_path] if flag not in candidate.flags else candidate.argv()


#: The SGLang-speaking virtual runtime under its former name.
VirtualSGLang = VirtualServer

