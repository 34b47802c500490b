"""``VirtualSGLang``: the simulated SGLang without processes, sockets or a wall clock.

A virtual launch goes through the same pieces as ``elsa-tune sim serve``: the candidate's command line is read by
the simulator's copy of SGLang's argument parser, the card's memory is planned (``memory.plan_memory``), the boot
log is printed phase by phase (``startup.Boot``) into memory, and what a runtime would read from it is read by the
real readers: ``runtime.startup_log.build_report`` (pools, slots, silent clamps and ignored flags) and
``runtime.classify.classify`` (the failure kind of a boot or a dead server). Serving a workload runs the scheduling
engine to completion on the simulated clock (``truth.truth``); a crash under load prints SGLang's lines after the
boot log and is classified the same way.

Everything is in the simulated system's time: ``VirtualLaunch.boot_s`` is how long the boot takes on the simulated
card, a ``Truth``'s makespan how long the workload takes there. Results are cached per candidate (and workload):
a configuration's launch and noiseless serving are deterministic, the noise of each boot is drawn by the caller
(``noise.boot_drift``). The ``Runtime`` methods refuse: a virtual study boots through the tuner's virtual booter.
"""

from __future__ import annotations

import argparse
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elsa_tune.errors import RuntimeUnavailable
from elsa_tune.runtime.boot_report import BootReport
from elsa_tune.runtime.classify import classify
from elsa_tune.runtime.failure import Failure, FailureHints, FailureKind
from elsa_tune.runtime.flags import FlagSet, parse_help
from elsa_tune.runtime.gpu import GpuMemory, GpuState
from elsa_tune.runtime.protocol import Exit, Health, Server
from elsa_tune.runtime.sglang import SGLANG
from elsa_tune.runtime.sim import flags as sglang_flags
from elsa_tune.runtime.sim.faults import Crash, watchdog_crash
from elsa_tune.runtime.sim.launch import facts_from_plan
from elsa_tune.runtime.sim.memory import MemoryPlan, SimCrash, plan_memory
from elsa_tune.runtime.sim.profile import SimProfile, load_profile
from elsa_tune.runtime.sim.source import crash_of
from elsa_tune.runtime.sim.startup import READY_LINE, Boot, ServerLog, uvicorn_started
from elsa_tune.runtime.sim.truth import Truth, TruthWorkload, truth
from elsa_tune.runtime.startup_log import build_report
from elsa_tune.search_spaces.candidate import Candidate, FlagValue

SCHEMA_VERSION = 1
#: Simulated seconds of a launch before the boot log's first phase (interpreter, imports, tokenizer) and of a stop.
PROCESS_START_S = 20.0
STOP_S = 5.0
#: SGLang's warm-up generate before the ready line.
WARMUP_S = 1.0
GIB = 1024**3


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


class VirtualSGLang:
    """Virtual boots of ``profile``'s simulated SGLang: launches and noiseless serving, cached per candidate."""

    name = "sglang-sim-virtual"
    family = SGLANG

    def __init__(self, profile: SimProfile | str | Path, *, model_path: str | None = None) -> None:
        self.profile = profile if isinstance(profile, SimProfile) else load_profile(profile)
        self.model_path = model_path or self.profile.model.served_name
        self.gpu = VirtualGpu(self.profile)
        self._parser = argparse.ArgumentParser(prog="sglang.launch_server", add_help=False)
        sglang_flags.add_sglang_arguments(self._parser, require_model=False)
        self._known = {spec.dest for spec in sglang_flags.sglang_flags()}
        self._launches: dict[str, VirtualLaunch] = {}
        self._flags: dict[str, dict[str, FlagValue]] = {}
        self._served: dict[tuple[str, str], Truth] = {}

    # ---- what a runtime offers ---------------------------------------------------------------------------

    @property
    def version(self) -> str:
        return self.profile.runtime_version

    @property
    def launch_command(self) -> tuple[str, ...]:
        return ("elsa-tune", "sim", "serve", "--virtual", "--sim-profile", self.profile.name)

    def flag_set(self) -> FlagSet:
        """The simulated SGLang's own flag list, read from its ``--help`` text (no process is started)."""
        parser = argparse.ArgumentParser(prog="sglang.launch_server")
        sglang_flags.add_sglang_arguments(parser, require_model=False)
        return parse_help(parser.format_help(), source="simulated SGLang (virtual)")

    def start(self, candidate: Candidate, boot_dir: Path) -> Server:
        raise RuntimeUnavailable("the virtual runtime starts no server process",
                                 remedy="boot it through the virtual study (elsa-tune --gpu sim --virtual …)")

    def check(self, server: Server) -> Health:
        raise RuntimeUnavailable("the virtual runtime has no server to check",
                                 remedy="boot it through the virtual study (elsa-tune --gpu sim --virtual …)")

    def stop(self, server: Server) -> Exit:
        raise RuntimeUnavailable("the virtual runtime has no server to stop",
                                 remedy="boot it through the virtual study (elsa-tune --gpu sim --virtual …)")

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
        if unknown is not None:
            text = (f"usage: launch_server.py [-h] --model-path MODEL_PATH ...\n"
                    f"launch_server.py: error: {unknown}\n")
            failure = classify(text, FailureHints(exit_code=2, became_ready=False))
            return VirtualLaunch(key, text, PROCESS_START_S, None, failure, None)
        given = {k: v for k, v in given_ns.items() if k in self._known}
        flags = self._flags[key] = sglang_flags.requested_flags(given)
        server_args = sglang_flags.resolve_defaults(given)
        plan = plan_memory(self.profile, flags, dict(candidate.env))
        out = io.StringIO()
        log = ServerLog(out, millis=False)
        facts = facts_from_plan(self.profile, plan, server_args)
        plan_crash = crash_of(plan.boot_failure) if plan.boot_failure is not None else None
        first_generation = plan.serve_crash if plan.serve_crash is not None and \
            plan.serve_crash.phase == "first_generation" else None

        def crash_at(phase: str) -> Crash | None:
            return plan_crash if plan_crash is not None and plan_crash.phase == phase else None

        boot = Boot(log, facts, lambda _s: None, crash_at, lambda _gb: None)
        crash = boot.run()
        seconds = PROCESS_START_S + sum(boot.seconds.values())
        if crash is not None:
            log.crash(crash, serving=False)
            failure = classify(out.getvalue(), FailureHints(exit_code=crash.exit_code, became_ready=False))
            return VirtualLaunch(key, out.getvalue(), seconds, None, failure, plan)
        uvicorn_started(log, str(server_args.get("host") or "127.0.0.1"), int(server_args.get("port") or 30000))
        if first_generation is not None:
            # SGLang's warm-up generate is the first generation: the server dies before its ready line
            log.crash(crash_of(first_generation), serving=True)
            failure = classify(out.getvalue(), FailureHints(exit_code=-9, became_ready=False))
            return VirtualLaunch(key, out.getvalue(), seconds + WARMUP_S, None, failure, plan)
        log.info(READY_LINE)
        report = build_report(out.getvalue(), candidate)
        return VirtualLaunch(key, out.getvalue(), seconds + WARMUP_S, report, None, plan)

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
        launch = self.launch(candidate)
        kind = FailureKind(served.crash_kind) if served.crash_kind else FailureKind.UNKNOWN_CRASH
        out = io.StringIO()
        log = ServerLog(out, millis=False)
        if kind is FailureKind.HANG:
            log.crash(watchdog_crash(300.0), serving=True)
            hints = FailureHints(exit_code=-9, became_ready=True, timed_out=True)
        else:
            log.crash(crash_of(SimCrash(kind, served.crash_phase or "under_load", served.crash_lines)),
                      serving=True)
            hints = FailureHints(exit_code=-9, became_ready=True)
        return classify(launch.log_text + out.getvalue(), hints)

    def _argv(self, candidate: Candidate) -> list[str]:
        return [*candidate.argv(), "--model-path", self.model_path] if "model-path" not in candidate.flags \
            else candidate.argv()

