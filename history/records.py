"""Boot and trial records: what one boot of the runtime did, and what Optuna was told about it.

``BootRecord`` is the unit of history. It is written to ``boots/<nnnn>-<label>/boot.json`` when the boot
is over, whatever happened (ready, failed, died, probe failed, measured), before anything is reported to
Optuna, so a killed study never loses a finished boot. Every number in it carries the fingerprint.
``TrialRecord`` mirrors one numeric-search trial (params, values, constraint, the boots it spent) so a
resumed study can re-tell Optuna what a killed process measured but never reported.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.probes.protocol import ProbeResult
from elsa_tune.runtime.boot_report import BootReport
from elsa_tune.runtime.failure import Failure
from elsa_tune.runtime.gpu import GpuState
from elsa_tune.search_spaces.candidate import Candidate

SCHEMA_VERSION = 2
# schema history: 1 — first version (BootRecord, TrialRecord, Covariates); 2 — a boot's tag, gate slot (block,
# position), per-pass gate measurements and quality reference are ``BootRecord`` fields (schema 1 kept them in
# ``extra``; ``BootRecord.from_dict`` moves them).

#: the ``extra`` keys of a schema-1 boot record that became fields (``gate_arm`` repeated ``arm``)
_TYPED_EXTRA = ("tag", "block", "position", "passes", "quality_reference", "gate_arm")

#: The keys a measurement dict may carry its output throughput under (``RunMeasurement.to_dict``).
THROUGHPUT_KEYS = ("output_throughput_tok_s", "output_tok_s")


class Phase(enum.Enum):
    BASELINE = "baseline"
    SCREENING = "screening"
    SEARCH = "search"
    CONFIRMATION = "confirmation"
    COMPARE = "compare"             # ``elsa-tune compare``: two flag files, one A/B, outside any study


class Arm(enum.Enum):
    """Which side of an A/B comparison a boot belongs to: the incumbent (arm A) or the candidate (arm B).

    Records store the value (``"incumbent"``); a run order (``ABBA``) and a boot's tag use the ``letter``.
    """

    INCUMBENT = "incumbent"
    CANDIDATE = "candidate"

    @property
    def letter(self) -> str:
        """``"A"`` for the incumbent, ``"B"`` for the candidate."""
        return "A" if self is Arm.INCUMBENT else "B"

    @classmethod
    def from_letter(cls, letter: str) -> Arm:
        """The arm a run order's letter names (``"A"`` or ``"B"``)."""
        if letter not in ("A", "B"):
            raise ValueError(f"an arm's letter is A or B, not {letter!r}")
        return cls.INCUMBENT if letter == "A" else cls.CANDIDATE

    @classmethod
    def read(cls, value: str) -> Arm:
        """The arm a record names, by value or by letter (gate samples of schema 1 stored the letter)."""
        return cls.from_letter(value) if value in ("A", "B") else cls(value)


class BootOutcome(enum.Enum):
    READY = "ready"                # booted; nothing else ran (yet)
    BOOT_FAILED = "boot_failed"    # never became ready: ``failure`` says why
    DIED = "died"                  # became ready, then died or hung
    PROBE_FAILED = "probe_failed"  # a stress probe or the quality gate rejected it
    MEASURED = "measured"          # survived the probes and was measured
    INTERRUPTED = "interrupted"    # the study was stopped during this boot

    @property
    def feasible(self) -> bool:
        return self in (BootOutcome.READY, BootOutcome.MEASURED)


@dataclass(frozen=True)
class Covariates:
    """Per-boot facts recorded beside the measurement: what drifts between boots and can explain a measurement.

    The GPU's clocks, temperature, power limit, persistence mode and other processes (``from_gpu_state``), the least
    free device memory seen during the boot, a pre-boot probe's score and the launch time. A pre-boot probe
    (``probe_score``, e.g. a matmul or bandwidth probe run before launch) is the only covariate certainly unaffected
    by the candidate; the free memory is not, for memory flags.
    """

    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    temperature_c: float | None = None
    power_limit_w: float | None = None
    persistence_mode: bool | None = None
    other_processes: int = 0
    free_memory_mib: float | None = None
    probe_score: float | None = None
    started_at: float | None = None          # unix time of the launch

    @classmethod
    def from_gpu_state(cls, state: GpuState, *, started_at: float | None = None,
                       min_free_bytes: int | None = None) -> Covariates:
        return cls(sm_clock_mhz=state.sm_clock_mhz, mem_clock_mhz=state.mem_clock_mhz,
                   temperature_c=state.temperature_c, power_limit_w=state.power_limit_w,
                   persistence_mode=state.persistence_mode, other_processes=len(state.processes),
                   free_memory_mib=min_free_bytes / 2**20 if min_free_bytes is not None else None,
                   started_at=started_at)

    def drifting(self) -> dict[str, float]:
        """The numeric covariates that are present, by name (what a drift analysis correlates with throughput)."""
        named = {"sm_clock_mhz": self.sm_clock_mhz, "mem_clock_mhz": self.mem_clock_mhz,
                 "temperature_c": self.temperature_c, "free_memory_mib": self.free_memory_mib,
                 "power_limit_w": self.power_limit_w, "probe_score": self.probe_score, "started_at": self.started_at}
        return {k: float(v) for k, v in named.items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Covariates:
        """Covariates as ``to_dict`` wrote them; a gate sample of schema 1 named the power limit ``power_w`` (and
        carried an ``extra`` mapping nothing wrote, which is dropped)."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if "power_w" in data and "power_limit_w" not in known:
            known["power_limit_w"] = data["power_w"]
        return cls(**known)


@dataclass(frozen=True)
class BootRecord:
    """Everything one boot produced. ``boot_id`` is the folder name (``0007-candidate``).

    ``measurements`` are ``RunMeasurement.to_dict()`` dicts (or per-pass summaries with at least
    ``output_throughput_tok_s``), in the order they ran; the first pass after a boot is warm-up.
    ``throughput_tok_s`` is the per-boot value the tuner used (warm-up discarded); when it is ``None``
    ``boot_throughput()`` derives it from the passes, or says ``None`` — never 0.
    ``log_path`` is relative to the run directory. ``tag`` is the booter's name for the boot (``baseline:0``,
    ``screening:<technique>:ab:B1.0``): a resumed study finds its finished boots by it. ``block``/``position`` are
    its slot in an A/B schedule, ``gate_passes`` the gate's per-pass measurements (``PassMeasurement`` fields, the
    warm-up included) from which a resumed study rebuilds the gate's sample, ``quality_reference`` the answers the
    quality gate compares later boots against (``QualitySample.to_dict``) when this boot recorded them.
    ``extra`` is an opaque pass-through nobody branches on.
    """

    study: str
    boot_id: str
    boot_number: int
    phase: Phase
    arm: Arm
    candidate: Candidate
    fingerprint: Fingerprint
    started_at: float
    ended_at: float
    outcome: BootOutcome
    trial_number: int | None = None
    technique: str | None = None
    report: BootReport | None = None
    failure: Failure | None = None
    covariates: Covariates | None = None
    min_free_gpu_bytes: int | None = None
    probes: tuple[ProbeResult, ...] = ()
    measurements: tuple[Mapping[str, Any], ...] = ()
    throughput_tok_s: float | None = None
    log_path: str | None = None
    note: str = ""
    schema_version: int = SCHEMA_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)
    tag: str | None = None
    block: int | None = None
    position: int | None = None
    gate_passes: tuple[Mapping[str, Any], ...] = ()
    quality_reference: Mapping[str, Any] | None = None

    @property
    def seconds(self) -> float:
        return max(0.0, self.ended_at - self.started_at)

    def passes(self) -> list[float]:
        """Output throughput of every measured pass, warm-up included, in order (passes without one skipped)."""
        return [v for v in (measurement_throughput(m) for m in self.measurements) if v is not None]

    def boot_throughput(self) -> float | None:
        """The per-boot output throughput, warm-up discarded; ``None`` without data (never 0).

        The tuner's own value (``throughput_tok_s``) when it recorded one; otherwise the first pass after
        the boot is dropped, passes are averaged per workload, and workloads are combined geometrically.
        """
        if self.throughput_tok_s is not None:
            return self.throughput_tok_s
        by_workload: dict[str, list[float]] = {}
        for m in self.measurements[1:]:
            value = measurement_throughput(m)
            if value is not None and value > 0:
                by_workload.setdefault(str(m.get("workload_id", "")), []).append(value)
        if not by_workload:
            return None
        logs = [math.log(sum(v) / len(v)) for v in by_workload.values()]
        return math.exp(sum(logs) / len(logs))

    def ttft_p50_s(self) -> float | None:
        """Median of the steady passes' TTFT p50 (``None`` when no pass reported one)."""
        return self._steady_ttft("p50")

    def ttft_p99_s(self) -> float | None:
        """Median of the steady passes' TTFT p99 (``None`` when no pass reported one)."""
        return self._steady_ttft("p99")

    def _steady_ttft(self, quantile: str) -> float | None:
        values = sorted(v for v in (_nested(m, "ttft_s", quantile) for m in self.measurements[1:]) if v is not None)
        return values[len(values) // 2] if values else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version, "study": self.study, "boot_id": self.boot_id,
            "boot_number": self.boot_number, "trial_number": self.trial_number, "phase": self.phase.value,
            "arm": self.arm.value, "technique": self.technique, "candidate": self.candidate.to_dict(),
            "fingerprint": self.fingerprint.to_dict(), "started_at": self.started_at, "ended_at": self.ended_at,
            "outcome": self.outcome.value, "report": self.report.to_dict() if self.report else None,
            "failure": self.failure.to_dict() if self.failure else None,
            "covariates": self.covariates.to_dict() if self.covariates else None,
            "min_free_gpu_bytes": self.min_free_gpu_bytes, "probes": [p.to_dict() for p in self.probes],
            "measurements": [dict(m) for m in self.measurements], "throughput_tok_s": self.throughput_tok_s,
            "log_path": self.log_path, "note": self.note, "extra": dict(self.extra), "tag": self.tag,
            "block": self.block, "position": self.position, "gate_passes": [dict(p) for p in self.gate_passes],
            "quality_reference": dict(self.quality_reference) if self.quality_reference is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BootRecord:
        """A boot record of any schema: one of schema 1 has its tag, slot, passes and reference moved out of
        ``extra``."""
        if int(data.get("schema_version", 1)) < 2:
            extra = dict(data.get("extra") or {})
            data = {**data, "schema_version": SCHEMA_VERSION, "tag": extra.get("tag"), "block": extra.get("block"),
                    "position": extra.get("position"), "gate_passes": extra.get("passes") or (),
                    "quality_reference": extra.get("quality_reference") or None,
                    "extra": {k: v for k, v in extra.items() if k not in _TYPED_EXTRA}}
        report, failure, covariates = data.get("report"), data.get("failure"), data.get("covariates")
        reference = data.get("quality_reference")
        return cls(
            study=str(data["study"]), boot_id=str(data["boot_id"]), boot_number=int(data["boot_number"]),
            trial_number=data.get("trial_number"), phase=Phase(data["phase"]), arm=Arm(data["arm"]),
            technique=data.get("technique"), candidate=Candidate.from_dict(data["candidate"]),
            fingerprint=Fingerprint.from_dict(data["fingerprint"]), started_at=float(data["started_at"]),
            ended_at=float(data["ended_at"]), outcome=BootOutcome(data["outcome"]),
            report=BootReport.from_dict(report) if report else None,
            failure=Failure.from_dict(failure) if failure else None,
            covariates=Covariates.from_dict(covariates) if covariates else None,
            min_free_gpu_bytes=data.get("min_free_gpu_bytes"),
            probes=tuple(ProbeResult.from_dict(p) for p in data.get("probes", ())),
            measurements=tuple(dict(m) for m in data.get("measurements", ())),
            throughput_tok_s=data.get("throughput_tok_s"), log_path=data.get("log_path"),
            note=str(data.get("note", "")), schema_version=int(data.get("schema_version", SCHEMA_VERSION)),
            extra=dict(data.get("extra") or {}), tag=data.get("tag"), block=data.get("block"),
            position=data.get("position"), gate_passes=tuple(dict(p) for p in data.get("gate_passes") or ()),
            quality_reference=dict(reference) if isinstance(reference, Mapping) else None,
        )


class TrialState(enum.Enum):
    COMPLETE = "complete"      # measured: ``values`` are real, ``constraint`` <= 0
    INFEASIBLE = "infeasible"  # crashed / OOM / missed the context target: ``constraint`` > 0
    FAILED = "failed"          # nothing usable (interrupted); Optuna's FAIL


@dataclass(frozen=True)
class TrialRecord:
    """One numeric-search trial as Optuna was (or is to be) told it. Written before ``study.tell``."""

    study: str
    number: int
    params: Mapping[str, Any]
    state: TrialState
    values: tuple[float, ...] | None
    constraint: float
    boot_ids: tuple[str, ...] = ()
    failure_kind: str | None = None
    told_at: float | None = None
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "study": self.study, "number": self.number,
                "params": dict(self.params), "state": self.state.value,
                "values": list(self.values) if self.values is not None else None, "constraint": self.constraint,
                "boot_ids": list(self.boot_ids), "failure_kind": self.failure_kind, "told_at": self.told_at}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialRecord:
        values = data.get("values")
        return cls(study=str(data["study"]), number=int(data["number"]), params=dict(data.get("params", {})),
                   state=TrialState(data["state"]), values=tuple(float(v) for v in values) if values is not None
                   else None, constraint=float(data.get("constraint", 0.0)),
                   boot_ids=tuple(data.get("boot_ids", ())), failure_kind=data.get("failure_kind"),
                   told_at=data.get("told_at"), schema_version=int(data.get("schema_version", SCHEMA_VERSION)))


def measurement_throughput(measurement: Mapping[str, Any]) -> float | None:
    """The output throughput of one measured pass, from a ``RunMeasurement.to_dict()`` or a summary dict.

    Returns ``None`` (never 0) when the pass has no usable value: missing, non-finite, or a pass whose
    requests all failed (``ok_requests == 0``).
    """
    if measurement.get("requests_ok") == 0 or measurement.get("ok_requests") == 0:
        return None
    for key in THROUGHPUT_KEYS:
        value = measurement.get(key)
        if value is None and isinstance(measurement.get("summary"), Mapping):
            value = measurement["summary"].get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def _nested(data: Mapping[str, Any], key: str, inner: str) -> float | None:
    value = data.get(key)
    if isinstance(value, Mapping):
        value = value.get(inner)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
