"""A technique's true effect in the simulator: when it applies (flag/env conditions) and what it does.

A technique is a flag or environment value (or a combination) whose effect on this card and model is known from
measurements: speed multipliers by context and regime, memory it costs, a crash with SGLang's exact text, a silent
ignore, or damage to the answers while nothing errors. Profiles list them under ``techniques:``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from elsa_tune.runtime.failure import FailureKind
from elsa_tune.search_spaces.candidate import FlagValue


@dataclass(frozen=True)
class Condition:
    """One requirement of a technique's match: a flag or env value, compared as text or numerically."""

    key: str
    source: str           # "flag", "env" or "spec"
    equals: Any = None
    gte: float | None = None
    lte: float | None = None

    def holds(self, flags: Mapping[str, FlagValue], env: Mapping[str, str], spec_on: bool) -> bool:
        if self.source == "spec":
            return spec_on == bool(self.equals)
        value: Any = flags.get(self.key) if self.source == "flag" else env.get(self.key)
        if value is None or value is False:
            return self.equals is False and self.gte is None and self.lte is None
        if self.gte is not None or self.lte is not None:
            try:
                number = float(value)
            except (TypeError, ValueError):
                return False
            return (self.gte is None or number >= self.gte) and (self.lte is None or number <= self.lte)
        if self.equals is True:
            return str(value).lower() not in ("0", "false", "")
        return _text(value) == _text(self.equals)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value == int(value):
        return str(int(value))
    return str(value).strip().lower()


@dataclass(frozen=True)
class TechniqueCrash:
    """How a technique kills the server: the phase, the failure kind and SGLang's exact lines."""

    phase: str                       # "boot", "first_generation" or "under_load"
    kind: FailureKind
    lines: tuple[str, ...]


@dataclass(frozen=True)
class TechniqueEffect:
    """The true effect of a flag or env value (or a combination) on this card and model.

    Speed multipliers apply to step times' inverse (``>1`` is faster): ``decode`` is piecewise-linear in
    log context over ``(context_tokens, multiplier)`` points; ``prefill`` likewise; ``regime`` multiplies by
    content regime. ``static_gb`` is taken from the static pool (weights/buffers), ``outside_gb`` from the
    headroom outside it (e.g. a tokenizer worker's CUDA context), ``kv_pool_factor`` scales the KV pool.
    ``ignored`` names a flag the runtime accepts and silently drops (the resolved args show ``ignored_value``).
    ``quality_damage`` says what goes wrong in the answers while nothing errors.
    """

    name: str
    conditions: tuple[Condition, ...]
    decode: tuple[tuple[float, float], ...] = ()
    prefill: tuple[tuple[float, float], ...] = ()
    regime: Mapping[str, float] = field(default_factory=dict)
    acceptance_factor: float = 1.0
    draft_step_factor: float = 1.0
    batch_compute_factor: float = 1.0
    static_gb: float = 0.0
    outside_gb: float = 0.0
    draft_weights_factor: float = 1.0
    share_draft_vocab: bool = False
    kv_pool_factor: float = 1.0
    context_overhead_gb: float = 0.0
    ignored: str | None = None
    ignored_value: Any = None
    crash: TechniqueCrash | None = None
    quality_damage: str | None = None
    note: str = ""

    def matches(self, flags: Mapping[str, FlagValue], env: Mapping[str, str], spec_on: bool) -> bool:
        return all(c.holds(flags, env, spec_on) for c in self.conditions)

    def decode_multiplier(self, context_tokens: float) -> float:
        return _interpolate(self.decode, context_tokens)

    def prefill_multiplier(self, context_tokens: float) -> float:
        return _interpolate(self.prefill, context_tokens)


def _interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """Piecewise-linear in log(x) between points, flat outside; 1.0 with no points."""
    if not points:
        return 1.0
    if len(points) == 1 or x <= points[0][0]:
        return float(points[0][1])
    if x >= points[-1][0]:
        return float(points[-1][1])
    lx = math.log(max(x, 1.0))
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            l0, l1 = math.log(max(x0, 1.0)), math.log(max(x1, 1.0))
            t = 0.0 if l1 == l0 else (lx - l0) / (l1 - l0)
            return float(y0 + t * (y1 - y0))
    return float(points[-1][1])


def technique_from_yaml(data: Mapping[str, Any]) -> TechniqueEffect:
    """One entry of a profile's ``techniques:`` list."""
    conditions: list[Condition] = []
    match = data.get("match") or {}
    for source, key_source in (("flags", "flag"), ("env", "env")):
        for key, want in (match.get(source) or {}).items():
            if isinstance(want, Mapping):
                conditions.append(Condition(str(key), key_source, gte=want.get("gte"), lte=want.get("lte"),
                                            equals=want.get("equals")))
            else:
                conditions.append(Condition(str(key), key_source, equals=want))
    if "spec" in match:
        conditions.append(Condition("spec", "spec", equals=bool(match["spec"])))
    crash = data.get("crash")
    fields = {k: v for k, v in data.items() if k not in ("match", "crash", "decode", "prefill", "regime")}
    return TechniqueEffect(
        conditions=tuple(conditions),
        decode=tuple((float(a), float(b)) for a, b in data.get("decode") or ()),
        prefill=tuple((float(a), float(b)) for a, b in data.get("prefill") or ()),
        regime=MappingProxyType(dict(data.get("regime") or {})),
        crash=None if not crash else TechniqueCrash(phase=str(crash["phase"]), kind=FailureKind(crash["kind"]),
                                                    lines=tuple(str(x) for x in crash["lines"])),
        **fields,
    )
