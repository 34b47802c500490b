"""The study's time budget: one deadline shared by the phases, visible to the display and the report."""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from elsa_tune.errors import ConfigError


class BudgetPhase(enum.StrEnum):
    """A phase of the study that the budget gives an allowance to, in the order the phases run."""

    PREFLIGHT = "preflight"
    BASELINE = "baseline"
    SCREENING = "screening"
    SEARCH = "search"
    CONFIRMATION = "confirmation"


#: Default shares of the whole budget. Baseline and confirmation are small but protected; screening and
#: search take what the earlier phases leave (a phase that finishes early hands its rest on).
DEFAULT_SHARES: Mapping[BudgetPhase, float] = {
    BudgetPhase.PREFLIGHT: 0.02,
    BudgetPhase.BASELINE: 0.15,
    BudgetPhase.SCREENING: 0.35,
    BudgetPhase.SEARCH: 0.33,
    BudgetPhase.CONFIRMATION: 0.15,
}

#: what a budget counts in: the host's wall clock (a real runtime) or the simulated system's seconds (the virtual
#: runtime, and the live simulated runtime through ``tuner/flow/simulated_time.py``)
WALL_CLOCK = "wall-clock seconds"
SIMULATED_CLOCK = "the simulated system's seconds"

#: The arguments a budget crosses to another process as (``Budget.to_argv``; ``Budget.handed_over`` reads them back).
BUDGET_FLAG = "--budget"
DEADLINE_FLAG = "--deadline"

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
    later phases. ``counts`` names the clock ``clock`` reads (``WALL_CLOCK`` or ``SIMULATED_CLOCK``). A budget of
    zero seconds is spent from the start (one handed over past its deadline).

    A budget crosses to another process (a search worker) as itself: ``to_argv`` writes the time it has left as that
    process's arguments, ``handed_over`` builds the same budget there from them.
    """

    total_s: float
    shares: Mapping[BudgetPhase, float] = field(default_factory=lambda: dict(DEFAULT_SHARES))
    clock: Callable[[], float] = time.monotonic
    counts: str = WALL_CLOCK
    started_at: float = -1.0
    spent: dict[BudgetPhase, float] = field(default_factory=dict)
    _phase: BudgetPhase | None = None
    _phase_started: float = 0.0

    def __post_init__(self) -> None:
        if self.total_s < 0:
            raise ConfigError("the budget cannot be negative", remedy="pass e.g. --budget 8h")
        if abs(sum(self.shares.values()) - 1.0) > 1e-6:
            raise ConfigError("budget shares must add up to 1", remedy="fix the shares in the settings")
        if self.started_at < 0:
            self.started_at = self.clock()

    @classmethod
    def handed_over(cls, total_s: float, deadline: float | None, *, now: float | None = None,
                    clock: Callable[[], float] = time.monotonic) -> Budget:
        """The budget another process handed over (``to_argv``): ``total_s`` seconds counted from now on ``clock``,
        ending by ``deadline`` (Unix seconds; ``now`` is the Unix time, the wall clock's by default) at the latest."""
        wall = time.time() if now is None else now
        left = total_s if deadline is None else max(0.0, min(total_s, deadline - wall))
        return cls(left, clock=clock)

    def to_argv(self, *, now: float | None = None) -> list[str]:
        """The time this budget has left, as another process's arguments: its seconds, and the Unix time they end
        (``now`` plus them), so the seconds that process takes to start count against it too."""
        left = self.left_s
        end = (time.time() if now is None else now) + left
        return [BUDGET_FLAG, f"{left:.0f}", DEADLINE_FLAG, f"{end:.1f}"]

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.started_at

    @property
    def left_s(self) -> float:
        return max(0.0, self.total_s - self.elapsed_s)

    @property
    def phase(self) -> BudgetPhase | None:
        return self._phase

    def begin(self, phase: BudgetPhase) -> None:
        if phase not in self.shares:
            raise ValueError(f"unknown phase {phase!r}")
        self.end()
        self._phase = BudgetPhase(phase)
        self._phase_started = self.clock()

    def end(self) -> None:
        if self._phase is not None:
            self.spent[self._phase] = self.spent.get(self._phase, 0.0) + self.clock() - self._phase_started
            self._phase = None

    def allowance(self, phase: BudgetPhase) -> float:
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
