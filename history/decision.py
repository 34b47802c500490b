"""``DecisionRecord``: one keep/reject decision of a study, the row of the "Tried / Result / Kept?" table.

A decision is made by the A/B gate (``verdict``), by a failure before any A/B (``failure``: the candidate
crashed, OOMed or hung), by a flag the runtime accepted and ignored (``ignored``: rejected without
spending boots on an A/B), or by the ledger (``skipped``: rejected earlier for the same fingerprint).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elsa_tune.history.reasons import reason_category, reason_from_adjustment, reason_from_failure, reason_from_verdict
from elsa_tune.history.records import Phase
from elsa_tune.history.verdict import Decision, Verdict
from elsa_tune.runtime.boot_report import Adjustment
from elsa_tune.runtime.failure import Failure
from elsa_tune.search_spaces.candidate import FlagValue
from elsa_tune.search_spaces.space import ReasonCategory

SCHEMA_VERSION = 1
# schema history: 1 — first version.


class Kept(enum.Enum):
    YES = "yes"
    NO = "no"
    INCONCLUSIVE = "inconclusive"   # the incumbent stays; the technique is not proven worse
    SKIPPED = "skipped"             # the ledger already rejected it for this fingerprint


@dataclass(frozen=True)
class DecisionRecord:
    """One decision: what was tried (a flag/env delta on the incumbent), what happened, whether it was kept."""

    study: str
    number: int
    phase: Phase
    technique: str
    flags_delta: Mapping[str, FlagValue] = field(default_factory=dict)
    env_delta: Mapping[str, str] = field(default_factory=dict)
    incumbent_key: str = ""
    candidate_key: str = ""
    verdict: Verdict | None = None
    failure: Failure | None = None
    ignored: tuple[Adjustment, ...] = ()
    skipped: str = ""                       # why the ledger skipped it (with the date it was rejected)
    boots_incumbent: tuple[str, ...] = ()
    boots_candidate: tuple[str, ...] = ()
    decided_at: float = 0.0
    result: str = ""                        # one sentence; derived from the above when empty
    ab_result: Mapping[str, Any] | None = None   # the gate's ``ABResult.to_dict()``: samples, schedule, policy
    attempts: int = 1                       # boots tried before a ``failure`` was accepted as the answer
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if not self.result:
            object.__setattr__(self, "result", self._derive_result())

    @property
    def kept(self) -> Kept:
        if self.skipped:
            return Kept.SKIPPED
        if self.failure is not None or self.ignored:
            return Kept.NO
        if self.verdict is None:
            return Kept.INCONCLUSIVE
        return {Decision.KEEP: Kept.YES, Decision.REJECT: Kept.NO,
                Decision.INCONCLUSIVE: Kept.INCONCLUSIVE}[self.verdict.decision]

    @property
    def category(self) -> ReasonCategory | None:
        """Why it was (not) kept, in a rejection table's words (``history/reasons.py``); ``None`` when skipped."""
        if self.skipped:
            return None
        return reason_category(self.verdict, self.failure, self.ignored)

    def delta_text(self) -> str:
        """The delta as command-line text: ``--enable-mixed-chunk --page-size 32 SGLANG_X=1``."""
        parts: list[str] = []
        for name, value in self.flags_delta.items():
            if value is True:
                parts.append(f"--{name}")
            elif value is None or value is False:
                parts.append(f"(no --{name})")
            else:
                parts.append(f"--{name} {value}")
        parts.extend(f"{k}={v}" for k, v in self.env_delta.items())
        return " ".join(parts)

    def _derive_result(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        if self.failure is not None:
            reason = str(reason_from_failure(self.failure))
            return f"{self.attempts} attempts, {self.attempts} failures — {reason}" if self.attempts > 1 else reason
        if self.ignored:
            return str(reason_from_adjustment(self.ignored[0]))
        if self.verdict is not None:
            return str(reason_from_verdict(self.verdict))
        return "no verdict recorded"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version, "study": self.study, "number": self.number,
            "phase": self.phase.value, "technique": self.technique, "flags_delta": dict(self.flags_delta),
            "env_delta": dict(self.env_delta), "incumbent_key": self.incumbent_key,
            "candidate_key": self.candidate_key, "verdict": self.verdict.to_dict() if self.verdict else None,
            "failure": self.failure.to_dict() if self.failure else None,
            "ignored": [a.to_dict() for a in self.ignored], "skipped": self.skipped,
            "boots_incumbent": list(self.boots_incumbent), "boots_candidate": list(self.boots_candidate),
            "decided_at": self.decided_at, "result": self.result, "kept": self.kept.value,
            "category": self.category.value if self.category is not None else None,
            "ab_result": dict(self.ab_result) if self.ab_result is not None else None, "attempts": self.attempts,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecisionRecord:
        verdict, failure = data.get("verdict"), data.get("failure")
        return cls(
            study=str(data["study"]), number=int(data["number"]), phase=Phase(data["phase"]),
            technique=str(data["technique"]), flags_delta=dict(data.get("flags_delta", {})),
            env_delta=dict(data.get("env_delta", {})), incumbent_key=str(data.get("incumbent_key", "")),
            candidate_key=str(data.get("candidate_key", "")),
            verdict=Verdict.from_dict(verdict) if verdict else None,
            failure=Failure.from_dict(failure) if failure else None,
            ignored=tuple(Adjustment(**a) for a in data.get("ignored", ())), skipped=str(data.get("skipped", "")),
            boots_incumbent=tuple(data.get("boots_incumbent", ())),
            boots_candidate=tuple(data.get("boots_candidate", ())), decided_at=float(data.get("decided_at", 0.0)),
            result=str(data.get("result", "")), schema_version=int(data.get("schema_version", SCHEMA_VERSION)),
            ab_result=dict(data["ab_result"]) if data.get("ab_result") is not None else None,
            attempts=int(data.get("attempts", 1)),
        )
