"""A whole study on the simulated runtime (tiny profile): every phase, every output, each rejection's reason."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import optuna
import pytest
from elsa_e2e_helpers import TINY_SPACE, RunStudy, ledger_lines

from elsa_tune.history.run_dir import RunDir
from elsa_tune.history.study_record import StudyStatus

pytestmark = pytest.mark.slow


def test_tiny_study_end_to_end(run_study: RunStudy, small_trace: Path, tmp_path: Path) -> None:
    outcome = run_study(traffic=str(small_trace), budget_s=150.0)
    run_dir = Path(outcome.run_dir)
    assert outcome.status is StudyStatus.FINISHED
    for name in ("report.md", "report.html", "study.json", "study.db"):
        assert (run_dir / name).exists(), name
    assert (run_dir / "best").is_dir()
    history = RunDir(run_dir).load()
    decisions = {d.technique: d for d in history.decisions}
    assert "crashes" in decisions["hierarchical-cache"].result
    assert "HybridLinearKVPool" in decisions["hierarchical-cache"].result
    assert decisions["mixed-chunk"].result.startswith("accepted and silently ignored")
    ngram = decisions["speculative-ngram"]
    assert ngram.failure is not None and ngram.failure.kind.value == "oom_under_load" and ngram.attempts == 3
    # Every boot carries the fingerprint, its server log, and its BootReport when it booted.
    fingerprints = {b.fingerprint.key() for b in history.boots}
    assert len(fingerprints) == 1
    assert all(b.log_path and (run_dir / b.log_path).exists() for b in history.boots)
    ledger = ledger_lines(run_dir)
    assert {e["technique"] for e in ledger} >= {"hierarchical-cache", "mixed-chunk", "speculative-ngram"}
    study = json.loads((run_dir / "study.json").read_text())
    assert study["status"] == "finished" and study["noise"]["boots"] == 3
    md = (run_dir / "report.md").read_text()
    assert "HybridLinearKVPool" in md and "hierarchical-cache" in md
    # The report leads with the decision and the file to run, and lists every technique the study booted.
    head = "\n".join(md.splitlines()[:15])
    assert "## Decision" in head and "`best/launch.sh`" in head and "SIMULATED — do not deploy" in head
    tried = {line.split(" | ")[0].removeprefix("| ").split(" (`")[0] for line in md.splitlines()
             if line.startswith("| ")}
    # a search trial's boots carry its label ("trial-4"), its decision the words "search trial 4"
    assert {t.replace("trial-", "search trial ") if t.startswith("trial-") and t not in tried else t
            for t in {b.technique for b in history.boots if b.technique}} <= tried
    # Every Optuna study in study.db is a real one: trials and metric names; boots live in their own table.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        url = f"sqlite:///{run_dir / 'study.db'}"
        for summary in optuna.get_all_study_summaries(url):
            study_ = optuna.load_study(study_name=summary.study_name, storage=url)
            assert study_.trials and study_.metric_names, summary.study_name

    # A second study with the same fingerprint skips what the first rejected, and says so.
    again = run_study(traffic=str(small_trace), budget_s=40.0, out=tmp_path / "runs" / "second", space=TINY_SPACE)
    skipped = {d.technique: d for d in RunDir(Path(again.run_dir)).load().decisions if d.skipped}
    assert {"hierarchical-cache", "mixed-chunk", "speculative-ngram"} <= set(skipped)
    assert "rejected" in skipped["hierarchical-cache"].result
