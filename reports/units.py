"""How numbers read in reports: one place for units, rounding and "unknown" (never a made-up 0)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

MiB = 1024 * 1024


def ids(ids: Sequence[str]) -> str:
    return ", ".join(ids) if len(ids) <= 4 else f"{', '.join(ids[:3])} … (+{len(ids) - 3})"


def p_value(p: float | None) -> str:
    return "n/a" if p is None else (f"{p:.3f}" if p >= 0.001 else "<0.001")


def num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def integer(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"


def mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / MiB:,.0f} MiB"


def frac(value: float | None, *, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value * 100:+.1f}%" if signed else f"{value * 100:.1f}%"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    minutes = round(seconds / 60)
    return f"{minutes // 60}h {minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def when(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


#: What a report says about its numbers when the runtime was the simulated SGLang (fingerprint ``sglang-sim``).
SIMULATED_TIME = ("simulated: every rate and latency is the simulated system's, in simulated seconds (the load "
                  "generator reads the simulated server's clock), not a measurement of real hardware")


def budget_clock(clock: str | None) -> str:
    """`` (in <clock>)`` when the study recorded which clock its budget counts in (``Budget.counts``), else ``""``."""
    return f" (in {clock})" if clock else ""


def simulated(runtime: str | None) -> bool:
    """Whether a fingerprint's runtime is the simulated SGLang (served, ``sglang-sim``, or virtual-time)."""
    return runtime is not None and runtime.startswith("sglang-sim")
