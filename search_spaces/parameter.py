"""``Parameter``: one tunable setting of a search space, its range and the flag or variable it sets."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from elsa_tune.search_spaces.candidate import FlagValue

#: A parameter's value as a study sees it (categorical choices may be strings, numbers or bools).
Value = str | int | float | bool


class ParameterKind(StrEnum):
    INT = "int"
    FLOAT = "float"
    CATEGORICAL = "categorical"
    BOOL = "bool"


@dataclass(frozen=True)
class Parameter:
    """A numeric range or a set of choices that maps to one SGLang flag or one environment variable.

    ``baseline`` is the value of the baseline configuration. For ``int``/``float`` a ``step`` makes
    the range a lattice ``low, low+step, …``; ``log`` samples and grids it geometrically. A ``bool``
    parameter on a flag is a switch (``True`` adds ``--flag``, ``False`` leaves it out); on an
    environment variable it is written ``"1"``/``"0"``. ``line`` is where the parameter is declared.
    """

    name: str
    kind: ParameterKind
    baseline: Value
    flag: str | None = None
    env: str | None = None
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: tuple[Value, ...] = ()
    description: str = ""
    line: int | None = None

    @property
    def target(self) -> str:
        """``--flag`` or ``$VARIABLE``: what the parameter sets, for messages."""
        return f"--{self.flag}" if self.flag else f"${self.env}"

    @property
    def is_numeric(self) -> bool:
        return self.kind in (ParameterKind.INT, ParameterKind.FLOAT)

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not a value of this parameter, or ``None`` when it is."""
        if self.kind is ParameterKind.BOOL:
            return None if isinstance(value, bool) else f"{value!r} is not true/false"
        if self.kind is ParameterKind.CATEGORICAL:
            return None if any(_same(value, c) for c in self.choices) else (
                f"{value!r} is not one of {list(self.choices)}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{value!r} is not a number"
        if self.kind is ParameterKind.INT and (not isinstance(value, int) and not float(value).is_integer()):
            return f"{value!r} is not an integer"
        assert self.low is not None and self.high is not None
        if not self.low <= value <= self.high:
            return f"{value!r} is outside [{_num(self.low)}, {_num(self.high)}]"
        if self.step and not _on_lattice(value, self.low, self.step):
            return f"{value!r} is not on the lattice {_num(self.low)} + k·{_num(self.step)}"
        return None

    def coerce(self, value: Value) -> Value:
        """``value`` in the parameter's own type (an integral float becomes an int for ``int``)."""
        if self.kind is ParameterKind.INT and isinstance(value, float):
            return int(value)
        if self.kind is ParameterKind.FLOAT and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value

    def grid(self, points: int) -> tuple[Value, ...]:
        """Up to ``points`` values spread over the range, both ends included; every choice otherwise."""
        if self.kind is ParameterKind.BOOL:
            return (False, True)
        if self.kind is ParameterKind.CATEGORICAL:
            return self.choices
        assert self.low is not None and self.high is not None
        points = max(points, 2)
        if self.low == self.high:
            return (self.coerce(self.low),)
        raw = [self._at(i / (points - 1)) for i in range(points)]
        return tuple(dict.fromkeys(self._snap(v) for v in raw))

    def neighbours(self, value: Value, points: int = 9) -> tuple[Value, ...]:
        """The values one move away from ``value``: every other choice, or the nearest values below and above it
        on the range's ``points``-point grid (its lattice when the step is coarser)."""
        if self.kind in (ParameterKind.BOOL, ParameterKind.CATEGORICAL):
            return tuple(v for v in self.grid(points) if not _same(v, value))
        grid = self.grid(points)
        below = [v for v in grid if float(v) < float(value)]
        above = [v for v in grid if float(v) > float(value)]
        return tuple(([below[-1]] if below else []) + ([above[0]] if above else []))

    def sample(self, rng: random.Random) -> Value:
        """One value drawn uniformly (geometrically for ``log``) from the range or the choices."""
        if self.kind is ParameterKind.BOOL:
            return rng.random() < 0.5
        if self.kind is ParameterKind.CATEGORICAL:
            return rng.choice(self.choices)
        return self._snap(self._at(rng.random()))

    def assign(self, value: Value, flags: dict[str, FlagValue], env: dict[str, str]) -> None:
        """Write ``value`` into ``flags`` or ``env``."""
        if self.flag:
            flags[self.flag] = value
        elif self.env:
            env[self.env] = ("1" if value else "0") if isinstance(value, bool) else _num(value)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.kind.value, "baseline": self.baseline}
        if self.flag:
            out["flag"] = self.flag
        if self.env:
            out["env"] = self.env
        if self.is_numeric:
            out.update(low=self.low, high=self.high, step=self.step, log=self.log)
        if self.kind is ParameterKind.CATEGORICAL:
            out["choices"] = list(self.choices)
        return out

    def _at(self, fraction: float) -> float:
        assert self.low is not None and self.high is not None
        if self.log:
            return float(math.exp(math.log(self.low) + fraction * (math.log(self.high) - math.log(self.low))))
        return self.low + fraction * (self.high - self.low)

    def _snap(self, raw: float) -> Value:
        assert self.low is not None and self.high is not None
        value = raw
        if self.step:
            value = self.low + round((raw - self.low) / self.step) * self.step
            value = min(value, self.low + math.floor((self.high - self.low) / self.step + 1e-9) * self.step)
        value = min(max(value, self.low), self.high)
        if self.kind is ParameterKind.INT:
            return round(value)
        return float(round(value, 10))


def _same(a: Any, b: Any) -> bool:
    return (type(a) is type(b) and a == b) or (
        isinstance(a, int | float) and isinstance(b, int | float)
        and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def _on_lattice(value: float, low: float, step: float) -> bool:
    k = (value - low) / step
    return abs(k - round(k)) < 1e-6


def _num(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)

