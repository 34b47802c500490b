"""``Worker``: one GPU's share of a study searched by several GPUs and hosts through a shared storage.

A worker boots the baseline on its own GPU and dimensions that GPU's noise (its policy is ``gate_policy``,
as on one GPU), then runs the numeric search on the shared Optuna study ``<study>:search``: ask, claim
the candidate (``history/claims.py``: one boot per candidate however many trials propose it), boot, tell
(``trial_values``, as on one GPU). A trial that beats the incumbent's throughput on the same GPU by
``promote_margin`` boot σ's goes through the A/B gate, claimed as one work item and run on this GPU only;
a keep replaces the shared incumbent by compare-and-set. A dead worker's trial is failed once its
heartbeat is stale and queued again. What is here is about claims and shared storage; the steps are the
single-GPU study's: the baseline (``measure_baseline``, ``tuner/flow/baseline.py``), the trial (``boot_trial``,
``tuner/search/phase.py``), the policy and the A/B's record.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.trial import TrialState

from elsa_tune.durable_file import write_atomic
from elsa_tune.errors import ConfigError, StudyError
from elsa_tune.history.claims import Claim, ClaimState, WorkClaims, setup_lock
from elsa_tune.history.decision import Kept
from elsa_tune.history.ledger import Ledger
from elsa_tune.history.pg_ledger import ledger_for
from elsa_tune.history.records import Arm, Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.history.study_record import StudyRecord, StudyStatus
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.tuner.ab.dimensioning import NoiseReport
from elsa_tune.tuner.ab.gate import GatePolicy, run_ab
from elsa_tune.tuner.ab.policy import SEARCH_LOOKS
from elsa_tune.tuner.flow.baseline import BaselineRequest, measure_baseline
from elsa_tune.tuner.flow.booter import ABSampler, BootPlan, CandidateBooter
from elsa_tune.tuner.flow.budget import Budget
from elsa_tune.tuner.flow.memory_model import MemoryModel
from elsa_tune.tuner.flow.night import arm_mean, typical_boot_s
from elsa_tune.tuner.flow.preflight import Preflight
from elsa_tune.tuner.flow.signals import Interrupts
from elsa_tune.tuner.search.optuna_search import NumericSearch, Proposal
from elsa_tune.tuner.search.phase import boot_trial, search_decision

log = logging.getLogger(__name__)

INCUMBENT = "incumbent"
SPACE, SETUP = "space", "setup"       # shared values every worker of a study must agree on
SHARED_SUMMARY = "shared-study.json"
#: The time a worker built without a budget has.
WORKER_BUDGET_S = 3600.0
#: Work-item phases of the claim table.
BASELINE, SEARCH, AB = "baseline", "search", "ab"


class StopWorker(Exception):
    """Raised before a boot when the worker must end now; its outputs are written."""


@dataclass(frozen=True)
class WorkerConfig:
    """How one worker joins a shared study. ``gpu`` is the label of its GPU (NVML index, or the simulated
    card's number); ``worker`` names this process in the claim table (default ``host:gpuN:pid``)."""

    storage_url: str
    study: str
    gpu: str
    worker: str = ""
    max_trials: int = 40
    heartbeat_s: int = 5
    grace_s: int = 20
    promote: bool = True
    promote_margin: float = 1.0       # a trial goes to the A/B gate when it beats the incumbent by this many σ_boot
    max_retries: int = 2
    techniques: tuple[str, ...] = ()
    drain_s: float | None = None      # how long to wait for other workers' running trials at the end
    ledger: str | None = None         # a JSONL ledger instead of the storage's (tune --gpu 0,1: the study's)

    def worker_name(self) -> str:
        import os

        return self.worker or f"{socket.gethostname()}:gpu{self.gpu}:{os.getpid()}"


@dataclass
class WorkerStats:
    """What one worker did (returned by ``Worker.run`` and written into ``shared-study.json``)."""

    worker: str
    gpu: str
    gpu_uuid: str | None
    boots: int = 0
    trials_told: int = 0
    shared_results: int = 0           # trials told another worker's result for the same candidate (no boot)
    refused: int = 0
    skipped_by_model: int = 0
    taken_over: list[str] = field(default_factory=list)
    promotions: int = 0
    keeps: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class Worker:
    """One GPU's worker. Build it from the GPU's own ``Preflight`` (its runtime and ``GpuView``), run it."""

    def __init__(self, pre: Preflight, config: WorkerConfig, *, budget: Budget | None = None,
                 interrupts: Interrupts | None = None) -> None:
        """``budget``: the time this worker has (``Budget.handed_over`` from its command line; an hour if none)."""
        self.pre = pre
        self.interrupts = interrupts or Interrupts()
        self.config = config
        self.space = pre.space
        self.name = config.worker_name()
        self.gpu_uuid = pre.gpu_state.uuid if pre.gpu_state else None
        run_dir = pre.settings.run_dir
        with setup_lock(config.storage_url):      # Optuna's schema creation is not safe against a twin
            self.store = StudyStore(run_dir, storage_url=config.storage_url, name=f"{config.study}@{run_dir.name}",
                                    heartbeat_interval=config.heartbeat_s, grace_period=config.grace_s)
            self.claims = WorkClaims(config.storage_url, config.study, self.name, grace_s=float(config.grace_s))
            self.ledger: Ledger = Ledger.at(config.ledger) if config.ledger else ledger_for(run_dir, config.storage_url)
        # A trial whose worker died is failed by whichever worker sees its heartbeat stale; this queues its
        # parameters again as a WAITING trial, which the next ask of any worker takes.
        retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)  # Optuna >= 4.9
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            callback = (retry or optuna.storages.RetryFailedTrialCallback)(max_retry=config.max_retries)
        self.store.storage.heartbeat_stale_trial_callback = callback
        self.store.check_fingerprint(pre.fingerprint)
        self.context_target = pre.context_target
        self.booter = CandidateBooter(pre.boot_context(self.store, config.study), before_boot=self._before_boot)
        self.baseline = self.space.candidate(self.space.baseline_values(), list(config.techniques), label="baseline")
        self.memory = MemoryModel.for_space(self.space)
        self.noise: NoiseReport | None = None
        self.policy: GatePolicy | None = None
        self.own_throughput: dict[str, float] = {}     # candidate key → this GPU's mean throughput
        self.stats = WorkerStats(self.name, config.gpu, self.gpu_uuid)
        self.budget = budget if budget is not None else Budget(WORKER_BUDGET_S)
        self.started_at = time.time()

    # ---- the worker's life -----------------------------------------------------------------------------

    def run(self) -> WorkerStats:
        status = StudyStatus.FAILED
        try:
            with self.interrupts:
                self.join()
                self.store.reconcile()
                self._baseline()
                self._search()
            status = StudyStatus.INTERRUPTED if self.interrupts.requested else StudyStatus.FINISHED
        except StopWorker as stop:
            log.warning("worker %s stopped: %s", self.name, stop)
            status = StudyStatus.INTERRUPTED if self.interrupts.requested else StudyStatus.FINISHED
        except KeyboardInterrupt:
            status = StudyStatus.INTERRUPTED
            raise
        finally:
            self.stats.boots = self.booter.boots
            self.stats.seconds = self.budget.elapsed_s
            self.write_outputs(status)
            self.claims.close()
        return self.stats

    def join(self) -> None:
        """Refuse to join a study searching another space, or measured on another setup (runtime, model, GPU
        model, driver): its trials' numbers would not be comparable with this worker's."""
        wanted = {SPACE: (self.space.digest, {"space": self.space.name}),
                  SETUP: (self.pre.fingerprint.ledger_key(), {"setup": self.pre.fingerprint.describe()})}
        for name, (key, value) in wanted.items():
            self.claims.compare_and_set(name, None, key, value)
            stored_key, stored = self.claims.get(name)
            if stored_key != key:
                raise ConfigError(f"study {self.config.study} has another {name}: {dict(stored or {})}, this worker "
                                  f"has {value}",
                                  remedy="join with the same search space on the same kind of GPU, runtime and model, "
                                         "or start another study (--study)")

    def _before_boot(self, plan: BootPlan) -> None:
        """Stop before a boot when a person asked, or before an A/B boot once the budget is spent (an unfinished
        comparison keeps the incumbent; its work item is released for another worker)."""
        if self.interrupts.requested:
            raise StopWorker("interrupted: the last boot was recorded")
        if plan.tag.startswith(f"{AB}:") and self.budget.left_s <= 0:
            raise StopWorker("the budget ran out during an A/B comparison")

    def _boot_s(self) -> float:
        return typical_boot_s(b.seconds for b in self.store.load().boots)

    # ---- baseline on this GPU ----------------------------------------------------------------------

    def _baseline(self) -> None:
        item = f"{self.baseline.key()}@{self.gpu_uuid or self.config.gpu}"
        claim = self.claims.wait(BASELINE, item, timeout_s=3.0 * self.config.grace_s, gpu=self.gpu_uuid)
        if claim.state is ClaimState.BUSY:
            raise StudyError(f"GPU {self.config.gpu} ({self.gpu_uuid}) is already worked on by {claim.owner}",
                             remedy="run one worker per GPU; a dead worker's claim frees itself after the grace period")
        gpu = self.gpu_uuid or self.config.gpu
        with self.claims.holding(claim) if claim.state is ClaimState.CLAIMED else _nothing(claim):
            baseline = measure_baseline(self.booter.boot, BaselineRequest(
                candidate=self.baseline, boots=self.pre.settings.baseline_boots, tag="baseline",
                phase=Phase.BASELINE, what="the baseline", where=f"on GPU {self.config.gpu}", runner="the worker",
                remedy="fix the base flags of the search space",
                noise_context={"runtime": self.pre.fingerprint.describe(), "gpu": gpu}),
                run_dir=self.store.run_dir)
            self.noise = baseline.noise
            throughput = baseline.throughput_all_boots
            if throughput is not None:
                self.own_throughput[self.baseline.key()] = throughput
            if claim.state is ClaimState.CLAIMED:
                self.claims.finish(claim, {"throughput": self.own_throughput.get(self.baseline.key()),
                                           "sigma_boot": self.noise.sigma_boot, "worker": self.name})
        self.policy = baseline.policy(self.space, self.pre.settings, looks=self.pre.settings.looks or SEARCH_LOOKS,
                                      context_target=self.context_target)
        self.claims.compare_and_set(INCUMBENT, None, self.baseline.key(),
                                    {"values": self.space.baseline_values(), "trial": None, "worker": self.name})
        log.info("worker %s: GPU %s baseline %.1f tok/s, boot noise %.1f%%", self.name, self.config.gpu,
                 self.own_throughput.get(self.baseline.key(), float("nan")), 100 * self.noise.sigma_boot)

    # ---- the shared numeric search -----------------------------------------------------------------

    def _search(self) -> None:
        if not self.space.parameters:
            return
        self.memory.add_boots(self.store.load().boots)
        gpu_index = int(self.config.gpu) if self.config.gpu.isdigit() else 0
        search = NumericSearch(self.space, self.store, study_name=self.config.study,
                               seed=self.pre.settings.seed * 101 + gpu_index, techniques=self.config.techniques)
        self.search = search
        search.enqueue(self.space.baseline_values())
        drain_until: float | None = None
        while self.budget.left_s > 0 and not self.interrupts.requested:
            self.store.fail_stale_trials(search.study)       # a dead worker's trial: FAIL, then queued again
            trials = search.study.get_trials(deepcopy=False)
            complete = sum(t.state is TrialState.COMPLETE for t in trials)
            waiting = any(t.state is TrialState.WAITING for t in trials)
            if complete >= self.config.max_trials and not waiting:
                running = [t for t in trials if t.state is TrialState.RUNNING]
                if not running:
                    break
                # Others' trials are running: one may belong to a dead worker, to be retried here.
                drain_until = drain_until or time.monotonic() + (self.config.drain_s or 4.0 * self.config.grace_s)
                if time.monotonic() > drain_until:
                    log.info("worker %s: leaving %d trials to their workers", self.name, len(running))
                    break
                time.sleep(min(1.0, self.config.heartbeat_s))
                continue
            drain_until = None
            proposal = search.ask()
            try:
                self._trial(search, proposal)
            except StopWorker:      # asked but not booted: the trial ends here, the resumed run asks anew
                search.withdraw(proposal, "the worker stopped before booting it")
                raise

    def _trial(self, search: NumericSearch, proposal: Proposal) -> None:
        number = proposal.trial.number
        self.stats.trials_told += 1
        with self.store.heartbeat(proposal.trial):
            if proposal.candidate is None:
                self.stats.refused += 1
                search.tell(proposal, None, constraint=1.0)
                return
            candidate = replace(proposal.candidate, label=f"trial-{number}")
            key = candidate.key()
            # A live twin finishes its boot (then its result is told here) or dies (then this worker takes over).
            claim = self.claims.wait(SEARCH, key, gpu=self.gpu_uuid, timeout_s=max(60.0, self.budget.left_s))
            if claim.state is ClaimState.DONE and claim.result is not None:
                self.stats.shared_results += 1
                r = claim.result
                log.info("trial %d: candidate %s already measured by %s; told its result", number, key,
                         r.get("worker"))
                search.tell(proposal, r.get("values"), constraint=float(r.get("constraint", 0.0)),
                            boot_ids=tuple(r.get("boot_ids", ())))
                return
            if claim.state is ClaimState.BUSY:
                log.warning("trial %d: candidate %s still held by %s; told as failed", number, key, claim.owner)
                search.tell(proposal, None)
                return
            if claim.took_over:
                self.stats.taken_over.append(f"{SEARCH}/{key} from {claim.took_over}")
            with self.claims.holding(claim):
                outcome = self._measure(search, proposal, candidate, number)
                self.claims.finish(claim, outcome)
        tput = outcome.get("throughput")
        if self.config.promote and outcome.get("values") and tput:
            self._maybe_promote(candidate, proposal.values, number, float(tput))

    def _measure(self, search: NumericSearch, proposal: Proposal, candidate: Candidate,
                 number: int) -> dict[str, Any]:
        """Boot one candidate for a trial and tell Optuna; returns the claim's result (what a twin is told)."""
        trial = boot_trial(self.booter.boot, self.memory, search, proposal, candidate,
                           tag=f"search:{candidate.key()}", space=self.space, context_target=self.context_target)
        result, values, failure = trial.result, trial.values, trial.failure
        if result is None:
            self.stats.skipped_by_model += 1
            return {"values": None, "constraint": trial.constraint, "boot_ids": [], "worker": self.name,
                    "skipped": "memory model"}
        boot_ids = (result.record.boot_id,)
        tput = result.record.throughput_tok_s
        if values and tput:
            self.own_throughput.setdefault(candidate.key(), tput)
        return {"values": values, "constraint": trial.constraint, "boot_ids": list(boot_ids), "worker": self.name,
                "gpu": self.gpu_uuid, "throughput": tput, "trial": number,
                "failure_kind": failure.kind.value if failure else None}

    # ---- A/B promotion on this GPU ------------------------------------------------------------------

    def _maybe_promote(self, candidate: Candidate, values: Mapping[str, Any], number: int, tput: float) -> None:
        assert self.noise is not None and self.policy is not None
        incumbent_key, incumbent = self.claims.get(INCUMBENT)
        if incumbent_key is None or incumbent is None or incumbent_key == candidate.key():
            return
        reference = self.own_throughput.get(incumbent_key)
        if reference is None:
            # The incumbent was kept on another GPU: this GPU has no number for it, so its screening boot
            # cannot be compared here without mixing cards. The A/B (all on this GPU) settles it if the
            # trial's value beats the incumbent trial's value by the noise.
            reference = _incumbent_value(self.search, incumbent)
        if reference is None or math.log(tput / reference) <= self.config.promote_margin * self.noise.sigma_boot:
            return
        boots_needed = 2 * self.policy.looks[0]
        if self.budget.left_s < boots_needed * self._boot_s():
            return
        margin = self.config.promote_margin
        why = (f"trial {number}: {100 * (tput / reference - 1):+.1f}% against the incumbent on GPU {self.config.gpu} "
               f"(margin {margin:.1f} σ = {100 * margin * self.noise.sigma_boot:.1f}%): A/B on this GPU")
        against: str | None = None
        for _ in range(4):     # a keep must beat the incumbent it replaces: another GPU may have replaced it meanwhile
            if not self._claimed_ab(candidate, number, incumbent_key, incumbent, against=against, why=why):
                return
            if self.claims.compare_and_set(INCUMBENT, incumbent_key, candidate.key(),
                                           {"values": dict(values), "trial": number, "worker": self.name,
                                            "gpu": self.gpu_uuid}):
                self.stats.keeps += 1
                return
            incumbent_key, incumbent = self.claims.get(INCUMBENT)
            if incumbent_key is None or incumbent is None or incumbent_key == candidate.key():
                return
            if self.budget.left_s < boots_needed * self._boot_s():
                log.info("trial %d kept, but the incumbent changed meanwhile and no time is left to compare it "
                         "with the new one; it stays a kept trial only", number)
                return
            against = f"trial {incumbent['trial']}" if incumbent.get("trial") is not None else "the new incumbent"
            why = (f"trial {number} kept, but the incumbent changed meanwhile ({against}): A/B against the new one "
                   f"on GPU {self.config.gpu}")

    def _claimed_ab(self, candidate: Candidate, number: int, incumbent_key: str, incumbent: Mapping[str, Any], *,
                    against: str | None, why: str) -> bool:
        """Claim the A/B of ``candidate`` against ``incumbent`` and run it on this GPU; ``False`` when another worker
        holds that A/B or the candidate is not kept."""
        claim = self.claims.claim(AB, f"{candidate.key()}>{incumbent_key}", gpu=self.gpu_uuid)
        if claim.state is not ClaimState.CLAIMED:
            return False
        if against is None:
            self.stats.promotions += 1
        log.info("%s", why)
        inc_candidate = self.space.candidate(dict(incumbent["values"]), list(self.config.techniques),
                                             label=INCUMBENT)
        with self.claims.holding(claim):
            return self._ab(claim, candidate, inc_candidate, number, against=against)

    def _ab(self, claim: Claim, candidate: Candidate, incumbent: Candidate, number: int, *,
            against: str | None = None) -> bool:
        assert self.policy is not None
        technique = f"search trial {number}" + (f" vs {against}" if against else "")
        sampler = ABSampler(self.booter, incumbent=incumbent, candidate=candidate, phase=Phase.SEARCH,
                            tag=f"ab:{claim.item}", technique=technique, trial_number=number)
        ab = run_ab(sampler, self.policy, rng_seed=self.pre.settings.seed * 7919 + 1000 + number,
                    context={"fingerprint": self.pre.fingerprint.key(), "runtime": self.pre.runtime_name,
                             "gpu": self.gpu_uuid or self.config.gpu})
        decision = search_decision(ab, sampler.boot_ids, study=self.config.study,
                                   number=self.store.next_decision_number(), technique=technique,
                                   incumbent=incumbent, candidate=candidate)
        self.store.record_decision(decision)
        self.ledger.record(decision, self.pre.fingerprint, run_dir=self.store.run_dir, trials=(number,))
        keep = decision.kept is Kept.YES
        throughput = arm_mean(ab, Arm.CANDIDATE)
        if keep and throughput is not None:
            self.own_throughput[candidate.key()] = throughput
        self.claims.finish(claim, {"decision": decision.kept.value, "reason": decision.result, "worker": self.name,
                                   "gpu": self.gpu_uuid, "trial": number})
        log.info("A/B trial %d on GPU %s: %s — %s", number, self.config.gpu, decision.kept.value, decision.result)
        return keep

    # ---- outputs ----------------------------------------------------------------------------------

    def write_outputs(self, status: StudyStatus) -> None:
        """This worker's ``study.json`` and report, and the shared study's summary (any worker may write it)."""
        key, incumbent = self.claims.get(INCUMBENT)
        final = self.baseline
        if incumbent is not None and key != self.baseline.key():
            final = self.space.candidate(dict(incumbent["values"]), list(self.config.techniques), label="incumbent")
        noise = self.noise.record() if self.noise is not None else None
        record = StudyRecord(name=self.config.study, fingerprint=self.pre.fingerprint, started_at=self.started_at,
                             updated_at=time.time(), baseline=self.baseline, incumbent=final,
                             budget_s=self.budget.total_s, status=status, noise=noise,
                             traffic=self.pre.settings.traffic, context_target=self.context_target,
                             note=f"worker {self.name} of the shared study {self.config.study} (GPU {self.config.gpu})",
                             worker=self.stats.to_dict(), extra={"storage": _redacted(self.config.storage_url)})
        self.store.write_study(record)
        summary = shared_summary(self.store, self.claims, self.config.study)
        summary["written_by"] = self.name
        write_atomic(self.store.run_dir / SHARED_SUMMARY, json.dumps(summary, indent=2, sort_keys=True, default=str))
        from elsa_tune.reports.build import write_outputs  # matplotlib: only when rendering

        write_outputs(self.store.run_dir, ledger=self.ledger, with_plots=False)


def shared_summary(store: StudyStore, claims: WorkClaims, study: str) -> dict[str, Any]:
    """The study-wide view from the shared storage: trials by state, who measured what, the incumbent."""
    trials: list[dict[str, Any]] = []
    try:
        loaded = optuna.load_study(study_name=f"{study}:search", storage=store.storage)
        for t in loaded.get_trials(deepcopy=False):
            trials.append({"number": t.number, "state": t.state.name, "values": t.values, "params": t.params,
                           "constraint": t.user_attrs.get("constraint"), "boot_ids": t.user_attrs.get("boot_ids"),
                           "retry_of": t.system_attrs.get("failed_trial")})
    except KeyError:      # no search study yet (every worker died in its baseline)
        pass
    key, incumbent = claims.get(INCUMBENT)
    by_state: dict[str, int] = {}
    for row in trials:
        by_state[row["state"]] = by_state.get(row["state"], 0) + 1
    items = claims.items()
    return {"study": study, "trials": trials, "trials_by_state": by_state,
            "incumbent": {"key": key, **(dict(incumbent) if incumbent else {})},
            "work_items": [vars(i) for i in items],
            "boots_by_worker": _boots_by_worker(items)}


def _boots_by_worker(items: Sequence[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        if item.phase == SEARCH and item.result and item.result.get("boot_ids"):
            counts[item.owner] = counts.get(item.owner, 0) + 1
    return counts


def _incumbent_value(search: NumericSearch, incumbent: Mapping[str, Any]) -> float | None:
    trial = incumbent.get("trial")
    if trial is None:
        return None
    for t in search.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.number == trial and t.values:
            return float(t.values[0])
    return None


def _redacted(url: str) -> str:
    import sqlalchemy as sa

    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # any parse problem: never print what may be a password
        return url.split("@")[-1]


class _nothing:
    """A no-op context for a baseline whose claim was already DONE (a restarted worker replays its boots)."""

    def __init__(self, claim: Claim) -> None:
        self.claim = claim

    def __enter__(self) -> Claim:
        return self.claim

    def __exit__(self, *exc: object) -> None:
        return None


def local_run_dir(root: Path, gpu: str) -> Path:
    """A worker's run folder under the shared root: ``<root>/<host>-gpu<N>`` (the ledger sits in ``root``)."""
    return Path(root) / f"{socket.gethostname()}-gpu{gpu}"
