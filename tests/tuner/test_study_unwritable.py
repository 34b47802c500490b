"""A study whose run folder cannot be written mid-run (a full disk) stops with one paragraph, never exit 70.

The first write of ``report.html`` after the baseline fails with ``ENOSPC`` (through ``durable_file.replacing``,
which every record and output goes through): the study ends with ``HistoryError`` (exit 5) naming the file and the
remedy, its records so far stand, and the same command then resumes and finishes with the recommendation of a run
that was never stopped.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import BinaryIO

import pytest

from elsa_tune import durable_file, exit_codes
from elsa_tune.tuner.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY_SPACE = REPO / "benchmarks" / "workers" / "tiny-space.yaml"

pytestmark = pytest.mark.filterwarnings("ignore")


def study_argv(out: Path) -> list[str]:
    return ["--gpu", "sim", "--sim-profile", "tiny-test", "--space", str(TINY_SPACE), "--traffic", "demo",
            "--virtual", "--no-live", "--study", "tiny", "--budget", "20m", "--out", str(out), "-q"]


def recommendation(run: Path) -> tuple[str, dict[str, object]]:
    study = json.loads((run / "study.json").read_text())
    return str(study["status"]), dict(study["incumbent"]["flags"])


def test_a_full_disk_mid_study_is_one_paragraph_and_the_rerun_resumes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(study_argv(tmp_path / "reference" / "r")) == exit_codes.OK
    reference = recommendation(tmp_path / "reference" / "r")
    capsys.readouterr()

    real = durable_file.replacing
    failed: list[Path] = []

    @contextmanager
    def full_disk(path: Path, *, mode: int | None = None) -> Iterator[BinaryIO]:
        if path.name == "report.html" and not failed:
            failed.append(path)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        with real(path, mode=mode) as handle:
            yield handle

    def patched(path: Path, *, mode: int | None = None) -> AbstractContextManager[BinaryIO]:
        return full_disk(path, mode=mode)

    run = tmp_path / "full" / "r"
    monkeypatch.setattr(durable_file, "replacing", patched)
    code = main(study_argv(run))
    err = capsys.readouterr().err.strip()
    assert failed and code == exit_codes.HISTORY, (code, err)
    assert "Traceback" not in err and err.startswith("elsa-tune: error: ") and "\n\n" not in err, err
    message, remedy = err.split("remedy: ", 1)
    assert "report.html: No space left on device" in message and "rerun the same command" in remedy, err
    assert recommendation(run)[0] == "running"      # the records written before the failure stand
    monkeypatch.setattr(durable_file, "replacing", real)
    assert main(study_argv(run)) == exit_codes.OK
    assert recommendation(run) == reference
