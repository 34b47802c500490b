"""The simulator's truth over a scenario's space: the best it allows, and what each technique truly does.

``Oracle`` evaluates configurations with ``runtime/sim/truth.py`` (noiseless) on the workload one measured pass of
the study replays (``VirtualBench.workload``), cached by candidate key.

**The best the space allows** is exhaustive: every value of every parameter lattice (the generated spaces have
lattices only) times every subset of the *viable* techniques, rule-abiding ones only. Two reductions are certified
by the simulator's code rather than assumed: a parameter that sets an environment variable no profile technique
conditions on cannot change any truth (the memory plan, step times and engine read flags, and env only through a
technique's match), so it is held at its baseline; a technique that crashes, damages quality or is ignored on the
baseline does so in every configuration (its effect is a static property of its match, which names only its own
flags/env), so no feasible configuration contains it. A configuration is feasible when it boots and serves every
request, no answer is damaged, its KV pool holds the context target, and its TTFT p50/p99 stay within the space's
guardrail margins of the baseline's.

**A technique's truth** is judged where the study judged it: against the incumbent at the time of the decision.
``expected`` maps that truth to the ``ReasonCategory`` values a correct decision may record, from the truth alone:
the crash kind (``history/reasons.failure_category``), new quality damage (a collapsed draft, whose answers stay
right, may also be judged on its speed), a flag of the technique adjusted in the
memory plan (ignored or clamped), the pool against the context target and (memory techniques) against the
incumbent's (a speed technique's pool only when the space sets no context target, as the study's KV guardrail),
TTFT against the guardrail margins, and the throughput ratio against the gate's thresholds (keep from
+3%; a memory technique no slower than −2%). Where the gate cannot tell two categories apart at any boot count it
spends (a true +3–10%, a true −2–9%, a TTFT change within 10% of its margin), both are accepted; the first one
listed is the truth's own.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from elsa_tune.errors import ConfigError
from elsa_tune.history.reasons import failure_category
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.runtime.sim.profile import SimProfile, load_profile
from elsa_tune.runtime.sim.truth import Truth, TruthWorkload, truth
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.search_spaces.parameter import Parameter, ParameterKind, Value
from elsa_tune.search_spaces.rules import DerivationError, RuleViolation
from elsa_tune.search_spaces.space import ReasonCategory, SearchSpace, TechniqueKind
from elsa_tune.tuner.flow.virtual import VirtualBench

MIN_EFFECT = 0.03          # the gate's minimum worthwhile gain (``GatePolicy.min_effect``)
MEMORY_MARGIN = 0.02       # a memory technique's non-inferiority margin and minimum pool gain
SLOWER_BELOW = 0.91        # ``history/reasons.SLOWER_BELOW``: a rejected estimate this low is "slower"
GRAY_GAIN = 0.10           # a true gain below this is too small for the gate to be sure of at its boot cap
FLOAT_POINTS = 5           # points of a continuous float range (the generated spaces have lattices only)
EXHAUSTIVE_LIMIT = 3000    # beyond this many configurations the best is a coordinate sweep (said so), not exhaustive


@dataclass(frozen=True)
class Config:
    """A configuration as the study builds one: parameter values and techniques in order."""

    values: Mapping[str, Value]
    techniques: tuple[str, ...] = ()


@dataclass(frozen=True)
class TechniqueTruth:
    """What a technique truly does on top of an incumbent, and the categories a correct decision records."""

    technique: str
    ratio: float | None            # candidate / incumbent output throughput (None: either crashed)
    kv_ratio: float | None
    quality_damage: tuple[str, ...]
    crashed: bool
    expected: tuple[ReasonCategory, ...]

    @property
    def harmless_keep(self) -> bool:
        """Whether keeping it is right: a real gain (speed) or a pool gain at no real cost (memory)."""
        return ReasonCategory.KEPT in self.expected or ReasonCategory.KEPT_FOR_MEMORY in self.expected

    def true_effect_positive(self, kind: TechniqueKind) -> bool:
        if self.crashed or self.ratio is None or self.quality_damage:
            return False
        if kind is TechniqueKind.MEMORY:
            return (self.kv_ratio or 0.0) > 1.0 and self.ratio >= 1.0 - MEMORY_MARGIN
        return self.ratio > 1.0


class Oracle:
    """Noiseless truth for one scenario (profile, space, traffic) on the study's measured workload."""

    def __init__(self, profile: str | Path, space: str | Path, traffic: str, *, budget_s: float = 8 * 3600) -> None:
        self.bench = VirtualBench(profile=str(profile), space=str(space), traffic=traffic, budget_s=budget_s, seed=0)
        self.profile: SimProfile = load_profile(profile)
        self.space: SearchSpace = self.bench.space
        self.workload: TruthWorkload = self.bench.workload
        self.target = self.space.guardrails.min_context_tokens or self.space.model.context_target or 0
        self._cache: dict[str, Truth] = {}
        self._baseline = self.truth(self.space.baseline())

    # ---- truth ---------------------------------------------------------------------------------------------

    def truth(self, candidate: Candidate) -> Truth:
        """The bench's noiseless measured pass; for a launch that never becomes ready, the plan's own crash."""
        key = candidate.key()
        if key not in self._cache:
            served = self.bench.truth(candidate)
            self._cache[key] = served if served is not None else truth(self.profile, candidate.flags, candidate.env,
                                                                      self.workload)
        return self._cache[key]

    def candidate(self, config: Config) -> Candidate:
        return self.space.candidate(dict(config.values), list(config.techniques))

    def feasible(self, t: Truth) -> bool:
        base, g = self._baseline, self.space.guardrails
        if t.crashed or not t.output_tokens_per_s or t.quality_damaged or t.rejected or t.aborted:
            return False
        if t.kv_pool_tokens < self.target:
            return False
        return _within(t.ttft_p50_s, base.ttft_p50_s, g.ttft_p50_margin) and \
            _within(t.ttft_p99_s, base.ttft_p99_s, g.ttft_p99_margin)

    def worth(self, candidate: Candidate) -> float:
        """True output throughput of a feasible configuration, 0 for an infeasible one (a crash is never a speed)."""
        t = self.truth(candidate)
        return float(t.output_tokens_per_s or 0.0) if self.feasible(t) else 0.0

    # ---- the best the space allows -------------------------------------------------------------------------

    def effective_parameters(self) -> list[Parameter]:
        """Parameters that can change a truth: every flag, and env variables some profile technique matches on."""
        matched = {c.key for t in self.profile.techniques for c in t.conditions if c.source == "env"}
        return [p for p in self.space.parameters if p.flag is not None or (p.env is not None and p.env in matched)]

    def grid_size(self) -> int:
        return int(math.prod(len(lattice(p)) for p in self.effective_parameters()))

    def viable_techniques(self) -> list[str]:
        """Screened techniques that do not crash, damage quality or get ignored on the baseline."""
        out = []
        base = self.space.baseline_values()
        for t in self.space.techniques:
            if not t.screen:
                continue
            try:
                c = self.candidate(Config(base, (t.name,)))
            except (RuleViolation, DerivationError, ConfigError):
                continue
            tr = self.truth(c)
            if tr.crashed or tr.quality_damaged or _adjusted(tr, t.flags):
                continue
            out.append(t.name)
        return out

    def configurations(self) -> Iterator[Candidate]:
        params = self.effective_parameters()
        names = [p.name for p in params]
        viable = self.viable_techniques()
        subsets = [s for r in range(len(viable) + 1) for s in itertools.combinations(viable, r)]
        for values in itertools.product(*(lattice(p) for p in params)):
            for subset in subsets:
                try:
                    yield self.space.candidate(dict(zip(names, values, strict=True)), list(subset))
                except (RuleViolation, DerivationError, ConfigError):
                    continue

    def size(self) -> int:
        return int(self.grid_size() * 2 ** len(self.viable_techniques()))

    def best(self) -> tuple[float, Candidate, str]:
        """The highest true throughput over every feasible configuration (the baseline included), and how it was
        found: ``exhaustive``, or ``coordinate sweep`` for a space too large to enumerate (a shipped one)."""
        best_value, best = self.worth(self.space.baseline()), self.space.baseline()
        if self.size() > EXHAUSTIVE_LIMIT:
            return (*self._sweep(), "coordinate sweep")
        for c in self.configurations():
            value = self.worth(c)
            if value > best_value:
                best_value, best = value, c
        return best_value, best, "exhaustive"

    def _sweep(self) -> tuple[float, Candidate]:
        """Every viable technique added greedily, then every value of each parameter in turn, until nothing improves."""
        values: dict[str, Value] = dict(self.space.baseline_values())
        chosen: list[str] = []
        best_value = self.worth(self.space.baseline())
        params = self.effective_parameters()
        improved = True
        while improved:
            improved = False
            moves: list[tuple[dict[str, Value], list[str]]] = [
                (values, [*chosen, t]) for t in self.viable_techniques() if t not in chosen]
            moves += [(values, [x for x in chosen if x != t]) for t in chosen]
            moves += [({**values, p.name: v}, chosen) for p in params for v in lattice(p) if v != values[p.name]]
            for vals, techs in moves:
                try:
                    c = self.space.candidate(dict(vals), techs)
                except (RuleViolation, DerivationError, ConfigError):
                    continue
                value = self.worth(c)
                if value > best_value * (1 + 1e-9):
                    best_value, values, chosen, improved = value, dict(vals), list(techs), True
        return best_value, self.space.candidate(values, chosen)

    # ---- techniques ----------------------------------------------------------------------------------------

    def technique_truth(self, technique: str, incumbent: Candidate, with_technique: Candidate) -> TechniqueTruth:
        """``technique`` judged as the study judged it: ``with_technique`` (the incumbent plus it) vs ``incumbent``."""
        spec = self.space.technique(technique)
        ti, tc = self.truth(incumbent), self.truth(with_technique)
        new_damage = tuple(d for d in tc.quality_damage if d not in ti.quality_damage)
        ratio = (tc.output_tokens_per_s / ti.output_tokens_per_s
                 if tc.output_tokens_per_s and ti.output_tokens_per_s else None)
        kv_ratio = tc.kv_pool_tokens / ti.kv_pool_tokens if ti.kv_pool_tokens else None
        expected = self._expected(spec.kind, spec.flags, ti, tc, new_damage, ratio, kv_ratio)
        return TechniqueTruth(technique, ratio, kv_ratio, new_damage, tc.crashed, expected)

    def _expected(self, kind: TechniqueKind, flags: Mapping[str, object], ti: Truth, tc: Truth,
                  damage: Sequence[str], ratio: float | None, kv_ratio: float | None) -> tuple[ReasonCategory, ...]:
        C = ReasonCategory
        if tc.crashed:
            kind_ = FailureKind(tc.crash_kind) if tc.crash_kind else FailureKind.UNKNOWN_CRASH
            failure = Failure(kind=kind_, summary=tc.crash_reason or "", remedy="", evidence=tc.crash_lines,
                              phase=tc.crash_phase or "serve")
            return (failure_category(failure),)
        if any(not d.startswith("draft_garbage") for d in damage):
            return (C.WRONG_ANSWERS,)
        if damage:   # a collapsed draft: answers stay right, so the quality gate or the speed may reject it
            return (C.WRONG_ANSWERS, *self._expected(kind, flags, ti, tc, (), ratio, kv_ratio))
        if _adjusted(tc, flags):
            return (C.IGNORED,)
        if tc.kv_pool_tokens < self.target:
            return (C.CONTEXT_DROP,)
        if ratio is None or kv_ratio is None:
            return (C.NO_GAIN,)
        g = self.space.guardrails
        ttft = [(_ratio(tc.ttft_p50_s, ti.ttft_p50_s), 1 + g.ttft_p50_margin),
                (_ratio(tc.ttft_p99_s, ti.ttft_p99_s), 1 + g.ttft_p99_margin)]
        if kind is TechniqueKind.MEMORY:
            if kv_ratio <= 1.0:
                return (C.MEMORY_LOSS,)
            if kv_ratio < 1.0 + MEMORY_MARGIN:
                return (C.MEMORY_LOSS, C.NO_GAIN)
            if ratio < 1.0 - MEMORY_MARGIN:
                return (C.SLOWER, C.NO_GAIN)
            if any(r > m * 1.1 for r, m in ttft):
                return (C.SLOWER,)
            return (C.KEPT_FOR_MEMORY,) if ratio >= 1.0 else (C.KEPT_FOR_MEMORY, C.NO_GAIN)
        if kv_ratio < 1.0 - MEMORY_MARGIN and not self.target:
            return (C.MEMORY_LOSS,)     # the study's KV guardrail; with a context target the target is the guardrail
        if any(r > m * 1.1 for r, m in ttft):
            return (C.SLOWER,)
        borderline_ttft = any(r > m / 1.1 for r, m in ttft)
        if ratio <= SLOWER_BELOW:
            return (C.SLOWER,)
        if ratio < 1.0 - MEMORY_MARGIN:
            return (C.SLOWER, C.NO_GAIN)
        if ratio < 1.0 + MIN_EFFECT:
            return (C.NO_GAIN, C.SLOWER) if borderline_ttft else (C.NO_GAIN,)
        if ratio < 1.0 + GRAY_GAIN or borderline_ttft:
            return (C.KEPT, C.NO_GAIN, C.SLOWER) if borderline_ttft else (C.KEPT, C.NO_GAIN)
        return (C.KEPT,)


def lattice(p: Parameter) -> tuple[Value, ...]:
    """Every value a parameter may take (the generated spaces only have lattices, choices and switches)."""
    if p.kind is ParameterKind.CATEGORICAL:
        return tuple(p.choices)
    if p.kind is ParameterKind.BOOL:
        return (False, True)
    assert p.low is not None and p.high is not None
    if p.step is None and p.kind is ParameterKind.FLOAT:
        return tuple(p.grid(FLOAT_POINTS))              # a continuous range: discretised
    step = p.step or 1.0
    count = round((p.high - p.low) / step) + 1
    if p.kind is ParameterKind.INT:
        return tuple(round(p.low + i * step) for i in range(count))
    return tuple(round(p.low + i * step, 6) for i in range(count))


def _adjusted(t: Truth, flags: Mapping[str, object]) -> bool:
    return t.plan is not None and any(a.flag in flags for a in t.plan.adjustments)


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b else 1.0


def _within(value: float | None, base: float | None, margin: float) -> bool:
    return value is None or base is None or value <= base * (1.0 + margin)

