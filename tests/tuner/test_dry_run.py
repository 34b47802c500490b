"""``elsa-tune --dry-run``: the plan of a study — phases, budget, boots, every candidate's command line checked
against the runtime's flags, the ledger's skips — with no boot and no run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elsa_tune.history.decision import DecisionRecord
from elsa_tune.history.ledger import Ledger
from elsa_tune.history.records import Phase
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.tuner.cli import main
from elsa_tune.tuner.flow.plan import plan_study
from elsa_tune.tuner.flow.preflight import run_preflight
from elsa_tune.tuner.flow.settings import Settings

TINY_SPACE = Path(__file__).parents[1] / "e2e" / "data" / "tiny-space.yaml"


def test_dry_run_plans_without_booting(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELSA_SIM_CARD_DIR", str(tmp_path / "card"))
    run = tmp_path / "runs" / "study"
    code = main(["--gpu", "sim", "--sim-profile", "tiny-test", "--space", str(TINY_SPACE), "--traffic", "demo",
                 "--budget", "10m", "--out", str(run), "--dry-run", "--json", "--no-live", "-q"])
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    assert not run.exists() and not (tmp_path / "runs").exists()            # nothing written, nothing booted
    assert [p["name"] for p in plan["phases"]] == ["baseline", "screening", "search", "confirmation"]
    assert abs(sum(p["budget_s"] for p in plan["phases"]) - 0.98 * 600) < 1e-6
    assert plan["phases"][0]["boots_low"] == plan["phases"][0]["boots_high"] == 4
    assert 0 < plan["boots"]["low"] <= plan["boots"]["high"]
    assert plan["flags_checked"] and plan["ok"]
    labels = [c["label"] for c in plan["candidates"]]
    assert labels[0] == "baseline" and "hierarchical-cache" in labels
    hicache = next(c for c in plan["candidates"] if c["label"] == "hierarchical-cache")
    assert "--enable-hierarchical-cache" in hicache["argv"] and hicache["argv"][:3] != ["--enable-hierarchical-cache"]
    assert all(not c["unknown_flags"] for c in plan["candidates"])


def test_the_plan_names_what_the_ledger_will_skip(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "second"
    pre = run_preflight(Settings(gpu="sim", sim_profile="tiny-test", space=str(TINY_SPACE), traffic="demo",
                                 budget_s=600.0, out=run), card_dir=tmp_path / "card")
    crash = Failure(FailureKind.TECHNIQUE_CRASH, "AttributeError: 'HybridLinearKVPool' object has no attribute "
                    "'layer_num'", "drop the flag")
    Ledger.for_run_dir(run).record(DecisionRecord(study="first", number=1, phase=Phase.SCREENING,
                                                  technique="hierarchical-cache",
                                                  flags_delta={"enable-hierarchical-cache": True}, failure=crash),
                                   pre.fingerprint, run_dir=tmp_path / "runs" / "first")
    plan = plan_study(pre)
    assert [t for t, _ in plan.ledger_skips] == ["hierarchical-cache"]
    assert "hierarchical-cache" not in [c.label for c in plan.candidates]
    text = "\n".join(plan.lines())
    assert "skipped by the ledger:" in text and "HybridLinearKVPool" in text and not run.exists()
