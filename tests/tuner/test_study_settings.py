"""Settings precedence (defaults < ELSA_TUNE_* < CLI) and the budget shared by the study's phases."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from elsa_tune.errors import ConfigError
from elsa_tune.tuner.flow.budget import Budget
from elsa_tune.tuner.flow.settings import Settings

SIM = {"gpu": "sim", "sim_profile": "tiny-test"}


def test_defaults_then_environment_then_command_line() -> None:
    assert Settings.resolve({}, environ={}).budget_s == 8 * 3600
    env = {"ELSA_TUNE_BUDGET_S": "90m", "ELSA_TUNE_SEED": "7", "ELSA_TUNE_LOOKS": "2,4,6"}
    from_env = Settings.resolve({}, environ=env)
    assert (from_env.budget_s, from_env.seed, from_env.looks) == (5400.0, 7, (2, 4, 6))
    both = Settings.resolve({"budget_s": "8m", "seed": None, "out": "runs/x"}, environ=env)
    assert both.budget_s == 480.0           # the command line wins
    assert both.seed == 7                   # not given on the command line: the environment's
    assert both.out == Path("runs/x")


def test_unknown_environment_variables_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="elsa_tune"):
        Settings.resolve({}, environ={"ELSA_TUNE_BUDGT": "1h"})
    assert "ELSA_TUNE_BUDGT" in caplog.text


def test_bad_values_are_usage_errors_with_a_remedy() -> None:
    with pytest.raises(ConfigError, match="ELSA_TUNE_SEED"):
        Settings.resolve({}, environ={"ELSA_TUNE_SEED": "seven"})
    with pytest.raises(ConfigError, match="duration"):
        Settings.resolve({"budget_s": "eight hours"}, environ={})
    with pytest.raises(ConfigError, match="profile"):
        Settings.resolve({"gpu": "sim"}, environ={})


def test_settings_are_frozen_and_sim_implies_the_sim_runtime() -> None:
    s = Settings.resolve(SIM, environ={})
    assert s.runtime == "sim" and s.simulated
    with pytest.raises(AttributeError):
        s.seed = 3  # type: ignore[misc,unused-ignore]


def test_pass_length_is_sized_from_the_budget() -> None:
    assert Settings(**SIM, budget_s=8 * 3600).pass_s == pytest.approx(63.0)
    assert Settings(**SIM, budget_s=1800).pass_s == pytest.approx(3.0)
    assert Settings(**SIM, budget_s=480).pass_s == 1.0
    assert Settings(**SIM, budget_s=480, pass_seconds=5).pass_s == 5


def test_a_phase_that_finishes_early_hands_its_time_on() -> None:
    now = [0.0]
    budget = Budget(1000.0, clock=lambda: now[0])
    budget.begin("preflight")
    now[0] = 5.0
    budget.begin("baseline")
    assert budget.allowance("baseline") == pytest.approx(150 + 15)      # its share + preflight's unused 15 s
    now[0] = 55.0
    budget.begin("screening")
    assert budget.allowance("screening") == pytest.approx(350 + 115)
    assert budget.allowance("search") >= 330                             # later reserves are protected
    now[0] = 2000.0
    assert budget.expired() and budget.allowance("screening") == 0.0
