"""Preflight: everything that can refuse a study before the night starts, and the facts it runs on.

1. Resolve the GPU (index or UUID → UUID through NVML, or the simulated card); stop the servers that killed
   tuners left on it (their lease's owner is dead: ``runtime/lease.py``); record its state (clocks,
   temperature, power cap, persistence, driver); refuse a GPU that other processes use.
2. Ask the installed runtime for its version and its own ``--help`` flag list and validate the search
   space against it (a misspelt flag fails now, at its file and line, not at 3 a.m.).
3. Load the traffic and derive the workloads: a closed-loop measurement pass sized to a few seconds
   (simulator) or minutes (GPU), and the busiest burst for the stress probe.
4. Compute the fingerprint every record will carry.

``elsa-tune check`` runs this alone and prints it; the study runs it first.
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import shlex
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from elsa_tune.errors import ConfigError, EnvironmentError_
from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.history.store import StudyStore
from elsa_tune.probes.plan import MAX_FIRST_TOKEN_S, budget_from_settings
from elsa_tune.probes.protocol import ProbeBudget
from elsa_tune.probes.quality import QualityGate
from elsa_tune.runtime.family import family
from elsa_tune.runtime.flags import FlagSet
from elsa_tune.runtime.gpu import GpuState, GpuView
from elsa_tune.runtime.host_memory import HostMemory
from elsa_tune.runtime.lease import OrphanReaper
from elsa_tune.runtime.protocol import Runtime, RuntimeTimeouts
from elsa_tune.runtime.sim.virtual import VirtualSGLang
from elsa_tune.search_spaces.loader import load_space
from elsa_tune.search_spaces.space import SearchSpace
from elsa_tune.traffic.prompts import PromptSynth, RandomTokens, TokenSpace
from elsa_tune.traffic.trace import Trace, read_trace
from elsa_tune.traffic.workload import Workload, busiest_window, closed_loop
from elsa_tune.tuner.flow.booter import BootContext
from elsa_tune.tuner.flow.settings import CPU, Launcher, Settings

log = logging.getLogger(__name__)

DEMO_TRACE = "demo"
#: Traces shipped with elsa-tune: ``demo``, a window of the Mooncake conversation trace (long prompts, shared
#: prefixes: ~10K tokens in, ~330 out); ``demo-chat``, the first 400 requests of the Azure LLM inference trace
#: 2023, conversation part (CC-BY-4.0: ~930 tokens in, ~260 out, no prefix information), for small models.
BUNDLED_TRACES = {DEMO_TRACE: "demo.parquet", "demo-chat": "demo-chat.parquet"}
#: A single stream delivers ~60 output tok/s end to end and prefills ~4K tok/s: a first guess to size passes.
_DECODE_TOK_S = 60.0
_PREFILL_TOK_S = 4000.0
#: wall-second floors of the probes' stall and first-token limits on the (sped-up) simulator
SIM_HANG_FLOOR_S = 10.0
SIM_REQUEST_FLOOR_S = 30.0


@dataclass(frozen=True)
class Preflight:
    """What preflight found. ``runtime`` and ``gpu`` are ready to use; ``problems`` are warnings only."""

    settings: Settings
    space: SearchSpace
    runtime: Runtime
    gpu: GpuView | None
    gpu_state: GpuState | None
    runtime_name: str
    runtime_version: str | None
    flags: FlagSet | None
    trace: Trace
    workload: Workload
    burst: Workload
    concurrency: int
    fingerprint: Fingerprint
    launch: tuple[str, ...]
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def context_target(self) -> int | None:
        """The KV pool every boot must hold: the space's minimum context, else its model's context target."""
        return self.space.guardrails.min_context_tokens or self.space.model.context_target

    def boot_context(self, store: StudyStore, study: str) -> BootContext:
        """What every boot of ``study`` on this GPU shares: the runtime, the workload, the probes, the passes."""
        settings = self.settings
        return BootContext(runtime=self.runtime, gpu=self.gpu, store=store, study=study,
                           fingerprint=self.fingerprint, workload=self.workload, burst=self.burst,
                           prompts=PromptSynth(self.workload.block_size, self.token_source()),
                           context_target=self.context_target, check_needles=self.space.model.retrieves_needles,
                           probe_budget=self.probe_budget(), warmup_passes=settings.warmup_passes,
                           measured_passes=settings.measured_passes, seed=settings.seed,
                           quality=QualityGate() if self.space.guardrails.quality_gate else None,
                           vision=self.space.model.vision)

    def token_source(self) -> RandomTokens:
        """Prompt token ids inside the served model's vocabulary (ids below 32,000 when the family cannot read it)."""
        size = self.runtime.family.vocabulary_size(self.space.model.path)
        default = TokenSpace()
        if size is None or size >= default.high:
            return RandomTokens(default)
        return RandomTokens(TokenSpace(low=min(default.low, size // 4), high=size))

    def probe_budget(self) -> ProbeBudget:
        """The probes' limits from the space. On the simulator a stall and a first token are judged in its own
        sped-up time (a 120 s stall is 3 s at 40×, as every boot and pass is), never below a floor of wall
        seconds so that a loaded host's pause is not called a hang."""
        budget = budget_from_settings(self.space.probes)
        if self.settings.speedup <= 1.0:
            return budget
        speed = self.settings.speedup
        hang = max(min(budget.hang_s, SIM_HANG_FLOOR_S), budget.hang_s / speed)
        request = min(budget.deadline_s, MAX_FIRST_TOKEN_S)
        request = max(min(request, SIM_REQUEST_FLOOR_S), request / speed)
        return replace(budget, request_timeout_s=max(hang, request), hang_s=hang)

    def lines(self) -> list[str]:
        """What ``elsa-tune check`` prints: the GPU state that affects measurements and the validation."""
        s = self.gpu_state
        out = [f"runtime: {self.runtime_name} {self.runtime_version or '(version unknown)'}: "
               f"{' '.join(self.launch)}"]
        if s is not None:
            procs = ", ".join(f"{p.name or p.pid} ({(p.used_bytes or 0) / 2**30:.1f} GiB)" for p in s.processes)
            where = f"GPU {s.index}" if s.index >= 0 else "host (no GPU)"
            out += [f"{where}: {s.name} ({s.uuid}), {s.memory_total / 2**30:.1f} GiB",
                    f"  driver {s.driver}, CUDA {s.cuda_driver or '?'}",
                    f"  clocks: SM {s.sm_clock_mhz or '?'} MHz (max {s.max_sm_clock_mhz or '?'}), "
                    f"memory {s.mem_clock_mhz or '?'} MHz",
                    f"  power cap {_w(s.power_limit_w)} (default {_w(s.power_default_limit_w)}), "
                    f"persistence {'on' if s.persistence_mode else 'off' if s.persistence_mode is False else '?'}, "
                    f"temperature {s.temperature_c if s.temperature_c is not None else '?'} °C",
                    f"  other processes: {procs or 'none'}"]
        else:
            out.append("GPU: state unknown")
        known = len(self.flags.names) if self.flags is not None else 0
        out.append(f"search space {self.space.name}: {len(self.space.parameters)} parameters, "
                   f"{len(self.space.techniques)} techniques; every flag is one of the runtime's {known} flags")
        out.append(f"traffic: {len(self.trace)} requests ({self.trace.metadata.source}); measured pass "
                   f"{len(self.workload)} requests at concurrency {self.concurrency}; burst {len(self.burst)} requests")
        out.append(f"fingerprint {self.fingerprint.key()}: {self.fingerprint.describe()}")
        out += [f"warning: {p}" for p in self.problems]
        return out


def run_preflight(settings: Settings, *, card_dir: Path | None = None, harvest_flags: bool = True) -> Preflight:
    """Every check of the flow's first step; raises a ``StudyError`` naming the remedy when one fails."""
    space = load_space(settings.space)
    if settings.model:
        space = space.with_model(settings.model)
    problems: list[str] = []
    runtime, gpu, launch, runtime_name, version = _runtime(settings, space, card_dir)
    if isinstance(runtime, OrphanReaper):
        problems += [f"stopped an orphaned server on this GPU ({r.name}, left by dead {r.owner.describe()}): "
                     f"{r.detail}" for r in runtime.reap_orphans()]
    state = gpu.state() if gpu is not None else None
    if state is not None:
        others = [p for p in state.processes if p.pid not in _own_pids()]
        if others:
            names = ", ".join(f"{p.name or 'pid'} {p.pid}" for p in others)
            hint = (" (a simulated card is shared by every study on it: give a concurrent study its own with "
                    "ELSA_SIM_CARD_DIR)" if settings.simulated else "")
            raise EnvironmentError_(f"GPU {state.index} ({state.name}) is in use by {names}",
                                    remedy="stop those processes or pick another GPU: measurements next to another "
                                           f"process are noise, and its memory is not the runtime's{hint}")
        if state.persistence_mode is False:
            problems.append("persistence mode is off: boots are slower and clocks may settle differently "
                            "(nvidia-smi -pm 1)")
        if state.power_limit_w and state.power_default_limit_w and state.power_limit_w < state.power_default_limit_w:
            problems.append(f"the power cap {state.power_limit_w:.0f} W is below the default "
                            f"{state.power_default_limit_w:.0f} W: results hold for this cap only")
    flags: FlagSet | None = None
    if settings.virtual or (harvest_flags and settings.runtime is not Launcher.DOCKER):
        flags = runtime.flag_set()
    elif settings.runtime is Launcher.DOCKER:
        problems.append("flags not validated against the image before the study (the first boot will)")
    if flags is not None:
        space.validate_flags(flags.shapes())
    trace = load_traffic(settings.traffic)
    concurrency = measured_concurrency(space)
    workload, burst = workloads(trace, settings, concurrency)
    fingerprint = Fingerprint.build(runtime=runtime_name, runtime_version=version, launch_command=launch,
                                    model_path=space.model.path, gpu=state,
                                    image_digest=settings.image if settings.runtime is Launcher.DOCKER else None)
    return Preflight(settings=settings, space=space, runtime=runtime, gpu=gpu, gpu_state=state,
                     runtime_name=runtime_name, runtime_version=version, flags=flags, trace=trace,
                     workload=workload, burst=burst, concurrency=concurrency, fingerprint=fingerprint,
                     launch=launch, problems=tuple(problems))


def load_traffic(traffic: str) -> Trace:
    """A bundled trace by name (``BUNDLED_TRACES``) or a trace file in elsa-tune's Parquet format."""
    if traffic in BUNDLED_TRACES:
        path = importlib.resources.files("elsa_tune.traffic").joinpath("data", BUNDLED_TRACES[traffic])
        return read_trace(str(path))
    if not Path(traffic).exists():
        raise ConfigError(f"{traffic}: no such traffic file",
                          remedy="record one (elsa-tune record), import one (elsa-tune traffic import) "
                                 "or pass a bundled trace: --traffic demo or --traffic demo-chat")
    trace = read_trace(traffic)
    if len(trace) == 0:    # nothing to replay: every pass would be empty
        raise ConfigError(f"--traffic {traffic} holds no requests",
                          remedy="record a window in which the server served requests, or import a trace with some")
    return trace


def workloads(trace: Trace, settings: Settings, concurrency: int) -> tuple[Workload, Workload]:
    """The measured pass (closed loop over the trace's requests) and the burst (its busiest window).

    ``settings.pass_s`` is in the seconds the budget counts in, the runtime's own: a simulated runtime's study
    counts the simulated system's seconds (``tuner/flow/simulated_time.py``), so its passes are sized in them too and
    the same budget gives the same passes at any ``--sim-speedup``."""
    ins = trace.column("input_tokens")
    outs = trace.column("output_tokens")
    per_request = (float(statistics.fmean(outs)) / _DECODE_TOK_S + float(statistics.fmean(ins)) / _PREFILL_TOK_S)
    n = int(max(4, min(len(trace), round(settings.pass_s * concurrency / max(per_request, 1e-6)))))
    measured = closed_loop(trace, concurrency=concurrency, n_requests=n)
    burst = busiest_window(trace, duration_s=max(1.0, settings.pass_s), compress=1.0,
                           max_requests=max(2 * concurrency, n // 2), concurrency=None)
    return measured, burst


def measured_concurrency(space: SearchSpace) -> int:
    """Clients in flight during a measured pass: the baseline's running slots (the user's deployment today)."""
    slots_flag = family(space.runtime.family).slots_flag
    value = space.base_flags.get(slots_flag)
    for p in space.parameters:
        if p.flag == slots_flag:
            value = p.baseline
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1 else 8


def _runtime(settings: Settings, space: SearchSpace, card_dir: Path | None
             ) -> tuple[Runtime, GpuView | None, tuple[str, ...], str, str | None]:
    timeout = settings.boot_timeout_s or space.probes.boot_timeout_s
    runtime_family = family(space.runtime.family)
    if settings.family is not None and settings.family != runtime_family.name.value:
        raise ConfigError(f"--runtime {settings.family} but the search space {space.name!r} is for "
                          f"{runtime_family.name.value} (runtime.family)",
                          remedy=f"use a {settings.family} space (elsa-tune space list) or drop --runtime")
    if settings.virtual:
        assert settings.sim_profile is not None
        try:
            virtual = VirtualSGLang(settings.sim_profile, model_path=space.model.path,
                                    family_name=space.runtime.family.value)
        except (OSError, KeyError, ValueError) as exc:
            raise ConfigError(f"cannot load the simulator profile {settings.sim_profile!r}: {exc}",
                              remedy="use a profile of runtime/sim/profiles/") from exc
        return virtual, virtual.gpu, virtual.launch_command, virtual.name, virtual.version
    if settings.simulated:
        from elsa_tune.runtime.sim.runtime import SIM_TIMEOUTS, SimulatedSGLang

        assert settings.sim_profile is not None
        try:
            sim = SimulatedSGLang(settings.sim_profile, card_dir=card_dir, seed=settings.seed,
                                  speedup=settings.sim_speedup,
                                  timeouts=replace(SIM_TIMEOUTS, boot_s=min(timeout, 120.0)),
                                  model_path=space.model.path, family_name=space.runtime.family.value)
        except (OSError, KeyError) as exc:
            raise ConfigError(f"cannot load the simulator profile {settings.sim_profile!r}: {exc}",
                              remedy="use a profile of runtime/sim/profiles/") from exc
        return sim, sim.gpu, tuple(sim.launch), f"{space.runtime.family.value}-sim", sim.version
    gpu: GpuView
    if settings.gpu == CPU:
        gpu = HostMemory()
    else:
        from elsa_tune.runtime.nvml import NvmlGpu

        gpu = NvmlGpu(int(settings.gpu) if settings.gpu.isascii() and settings.gpu.isdigit() else settings.gpu)
    launch = tuple(shlex.split(settings.launch)) if settings.launch else tuple(space.runtime.command or ())
    if settings.runtime is Launcher.DOCKER:
        from elsa_tune.runtime.docker import SGLangDocker

        image = settings.image or space.runtime.image
        if not image:
            raise ConfigError("the docker runtime needs an image", remedy="pass --image IMAGE or set runtime.image")
        docker_rt = SGLangDocker(image, gpu, launch=launch or runtime_family.default_launch,
                                 timeouts=RuntimeTimeouts(boot_s=timeout), family=runtime_family)
        return docker_rt, gpu, launch, runtime_family.name.value, space.runtime.version
    from elsa_tune.runtime.process import ServerProcess

    launch = runtime_family.resolve_launch(launch or runtime_family.default_launch)
    runtime = ServerProcess(runtime_family, launch, gpu, timeouts=RuntimeTimeouts(boot_s=timeout),
                            pin_gpu=settings.gpu != CPU)
    return (runtime, gpu, launch, runtime_family.name.value,
            runtime_family.installed_version(launch) or space.runtime.version)


def _own_pids() -> set[int]:
    return {os.getpid()}


def _w(value: float | None) -> str:
    return f"{value:.0f} W" if value is not None else "?"

