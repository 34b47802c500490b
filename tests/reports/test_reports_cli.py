from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from elsa_history_factory import XSS, HistoryBuilder, copy_history

from elsa_tune.tuner.cli import main


@pytest.fixture(scope="module")
def run_dir(history_template: HistoryBuilder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_history(history_template, tmp_path_factory.mktemp("cli")).run_dir


def test_report_command_writes_outputs(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(run_dir), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "winner vs baseline: +11%" in out and "report.html" in out
    assert (run_dir / "report.md").exists() and (run_dir / "best" / "launch.sh").exists()


def test_report_command_refuses_a_non_study(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "not a study folder" in capsys.readouterr().err


def test_ledger_command_tables(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "hicache  —  crashes: AttributeError: 'HybridLinearKVPool' object has no attribute 'layer_num'" in out
    assert "mixed-chunk  —  accepted and silently ignored: server_args shows False" in out
    assert "page-size 32" not in out                 # kept, so not in the rejected table
    assert main(["ledger", str(run_dir.parent), "--all", "--technique", "page"]) == 0
    assert "page-size 32" in capsys.readouterr().out


def test_ledger_command_json_and_filters(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", str(run_dir.parent / "ledger.jsonl"), "--json", "--technique", "HiCache"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["technique"] == "hicache" and XSS in entry["evidence"]["log_excerpt"][-1]
    key = entry["ledger_key"]
    assert main(["ledger", str(run_dir), "--json", "--fingerprint", key[:6]]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4
    assert main(["ledger", str(run_dir), "--json", "--fingerprint", "ffffff"]) == 0
    assert capsys.readouterr().out == ""


def test_ledger_command_reports_corrupt_lines(tmp_path: Path, run_dir: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / "ledger.jsonl"
    lines = (run_dir.parent / "ledger.jsonl").read_text().splitlines()
    ledger.write_text("\n".join([lines[0], "{broken", lines[1]]) + "\n")
    assert main(["ledger", str(ledger)]) == 0
    captured = capsys.readouterr()
    assert "ledger.jsonl:2:" in captured.err and "hicache" in captured.out and "mixed-chunk" in captured.out


def test_ledger_command_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", str(tmp_path / "nope")]) == 2
    assert "no such ledger" in capsys.readouterr().err


def test_ledger_command_draws_a_rich_table_on_a_terminal(run_dir: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["ledger", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "Measured and rejected" in out and "technique" in out and "hicache" in out
    assert "<script>alert(1)</script>" in out           # markup=False: log text is shown, not interpreted
