"""``elsa-tune gate plan|simulate``."""

from __future__ import annotations

import json

import pytest

from elsa_tune.tuner.cli import main


def test_plan_prints_spec_boundaries_and_boot_needs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gate", "plan", "--passes", "3"]) == 0
    out = capsys.readouterr().out
    assert "OBF" in out and "10%: 15" in out          # statistics.md §3.6: 15 boots per arm for 10% at σ_b 10%
    assert main(["gate", "plan", "--json", "--shape", "pocock"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["boundaries"]["design"]["shape"] == "pocock" and len(data["looks"]) == 3


def test_simulate_reports_keep_rates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gate", "simulate", "--runs", "20", "--effect", "0.3", "--sigma-boot", "0.05"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert row[0] == "+30.0%" and float(row[1]) >= 0.9


def test_bad_settings_are_a_config_error_with_a_remedy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gate", "plan", "--looks", "8,4"]) == 2
    assert "remedy" in capsys.readouterr().err
