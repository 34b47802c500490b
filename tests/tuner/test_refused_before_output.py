"""A refused command creates nothing (issue 31, "refused only after creating output"): a ledger beside ``--out`` that
cannot be read, the workers' inputs, a damaged ``--storage`` file are refused before a folder or a file exists."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elsa_tune import exit_codes
from elsa_tune.tuner.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY_SPACE = str(REPO / "benchmarks" / "workers" / "tiny-space.yaml")
STUDY = ["--gpu", "sim", "--sim-profile", "tiny-test", "--space", TINY_SPACE, "--traffic", "demo", "--virtual",
         "--no-live", "--budget", "1m", "-q"]
WORKER = ["worker", "--study", "s", "--runtime", "sim", "--sim-profile", "tiny-test", "--space", TINY_SPACE,
          "--budget", "5s"]

pytestmark = pytest.mark.filterwarnings("ignore")


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *, code: int, cause: str) -> str:
    got = main(argv)
    err = capsys.readouterr().err.strip()
    assert got == code, (got, err[-2000:])
    assert "Traceback" not in err and err.startswith("elsa-tune: error: ") and "\n  remedy: " in err, err
    assert cause in err, err
    return err


def tree(root: Path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files)


def test_a_folder_where_the_ledger_belongs_is_refused_before_the_run_folder_exists(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ledger.jsonl").mkdir()
    refused(capsys, [*STUDY, "--out", str(tmp_path / "run")], code=exit_codes.HISTORY,
            cause="ledger.jsonl is a folder, not the ledger's file")
    assert tree(tmp_path) == ["ledger.jsonl"]


def test_a_ledger_line_nested_too_deep_is_a_corrupt_line_not_a_crash(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("[" * 100_000 + "\n")
    before = ledger.read_bytes()
    assert main([*STUDY, "--out", str(tmp_path / "run")]) == exit_codes.OK
    assert "skipping corrupt ledger line" in capsys.readouterr().err
    assert ledger.read_bytes().startswith(before)


def test_workers_check_their_inputs_before_their_folders_exist(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, [*WORKER, "--gpu", "0,1", "--traffic", str(tmp_path / "nope.parquet"), "--out",
                     str(tmp_path / "wk")], code=exit_codes.USAGE, cause="no such traffic file")
    assert tree(tmp_path) == []


def test_a_damaged_storage_file_is_refused_with_nothing_beside_it(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    user = tmp_path / "user.db"
    data = bytes(range(256)) * 16
    user.write_bytes(data)
    refused(capsys, [*WORKER, "--gpu", "0", "--traffic", "demo", "--out", str(tmp_path / "wk"), "--storage",
                     f"sqlite:///{user}"], code=exit_codes.HISTORY, cause="is not a SQLite database")
    assert tree(tmp_path) == ["user.db"] and user.read_bytes() == data
