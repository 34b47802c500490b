"""Argument types for the CLI's numbers: a value out of range is refused by argparse, as one paragraph.

Each is a callable for ``add_argument(type=…)``; it raises ``argparse.ArgumentTypeError`` naming the range, which
the CLI prints with a remedy and exit status ``USAGE``. ``nan`` and ``inf`` are never a count, a time or a size;
every number obeys the one finite-number rule (``elsa_tune.finite_number``), and counts whose cost grows with them
have a ceiling (``int_in``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from elsa_tune.finite_number import LIMIT, number_problem


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    problem = number_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def _integer(text: str) -> int:
    if len(text) > 40:
        raise argparse.ArgumentTypeError(f"{text[:20]!r}… is larger than {LIMIT:.0e}")
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    problem = number_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def int_in(low: int, high: int) -> Callable[[str], int]:
    """A whole number in [low, high] (a count whose cost grows with it: passes, runs, bins)."""
    def parse(text: str) -> int:
        value = _integer(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} must be between {low} and {high}")
        return value
    parse.__name__ = "whole number"
    return parse


def float_in(low: float, high: float, *, open_low: bool = False) -> Callable[[str], float]:
    """A finite number in [low, high] (``(low, high]`` with ``open_low``): a rate, a fraction, a σ."""
    def parse(text: str) -> float:
        value = _number(text)
        if value > high or value < low or (open_low and value == low):
            raise argparse.ArgumentTypeError(f"{text!r} must be {'more than' if open_low else 'at least'} {low:g} "
                                             f"and at most {high:g}")
        return value
    parse.__name__ = "number"
    return parse


def finite_float(text: str) -> float:
    """Any finite number."""
    return _number(text)


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, ratios, speed-ups)."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
    return value


def nonnegative_float(text: str) -> float:
    """A finite number ≥ 0 (σ's, grace periods)."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def positive_int(text: str) -> int:
    """A whole number ≥ 1 (counts, sizes)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def nonnegative_int(text: str) -> int:
    """A whole number ≥ 0."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value
