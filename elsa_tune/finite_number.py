"""The one rule for a number elsa-tune reads from a person or a record: finite, and at most ``LIMIT`` in size.

Every numeric input — a CLI argument, a value in a search space, a flag file, a workload, a ledger line, a setting
from the environment — passes ``number_problem`` before it is used. A bool is not a number; an integer too large for
a float (a 400-digit ``high:``) is refused without converting it; ``nan``, ``inf`` and anything larger in magnitude
than ``LIMIT`` is refused, so arithmetic on an accepted value (squares, sums over a study) never overflows. Ranges that
depend on what the number means (a fraction, a count) are the caller's, on top of this rule.
"""

from __future__ import annotations

import math

#: the largest magnitude any number read from outside may have (10¹⁵: seconds, tokens, bytes and counts all fit)
LIMIT = 1e15


def number_problem(value: object) -> str | None:
    """Why ``value`` is not a number elsa-tune accepts (``None`` when it is one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{value!r} is not a number"
    if isinstance(value, int):
        return None if abs(value) <= LIMIT else f"{_short(value)} is larger than {LIMIT:.0e}"
    if not math.isfinite(value):
        return f"{value!r} is not a finite number"
    if abs(value) > LIMIT:
        return f"{value!r} is larger than {LIMIT:.0e}"
    return None


def is_number(value: object) -> bool:
    """``value`` is an int or float (not a bool) within the rule."""
    return number_problem(value) is None


def _short(value: int) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}…({len(text)} digits)"
