"""``FleetSearch``: the numeric search phase of one study on several GPUs of this host (``tune --gpu 0,1``, issue 8).

The study's lead process owns the first GPU for the sequential phases — baseline, screening (kept techniques
stack: one chain of decisions) and confirmation. For the search phase it holds no server (its booter stops every
server after its boot) and starts one ``elsa-tune worker`` per listed GPU, the first included, through
``WorkerPool``, on a SQLite storage in the run folder (``fleet.db``). Each worker (``tuner/fleet/workers.py``) boots the
incumbent (the baseline plus the techniques the screening kept) on its own GPU to dimension that GPU's noise
(cards of one model differ), searches the shared Optuna study around it, and A/Bs a promising trial entirely
on its own GPU: A/B blocks never mix GPUs. A keep replaces the shared incumbent by compare-and-set. The workers'
run folders are ``<run_dir>/<host>-gpu<N>/``; they append their decisions to this study's ledger, each with its
own GPU's fingerprint, once.

One budget: the workers' budget is the search phase's allowance (less one boot, which a worker may finish after
it), handed to each as itself (``Budget.to_argv``, read back by ``Budget.handed_over``); the pool stops what
overruns; Ctrl-C reaches the pool through the study's ``Interrupts`` and is forwarded (each worker finishes its boot
and writes its outputs); the children die with the lead (``WorkerPool``).

Afterwards the study adopts what the workers did: the shared incumbent becomes the night's incumbent, and every
worker decision is recorded in the study's own history (numbered in the study's order, its GPU in its name), so
the report shows it; the ledger already has it.

Resume: ``fleet.json`` records each start of the pool (when, the children's pids, how it ended). A resumed study
charges the search time of earlier starts to its clock, waits for earlier children to be gone, and starts the pool
again unless the search had finished; the workers reuse their recorded boots and the storage keeps every finished
trial, so nothing finished is measured twice.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from elsa_tune.durable_file import write_atomic
from elsa_tune.history.decision import DecisionRecord
from elsa_tune.history.run_dir import RunDir
from elsa_tune.tuner.commands.worker import worker_argv
from elsa_tune.tuner.fleet.worker_pool import WorkerPool, WorkerProcess
from elsa_tune.tuner.fleet.workers import INCUMBENT, local_run_dir
from elsa_tune.tuner.flow.budget import Budget
from elsa_tune.tuner.flow.night import Incumbent, geo
from elsa_tune.tuner.search.context import SearchContext
from elsa_tune.tuner.search.phase import SearchOutcome

log = logging.getLogger(__name__)

FLEET_FILE = "fleet.json"
FLEET_DB = "fleet.db"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class PoolStart:
    """One start of the workers: wall times, the children (pid and ``/proc`` start ticks), how it ended."""

    started_at: float
    budget_s: float
    gpus: tuple[str, ...]
    children: tuple[tuple[int, int], ...] = ()
    ended_at: float | None = None
    outcome: str = "running"          # running (or killed with the lead) | finished | interrupted

    def to_dict(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "budget_s": self.budget_s, "gpus": list(self.gpus),
                "children": [list(c) for c in self.children], "ended_at": self.ended_at, "outcome": self.outcome}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PoolStart:
        return cls(started_at=float(data["started_at"]), budget_s=float(data["budget_s"]),
                   gpus=tuple(str(g) for g in data.get("gpus", ())),
                   children=tuple((int(p), int(t)) for p, t in data.get("children", ())),
                   ended_at=float(data["ended_at"]) if data.get("ended_at") is not None else None,
                   outcome=str(data.get("outcome", "running")))


@dataclass
class FleetLog:
    """``<run_dir>/fleet.json``: every start of the pool, rewritten atomically after each change."""

    path: Path
    starts: list[PoolStart] = field(default_factory=list)

    @classmethod
    def read(cls, run_dir: Path) -> FleetLog:
        path = run_dir / FLEET_FILE
        if not path.exists():
            return cls(path)
        data = json.loads(path.read_text())
        return cls(path, [PoolStart.from_dict(s) for s in data.get("starts", ())])

    def write(self) -> None:
        payload = {"schema_version": SCHEMA_VERSION, "starts": [s.to_dict() for s in self.starts]}
        write_atomic(self.path, json.dumps(payload, indent=2, sort_keys=True))

    @property
    def finished(self) -> bool:
        return bool(self.starts) and self.starts[-1].outcome == "finished"

    def spent_s(self) -> float:
        """Wall seconds the recorded starts spent; a start whose end was never recorded (the lead was killed) spent
        until its workers' last recorded boot."""
        spent = 0.0
        for start in self.starts:
            end = start.ended_at
            if end is None:
                ends = [b.ended_at for gpu in start.gpus for b in _boots(local_run_dir(self.path.parent, gpu))
                        if b.started_at >= start.started_at]
                end = max(ends, default=start.started_at)
            spent += max(0.0, end - start.started_at)
        return spent

    def wait_for_children(self, timeout_s: float) -> list[int]:
        """Wait (at most ``timeout_s``) until no child of a recorded start runs: a killed lead's workers got
        SIGTERM with it and finish their boot first. Returns the pids still running."""
        children = [c for s in self.starts for c in s.children]
        deadline = time.monotonic() + timeout_s
        while True:
            alive = [pid for pid, ticks in children if ticks and _start_ticks(pid) == ticks]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.2)


class FleetSearch:
    """A ``SearchBackend`` (``tuner/search/phase.py``) that runs the search phase on ``gpus`` at once, one worker each.

    ``gpus`` are NVML indexes or, with ``--runtime sim``, simulated card numbers (card folders
    ``<run_dir>/sim-cards/gpu<N>``, as ``elsa-tune worker`` maps them); the first is the lead's own GPU.
    """

    def __init__(self, gpus: Sequence[str], *, heartbeat_s: int = 5, grace_s: int = 20,
                 stop_grace_s: float = 30.0, verbose: int = 0) -> None:
        if len(gpus) < 2:
            raise ValueError("a fleet needs at least two GPUs; one GPU searches with LocalSearch")
        self.gpus = list(gpus)
        self.heartbeat_s = heartbeat_s
        self.grace_s = grace_s
        self.stop_grace_s = stop_grace_s
        self.verbose = verbose

    # ---- the phase -------------------------------------------------------------------------------------

    def run(self, ctx: SearchContext) -> SearchOutcome:
        if not ctx.setup.space.parameters:
            return SearchOutcome(ctx.setup.incumbent, (), 0)
        run_dir = ctx.setup.store.run_dir.resolve()
        fleet = FleetLog.read(run_dir)
        charged = fleet.spent_s()
        if charged:
            ctx.charge_s(charged)
            log.info("search on %d GPUs: %.0f s spent by earlier starts of the workers charged to the budget",
                     len(self.gpus), charged)
        # What earlier starts decided is adopted even when no time is left to start again.
        if not fleet.finished and not ctx.setup.interrupts.requested:
            alive = fleet.wait_for_children(2 * self.stop_grace_s + 10.0)
            if alive:
                log.warning("search: workers of an earlier start (pids %s) still run; starting anyway",
                            ", ".join(map(str, alive)))
            allowance = ctx.allowance_s()
            needed = (ctx.setup.settings.baseline_boots + 1) * ctx.boot_s()
            if allowance < needed:
                log.info("search: %.0f s left, less than a worker's baseline and one trial (%.0f s)", allowance, needed)
                ctx.note(f"search on GPUs {', '.join(self.gpus)} not started: {allowance:.0f} s left")
            else:
                self._run_pool(ctx, fleet, run_dir, allowance)
        outcome = self.adopt(ctx, run_dir, earlier=[g for start in fleet.starts for g in start.gpus])
        ctx.check()        # interrupted during the pool: StopStudy after the adoption, like after a boot
        return outcome

    def _run_pool(self, ctx: SearchContext, fleet: FleetLog, run_dir: Path, allowance: float) -> None:
        boot_s = ctx.boot_s()
        budget = Budget(max(boot_s, allowance - boot_s))
        budget_s = budget.total_s
        start = PoolStart(started_at=time.time(), budget_s=budget_s, gpus=tuple(self.gpus))
        fleet.starts.append(start)
        fleet.write()

        def started(workers: Sequence[WorkerProcess]) -> None:
            fleet.starts[-1] = replace(fleet.starts[-1], children=tuple((w.pid, _start_ticks(w.pid) or 0)
                                                                        for w in workers))
            fleet.write()

        setup = ctx.setup
        argv = worker_argv(setup.settings, storage=f"sqlite:///{run_dir / FLEET_DB}", study=setup.name, out=run_dir,
                           budget=budget, techniques=setup.incumbent.techniques, looks=setup.policy.looks,
                           ledger=str(setup.store.ledger.backend.source), heartbeat_s=self.heartbeat_s,
                           grace_s=self.grace_s, verbose=self.verbose)
        pool = WorkerPool(self.gpus, argv, log_dir=run_dir / "logs", timeout_s=budget_s + 2 * boot_s + 60.0,
                          stop_grace_s=self.stop_grace_s, interrupts=ctx.setup.interrupts, on_started=started)
        ctx.event(f"search on GPUs {', '.join(self.gpus)}: one worker each")
        log.info("search: %d workers (GPUs %s), %.0f s each, storage %s", len(self.gpus), ", ".join(self.gpus),
                 budget_s, run_dir / FLEET_DB)
        outcome = "interrupted"
        try:
            code = pool.run()
            if code != 0:
                logs = ", ".join(str(w.log_path) for w in pool.workers if w.process.returncode)
                ctx.note(f"search: a worker exited with {code} (logs: {logs or run_dir / 'logs'})")
                log.warning("search: a worker exited with %d; see %s", code, logs or run_dir / "logs")
            outcome = "interrupted" if ctx.setup.interrupts.requested else "finished"
        finally:
            fleet.starts[-1] = replace(fleet.starts[-1], ended_at=time.time(), outcome=outcome)
            fleet.write()

    # ---- what the workers did becomes the study's ------------------------------------------------------

    def adopt(self, ctx: SearchContext, run_dir: Path, *, earlier: Sequence[str] = ()) -> SearchOutcome:
        """The shared incumbent becomes the night's (``ctx.keep``); every worker decision is recorded in the study's
        history (``ctx.decide`` with ``ledgered=True``), also those of GPUs an earlier start had that this one does
        not (``earlier``)."""
        folders = [(gpu, local_run_dir(run_dir, gpu)) for gpu in dict.fromkeys([*self.gpus, *earlier])]
        found: list[tuple[float, int, int, str, DecisionRecord]] = []
        trials = 0
        for index, (gpu, folder) in enumerate(folders):
            if not folder.is_dir():
                continue
            files = RunDir(folder)
            trials += len(files.trials())
            found += [(d.decided_at, index, d.number, gpu, d) for d in files.decisions()]
        decisions = [ctx.decide(replace(decision, technique=f"{decision.technique} (GPU {gpu})"), ledgered=True)
                     for _, _, _, gpu, decision in sorted(found, key=lambda f: f[:3])]
        incumbent = ctx.setup.incumbent
        shared = self._shared_incumbent(run_dir, ctx.setup.name)
        if shared is not None and shared[0] != incumbent.candidate.key():
            key, values, trial = shared
            candidate = ctx.setup.space.candidate(values, list(incumbent.techniques),
                                              label=f"trial-{trial}" if trial is not None else "incumbent")
            if candidate.key() != key:
                log.warning("search: the shared incumbent %s rebuilds as %s; keeping it as given", key, candidate.key())
            incumbent = Incumbent(dict(values), list(incumbent.techniques), candidate,
                                  _throughput_on(folders[0][1], candidate.key()))
            ctx.keep(incumbent)
            log.info("search on %d GPUs: the incumbent is now %s (%s)", len(self.gpus), candidate.label,
                     " ".join(candidate.argv()))
        ctx.note(f"search ran on GPUs {', '.join(self.gpus)} at once ({trials} trials told, "
                           f"{len(decisions)} A/B decisions, each on one GPU); workers' folders: "
                           + ", ".join(f.name for _, f in folders))
        ctx.outputs()
        return SearchOutcome(incumbent, tuple(decisions), trials)

    def _shared_incumbent(self, run_dir: Path, study: str) -> tuple[str, dict[str, Any], int | None] | None:
        if not (run_dir / FLEET_DB).exists():
            return None
        from elsa_tune.history.claims import WorkClaims

        claims = WorkClaims(f"sqlite:///{run_dir / FLEET_DB}", study, f"lead:{os.getpid()}",
                            grace_s=float(self.grace_s))
        try:
            key, value = claims.get(INCUMBENT)
        finally:
            claims.close()
        if key is None or value is None or value.get("trial") is None:
            return None          # never set, or still the workers' baseline (the night's incumbent)
        return key, dict(value["values"]), int(value["trial"])


def _boots(folder: Path) -> list[Any]:
    return RunDir(folder).boots() if folder.is_dir() else []


def _throughput_on(folder: Path, key: str) -> float | None:
    """Mean per-boot throughput of ``key`` on one worker's GPU (the lead's), ``None`` when it never booted there."""
    means = [m for b in _boots(folder) if b.candidate.key() == key and b.failure is None
             and (m := b.boot_throughput()) is not None]
    return geo(means) if means else None


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22): a pid reused by
    another process has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if not fields or fields[0] == "Z":
        return None
    return int(fields[19]) if sys.platform.startswith("linux") and len(fields) > 19 else None

