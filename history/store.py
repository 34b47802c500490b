"""``StudyStore``: the study's history — Optuna's storage plus the run folder, kept consistent.

Ordering is what makes it kill-safe: a boot's ``boot.json`` (and a trial's ``TrialRecord``) is written
atomically to disk BEFORE Optuna is told, so after a SIGKILL at any instant the files hold every
finished boot and ``reconcile`` brings Optuna up to date with them:

* boots on disk that the boot registry (``BootRegistry``, a table beside Optuna's) does not list are registered;
* trials left RUNNING by the dead process are failed once their heartbeat is stale;
* trials whose result was written but never told are re-added as finished trials, so the sampler keeps
  what was measured (including the constraint of a crashed candidate).

Crashed or OOM candidates are told as COMPLETE trials with a constraint > 0 (user attr ``constraint`` and,
on Optuna >= 5, ``Trial.set_constraint("feasibility", …)`` which Optuna's samplers read by themselves; on
Optuna 4 pass ``constraint_values`` as the sampler's ``constraints_func``), so the sampler learns where the
cliff is: Optuna's samplers ignore FAIL trials and would sample the cliff again.

Typical use by the study (ask-and-tell around boots)::

    store = StudyStore(run_dir)                              # sqlite:///<run_dir>/study.db
    store.check_fingerprint(fp)                              # refuse to resume on another setup
    study = store.create_or_load_study("search", ["maximize"], sampler)
    store.reconcile(study)                                   # after a kill: register, fail stale, recover
    with store.trial(study) as trial:                        # ask + heartbeat
        flags = ...trial.suggest_*...
        slot = store.new_boot(label)                         # boots/<nnnn>-<label>/ for Runtime.start
        store.attach_boot(trial, slot.boot_id)
        ...boot, probe, measure...
        store.record_boot(BootRecord(...))                   # boot.json first, then Optuna
        store.record_trial_result(study, trial, values=[tok_s] or None, failure=failure)
    store.record_decision(decision); store.ledger.record(decision, fp, run_dir=run_dir)
    store.write_study(study_record); reports.build.write_outputs(run_dir)
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.distributions import BaseDistribution
from optuna.exceptions import ExperimentalWarning
from optuna.storages import RDBStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from elsa_tune.errors import HistoryError
from elsa_tune.history.boot_registry import BootRegistry
from elsa_tune.history.decision import DecisionRecord
from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.history.heartbeat import Heartbeat
from elsa_tune.history.ledger import Ledger
from elsa_tune.history.records import BootRecord, TrialRecord, TrialState
from elsa_tune.history.run_dir import BootSlot, History, RunDir
from elsa_tune.history.study_database import check_study_database
from elsa_tune.history.study_record import StudyRecord
from elsa_tune.runtime.failure import Failure

log = logging.getLogger(__name__)

CONSTRAINT_ATTR = "constraint"
BOOTS_ATTR = "boot_ids"
RECOVERED_ATTR = "recovered_from"
CONSTRAINT_KEY = "feasibility"          # Optuna >= 5 constraint name (system attr ``constraints:feasibility``)
_NATIVE_CONSTRAINTS = hasattr(optuna.trial.Trial, "set_constraint")


@dataclass(frozen=True)
class Reconciliation:
    """What ``StudyStore.reconcile`` found and repaired after a restart."""

    registered_boots: tuple[str, ...]     # on disk, missing from the boot registry: now registered
    incomplete_boots: tuple[str, ...]     # folders without boot.json: boots the dead process never finished
    failed_stale_trials: tuple[int, ...]  # RUNNING trials whose heartbeat stopped: now FAIL
    recovered_trials: tuple[int, ...]     # written to disk but never told: re-added as finished trials
    removed_temp_files: int = 0           # half-written temporary files of a killed process, deleted


def constraint_values(trial: FrozenTrial) -> Sequence[float]:
    """``constraints_func`` for Optuna samplers: the user attr ``constraint`` (> 0 means infeasible)."""
    value = trial.user_attrs.get(CONSTRAINT_ATTR, 0.0)
    if isinstance(value, (list, tuple)):
        return tuple(float(v) for v in value)
    return (float(value),)


def unreachable_values(directions: Sequence[StudyDirection]) -> list[float]:
    """The value told for an infeasible trial: the worst no measurement can reach, per objective."""
    return [-math.inf if d is StudyDirection.MAXIMIZE else math.inf for d in directions]


class StudyStore:
    """One study's history: ``RunDir`` files plus Optuna's storage (SQLite ``<run_dir>/study.db`` by default).

    ``storage_url`` may name any RDB Optuna supports (``postgresql://…``). ``heartbeat_interval`` and
    ``grace_period`` are seconds (Optuna's integers); a trial not beating for ``grace_period`` is stale.
    """

    def __init__(self, run_dir: str | Path, storage_url: str | None = None, *, name: str | None = None,
                 heartbeat_interval: int | None = 30, grace_period: int | None = None) -> None:
        self.files = RunDir(run_dir)
        self.name = name or self.files.path.resolve().name
        self.storage_url = storage_url or f"sqlite:///{self.files.path.resolve() / 'study.db'}"
        database = sqlite_file(self.storage_url)
        if database is not None:     # before Optuna adds its tables to a file that may be another application's
            check_study_database(database)
        self.files.path.mkdir(parents=True, exist_ok=True)
        engine_kwargs: dict[str, Any] = {}
        if self.storage_url.startswith("sqlite"):
            engine_kwargs["connect_args"] = {"timeout": 60}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)
                self.storage = RDBStorage(self.storage_url, engine_kwargs=engine_kwargs,
                                          heartbeat_interval=heartbeat_interval, grace_period=grace_period)
        except Exception as exc:  # sqlalchemy/alembic errors have no common base worth naming here
            cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise HistoryError(f"cannot open the study storage {self.storage_url}: {cause}",
                               remedy=_storage_remedy(self.storage_url, exc)) from exc
        self.registry = BootRegistry(self.storage.engine, self.name)

    # ---- files ---------------------------------------------------------------------------------------

    @property
    def run_dir(self) -> Path:
        path: Path = self.files.path
        return path

    def new_boot(self, label: str) -> BootSlot:
        return self.files.new_boot(label)

    def record_boot(self, record: BootRecord) -> Path:
        """Write ``boot.json`` atomically, then register the boot in Optuna's storage."""
        path: Path = self.files.write_boot(record)
        self._register(record)
        return path

    def registered_boots(self) -> dict[str, dict[str, Any]]:
        return self.registry.boots()

    def load(self) -> History:
        return self.files.load()

    def record_decision(self, decision: DecisionRecord) -> Path:
        """Write a keep/reject decision (``decisions/<nnnn>-<technique>.json``) atomically."""
        path: Path = self.files.write_decision(decision)
        return path

    def next_decision_number(self) -> int:
        number: int = self.files.next_decision_number()
        return number

    def write_study(self, study: StudyRecord) -> Path:
        """Rewrite ``study.json`` atomically; refuses a record whose setup differs from the stored one."""
        self.check_fingerprint(study.fingerprint)
        path: Path = self.files.write_study(study)
        return path

    def read_study(self) -> StudyRecord | None:
        record: StudyRecord | None = self.files.read_study()
        return record

    def check_fingerprint(self, fingerprint: Fingerprint) -> None:
        """Refuse to continue a study in this folder on another setup (numbers would not be comparable)."""
        stored = self.files.read_study()
        if stored is None or stored.fingerprint.key() == fingerprint.key():
            return
        changes = stored.fingerprint.differences(fingerprint) or [
            f"{k}: {v} → {fingerprint.to_dict()[k]}" for k, v in stored.fingerprint.to_dict().items()
            if fingerprint.to_dict().get(k) != v]
        raise HistoryError(f"{self.files.path} holds a study measured on another setup ({'; '.join(changes)})",
                           remedy="start a new study in a fresh run directory (--out); the ledger is shared")

    @property
    def ledger(self) -> Ledger:
        """The ledger shared by the studies: in the database when the store is on a server (PostgreSQL),
        else ``ledger.jsonl`` in this run directory's parent folder."""
        from elsa_tune.history.pg_ledger import ledger_for  # sqlalchemy is only needed for a database ledger

        return ledger_for(self.files.path, self.storage_url)

    # ---- Optuna -------------------------------------------------------------------------------------

    def create_or_load_study(self, name: str, directions: Sequence[str | StudyDirection],
                             sampler: optuna.samplers.BaseSampler | None = None, *,
                             metric_names: Sequence[str] | None = None) -> optuna.Study:
        """Create the Optuna study or load it (resume); refuses a study stored with other directions.

        ``metric_names`` (one per direction; default ``objective``, ``objective_2``…) are stored on the study,
        so optuna-dashboard names its axes.
        """
        wanted = [d if isinstance(d, StudyDirection) else StudyDirection[str(d).upper()] for d in directions]
        study = optuna.create_study(study_name=name, storage=self.storage, directions=wanted, sampler=sampler,
                                    load_if_exists=True)
        if list(study.directions) != wanted:
            raise HistoryError(f"study {name!r} in {self.storage_url} has directions "
                               f"{[d.name for d in study.directions]}, not {[d.name for d in wanted]}",
                               remedy="use a new study name or a fresh run directory")
        names = list(metric_names) if metric_names else [
            "objective" if i == 0 else f"objective_{i + 1}" for i in range(len(wanted))]
        if len(names) != len(wanted):
            raise HistoryError(f"study {name!r}: {len(names)} metric names for {len(wanted)} objectives",
                               remedy="give one metric name per objective")
        if study.metric_names != names:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)
                study.set_metric_names(names)
        return study

    def ask(self, study: optuna.Study, fixed_distributions: dict[str, BaseDistribution] | None = None
            ) -> optuna.Trial:
        """``study.ask`` for ask-and-tell with a heartbeat storage (Optuna warns it expects ``optimize``)."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
            return study.ask(fixed_distributions)

    def heartbeat(self, trial: optuna.Trial) -> Heartbeat:
        """A heartbeat for ``trial``; use ``with store.heartbeat(trial): …`` around the trial's boots."""
        return Heartbeat(self.storage, trial._trial_id)

    def attach_boot(self, trial: optuna.Trial, boot_id: str) -> None:
        """Note on the trial that ``boot_id`` belongs to it (before the boot starts)."""
        ids = list(trial.user_attrs.get(BOOTS_ATTR, []))
        if boot_id not in ids:
            trial.set_user_attr(BOOTS_ATTR, [*ids, boot_id])

    def record_trial_result(self, study: optuna.Study, trial: optuna.Trial, *, values: Sequence[float] | None,
                            constraint: float = 0.0, boot_ids: Sequence[str] = (),
                            failure: Failure | None = None) -> TrialRecord:
        """Tell Optuna a trial's result, after writing it to ``trials/`` atomically.

        ``values`` ``None`` with ``constraint`` > 0 (or a ``failure``): an infeasible candidate (crash, OOM,
        context target missed); it is told COMPLETE with the constraint, so constrained samplers avoid it, and
        with the unreachable worst value of each objective (−inf when maximising, +inf when minimising), which
        no measured trial can tie and Optuna's constrained samplers never rank; its ``TrialRecord`` holds no
        values. ``values`` ``None`` without a constraint: told FAIL.
        """
        if failure is not None and constraint <= 0:
            constraint = 1.0
        if values is not None and not all(math.isfinite(v) for v in values):
            raise HistoryError(f"trial {trial.number}: non-finite objective {list(values)}",
                               remedy="report a failed measurement as values=None with a constraint")
        if values is not None:
            state, told = (TrialState.COMPLETE if constraint <= 0 else TrialState.INFEASIBLE), list(values)
        elif constraint > 0:
            state, told = TrialState.INFEASIBLE, unreachable_values(study.directions)
        else:
            state, told = TrialState.FAILED, None
        record = TrialRecord(study=study.study_name, number=trial.number, params=dict(trial.params), state=state,
                             values=tuple(values) if values is not None else None, constraint=float(constraint),
                             boot_ids=tuple(boot_ids) or tuple(trial.user_attrs.get(BOOTS_ATTR, ())),
                             failure_kind=failure.kind.value if failure else None, told_at=time.time())
        self.files.write_trial(record)
        if self.storage.get_trial(trial._trial_id).state.is_finished():
            log.warning("trial %d was finished elsewhere (a stale-heartbeat sweep?); re-adding its result",
                        trial.number)
            self._recover(study, record)
            return record
        try:
            trial.set_user_attr(CONSTRAINT_ATTR, [record.constraint])
            if told is not None and _NATIVE_CONSTRAINTS:
                trial.set_constraint(CONSTRAINT_KEY, record.constraint)
            trial.set_user_attr(BOOTS_ATTR, list(record.boot_ids))
            if record.failure_kind:
                trial.set_user_attr("failure_kind", record.failure_kind)
            if values is None and told is not None:
                trial.set_user_attr("penalty_values", True)
            study.tell(trial, told, state=OptunaState.COMPLETE if told is not None else OptunaState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:  # failed by another process between our checks
            self._recover(study, record)
        return record

    def fail_stale_trials(self, study: optuna.Study) -> list[int]:
        """Mark RUNNING trials whose heartbeat is older than the grace period FAIL; returns their numbers."""
        before = {t.number for t in study.get_trials(deepcopy=False, states=(OptunaState.RUNNING,))}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        after = {t.number for t in study.get_trials(deepcopy=False, states=(OptunaState.RUNNING,))}
        return sorted(before - after)

    def reconcile(self, study: optuna.Study | None = None) -> Reconciliation:
        """Bring Optuna up to date with the files after a restart (see the module docstring).

        Call it once when a study (re)starts, before new boots; it must not run while another process writes.
        """
        swept = self.files.sweep_temp_files()
        registered = self.registered_boots()
        newly = []
        for record in self.files.boots():
            if record.boot_id not in registered:
                self._register(record)
                newly.append(record.boot_id)
        stale: list[int] = []
        recovered: list[int] = []
        if study is not None:
            stale = self.fail_stale_trials(study)
            for trial_record in self.files.trials():
                if trial_record.study == study.study_name and self._recover(study, trial_record):
                    recovered.append(trial_record.number)
        result = Reconciliation(tuple(newly), tuple(self.files.incomplete_boots()), tuple(stale), tuple(recovered),
                                len(swept))
        if any((result.registered_boots, result.incomplete_boots, result.failed_stale_trials,
                result.recovered_trials)):
            log.info("resumed %s: %d boots registered, %d boots interrupted, %d stale trials failed, "
                     "%d trials recovered", self.name, len(newly), len(result.incomplete_boots), len(stale),
                     len(recovered))
        return result

    @contextmanager
    def trial(self, study: optuna.Study) -> Iterator[optuna.Trial]:
        """Ask a trial and keep its heartbeat for the duration of the block."""
        trial = self.ask(study)
        with self.heartbeat(trial):
            yield trial

    # ---- internals ------------------------------------------------------------------------------------

    def _register(self, record: BootRecord) -> None:
        self.registry.register(record)

    def _recover(self, study: optuna.Study, record: TrialRecord) -> bool:
        """Re-add a trial whose result is on disk but not in Optuna (told FAIL or never told). Idempotent."""
        values = (list(record.values) if record.values is not None
                  else unreachable_values(study.directions) if record.state is TrialState.INFEASIBLE else None)
        if values is None:
            return False
        trials = study.get_trials(deepcopy=False)
        original = next((t for t in trials if t.number == record.number), None)
        if original is not None and original.state is OptunaState.COMPLETE:
            return False
        if any(t.user_attrs.get(RECOVERED_ATTR) == record.number for t in trials):
            return False
        if original is None or set(original.distributions) != set(record.params):
            log.warning("trial %d: cannot recover, its parameter distributions are not in the storage",
                        record.number)
            return False
        if original.state is OptunaState.RUNNING:  # not stale yet and never told: finish it as recorded
            try:
                self.storage.set_trial_user_attr(original._trial_id, CONSTRAINT_ATTR, [record.constraint])
                if _NATIVE_CONSTRAINTS:
                    self.storage.set_trial_system_attr(original._trial_id, f"constraints:{CONSTRAINT_KEY}",
                                                       record.constraint)
                self.storage.set_trial_user_attr(original._trial_id, BOOTS_ATTR, list(record.boot_ids))
                if record.values is None:
                    self.storage.set_trial_user_attr(original._trial_id, "penalty_values", True)
                self.storage.set_trial_state_values(original._trial_id, OptunaState.COMPLETE, values)
                return True
            except optuna.exceptions.UpdateFinishedTrialError:
                return self._recover(study, record)
        attrs = {CONSTRAINT_ATTR: [record.constraint], BOOTS_ATTR: list(record.boot_ids), RECOVERED_ATTR: record.number}
        if record.failure_kind:
            attrs["failure_kind"] = record.failure_kind
        if record.values is None:
            attrs["penalty_values"] = True
        system_attrs = {f"constraints:{CONSTRAINT_KEY}": record.constraint} if _NATIVE_CONSTRAINTS else {}
        study.add_trial(optuna.trial.create_trial(params=dict(record.params), distributions=original.distributions,
                                                  values=values, user_attrs=attrs,
                                                  system_attrs=system_attrs, state=OptunaState.COMPLETE))
        return True


def sqlite_file(url: str) -> Path | None:
    """The file a ``sqlite:///PATH`` storage URL names (``None`` for a server or an in-memory database)."""
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        return None
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def _storage_remedy(url: str, exc: Exception) -> str:
    """What to do about a storage that would not open: a damaged SQLite file is not a server problem."""
    text = str(exc).lower()
    if url.startswith("sqlite"):
        if "not a database" in text or "malformed" in text or "file is encrypted" in text:
            return ("the study's SQLite file is damaged: move it aside (the boots/ and decisions/ records stay) and "
                    "rerun to start the study's Optuna storage afresh, or give another --out")
        return "check that the study.db file and its folder can be read and written"
    return "check the URL, the database server and its permissions"
