"""``Verdict``: the A/B gate's decision as a record. The gate (``tuner/``) produces it; history stores it."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elsa_tune.search_spaces.space import ReasonCategory

#: 3: ``GuardrailResult.p_value`` (records of schema 2 read with it unset); 4: ``kv_pool_incumbent``,
#: ``kv_pool_candidate`` and ``speed_margin`` of a memory technique's test (records of schema 3 read with them unset)
SCHEMA_VERSION = 4


class Decision(enum.Enum):
    KEEP = "keep"
    REJECT = "reject"
    INCONCLUSIVE = "inconclusive"   # the incumbent stays; never reported as "significant" or as zero


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
class Verdict:
    """KEEP / REJECT / INCONCLUSIVE with the reason, effect ratio and its CI, p-value, boots per arm.

    ``effect`` is the throughput ratio candidate/incumbent (1.05 = 5% faster) estimated on per-boot
    means of log throughput; ``ci_low``/``ci_high`` bound it. ``mde`` is the smallest effect the
    protocol could have detected with the boots it spent, as ratio − 1 (0.05 = 5%, unlike ``effect``),
    stated whenever the result is not KEEP. A memory technique's test (``kind="memory"``) records what it buys:
    ``kv_pool_incumbent`` and ``kv_pool_candidate`` (the arms' median KV capacity, tokens) and ``speed_margin``,
    the slowdown its speed was tested within (0.02 = −2%).
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
    kind: str = "speed"              # "speed" needs superiority; "memory" needs non-inferiority + memory gain
    stopped_at_look: int | None = None
    adjusted_p_value: float | None = None   # after multiple-testing control across the night
    schema_version: int = SCHEMA_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: why, in the seeds' few words; set by whoever decides (the gate, a screening shortcut, the night's control)
    category: ReasonCategory | None = None
    kv_pool_incumbent: int | None = None
    kv_pool_candidate: int | None = None
    speed_margin: float | None = None

    @property
    def outlier_boots(self) -> tuple[OutlierBoot, ...]:
        """The boots the gate down-weighted as outliers (``extra["outlier_boots"]``), in run order of their blocks."""
        rows = self.extra.get("outlier_boots") if isinstance(self.extra, Mapping) else None
        if not isinstance(rows, (list, tuple)):
            return ()
        return tuple(OutlierBoot.from_dict(r) for r in rows if isinstance(r, Mapping))

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["decision"] = self.decision.value
        data["category"] = self.category.value if self.category is not None else None
        data["guardrails"] = [vars(g).copy() for g in self.guardrails]
        data["extra"] = dict(self.extra)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        kwargs["decision"] = Decision(data["decision"])
        kwargs["category"] = ReasonCategory(data["category"]) if data.get("category") else None
        kwargs["guardrails"] = tuple(GuardrailResult(**g) for g in data.get("guardrails", ()))
        kwargs["extra"] = dict(data.get("extra", {}))
        return cls(**kwargs)
