"""Derived flags and rules: what a search space computes from a candidate's flags and what must hold."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elsa_tune.errors import ConfigError
from elsa_tune.search_spaces.candidate import FlagValue
from elsa_tune.search_spaces.expression import Expression, ExpressionError


class RuleViolation(ConfigError):
    """A candidate breaks one or more rules of its search space; it must not be booted.

    ``rules`` are the violated rules; a study records such a candidate as infeasible, it never boots it.
    """

    def __init__(self, violated: Sequence[Violation], *, label: str = "") -> None:
        first = violated[0]
        more = f" (and {len(violated) - 1} more)" if len(violated) > 1 else ""
        who = f"candidate {label!r}" if label else "candidate"
        super().__init__(f"{who} breaks rule {first.rule.name!r}: {first.explain()}{more}",
                         remedy=f"change the values so that `{first.rule.expression}` holds, or drop the technique "
                                "that conflicts with it")
        self.violations = tuple(violated)


class DerivationError(ConfigError):
    """A derived flag cannot be computed for a candidate (a flag it reads is unset or of the wrong type)."""


@dataclass(frozen=True)
class Rule:
    """A condition over the flags that must hold before a boot (``expression`` returns a bool)."""

    name: str
    expression: Expression
    message: str = ""
    line: int | None = None

    def violation(self, flags: Mapping[str, Any]) -> Violation | None:
        """``None`` when the rule holds; otherwise why it does not (an unevaluable rule does not hold)."""
        try:
            if self.expression.holds(flags):
                return None
            return Violation(self, "")
        except ExpressionError as exc:
            return Violation(self, str(exc))


@dataclass(frozen=True)
class Violation:
    rule: Rule
    error: str = ""

    def explain(self) -> str:
        detail = self.rule.message or f"`{self.rule.expression}` is false"
        return f"{detail} ({self.error})" if self.error else detail


@dataclass(frozen=True)
class Derived:
    """A flag computed from others after parameters and techniques are applied.

    With ``when``, the flag is derived only where the condition holds (and left as it is elsewhere).
    A result of ``None`` removes the flag; ``False``/``True`` turn a switch off/on.
    """

    flag: str
    expression: Expression
    when: Expression | None = None
    line: int | None = None

    def apply(self, flags: dict[str, FlagValue]) -> None:
        try:
            if self.when is not None and not self.when.holds(flags):
                return
            value = self.expression.evaluate(flags)
        except ExpressionError as exc:
            raise DerivationError(f"derived flag {self.flag!r} = `{self.expression}` cannot be computed: {exc}",
                                  remedy="guard the derived flag with `when:` or set the flags it reads") from exc
        if value is None:
            flags.pop(self.flag, None)
        elif isinstance(value, bool | int | str):
            flags[self.flag] = value
        elif isinstance(value, float):
            flags[self.flag] = int(value) if value.is_integer() and _reads_ints(self, flags) else value
        else:
            raise DerivationError(f"derived flag {self.flag!r} = `{self.expression}` gave {value!r}",
                                  remedy="make the expression return a number, a string, a bool or None")


def _reads_ints(derived: Derived, flags: Mapping[str, Any]) -> bool:
    """A ``/`` of integer flags that comes out whole stays an integer flag (e.g. ``requests * 8 / 2``)."""
    return all(isinstance(flags.get(n), int) for n in derived.expression.names)


def check_rules(rules: Sequence[Rule], flags: Mapping[str, Any]) -> list[Violation]:
    """Every rule in ``rules`` that ``flags`` break, in file order."""
    return [v for v in (r.violation(flags) for r in rules) if v is not None]
