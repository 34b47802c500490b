from __future__ import annotations

import pytest

from elsa_tune.errors import ConfigError
from elsa_tune.tuner.flow.budget import Budget, parse_duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("text", "seconds"), [("8h", 28800), ("90m", 5400), ("1h30m", 5400), ("45", 45)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "8 hours", "h8", "1x"])
def test_parse_duration_rejects_garbage_with_remedy(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(text)
    assert "8h" in info.value.remedy


def test_unused_time_flows_to_later_phases_and_reserves_hold() -> None:
    clock = FakeClock()
    budget = Budget(total_s=1000, clock=clock)
    budget.begin("preflight")
    clock.now = 5  # 20 planned, 5 spent: 15 carried on
    budget.begin("baseline")
    assert budget.allowance("baseline") == pytest.approx(150 + 15)
    clock.now = 100
    assert budget.allowance("baseline") == pytest.approx(150 + 15 - 95)
    budget.begin("screening")
    # baseline spent 95 of its 150: the rest carries into screening, later reserves stay intact
    assert budget.allowance("screening") == pytest.approx(350 + 15 + 55)
    clock.now = 900
    assert budget.allowance("screening") == pytest.approx(0.0)
    assert budget.allowance("confirmation") == pytest.approx(100.0)
    clock.now = 2000
    assert budget.expired()
    assert budget.allowance("confirmation") == 0.0
