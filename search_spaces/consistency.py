"""Whole-space consistency: checks that need every section of a search space at once.

Run by the loader after each section parsed on its own. Each failure is a ``SpaceError`` at the line
of the rule, technique or derived flag to blame:

- every name in an expression is a flag the space can set (a typo would otherwise read as unset);
- a derived flag is not also a parameter;
- every rule is satisfiable: some candidate among the baseline, the screened techniques, a grid and a
  seeded random sample of the space obeys it;
- the baseline derives cleanly and obeys every rule, and every screened technique applies to it.
"""

from __future__ import annotations

import difflib
import itertools
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from elsa_tune.errors import ConfigError, SpaceError
from elsa_tune.search_spaces.candidate import FlagValue
from elsa_tune.search_spaces.rules import DerivationError, RuleViolation, check_rules
from elsa_tune.search_spaces.space import SearchSpace

GRID_POINTS = 3
GRID_LIMIT = 729
SAMPLES = 256


def check_space(space: SearchSpace) -> None:
    """Raise ``SpaceError`` (file and line) for the first whole-space inconsistency of ``space``."""
    _check_names(space)
    _check_derived_targets(space)
    _check_satisfiable(space)
    _check_baseline(space)
    _check_techniques(space)


def settable_flags(space: SearchSpace) -> set[str]:
    """Every flag the space can set: base, parameters, techniques, derived, and the model path."""
    flags = {space.model_flag, *space.base_flags}
    flags.update(p.flag for p in space.parameters if p.flag)
    for t in space.techniques:
        flags.update(t.flags)
    flags.update(d.flag for d in space.derived)
    return flags


def _check_names(space: SearchSpace) -> None:
    known = settable_flags(space)
    checks: list[tuple[frozenset[str], int | None, str]] = []
    checks += [(d.expression.names | (d.when.names if d.when else frozenset()), d.line, f"derived flag {d.flag!r}")
               for d in space.derived]
    checks += [(r.expression.names, r.line, f"rule {r.name!r}") for r in space.rules]
    checks += [(t.requires.names, t.line, f"technique {t.name!r} requires") for t in space.techniques if t.requires]
    for names, line, where in checks:
        for name in sorted(names - known):
            hint = difflib.get_close_matches(name, sorted(known), n=1)
            raise SpaceError(f"{where} reads {name!r}, which no part of the space sets", path=space.path, line=line,
                             remedy=(f"did you mean {hint[0]!r}? " if hint else "") +
                             "names in expressions are flag names set in base, parameters, techniques or derived")


def _check_derived_targets(space: SearchSpace) -> None:
    by_flag = {p.flag: p for p in space.parameters if p.flag}
    for d in space.derived:
        if d.flag in by_flag:
            raise SpaceError(f"--{d.flag} is both derived and the parameter {by_flag[d.flag].name!r}",
                             path=space.path, line=d.line, remedy="either tune the flag or derive it, not both")


def _flag_sets(space: SearchSpace) -> Iterator[Mapping[str, FlagValue]]:
    """Flag sets of the baseline, each screened technique, a grid and a seeded sample (derivable ones)."""
    attempts: list[tuple[Mapping[str, Any], Sequence[str]]] = [({}, ())]
    attempts += [({}, (t.name,)) for t in space.techniques if t.screen]
    names = [p.name for p in space.parameters]
    grids = [p.grid(GRID_POINTS) for p in space.parameters]
    attempts += [(dict(zip(names, combo, strict=True)), ()) for combo in itertools.islice(
        itertools.product(*grids), GRID_LIMIT)]
    rng = random.Random(space.name)
    attempts += [({p.name: p.sample(rng) for p in space.parameters}, ()) for _ in range(SAMPLES)]
    for values, techniques in attempts:
        try:
            flags, _, _ = space.assemble_flags(values, techniques)
        except (DerivationError, RuleViolation):
            continue
        yield flags


def _check_satisfiable(space: SearchSpace) -> None:
    if not space.rules:
        return
    satisfied = {r.name: False for r in space.rules}
    checked = 0
    for flags in _flag_sets(space):
        checked += 1
        broken = {v.rule.name for v in check_rules(space.rules, flags)}
        for name in satisfied:
            satisfied[name] = satisfied[name] or name not in broken
        if all(satisfied.values()):
            return
    for rule in space.rules:
        if not satisfied[rule.name]:
            raise SpaceError(
                f"no candidate of the space can satisfy rule {rule.name!r} (checked {checked} candidates: the "
                "baseline, each technique, a grid and a random sample)", path=space.path, line=rule.line,
                remedy="fix the rule or widen the parameter ranges it depends on: as written, every candidate "
                       "would be refused before it boots")


def _check_baseline(space: SearchSpace) -> None:
    try:
        flags, _, _ = space.assemble_flags({}, ())
    except DerivationError as exc:
        line = next((d.line for d in space.derived if f"{d.flag!r}" in exc.message), None)
        raise SpaceError(f"the baseline cannot be built: {exc.message}", path=space.path, line=line,
                         remedy=exc.remedy) from exc
    for violation in check_rules(space.rules, flags):
        raise SpaceError(f"the baseline breaks rule {violation.rule.name!r}: {violation.explain()}",
                         path=space.path, line=violation.rule.line,
                         remedy="change the base flags or parameter baselines so that the rule holds")


def _check_techniques(space: SearchSpace) -> None:
    for technique in space.techniques:
        if not technique.screen:
            continue
        try:
            flags, _, _ = space.assemble_flags({}, (technique.name,))
        except ConfigError as exc:
            raise SpaceError(f"technique {technique.name!r} cannot be applied to the baseline: {exc.message}",
                             path=space.path, line=technique.line, remedy=exc.remedy or
                             "adjust the technique's flags, or set screen: false") from exc
        for violation in check_rules(space.rules, flags):
            raise SpaceError(f"technique {technique.name!r} on the baseline breaks rule {violation.rule.name!r}: "
                             f"{violation.explain()}", path=space.path, line=technique.line,
                             remedy="add the flags the rule needs to the technique's bundle, or set screen: false")
