"""The score of one study (or one comparator run) against the oracle's truth.

- ``share``: the recommendation's true throughput over the best the space allows (0 when the recommendation is
  infeasible: it crashes, damages answers, misses the context target or breaks a TTFT margin); regret = 1 − share.
- per technique (the study's last decision about it): the recorded ``ReasonCategory`` beside the categories its
  truth implies (``Oracle.technique_truth`` against the incumbent the decision was made on, rebuilt from the
  decision's incumbent key), kept or not;
- ``false_keeps``: techniques kept although their true effect is ≤ 0 (speed: not faster; memory: no larger pool
  or slower than the margin) or they damage answers; ``damage_keeps``: kept techniques with any quality damage;
  ``harmful_total``: the techniques decided whose true effect is ≤ 0 (the false-keep rate's denominator);
- ``noops`` / ``noops_slower``: techniques whose true effect is within ±0.5% (speed and pool, no crash, no damage)
  and those of them recorded "slower"; ``memory_gains`` / ``memory_gains_filed``: memory techniques whose truth is a
  pool gain at no real cost (``TechniqueTruth.harmless_keep``) and those of them recorded as kept (any
  ``ReasonCategory`` whose name begins with ``KEPT``, so a kept-for-memory category counts).

For a comparator the "decisions" are the techniques in its recommendation, each judged by its marginal truth in
that configuration (the recommendation with and without it).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from oracle import Oracle, TechniqueTruth

from elsa_tune.errors import ConfigError
from elsa_tune.history.decision import DecisionRecord, Kept
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.search_spaces.parameter import Value
from elsa_tune.search_spaces.rules import DerivationError, RuleViolation
from elsa_tune.search_spaces.space import ReasonCategory, SearchSpace, TechniqueKind

#: a technique whose true speed and pool ratios are within this of 1 does nothing
NOOP_BAND = 0.005
#: the categories that file a technique as kept (a kept-for-memory category, once it exists, among them)
KEPT_CATEGORIES = frozenset(c.value for c in ReasonCategory if c.name.startswith("KEPT"))


@dataclass(frozen=True)
class Judged:
    """One technique's decision beside its truth."""

    technique: str
    category: str | None
    kept: str
    truth: TechniqueTruth
    incumbent_matched: bool
    kind: TechniqueKind = TechniqueKind.SPEED
    speed_margin: float | None = None     # the speed margin a memory technique's test ran at (its verdict's)

    @property
    def right(self) -> bool:
        return self.category is not None and self.category in {c.value for c in self.truth.expected}

    @property
    def noop(self) -> bool:
        """Whether the technique truly changes nothing: speed and pool within ±``NOOP_BAND``, no crash, no damage."""
        t = self.truth
        return (not t.crashed and not t.quality_damage and t.ratio is not None and abs(t.ratio - 1.0) <= NOOP_BAND
                and (t.kv_ratio is None or abs(t.kv_ratio - 1.0) <= NOOP_BAND))

    @property
    def memory_gain(self) -> bool:
        """Whether it is a memory technique whose truth is a pool gain at no real cost (keeping it is right)."""
        return self.kind is TechniqueKind.MEMORY and self.truth.true_effect_positive(self.kind) \
            and self.truth.harmless_keep

    def to_dict(self) -> dict[str, Any]:
        t = self.truth
        return {"technique": self.technique, "category": self.category, "kept": self.kept,
                "expected": [c.value for c in t.expected], "right": self.right,
                "true_ratio": t.ratio, "true_kv_ratio": t.kv_ratio, "quality_damage": list(t.quality_damage),
                "crashed": t.crashed, "incumbent_matched": self.incumbent_matched, "kind": self.kind.value,
                "noop": self.noop, "memory_gain": self.memory_gain, "speed_margin": self.speed_margin}


@dataclass(frozen=True)
class Score:
    share: float
    label: str
    judged: tuple[Judged, ...]
    false_keeps: int
    damage_keeps: int
    harmful_total: int

    @property
    def right(self) -> int:
        return sum(j.right for j in self.judged)

    @property
    def noops(self) -> int:
        return sum(j.noop for j in self.judged)

    @property
    def noops_slower(self) -> int:
        return sum(j.noop and j.category == ReasonCategory.SLOWER.value for j in self.judged)

    @property
    def memory_gains(self) -> int:
        return sum(j.memory_gain for j in self.judged)

    @property
    def memory_gains_filed(self) -> int:
        return sum(j.memory_gain and j.category in KEPT_CATEGORIES for j in self.judged)

    def to_dict(self) -> dict[str, Any]:
        return {"recommended_share": self.share, "regret": 1.0 - self.share, "recommended_label": self.label,
                "false_keeps": self.false_keeps, "damage_keeps": self.damage_keeps,
                "harmful_total": self.harmful_total, "right_categories": self.right, "judged": len(self.judged),
                "noops": self.noops, "noops_slower": self.noops_slower, "memory_gains": self.memory_gains,
                "memory_gains_filed": self.memory_gains_filed}


def share_of(oracle: Oracle, recommended: Candidate, best: float) -> float:
    return oracle.worth(recommended) / best if best > 0 else 0.0


def score_study(oracle: Oracle, recommended: Candidate, decisions: Sequence[DecisionRecord], best: float,
                recommended_values: dict[str, Value] | None = None) -> Score:
    space = oracle.space
    names = {t.name for t in space.techniques}
    last: dict[str, DecisionRecord] = {}
    order: list[str] = []
    for d in decisions:
        if d.technique in names and d.kept is not Kept.SKIPPED:
            if d.technique not in last:
                order.append(d.technique)
            last[d.technique] = d
    value_sets = [space.baseline_values()] + ([recommended_values] if recommended_values else [])
    kept_so_far: list[str] = []
    judged: list[Judged] = []
    for record in decisions:
        if record.technique not in names or id(last.get(record.technique)) != id(record):
            if record.technique in names and record.kept is Kept.YES:
                kept_so_far.extend(t for t in (*_partners(space, record, kept_so_far), record.technique)
                                   if t not in kept_so_far)
            continue
        incumbent, matched = _incumbent(oracle, record.incumbent_key, value_sets, kept_so_far)
        values, techniques = incumbent
        partners = _partners(space, record, techniques)
        with_it = oracle.space.candidate(dict(values), [*techniques, *partners, record.technique])
        truth = oracle.technique_truth(record.technique, oracle.space.candidate(dict(values), list(techniques)),
                                       with_it)
        category = record.category.value if record.category is not None else None
        judged.append(Judged(record.technique, category, record.kept.value, truth, matched,
                             space.technique(record.technique).kind,
                             record.verdict.speed_margin if record.verdict is not None else None))
        if record.kept is Kept.YES:
            kept_so_far.extend(t for t in (*partners, record.technique) if t not in kept_so_far)
    return _score(oracle, recommended, judged, best)


def _partners(space: SearchSpace, record: DecisionRecord, present: Sequence[str]) -> list[str]:
    """Techniques screened together with ``record.technique`` as one change (a memory technique that frees what
    it lacked): the others whose every flag and variable the decision's deltas carry, not already present."""
    own = space.technique(record.technique)
    out = []
    for t in space.techniques:
        if t.name == record.technique or t.name in present or not (t.flags or t.env):
            continue
        if t.flags.items() <= own.flags.items() and t.env.items() <= own.env.items():
            continue          # nothing of it beyond what the technique itself sets
        if all(record.flags_delta.get(k) == v for k, v in t.flags.items()) and \
                all(record.env_delta.get(k) == v for k, v in t.env.items()):
            out.append(t.name)
    return out


def score_protocol(oracle: Oracle, values: dict[str, Value], techniques: Sequence[str], best: float) -> Score:
    judged = []
    for t in techniques:
        rest = [x for x in techniques if x != t]
        without = oracle.space.candidate(dict(values), rest)
        with_it = oracle.space.candidate(dict(values), list(techniques))
        judged.append(Judged(t, None, Kept.YES.value, oracle.technique_truth(t, without, with_it), True,
                             oracle.space.technique(t).kind))
    return _score(oracle, oracle.space.candidate(dict(values), list(techniques)), judged, best)


def _score(oracle: Oracle, recommended: Candidate, judged: Iterable[Judged], best: float) -> Score:
    judged = tuple(judged)
    kinds = {t.name: t.kind for t in oracle.space.techniques}
    harmful = [j for j in judged if not j.truth.true_effect_positive(kinds.get(j.technique, TechniqueKind.SPEED))]
    false_keeps = sum(j.kept == Kept.YES.value for j in harmful)
    damage = sum(j.kept == Kept.YES.value and bool(j.truth.quality_damage) for j in judged)
    return Score(share_of(oracle, recommended, best), recommended.label, judged, false_keeps, damage, len(harmful))


def _incumbent(oracle: Oracle, key: str, value_sets: Sequence[dict[str, Value]], kept: Sequence[str]
               ) -> tuple[tuple[dict[str, Value], tuple[str, ...]], bool]:
    """The configuration whose key the decision recorded, among known values × subsets of the techniques kept."""
    for values in value_sets:
        for r in range(len(kept), -1, -1):
            for subset in itertools.combinations(kept, r):
                try:
                    if oracle.space.candidate(dict(values), list(subset)).key() == key:
                        return (values, subset), True
                except (RuleViolation, DerivationError, ConfigError):   # a subset the space refuses is not it
                    continue
    return (value_sets[0], tuple(kept)), False
