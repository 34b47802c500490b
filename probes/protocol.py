"""The ``Probe`` seam: stress a ready server within a budget and say whether the candidate survives.

A probe never hangs the study: every request has a deadline and the probe as a whole has one. The
outcome is a record (``ProbeResult``), not an exception: a crash, an OOM under load, a hang or a
quality regression is classified with the runtime layer's failure classes and kept as evidence.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from elsa_tune.runtime.failure import Failure
from elsa_tune.runtime.protocol import Server

SCHEMA_VERSION = 1


class ProbeStatus(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"              # the server crashed, hung or ran out of memory: ``failure`` says how
    REGRESSED = "regressed"        # the server survived but answered worse than the baseline
    LOW_HEADROOM = "low_headroom"  # survived, but free GPU memory fell below the study's floor
    SKIPPED = "skipped"            # not applicable (e.g. no vision model), with the reason in ``detail``


@dataclass(frozen=True)
class ProbeBudget:
    """Limits for one probe run. ``deadline_s`` bounds the whole probe; ``hang_s`` is how long without a
    token counts as a hang even while ``/health`` answers."""

    deadline_s: float = 600.0
    request_timeout_s: float = 300.0
    hang_s: float = 60.0
    headroom_floor_bytes: int = 512 * 1024 * 1024


@dataclass(frozen=True)
class ProbeResult:
    name: str
    status: ProbeStatus
    detail: str = ""
    failure: Failure | None = None
    min_free_bytes: int | None = None
    seconds: float = 0.0
    metrics: Mapping[str, Any] = field(default_factory=dict)
    evidence: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION

    @property
    def passed(self) -> bool:
        return self.status in (ProbeStatus.PASSED, ProbeStatus.SKIPPED)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "name": self.name, "status": self.status.value,
                "detail": self.detail, "failure": self.failure.to_dict() if self.failure else None,
                "min_free_bytes": self.min_free_bytes, "seconds": self.seconds, "metrics": dict(self.metrics),
                "evidence": list(self.evidence)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeResult:
        failure = data.get("failure")
        return cls(name=data["name"], status=ProbeStatus(data["status"]), detail=data.get("detail", ""),
                   failure=Failure.from_dict(failure) if failure else None,
                   min_free_bytes=data.get("min_free_bytes"), seconds=data.get("seconds", 0.0),
                   metrics=dict(data.get("metrics", {})), evidence=tuple(data.get("evidence", ())),
                   schema_version=data.get("schema_version", SCHEMA_VERSION))


@runtime_checkable
class Probe(Protocol):
    """One stress or quality check. ``run`` returns a ``ProbeResult`` and raises nothing for a
    failing candidate; it raises only for errors that must stop the study (a bug, a bad setting)."""

    name: str

    def run(self, server: Server, budget: ProbeBudget) -> ProbeResult: ...
