"""``SearchSpace``: which launch settings a study may try, and the one way to turn them into a ``Candidate``.

A space is loaded from YAML (``elsa_tune.search_spaces.loader.load_space``). Building a candidate always
goes the same way: the base flags and env, then the parameter values, then the technique bundles in the
order given, then the derived flags (except those a technique set explicitly: the technique is what is
being tested), then the rules. A candidate that breaks a rule raises ``RuleViolation`` and is never booted.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import random
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from elsa_tune.errors import ConfigError, SpaceError
from elsa_tune.finite_number import number_problem
from elsa_tune.runtime.family import FamilyName
from elsa_tune.search_spaces.candidate import Candidate, FlagValue
from elsa_tune.search_spaces.expression import Expression
from elsa_tune.search_spaces.parameter import Parameter, ParameterKind, Value
from elsa_tune.search_spaces.rules import DerivationError, Derived, Rule, RuleViolation, Violation, check_rules

SCHEMA_VERSION = 1
#: SGLang's model flag; a space's own is ``SearchSpace.model_flag`` (its runtime family's).
MODEL_FLAG = "model-path"


class TechniqueKind(StrEnum):
    SPEED = "speed"  # kept only on superiority of the objective
    MEMORY = "memory"  # kept on non-inferiority of the objective plus a memory gain


class ReasonCategory(StrEnum):
    """Why a technique was (not) kept, in the few words of a "measured and rejected" table.

    A study's decision maps to one (``history/reasons.py``); a prior names the ones that agree with it.
    """

    KEPT = "kept"
    KEPT_FOR_MEMORY = "kept for memory"  # a memory technique kept for the pool it buys, its speed within the margin
    CRASH = "crash"                # a code path crashed, an unsupported kernel, a refused flag
    OOM = "oom"                    # out of GPU (or host) memory at boot or under load
    HANG = "hang"                  # the server stopped producing tokens (or never became ready)
    IGNORED = "ignored"            # accepted and silently ignored or clamped
    CONTEXT_DROP = "context drop"  # the KV pool fell below the context target
    MEMORY_LOSS = "memory loss"    # a memory technique that bought no KV pool (or a speed one that lost it)
    WRONG_ANSWERS = "wrong answers"  # the quality gate failed
    SLOWER = "slower"              # measured slower (or its latency guardrail failed)
    NO_GAIN = "no gain"            # no demonstrated benefit: futile, inconclusive, within the noise


@dataclass(frozen=True)
class PriorVerdict:
    """What an earlier study (or a published report) concluded about a technique on this stack.

    ``categories`` are the ``ReasonCategory`` values that agree with the prior's reason (empty: not declared).
    """

    verdict: str  # keep | reject | inconclusive
    reason: str
    source: str = ""
    categories: tuple[ReasonCategory, ...] = ()


@dataclass(frozen=True)
class Technique:
    """A named flag/env bundle screened by A/B test against the incumbent.

    ``requires`` is a condition over the candidate's flags before the bundle is applied (e.g. speculative
    decoding on). ``screen=False`` keeps a technique on record (with its prior verdict) that this space
    cannot try, e.g. one that needs an artifact the user must supply.
    """

    name: str
    kind: TechniqueKind
    rationale: str
    flags: Mapping[str, FlagValue] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    requires: Expression | None = None
    screen: bool = True
    prior: PriorVerdict | None = None
    line: int | None = None
    flag_lines: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelSpec:
    """The served model. ``retrieves_needles`` is false for a model that is not expected to find facts in a long
    prompt (a designed test model): the long-context probes then check that the prompt is served, not its answer."""

    path: str | None
    hybrid_mamba: bool = False
    vision: bool = False
    speculative_head: bool = False
    context_target: int | None = None
    retrieves_needles: bool = True


@dataclass(frozen=True)
class RuntimeSpec:
    """Which runtime family, and how to launch it: a command (argv, e.g. a fork's venv python) or a Docker image."""

    family: FamilyName = FamilyName.SGLANG
    command: tuple[str, ...] | None = None
    image: str | None = None
    volumes: tuple[str, ...] = ()
    shm_size: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class Objective:
    metric: str
    direction: str  # maximize | minimize
    workload: str | None = None
    weight: float = 1.0


@dataclass(frozen=True)
class Guardrails:
    """Non-inferiority margins (fractions) and floors every kept change must respect."""

    ttft_p50_margin: float = 0.10
    ttft_p99_margin: float = 0.20
    kv_pool_tokens_floor: int | None = None
    min_context_tokens: int | None = None
    max_error_rate: float = 0.0
    quality_gate: bool = True


@dataclass(frozen=True)
class ProbeSettings:
    headroom_floor_mib: int = 512
    probe_timeout_s: float = 900.0
    hang_s: float = 120.0
    boot_timeout_s: float = 1800.0


@dataclass(frozen=True)
class Budget:
    hours: float | None = None
    max_boots: int | None = None
    boots_per_arm: int | None = None


class FlagShape(Protocol):
    """What flag validation needs to know about one runtime flag (``runtime`` harvests these)."""

    @property
    def takes_value(self) -> bool: ...

    @property
    def choices(self) -> tuple[str, ...] | None: ...


@dataclass(frozen=True)
class FlagUse:
    """One place the space uses a flag, with the values it may give it there."""

    flag: str
    values: tuple[FlagValue, ...]
    line: int | None
    where: str


@dataclass(frozen=True)
class SearchSpace:
    """A typed, frozen search space. Build candidates with ``baseline()`` and ``candidate()``."""

    name: str
    path: str
    model: ModelSpec
    runtime: RuntimeSpec
    description: str = ""
    gpu: str | None = None
    gpu_memory_gib: float | None = None
    base_flags: Mapping[str, FlagValue] = field(default_factory=dict)
    base_env: Mapping[str, str] = field(default_factory=dict)
    parameters: tuple[Parameter, ...] = ()
    derived: tuple[Derived, ...] = ()
    rules: tuple[Rule, ...] = ()
    techniques: tuple[Technique, ...] = ()
    objectives: tuple[Objective, ...] = ()
    guardrails: Guardrails = Guardrails()
    probes: ProbeSettings = ProbeSettings()
    budget: Budget = Budget()
    base_lines: Mapping[str, int] = field(default_factory=dict)
    digest: str = ""  # sha256 of the YAML text: which exact file a study ran
    schema_version: int = SCHEMA_VERSION

    # ---- candidates --------------------------------------------------------------------------------

    def baseline(self) -> Candidate:
        """The baseline configuration: base flags and env with every parameter at its baseline value."""
        return self.candidate({}, label="baseline")

    def candidate(self, values: Mapping[str, Value] | None = None, techniques: Sequence[str] = (),
                  label: str | None = None) -> Candidate:
        """The candidate for ``values`` (by parameter name; missing ones keep their baseline) with ``techniques``.

        Raises ``ConfigError`` for an unknown parameter or technique or a value out of range,
        ``DerivationError`` when a derived flag cannot be computed and ``RuleViolation`` naming the rule
        a candidate breaks.
        """
        if self.model.path is None:
            raise ConfigError(f"search space {self.name!r} names no model",
                              remedy="pass the model path on the command line (--model PATH) or set `model.path`")
        return self._build(values or {}, techniques, label)

    def check(self, candidate: Candidate) -> list[str]:
        """The violated rules of ``candidate`` as messages (empty when it may boot)."""
        return [f"{v.rule.name}: {v.explain()}" for v in check_rules(self.rules, candidate.flags)]

    def enumerate_grid(self, points_per_param: int = 3, *, limit: int | None = None) -> Iterator[Candidate]:
        """Every rule-abiding candidate of the grid with ``points_per_param`` values per numeric parameter."""
        names = [p.name for p in self.parameters]
        grids = [p.grid(points_per_param) for p in self.parameters]
        produced = 0
        for combo in itertools.product(*grids):
            if limit is not None and produced >= limit:
                return
            try:
                found = self.candidate(dict(zip(names, combo, strict=True)))
            except (RuleViolation, DerivationError):
                continue
            produced += 1
            yield found

    def sample(self, rng: random.Random, n: int) -> list[Candidate]:
        """``n`` distinct rule-abiding candidates drawn at random (fewer if the space is that small)."""
        out: dict[str, Candidate] = {}
        for _ in range(max(n, 1) * 50):
            if len(out) >= n:
                break
            values = {p.name: p.sample(rng) for p in self.parameters}
            try:
                found = self.candidate(values)
            except (RuleViolation, DerivationError):
                continue
            out.setdefault(found.key(), found)
        return list(out.values())

    # ---- views and copies ----------------------------------------------------------------------------

    def parameter(self, name: str) -> Parameter:
        for p in self.parameters:
            if p.name == name:
                return p
        raise ConfigError(f"search space {self.name!r} has no parameter {name!r}",
                          remedy=f"use one of: {', '.join(p.name for p in self.parameters) or '(none)'}")

    def technique(self, name: str) -> Technique:
        for t in self.techniques:
            if t.name == name:
                return t
        hint = difflib.get_close_matches(name, [t.name for t in self.techniques], n=1)
        raise ConfigError(f"search space {self.name!r} has no technique {name!r}",
                          remedy=f"did you mean {hint[0]!r}?" if hint else
                          f"use one of: {', '.join(t.name for t in self.techniques) or '(none)'}")

    def baseline_values(self) -> dict[str, Value]:
        return {p.name: p.baseline for p in self.parameters}

    def with_model(self, path: str) -> SearchSpace:
        """A copy that serves the model at ``path`` (a local directory or a hub name)."""
        return dataclasses.replace(self, model=dataclasses.replace(self.model, path=str(path)))

    def flag_uses(self) -> list[FlagUse]:
        """Every flag the space can put on a command line, where, and with which literal values."""
        uses = [FlagUse(self.model_flag, (self.model.path,) if self.model.path else (), None, "model.path")]
        uses += [FlagUse(f, (v,), self.base_lines.get(f), "base") for f, v in self.base_flags.items()]
        for p in self.parameters:
            if p.flag:
                ends = tuple(int(v) if p.kind is ParameterKind.INT else v for v in (p.low, p.high) if v is not None)
                uses.append(FlagUse(p.flag, (p.baseline, *p.choices) if p.choices else (p.baseline, *ends), p.line,
                                    f"parameter {p.name!r}"))
        for t in self.techniques:
            uses += [FlagUse(f, (v,), t.flag_lines.get(f, t.line), f"technique {t.name!r}") for f, v in t.flags.items()]
        uses += [FlagUse(d.flag, (), d.line, "derived") for d in self.derived]
        return uses

    @property
    def model_flag(self) -> str:
        """The flag that names the model for this space's runtime family."""
        from elsa_tune.runtime.family import family

        return family(self.runtime.family).model_flag

    def validate_flags(self, known: Collection[str] | Mapping[str, FlagShape | None]) -> None:
        """Refuse a flag the runtime does not have, a value outside its choices, or a switch given a value.

        ``known`` holds the runtime's flag names without dashes (aliases included), optionally mapped
        to their shape. Raises ``SpaceError`` at the file and line of the first problem, with the
        nearest existing flag as the hint.
        """
        shapes: Mapping[str, FlagShape | None] = known if isinstance(known, Mapping) else dict.fromkeys(known)
        for use in self.flag_uses():
            if use.flag not in shapes:
                hint = difflib.get_close_matches(use.flag, list(shapes), n=1, cutoff=0.6)
                raise SpaceError(
                    f"{use.where} uses --{use.flag}, which the runtime does not have",
                    path=self.path, line=use.line,
                    remedy=(f"did you mean --{hint[0]}? " if hint else "") +
                    f"check the flag against `{' '.join(self.runtime.command or ('the runtime',))} --help`")
            shape = shapes[use.flag]
            if shape is None:
                continue
            for value in use.values:
                problem = value_problem(shape, value)
                if problem:
                    raise SpaceError(f"{use.where}: --{use.flag} {problem}", path=self.path, line=use.line,
                                     remedy="use a value the runtime accepts (see its --help)")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able summary (for reports and ``space show --json``)."""
        return {
            "schema_version": self.schema_version, "name": self.name, "path": self.path, "digest": self.digest,
            "description": self.description, "model": dataclasses.asdict(self.model), "gpu": self.gpu,
            "runtime": dataclasses.asdict(self.runtime), "base_flags": dict(self.base_flags),
            "base_env": dict(self.base_env), "parameters": [p.to_dict() for p in self.parameters],
            "derived": {d.flag: d.expression.source for d in self.derived},
            "rules": [{"name": r.name, "rule": r.expression.source, "message": r.message} for r in self.rules],
            "techniques": [{"name": t.name, "kind": t.kind.value, "rationale": t.rationale, "flags": dict(t.flags),
                            "env": dict(t.env), "screen": t.screen,
                            "prior": dataclasses.asdict(t.prior) if t.prior else None} for t in self.techniques],
            "objectives": [dataclasses.asdict(o) for o in self.objectives],
            "guardrails": dataclasses.asdict(self.guardrails), "probes": dataclasses.asdict(self.probes),
            "budget": dataclasses.asdict(self.budget),
        }

    # ---- building ----------------------------------------------------------------------------------

    def _build(self, values: Mapping[str, Value], techniques: Sequence[str], label: str | None) -> Candidate:
        flags, env, chosen = self.assemble_flags(values, techniques)
        label = label if label is not None else _label(self, chosen, techniques)
        violations: list[Violation] = check_rules(self.rules, flags)
        if violations:
            raise RuleViolation(violations, label=label)
        # A switch set to False is a flag left out: drop it so equal command lines have equal keys.
        return Candidate(flags={k: v for k, v in flags.items() if v is not None and v is not False}, env=env,
                         label=label)

    def assemble_flags(self, values: Mapping[str, Value], techniques: Sequence[str] = (),
                       ) -> tuple[dict[str, FlagValue], dict[str, str], dict[str, Value]]:
        """Flags, env and parameter values of a candidate before the rules are checked (no model needed)."""
        flags: dict[str, FlagValue] = dict(self.base_flags)
        env: dict[str, str] = dict(self.base_env)
        if self.model.path is not None:
            flags[self.model_flag] = self.model.path
        by_name = {p.name: p for p in self.parameters}
        unknown = sorted(set(values) - set(by_name))
        if unknown:
            raise ConfigError(f"search space {self.name!r} has no parameter {unknown[0]!r}",
                              remedy=f"use one of: {', '.join(by_name) or '(none)'}")
        chosen: dict[str, Value] = {}
        for p in self.parameters:
            value = values.get(p.name, p.baseline)
            problem = p.problem(value)
            if problem:
                raise ConfigError(f"parameter {p.name!r} ({p.target}): {problem}",
                                  remedy="pick a value inside the range declared in the search space")
            chosen[p.name] = p.coerce(value)
            p.assign(chosen[p.name], flags, env)
        pinned: dict[str, str] = {}
        for name in dict.fromkeys(techniques):
            technique = self.technique(name)
            if technique.requires is not None:
                violation = Rule(f"requires of technique {name}", technique.requires).violation(flags)
                if violation is not None:
                    raise RuleViolation([violation], label=name)
            for flag, flag_value in technique.flags.items():
                if flag in pinned and flags.get(flag) != flag_value:
                    raise ConfigError(f"techniques {pinned[flag]!r} and {name!r} set --{flag} to different values",
                                      remedy="screen conflicting techniques one at a time")
                pinned[flag] = name
                flags[flag] = flag_value
            env.update(technique.env)
        for derived in self.derived:
            if derived.flag not in pinned:
                derived.apply(flags)
        return {k: v for k, v in flags.items() if v is not None}, env, chosen


def _label(space: SearchSpace, chosen: Mapping[str, Value], techniques: Sequence[str]) -> str:
    changed = [f"{p.name}={chosen[p.name]}" for p in space.parameters if chosen[p.name] != p.baseline]
    parts = list(dict.fromkeys(techniques)) + changed
    return "+".join(parts) if parts else "baseline"


def value_problem(shape: FlagShape, value: FlagValue) -> str | None:
    """Why the runtime's parser would refuse ``value`` for a flag of ``shape`` (``None`` when it takes it), as a
    phrase that follows the flag's name (``is a switch, not 3``): the one check of a value against the runtime's flag
    table, for a search space's values and a flag file's alike. A shape with a ``kind`` (``int``, ``float``; the
    bundled table's) is also held to it."""
    if value is None:
        return None
    if not shape.takes_value:
        return None if isinstance(value, bool) else f"is a switch, not {value!r} (write true, or delete the line)"
    if value is True:
        return "needs a value, not true"
    if value is False:
        return None
    problem = number_problem(value) if isinstance(value, (int, float)) else None
    if problem is not None:
        return f"takes a finite number: {problem}"
    kind = getattr(shape, "kind", None)
    if kind in ("int", "hint") and (isinstance(value, float) or (kind == "int" and isinstance(value, str))):
        return f"takes a whole number, not {value!r}"
    if kind == "float" and isinstance(value, str):
        return f"takes a number, not {value!r}"
    if shape.choices and str(value) not in shape.choices:
        return f"is {value!r}, not one of {', '.join(shape.choices)}"
    return None
