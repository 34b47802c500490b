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

SCHEMA_VERSION = 1
# schema history: 1 — first version.


class StudyStatus(enum.Enum):
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"
    FAILED = "failed"


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

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data.update(fingerprint=self.fingerprint.to_dict(), baseline=self.baseline.to_dict(),
                    incumbent=self.incumbent.to_dict(), status=self.status.value,
                    phases=[p.to_dict() for p in self.phases], noise=self.noise.to_dict() if self.noise else None,
                    extra=dict(self.extra))
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StudyRecord:
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        noise = data.get("noise")
        kwargs.update(fingerprint=Fingerprint.from_dict(data["fingerprint"]),
                      baseline=Candidate.from_dict(data["baseline"]), incumbent=Candidate.from_dict(data["incumbent"]),
                      status=StudyStatus(data.get("status", "running")),
                      phases=tuple(PhaseSpan.from_dict(p) for p in data.get("phases", ())),
                      noise=NoiseRecord.from_dict(noise) if noise else None, extra=dict(data.get("extra", {})))
        return cls(**kwargs)
