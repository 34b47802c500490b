"""The study's time budget: one deadline shared by the phases, visible to the display and the report."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from elsa_tune.errors import ConfigError

#: Default shares of the whole budget. Baseline and confirmation are small but protected; screening and
#: search take what the earlier phases leave (a phase that finishes early hands its rest on).
DEFAULT_SHARES: Mapping[str, float] = {
    "preflight": 0.02,
    "baseline": 0.15,
    "screening": 0.35,
    "search": 0.33,
    "confirmation": 0.15,
}

#: what a budget counts in: the host's wall clock (a real runtime) or the simulated system's seconds (the virtual
#: runtime, and the live simulated runtime through ``tuner/simulated_time.py``)
WALL_CLOCK = "wall-clock seconds"
SIMULATED_CLOCK = "the simulated system's seconds"

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``"8h"``, ``"90m"``, ``"1h30m"``, ``"45s"`` or plain seconds → seconds."""
    raw = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", raw):
        return float(raw)
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhd])", raw)
    if not parts or "".join(n + u for n, u in parts) != raw:
        raise ConfigError(f"cannot read the duration {text!r}",
                          remedy="write it like 8h, 90m, 1h30m or 45s")
    return sum(float(n) * _UNITS[u] for n, u in parts)


@dataclass
class Budget:
    """A deadline split into phase allowances. Not frozen: it is the study's clock.

    ``allowance(phase)`` is the time the phase may still spend: its share of the whole budget plus
    whatever earlier phases left unused, never more than the time left overall minus the reserves of
    later phases. ``counts`` names the clock ``clock`` reads (``WALL_CLOCK`` or ``SIMULATED_CLOCK``).
    """

    total_s: float
    shares: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_SHARES))
    clock: Callable[[], float] = time.monotonic
    counts: str = WALL_CLOCK
    started_at: float = -1.0
    spent: dict[str, float] = field(default_factory=dict)
    _phase: str | None = None
    _phase_started: float = 0.0

    def __post_init__(self) -> None:
        if self.total_s <= 0:
            raise ConfigError("the budget must be positive", remedy="pass e.g. --budget 8h")
        if abs(sum(self.shares.values()) - 1.0) > 1e-6:
            raise ConfigError("budget shares must add up to 1", remedy="fix the shares in the settings")
        if self.started_at < 0:
            self.started_at = self.clock()

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.started_at

    @property
    def left_s(self) -> float:
        return max(0.0, self.total_s - self.elapsed_s)

    @property
    def phase(self) -> str | None:
        return self._phase

    def begin(self, phase: str) -> None:
        if phase not in self.shares:
            raise ValueError(f"unknown phase {phase!r}")
        self.end()
        self._phase = phase
        self._phase_started = self.clock()

    def end(self) -> None:
        if self._phase is not None:
            self.spent[self._phase] = self.spent.get(self._phase, 0.0) + self.clock() - self._phase_started
            self._phase = None

    def allowance(self, phase: str) -> float:
        """Seconds the phase may spend from now on."""
        order = list(self.shares)
        index = order.index(phase)
        earlier = order[:index]
        later = order[index + 1:]
        planned_so_far = sum(self.shares[p] for p in earlier) * self.total_s
        spent_so_far = sum(self.spent.get(p, 0.0) for p in earlier)
        carried = max(0.0, planned_so_far - spent_so_far)
        own = self.shares[phase] * self.total_s + carried
        if self._phase == phase:
            own -= self.clock() - self._phase_started
        own -= self.spent.get(phase, 0.0)
        reserve = sum(self.shares[p] for p in later) * self.total_s
        return max(0.0, min(own, self.left_s - reserve))

    def expired(self) -> bool:
        return self.left_s <= 0.0
