"""``StudyRecord``: the study as a whole — setup, budget, phases, noise, baseline and incumbent.

Rewritten atomically (``study.json``) after every decision, so a report rendered from a killed study
still knows its fingerprint, budget and current incumbent.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.search_spaces.candidate import Candidate

SCHEMA_VERSION = 4
# schema history: 1 — first version; 2 — the settings, space digest, notes, confirmation and worker are fields
# (schema 1 kept them in ``extra``; ``StudyRecord.from_dict`` moves them); 3 — the ``--extend`` extensions are a
# field (schema 2 kept them in ``extra``; ``StudyRecord.from_dict`` moves them); 4 — the clock the budget counts in
# is a field (schema 3 kept it in ``extra["budget"]["clock"]``; ``StudyRecord.from_dict`` reads it from there).

#: the ``extra`` keys of a schema-1 study record that became fields
_TYPED_EXTRA = ("settings", "space_digest", "notes", "confirmation", "worker")


class StudyStatus(enum.Enum):
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"
    FAILED = "failed"


class ConfirmationStatus(enum.Enum):
    """How the confirmation phase ended for the recommended configuration."""

    CONFIRMED = "confirmed"          # its A/B against the baseline on fresh boots (and the soak) held
    UNCONFIRMED = "unconfirmed"      # recommended without a confirmation that showed it (no time, no gain shown)
    REJECTED = "rejected"            # the confirmation or the soak failed it: the baseline is recommended
    NOT_NEEDED = "not needed"        # nothing beat the baseline


@dataclass(frozen=True)
class Confirmation:
    """The confirmation's status and, in a sentence, why."""

    status: ConfirmationStatus
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status.value, "detail": self.detail}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Confirmation:
        return cls(status=ConfirmationStatus(data["status"]), detail=str(data.get("detail", "")))


@dataclass(frozen=True)
class Extension:
    """One ``--extend`` of a finished study: the budget it had, the seconds added, the budget after, and when (unix
    time) the extending run started."""

    from_budget_s: float
    added_s: float
    budget_s: float
    at: float

    def to_dict(self) -> dict[str, Any]:
        return {"from_budget_s": self.from_budget_s, "added_s": self.added_s, "budget_s": self.budget_s,
                "at": self.at}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Extension:
        return cls(from_budget_s=float(data["from_budget_s"]), added_s=float(data["added_s"]),
                   budget_s=float(data["budget_s"]), at=float(data["at"]))


@dataclass(frozen=True)
class PhaseSpan:
    """One phase of the study and the time it had and used (``ended_at`` None while it runs)."""

    name: str
    started_at: float
    ended_at: float | None = None
    budget_s: float | None = None
    boots: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PhaseSpan:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class NoiseRecord:
    """The baseline's noise as relative standard deviations (0.10 = 10%) and the warm-up bias.

    ``sigma_boot``: spread of per-boot means between restarts of the same config; ``sigma_run``: spread of
    passes within one boot; ``warmup_bias``: first pass after a boot relative to steady state (−0.127 =
    the cold pass reads 12.7% low). ``mde``: the smallest effect the planned gate can detect, as a ratio.
    ``set_aside_boot``: the baseline boot (0-based) left out of σ_boot as an outlier, ``set_aside_off_median`` its
    mean against the others' median − 1, ``sigma_boot_all`` σ_boot with it (all ``None`` when none was).
    """

    sigma_boot: float | None
    sigma_run: float | None
    warmup_bias: float | None
    boots: int
    passes_per_boot: float
    mde: float | None = None
    derived_from: str = "study"            # "study" (the tuner's numbers) or "boots" (recomputed by a report)
    set_aside_boot: int | None = None
    set_aside_off_median: float | None = None
    sigma_boot_all: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NoiseRecord:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class StudyRecord:
    """The study: what it ran on, under which budget, and where it stands.

    ``incumbent`` is the best configuration so far (the winner once ``status`` is FINISHED).
    ``port``, ``image`` and ``shm_size`` describe how the winner is to be deployed (``best/``).
    ``settings`` are the study's settings as ``Settings.to_dict`` wrote them, ``space_digest`` the digest of the
    search space it ran, ``notes`` what the study noted on the way, ``confirmation`` how the confirmation phase
    ended (``None`` before it did), ``worker`` a search worker's own counters (``WorkerStats.to_dict``, its
    ``gpu`` among them) when the record is a worker's, ``extensions`` the ``--extend`` runs that continued it, in
    order, ``budget_clock`` the clock the budget counts in (``Budget.counts``; ``None`` when not recorded).
    ``extra`` is an opaque pass-through nobody branches on.
    """

    name: str
    fingerprint: Fingerprint
    started_at: float
    updated_at: float
    baseline: Candidate
    incumbent: Candidate
    budget_s: float | None = None
    status: StudyStatus = StudyStatus.RUNNING
    phases: tuple[PhaseSpan, ...] = ()
    noise: NoiseRecord | None = None
    objective: str = "output_throughput_tok_s"
    traffic: str = ""
    context_target: int | None = None
    port: int = 30000
    host: str = "0.0.0.0"
    image: str | None = None
    shm_size: str = "32g"
    note: str = ""
    schema_version: int = SCHEMA_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    space_digest: str | None = None
    notes: tuple[str, ...] = ()
    confirmation: Confirmation | None = None
    worker: Mapping[str, Any] | None = None
    extensions: tuple[Extension, ...] = ()
    budget_clock: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data.update(fingerprint=self.fingerprint.to_dict(), baseline=self.baseline.to_dict(),
                    incumbent=self.incumbent.to_dict(), status=self.status.value,
                    phases=[p.to_dict() for p in self.phases], noise=self.noise.to_dict() if self.noise else None,
                    extra=dict(self.extra), settings=dict(self.settings), notes=list(self.notes),
                    confirmation=self.confirmation.to_dict() if self.confirmation is not None else None,
                    worker=dict(self.worker) if self.worker is not None else None,
                    extensions=[e.to_dict() for e in self.extensions])
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StudyRecord:
        """A study record of any schema: one of schema 1 has its settings, digest, notes, confirmation and worker
        moved out of ``extra`` (a confirmation status it never reached, ``""``, reads as ``None``), one of schema 2
        its extensions, one of schema 3 the clock its budget counted in."""
        version = int(data.get("schema_version", 1))
        if version < 2:
            extra = dict(data.get("extra") or {})
            confirmation = extra.get("confirmation")
            data = {**data, "schema_version": SCHEMA_VERSION, "settings": extra.get("settings") or {},
                    "space_digest": extra.get("space_digest") or None, "notes": extra.get("notes") or (),
                    "confirmation": confirmation if isinstance(confirmation, Mapping) and confirmation.get("status")
                    else None, "worker": extra.get("worker"),
                    "extra": {k: v for k, v in extra.items() if k not in _TYPED_EXTRA}}
        if version < 3:
            extra = dict(data.get("extra") or {})
            data = {**data, "schema_version": SCHEMA_VERSION, "extensions": extra.pop("extensions", None) or (),
                    "extra": extra}
        if version < 4:
            budget = (data.get("extra") or {}).get("budget")
            clock = budget.get("clock") if isinstance(budget, Mapping) else None
            data = {**data, "schema_version": SCHEMA_VERSION, "budget_clock": clock if isinstance(clock, str) else None}
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        clock = data.get("budget_clock")
        noise, confirmation, worker = data.get("noise"), data.get("confirmation"), data.get("worker")
        kwargs.update(fingerprint=Fingerprint.from_dict(data["fingerprint"]),
                      baseline=Candidate.from_dict(data["baseline"]), incumbent=Candidate.from_dict(data["incumbent"]),
                      status=StudyStatus(data.get("status", "running")),
                      phases=tuple(PhaseSpan.from_dict(p) for p in data.get("phases", ())),
                      noise=NoiseRecord.from_dict(noise) if noise else None, extra=dict(data.get("extra") or {}),
                      settings=dict(data.get("settings") or {}), notes=tuple(str(n) for n in data.get("notes") or ()),
                      confirmation=Confirmation.from_dict(confirmation) if isinstance(confirmation, Mapping) else None,
                      worker=dict(worker) if isinstance(worker, Mapping) else None,
                      extensions=tuple(Extension.from_dict(e) for e in data.get("extensions") or ()
                                       if isinstance(e, Mapping)),
                      budget_clock=clock if isinstance(clock, str) and clock else None)
        return cls(**kwargs)
