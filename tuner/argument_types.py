"""Argument types for the CLI's numbers: a value out of range is refused by argparse, as one paragraph.

Each is a callable for ``add_argument(type=…)``; it raises ``argparse.ArgumentTypeError`` naming the range, which
the CLI prints with a remedy and exit status ``USAGE``. ``nan`` and ``inf`` are never a count, a time or a size.
"""

from __future__ import annotations

import argparse
import math


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


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
