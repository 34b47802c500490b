"""``Verdict``: the A/B gate's decision as a record. The gate (``tuner/``) produces it; history stores it.

Every fact a decision, the ledger or a report reads is a typed field; ``extra`` is an opaque pass-through of
descriptive detail (the run's looks, the runtime it ran on) that nothing branches on.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from elsa_tune.runtime.failure import Failure
from elsa_tune.search_spaces.space import ReasonCategory

#: 4: the facts that were ``extra`` keys are typed fields (``final``, ``failure``, ``futility``, ``statistics``,
#: ``night_control``, ``stages``, ...), ``kind`` is a ``PolicyKind``; records of schema ≤ 3 are read with their
#: ``extra`` keys moved into those fields (``Verdict.from_dict``). 3: ``GuardrailResult.p_value`` (records of
#: schema 2 read with it unset).
#: 5: ``kv_pool_incumbent``, ``kv_pool_candidate`` and ``speed_margin`` of a memory technique's test (records of
#: schema 4 read with them unset).
#: 6: the A/B run's boot ``order`` (``"ABBABAAB"``) and ``schedule_seed`` are fields (records of schema ≤ 5 kept them
#: in ``extra``; ``Verdict.from_dict`` moves them).
SCHEMA_VERSION = 6


class Decision(enum.Enum):
    KEEP = "keep"
    REJECT = "reject"
    INCONCLUSIVE = "inconclusive"   # the incumbent stays; never reported as "significant" or as zero


class PolicyKind(enum.StrEnum):
    """What a test must show: ``SPEED`` superiority; ``MEMORY`` non-inferior speed and a larger KV pool."""

    SPEED = "speed"
    MEMORY = "memory"


class Futility(enum.StrEnum):
    """A futility rule: ``CI`` stops when the interval rules out the minimum gain; ``BOOT_SAVING`` also stops an
    early look whose estimate is too small to reach a keep (non-binding: such a test may be continued later);
    ``NONE`` never stops for futility (a policy setting only; a verdict's ``futility`` is then ``None``)."""

    BOOT_SAVING = "boot_saving"
    CI = "ci"
    NONE = "none"


@dataclass(frozen=True)
class GuardrailResult:
    """A non-inferiority test on a secondary metric (TTFT p50/p99, KV pool tokens, quality)."""

    name: str
    passed: bool | None              # None: could not be decided (no data) — never counts as passed
    ratio: float | None              # candidate / incumbent
    ci_low: float | None
    ci_high: float | None
    margin: float                    # the allowed worsening, as a ratio (e.g. 1.10 for TTFT +10%)
    detail: str = ""
    #: a statistical guardrail's one-sided p of "no better than the margin" (a retest combines it with its own)
    p_value: float | None = None


@dataclass(frozen=True)
class OutlierBoot:
    """A boot the gate's robust comparison down-weighted (weight below 0.5): it counted less, it was not dropped.

    ``arm`` is "incumbent" or "candidate" (for a paired analysis "pair": the block's difference was the outlier),
    ``block`` its ABBA·BAAB block, ``weight`` its weight in its arm's biweight location (0 = left out), ``off_median``
    its throughput against its arm's median minus 1 (−0.24: 24% slower than the arm's other boots).
    """

    arm: str
    block: int
    weight: float
    off_median: float

    def to_dict(self) -> dict[str, Any]:
        return {"arm": self.arm, "block": self.block, "weight": self.weight, "off_median": self.off_median}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OutlierBoot:
        return cls(arm=str(data["arm"]), block=int(data["block"]), weight=float(data["weight"]),
                   off_median=float(data["off_median"]))


@dataclass(frozen=True)
class GateStatistics:
    """The test behind a gate verdict at its look: the boundary it was held to and the comparison's numbers.

    ``nominal_p`` is the unadjusted one-sided p, ``boundary_p`` the look's nominal efficacy level (a keep needs
    ``nominal_p ≤ boundary_p``), ``t_critical`` the same boundary on the t scale. ``delta_log`` is the effect on the
    log scale with standard error ``se`` and ``df`` degrees of freedom; ``test`` names the comparison (Welch,
    pooled, paired, biweight). ``ci_level`` is the two-sided level of the verdict's interval (not adjusted for the
    sequential design). ``excluded_boots`` could not enter the test; ``unsteady_boots`` drifted within their passes.
    Fields a look never reached (no valid comparison) are ``None``.
    """

    look_blocks: int
    ci_level: float
    excluded_boots: int | None = None
    unsteady_boots: int | None = None
    nominal_p: float | None = None
    boundary_p: float | None = None
    t_critical: float | None = None
    delta_log: float | None = None
    se: float | None = None
    df: float | None = None
    t: float | None = None
    test: str | None = None
    sd_incumbent: float | None = None
    sd_candidate: float | None = None
    null_delta: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GateStatistics:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class CapLook:
    """The decision at the cap that a guardrail extension continued: its p, boundary and effect."""

    p: float | None
    boundary_p: float | None
    effect: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"p": self.p, "boundary_p": self.boundary_p, "effect": self.effect}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapLook:
        return cls(p=data.get("p"), boundary_p=data.get("boundary_p"), effect=data.get("effect"))


@dataclass(frozen=True)
class NightControl:
    """The night's false-keep control as applied to one verdict: how (``method``), at which ``level``, and whether
    it ``held`` back a keep the gate made (the verdict is then INCONCLUSIVE)."""

    method: str
    level: float
    held: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "level": self.level, "held": self.held}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NightControl:
        return cls(method=str(data["method"]), level=float(data["level"]), held=bool(data.get("held", False)))


#: how a retest's two stages are combined (``multiplicity.combined_p``)
STAGES_RULE = "inverse normal, equal weights"


@dataclass(frozen=True)
class Stages:
    """A retest's two stages: the first test's p, the retest's own, and their combination (``STAGES_RULE``)."""

    first_p: float
    second_p: float
    combined_p: float
    rule: str = STAGES_RULE

    def to_dict(self) -> dict[str, Any]:
        return {"first_p": self.first_p, "second_p": self.second_p, "combined_p": self.combined_p, "rule": self.rule}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Stages:
        return cls(first_p=float(data["first_p"]), second_p=float(data["second_p"]),
                   combined_p=float(data["combined_p"]), rule=str(data.get("rule", STAGES_RULE)))


@dataclass(frozen=True)
class PoolFacts:
    """The KV pool facts behind a screening shortcut: the candidate's pool, the incumbent's (a memory technique
    that did not grow it) or the context target it fell below. A capacity is tokens or, where the runtime fixes the
    pool by context, its own unit (``BootReport.kv_capacity``)."""

    kv_pool: float | None = None
    incumbent_kv_pool: float | None = None
    context_target: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kv_pool": self.kv_pool, "incumbent_kv_pool": self.incumbent_kv_pool,
                "context_target": self.context_target}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolFacts:
        return cls(kv_pool=data.get("kv_pool"), incumbent_kv_pool=data.get("incumbent_kv_pool"),
                   context_target=data.get("context_target"))


@dataclass(frozen=True)
class Verdict:
    """KEEP / REJECT / INCONCLUSIVE with the reason, effect ratio and its CI, p-value, boots per arm.

    ``effect`` is the throughput ratio candidate/incumbent (1.05 = 5% faster) estimated on per-boot
    means of log throughput; ``ci_low``/``ci_high`` bound it. ``mde`` is the smallest effect the
    protocol could have detected with the boots it spent, as ratio − 1 (0.05 = 5%, unlike ``effect``),
    stated whenever the result is not KEEP.

    The typed facts: ``final`` (no further look can change it), ``failure`` (the boot failure that decided it),
    ``quality_failed``, ``failed_guardrail``/``pending_guardrail`` (by name), ``crossed_at_cap`` (the gain crossed at
    the cap and a guardrail extension follows), ``futility`` (the rule that stopped it, ``None`` when none did),
    ``not_tested`` (the night's control left no level to test at), ``slow_boot_z`` (a screening boot this many σ
    below the incumbent), ``pool`` (KV pool facts of a screening shortcut), ``outlier_boots``, ``statistics`` (the
    test), ``at_cap`` (the cap's decision an extension continued), ``night_control`` and ``stages`` (a retest),
    ``by_workload`` (per-workload effect ratios where reported). A memory technique's test records what it buys:
    ``kv_pool_incumbent`` and ``kv_pool_candidate`` (the arms' median KV capacity) and ``speed_margin``, the
    slowdown its speed was tested within (0.02 = −2%). An A/B run's verdict records the boot ``order`` it ran
    (arm letters, ``"ABBABAAB"``) and the ``schedule_seed`` that drew it (``None`` for a verdict no A/B run made).
    """

    decision: Decision
    reason: str
    effect: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    boots_incumbent: int
    boots_candidate: int
    mde: float | None = None
    guardrails: tuple[GuardrailResult, ...] = ()
    kind: PolicyKind = PolicyKind.SPEED
    stopped_at_look: int | None = None
    adjusted_p_value: float | None = None   # after multiple-testing control across the night
    schema_version: int = SCHEMA_VERSION
    #: opaque descriptive detail (the run's order and looks, where it ran); never read by a decision
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: why, in a few words; set by whoever decides (the gate, a screening shortcut, the night's control)
    category: ReasonCategory | None = None
    final: bool = False
    failure: Failure | None = None
    quality_failed: bool = False
    failed_guardrail: str | None = None
    pending_guardrail: str | None = None
    crossed_at_cap: bool = False
    futility: Futility | None = None
    not_tested: bool = False
    slow_boot_z: float | None = None
    pool: PoolFacts | None = None
    outlier_boots: tuple[OutlierBoot, ...] = ()
    statistics: GateStatistics | None = None
    at_cap: CapLook | None = None
    night_control: NightControl | None = None
    stages: Stages | None = None
    by_workload: Mapping[str, float] = field(default_factory=dict)
    kv_pool_incumbent: int | None = None
    kv_pool_candidate: int | None = None
    speed_margin: float | None = None
    order: str | None = None
    schedule_seed: int | None = None

    @property
    def futile(self) -> bool:
        """A futility rule stopped the test."""
        return self.futility is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version, "decision": self.decision.value, "reason": self.reason,
            "effect": self.effect, "ci_low": self.ci_low, "ci_high": self.ci_high, "p_value": self.p_value,
            "boots_incumbent": self.boots_incumbent, "boots_candidate": self.boots_candidate, "mde": self.mde,
            "guardrails": [vars(g).copy() for g in self.guardrails], "kind": self.kind.value,
            "stopped_at_look": self.stopped_at_look, "adjusted_p_value": self.adjusted_p_value,
            "category": self.category.value if self.category is not None else None,
            "final": self.final, "failure": self.failure.to_dict() if self.failure is not None else None,
            "quality_failed": self.quality_failed, "failed_guardrail": self.failed_guardrail,
            "pending_guardrail": self.pending_guardrail, "crossed_at_cap": self.crossed_at_cap,
            "futility": self.futility.value if self.futility is not None else None, "not_tested": self.not_tested,
            "slow_boot_z": self.slow_boot_z, "pool": self.pool.to_dict() if self.pool is not None else None,
            "outlier_boots": [o.to_dict() for o in self.outlier_boots],
            "statistics": self.statistics.to_dict() if self.statistics is not None else None,
            "at_cap": self.at_cap.to_dict() if self.at_cap is not None else None,
            "night_control": self.night_control.to_dict() if self.night_control is not None else None,
            "stages": self.stages.to_dict() if self.stages is not None else None,
            "by_workload": dict(self.by_workload), "extra": dict(self.extra),
            "kv_pool_incumbent": self.kv_pool_incumbent, "kv_pool_candidate": self.kv_pool_candidate,
            "speed_margin": self.speed_margin, "order": self.order, "schedule_seed": self.schedule_seed,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        """A verdict of any schema: one before 4 has its facts moved out of ``extra`` (``_typed_from_extra``), one
        before 6 its run's ``order`` and ``schedule_seed``."""
        version = int(data.get("schema_version", 1))
        if version < 4:
            data = {**data, **_typed_from_extra(data.get("extra") or {}), "schema_version": SCHEMA_VERSION}
        if version < 6:
            extra = dict(data.get("extra") or {})
            data = {**data, "order": extra.pop("order", None), "schedule_seed": extra.pop("schedule_seed", None),
                    "extra": extra, "schema_version": SCHEMA_VERSION}
        failure, pool, statistics = data.get("failure"), data.get("pool"), data.get("statistics")
        at_cap, control, stages = data.get("at_cap"), data.get("night_control"), data.get("stages")
        return cls(
            decision=Decision(data["decision"]), reason=str(data["reason"]), effect=data.get("effect"),
            ci_low=data.get("ci_low"), ci_high=data.get("ci_high"), p_value=data.get("p_value"),
            boots_incumbent=int(data["boots_incumbent"]), boots_candidate=int(data["boots_candidate"]),
            mde=data.get("mde"), guardrails=tuple(GuardrailResult(**g) for g in data.get("guardrails", ())),
            kind=PolicyKind(data.get("kind") or PolicyKind.SPEED), stopped_at_look=data.get("stopped_at_look"),
            adjusted_p_value=data.get("adjusted_p_value"), schema_version=int(data.get("schema_version", version)),
            extra=dict(data.get("extra") or {}),
            category=ReasonCategory(data["category"]) if data.get("category") else None,
            final=bool(data.get("final", False)),
            failure=Failure.from_dict(failure) if isinstance(failure, Mapping) else None,
            quality_failed=bool(data.get("quality_failed", False)), failed_guardrail=data.get("failed_guardrail"),
            pending_guardrail=data.get("pending_guardrail"), crossed_at_cap=bool(data.get("crossed_at_cap", False)),
            futility=Futility(data["futility"]) if data.get("futility") else None,
            not_tested=bool(data.get("not_tested", False)), slow_boot_z=data.get("slow_boot_z"),
            pool=PoolFacts.from_dict(pool) if isinstance(pool, Mapping) else None,
            outlier_boots=tuple(OutlierBoot.from_dict(o) for o in data.get("outlier_boots") or ()
                                if isinstance(o, Mapping)),
            statistics=GateStatistics.from_dict(statistics) if isinstance(statistics, Mapping) else None,
            at_cap=CapLook.from_dict(at_cap) if isinstance(at_cap, Mapping) else None,
            night_control=NightControl.from_dict(control) if isinstance(control, Mapping) else None,
            stages=Stages.from_dict(stages) if isinstance(stages, Mapping) else None,
            by_workload={str(k): float(v) for k, v in (data.get("by_workload") or {}).items()},
            kv_pool_incumbent=data.get("kv_pool_incumbent"), kv_pool_candidate=data.get("kv_pool_candidate"),
            speed_margin=data.get("speed_margin"),
            order=str(data["order"]) if data.get("order") is not None else None,
            schedule_seed=int(data["schedule_seed"]) if data.get("schedule_seed") is not None else None,
        )


#: the ``extra`` keys of a schema ≤ 3 verdict that became ``GateStatistics`` fields
_STATISTICS_KEYS = frozenset(f.name for f in fields(GateStatistics))
#: the ``extra`` keys of a schema ≤ 3 verdict that became typed fields (the rest stay in ``extra``)
_TYPED_KEYS = _STATISTICS_KEYS | {
    "final", "failure", "quality_failed", "failed_guardrail", "pending_guardrail", "crossed_at_cap", "futile",
    "futility", "not_tested", "z", "kv_pool", "incumbent_kv_pool", "context_target", "outlier_boots", "cap_p",
    "cap_boundary_p", "cap_effect", "multiplicity", "multiplicity_level", "held_by_night_control", "stages",
    "by_workload"}


def _typed_from_extra(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The schema-4 fields of a schema ≤ 3 verdict, read from its ``extra`` (the keys moved out of it)."""
    out: dict[str, Any] = {"extra": {k: v for k, v in extra.items() if k not in _TYPED_KEYS}}
    for key in ("final", "quality_failed", "crossed_at_cap", "not_tested"):
        out[key] = bool(extra.get(key, False))
    for key in ("failure", "failed_guardrail", "pending_guardrail", "outlier_boots", "stages"):
        if extra.get(key) is not None:
            out[key] = extra[key]
    if extra.get("futility"):
        out["futility"] = extra["futility"]
    elif extra.get("futile"):
        out["futility"] = Futility.CI.value     # a futile stop that named no rule: the interval rule
    if extra.get("z") is not None:
        out["slow_boot_z"] = extra["z"]
    if any(k in extra for k in ("kv_pool", "incumbent_kv_pool", "context_target")):
        out["pool"] = {k: extra.get(k) for k in ("kv_pool", "incumbent_kv_pool", "context_target")}
    if "look_blocks" in extra and "ci_level" in extra:
        out["statistics"] = {k: extra[k] for k in _STATISTICS_KEYS if k in extra}
    if "cap_p" in extra or "cap_effect" in extra:
        out["at_cap"] = {"p": extra.get("cap_p"), "boundary_p": extra.get("cap_boundary_p"),
                         "effect": extra.get("cap_effect")}
    if isinstance(extra.get("multiplicity_level"), (int, float)):
        out["night_control"] = {"method": str(extra.get("multiplicity", "")), "level": extra["multiplicity_level"],
                                "held": bool(extra.get("held_by_night_control", False))}
    if isinstance(extra.get("by_workload"), Mapping):
        out["by_workload"] = {k: v for k, v in extra["by_workload"].items() if isinstance(v, (int, float))}
    return out
