"""The ledger of techniques tried: what was measured, on which setup, and why it was (not) kept.

``ledger.jsonl`` sits in the parent folder of the run directories, shared by every study there. It is
append-only, one JSON object per line; appends take an exclusive ``fcntl`` lock and are fsynced, so
concurrent studies never interleave lines. The reader is tolerant: a corrupt line (a torn write, a
hand edit) is reported with its line number and skipped, or raised with ``strict=True``.

A later study asks ``rejected_for(fingerprint)`` and skips those techniques, saying so; one whose test did not
decide (``LedgerEntry.unresolved``) is tested again by the next study, until two studies left it so. The match is on
``Fingerprint.ledger_key()`` (runtime, model, GPU model, driver): a changed fingerprint re-opens them.
The latest entry of a technique wins, so a retest that keeps it re-opens it as well.
``LedgerBackend`` is the seam for sharing the ledger elsewhere (PostgreSQL, issue 8).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from elsa_tune.errors import HistoryError
from elsa_tune.finite_number import number_problem
from elsa_tune.history.decision import DecisionRecord, Kept
from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.history.run_dir import LEDGER_FILE
from elsa_tune.history.verdict import Decision, Futility, Verdict
from elsa_tune.input_file import input_problem
from elsa_tune.search_spaces.candidate import FlagValue

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
#: a technique that this many studies on one setup left ``unresolved`` is skipped there like a rejected one
UNRESOLVED_STUDIES = 2
# schema history: 1 — first version.


@dataclass(frozen=True)
class Evidence:
    """Where the proof is: the study and run folder, the Optuna trials and boots, a log excerpt."""

    study: str
    run_dir: str | None = None
    trials: tuple[int, ...] = ()
    boot_ids: tuple[str, ...] = ()
    log_excerpt: tuple[str, ...] = ()
    decision: int | None = None          # the study's decision number (``decisions/<nnnn>-….json``)

    def to_dict(self) -> dict[str, Any]:
        return {"study": self.study, "run_dir": self.run_dir, "trials": list(self.trials),
                "boot_ids": list(self.boot_ids), "log_excerpt": list(self.log_excerpt), "decision": self.decision}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evidence:
        return cls(study=str(data.get("study", "")), run_dir=data.get("run_dir"),
                   trials=tuple(int(t) for t in data.get("trials", ())), boot_ids=tuple(data.get("boot_ids", ())),
                   log_excerpt=tuple(str(line) for line in data.get("log_excerpt", ())),
                   decision=data.get("decision"))


@dataclass(frozen=True)
class LedgerEntry:
    """One technique tried on one setup: verdict, effect with CI, a one-sentence reason, evidence, retest rule.

    ``decision`` is KEEP, REJECT or INCONCLUSIVE; a crash, an OOM or a silently ignored flag is a REJECT
    with no effect. ``effect``/``ci_low``/``ci_high`` are throughput ratios (candidate/incumbent).
    """

    technique: str
    fingerprint: Fingerprint
    decision: Decision
    reason: str
    evidence: Evidence
    date: str
    retest_when: str
    flags_delta: Mapping[str, FlagValue] = field(default_factory=dict)
    env_delta: Mapping[str, str] = field(default_factory=dict)
    effect: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    boots: int = 0
    verdict: Verdict | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def rejected(self) -> bool:
        return self.decision is not Decision.KEEP

    @property
    def unresolved(self) -> bool:
        """The test behind the entry did not decide, and its interval still reaches a gain: it ended INCONCLUSIVE
        with an interval, or an early look stopped it to save boots (``Futility.BOOT_SAVING``),
        with its upper bound above no change. A later study on the setup may test it again."""
        if self.ci_high is None or self.ci_high <= 1.0 or self.verdict is None:
            return False
        if self.decision is Decision.INCONCLUSIVE:
            return True
        return self.decision is Decision.REJECT and self.verdict.futility is Futility.BOOT_SAVING

    def key(self) -> str:
        """Identity of the measurement behind the entry (study, decision, technique, setup, boots), not its date:
        appending the same decision twice (a resumed study) is recognised by ``Ledger.append_once``."""
        payload = json.dumps([self.evidence.study, self.evidence.decision, self.technique, self.fingerprint.key(),
                              sorted(self.evidence.boot_ids)], default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "technique": self.technique,
                "flags_delta": dict(self.flags_delta), "env_delta": dict(self.env_delta),
                "fingerprint": self.fingerprint.to_dict(), "ledger_key": self.fingerprint.ledger_key(),
                "decision": self.decision.value, "effect": self.effect, "ci_low": self.ci_low,
                "ci_high": self.ci_high, "boots": self.boots, "reason": self.reason,
                "evidence": self.evidence.to_dict(), "date": self.date, "retest_when": self.retest_when,
                "verdict": self.verdict.to_dict() if self.verdict else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LedgerEntry:
        verdict = data.get("verdict")
        return cls(technique=str(data["technique"]), fingerprint=Fingerprint.from_dict(data["fingerprint"]),
                   decision=Decision(data["decision"]), reason=str(data["reason"]),
                   evidence=Evidence.from_dict(data.get("evidence", {})), date=str(data["date"]),
                   retest_when=str(data.get("retest_when", "")), flags_delta=dict(data.get("flags_delta", {})),
                   env_delta=dict(data.get("env_delta", {})), effect=_ratio(data, "effect"),
                   ci_low=_ratio(data, "ci_low"), ci_high=_ratio(data, "ci_high"), boots=_count(data, "boots"),
                   verdict=Verdict.from_dict(verdict) if verdict else None,
                   schema_version=int(data.get("schema_version", SCHEMA_VERSION)))

    @classmethod
    def from_decision(cls, decision: DecisionRecord, fingerprint: Fingerprint, *, run_dir: str | Path | None = None,
                      trials: Sequence[int] = (), log_excerpt: Sequence[str] = (),
                      when: dt.datetime | None = None) -> LedgerEntry:
        """The ledger line for a study's decision (``Kept.SKIPPED`` decisions are not ledger material)."""
        if decision.kept is Kept.SKIPPED:
            raise ValueError(f"decision {decision.number} was skipped by the ledger; it adds nothing to it")
        verdict = decision.verdict
        outcome = {Kept.YES: Decision.KEEP, Kept.NO: Decision.REJECT, Kept.INCONCLUSIVE: Decision.INCONCLUSIVE}
        excerpt = tuple(log_excerpt) or (decision.failure.evidence if decision.failure else ()) or tuple(
            a.evidence for a in decision.ignored if a.evidence)
        return cls(technique=decision.technique, fingerprint=fingerprint, decision=outcome[decision.kept],
                   reason=decision.result,
                   evidence=Evidence(study=decision.study, run_dir=str(run_dir) if run_dir else None,
                                     trials=tuple(trials), boot_ids=decision.boots_incumbent + decision.boots_candidate,
                                     log_excerpt=tuple(excerpt)[-8:], decision=decision.number),
                   date=(when or dt.datetime.now(dt.UTC)).isoformat(timespec="seconds"),
                   retest_when=fingerprint.retest_condition(), flags_delta=dict(decision.flags_delta),
                   env_delta=dict(decision.env_delta), effect=verdict.effect if verdict else None,
                   ci_low=verdict.ci_low if verdict else None, ci_high=verdict.ci_high if verdict else None,
                   boots=len(decision.boots_incumbent) + len(decision.boots_candidate), verdict=verdict)


@dataclass(frozen=True)
class CorruptLine:
    number: int          # 1-based line number in the ledger
    text: str
    error: str

    def describe(self, source: str) -> str:
        return f"{source}:{self.number}: {self.error}: {self.text[:120]!r}"


@dataclass(frozen=True)
class LedgerContents:
    entries: tuple[LedgerEntry, ...]
    corrupt: tuple[CorruptLine, ...] = ()


@runtime_checkable
class LedgerBackend(Protocol):
    """Where ledger entries live. ``append`` is atomic per entry and safe across processes;
    ``read`` returns every entry in append order plus the lines it could not read (never raises for those).
    """

    @property
    def source(self) -> str: ...

    def append(self, entry: LedgerEntry) -> None: ...

    def read(self) -> LedgerContents: ...


_SNIFF_BYTES = 1 << 16


class JsonlLedger:
    """The ledger as a JSON-lines file, locked with ``fcntl.flock`` for appends."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def source(self) -> str:
        return str(self.path)

    def append(self, entry: LedgerEntry) -> None:
        line = json.dumps(entry.to_dict(), sort_keys=True, ensure_ascii=False, default=str)
        if "\n" in line:
            raise HistoryError("ledger entry serialised to several lines", remedy="this is a bug in elsa-tune")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                handle.seek(0, os.SEEK_END)
                prefix = b""
                if handle.tell() > 0:  # a writer killed mid-line left no newline: do not glue onto its torn line
                    handle.seek(-1, os.SEEK_END)
                    if handle.read(1) != b"\n":
                        prefix = b"\n"
                    handle.seek(0, os.SEEK_END)
                handle.write(prefix + line.encode() + b"\n")
                handle.flush()
                os.fsync(handle.fileno())
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def is_foreign(self) -> bool:
        """Whether the file holds something else: text of which no line is a JSON object (a torn line of a ledger
        is one line among others). Such a file is never appended to."""
        try:
            with open(self.path, "rb") as handle:
                head = handle.read(_SNIFF_BYTES)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise HistoryError(f"{self.path}: cannot read the ledger: {exc.strerror or exc}",
                               remedy="check its permissions") from exc
        lines = [line for line in head.split(b"\n") if line.strip()]
        if len(head) == _SNIFF_BYTES and lines and not head.endswith(b"\n"):
            lines.pop()              # cut by the sniff: not evidence either way
        for line in lines:
            try:
                if isinstance(json.loads(line), dict):
                    return False
            except (ValueError, RecursionError):    # ValueError: not JSON, or not UTF-8
                continue
        return bool(lines)

    def read(self) -> LedgerContents:
        problem = input_problem(self.path)
        if problem is not None:
            raise HistoryError(f"{self.path} {problem}, not the ledger's file",
                               remedy="move it aside: the studies of this folder keep their ledger there, one JSON "
                                      "line per decision")
        try:
            with open(self.path, "rb") as handle:
                fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
                try:
                    raw = handle.read()
                finally:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        except FileNotFoundError:
            return LedgerContents(())
        except IsADirectoryError as exc:
            raise HistoryError(f"{self.path} is a folder, not the ledger's file",
                               remedy="move that folder aside: the studies of this folder keep their ledger there, "
                                      "one JSON line per decision") from exc
        except OSError as exc:
            raise HistoryError(f"{self.path}: cannot read the ledger: {exc}", remedy="check its permissions") from exc
        entries: list[LedgerEntry] = []
        corrupt: list[CorruptLine] = []
        for number, blob in enumerate(raw.split(b"\n"), start=1):
            text = blob.decode("utf-8", errors="replace").strip()
            if not text:
                continue
            try:
                data = json.loads(text)
                if not isinstance(data, dict):
                    raise TypeError("not a JSON object")
                entries.append(LedgerEntry.from_dict(data))
            except (json.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError, RecursionError) as exc:
                corrupt.append(CorruptLine(number, text, f"{type(exc).__name__}: {exc}"))
        return LedgerContents(tuple(entries), tuple(corrupt))


def _ratio(data: Mapping[str, Any], key: str) -> float | None:
    """``data[key]``: absent, null or a number within the one finite-number rule; anything else is a ``TypeError``."""
    value = data.get(key)
    if value is None:
        return None
    problem = number_problem(value)
    if problem is not None:
        raise TypeError(f"{key}: {problem}")
    return float(value)


def _count(data: Mapping[str, Any], key: str) -> int:
    value = data.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or number_problem(value) is not None or value < 0:
        raise TypeError(f"{key}: {value!r} is not a count")
    return value


class Ledger:
    """The ledger as studies use it: append entries, read them, ask what is rejected for a fingerprint."""

    def __init__(self, backend: LedgerBackend) -> None:
        self.backend = backend

    @classmethod
    def at(cls, path: str | Path) -> Ledger:
        """The JSONL ledger at ``path``: a ``.jsonl`` file, a folder holding ``ledger.jsonl``, or a run dir
        (whose ledger is in its parent folder)."""
        target = Path(path)
        if target.suffix == ".jsonl" or target.is_file():
            return cls(JsonlLedger(target))
        is_run_dir = (target / "study.json").exists() or (target / "boots").is_dir()
        if is_run_dir and not (target / LEDGER_FILE).exists():
            return cls.for_run_dir(target)
        return cls(JsonlLedger(target / LEDGER_FILE))

    @classmethod
    def for_run_dir(cls, run_dir: str | Path) -> Ledger:
        return cls(JsonlLedger(Path(run_dir).resolve().parent / LEDGER_FILE))

    def append(self, entry: LedgerEntry) -> None:
        self.backend.append(entry)

    def append_once(self, entry: LedgerEntry) -> bool:
        """Append unless an entry with the same ``key()`` is already there (a resumed study re-recording a
        decision); returns whether it appended. One study appends from one process, so read-then-append is safe."""
        if any(e.key() == entry.key() for e in self.entries()):
            return False
        self.backend.append(entry)
        return True

    def record(self, decision: DecisionRecord, fingerprint: Fingerprint, *, run_dir: str | Path | None = None,
               trials: Sequence[int] = (), log_excerpt: Sequence[str] = ()) -> LedgerEntry | None:
        """The ledger line for a study's decision, appended once; ``None`` for decisions the ledger skipped."""
        if decision.kept is Kept.SKIPPED:
            return None
        entry = LedgerEntry.from_decision(decision, fingerprint, run_dir=run_dir, trials=trials,
                                          log_excerpt=log_excerpt)
        self.append_once(entry)
        return entry

    def entries(self, *, strict: bool = False) -> list[LedgerEntry]:
        """Every entry in append order. Corrupt lines are logged with their number and skipped, or raised
        as ``HistoryError`` when ``strict``."""
        contents = self.backend.read()
        for bad in contents.corrupt:
            message = bad.describe(self.backend.source)
            if strict:
                raise HistoryError(f"corrupt ledger line: {message}",
                                   remedy=f"fix or delete line {bad.number} of {self.backend.source}")
            log.warning("skipping corrupt ledger line %s", message)
        return list(contents.entries)

    def problems(self) -> list[CorruptLine]:
        return list(self.backend.read().corrupt)

    def latest_for(self, fingerprint: Fingerprint) -> dict[str, LedgerEntry]:
        """The latest entry of every technique tried under ``fingerprint``'s ledger key."""
        key = fingerprint.ledger_key()
        latest: dict[str, LedgerEntry] = {}
        for entry in self.entries():
            if entry.fingerprint.ledger_key() == key:
                latest[entry.technique] = entry
        return latest

    def rejected_for(self, fingerprint: Fingerprint) -> dict[str, LedgerEntry]:
        """Techniques whose latest verdict under this fingerprint was not KEEP: a study skips these.

        Except a technique whose latest entry is ``unresolved`` and which fewer than ``UNRESOLVED_STUDIES``
        studies on this setup left unresolved: an underpowered test is evidence of nothing, and the next study
        tests it again (its entries stay; the latest wins as before).
        """
        key = fingerprint.ledger_key()
        latest: dict[str, LedgerEntry] = {}
        last_per_study: dict[tuple[str, str], LedgerEntry] = {}
        for entry in self.entries():          # one read of the backend: the latest entry overall and per study
            if entry.fingerprint.ledger_key() == key:
                latest[entry.technique] = entry
                last_per_study[(entry.technique, entry.evidence.study)] = entry
        rejected: dict[str, LedgerEntry] = {}
        for name, entry in latest.items():
            if not entry.rejected:
                continue
            left_open = sum(1 for (technique, _), e in last_per_study.items() if technique == name and e.unresolved)
            if entry.unresolved and left_open < UNRESOLVED_STUDIES:
                continue
            rejected[name] = entry
        return rejected

    def reopened_for(self, fingerprint: Fingerprint) -> dict[str, tuple[LedgerEntry, list[str]]]:
        """Techniques rejected under another fingerprint only, with what changed: a study retests these."""
        current = self.latest_for(fingerprint)
        reopened: dict[str, tuple[LedgerEntry, list[str]]] = {}
        for entry in self.entries():
            if entry.technique in current or not entry.rejected:
                continue
            reopened[entry.technique] = (entry, entry.fingerprint.differences(fingerprint))
        return reopened

    def skip_note(self, entry: LedgerEntry) -> str:
        """How a study says it skipped a technique: "rejected 2026-11-28 (study s1): crashes: …", or "not kept
        2026-11-28 (study s1): no demonstrated benefit: …" for an inconclusive one (nothing measurable)."""
        how = "rejected" if entry.decision is Decision.REJECT else "not kept"
        return f"{how} {entry.date[:10]} (study {entry.evidence.study}): {entry.reason}"
