"""A run folder belongs to one study, and a finished study is a result (issue 31, data loss 1, 2 and 5).

Rerunning a finished study, pointing another study (another space, traffic or name), ``compare`` or ``tune`` at a
folder that is not theirs, or handing a study a ``study.db`` of another application is refused with one paragraph,
before a byte of the folder changes. The studies are virtual (the simulated card in simulated time: seconds).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bad_input_corpus import snapshot

from elsa_tune import exit_codes
from elsa_tune.tuner.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY_SPACE = REPO / "benchmarks" / "workers" / "tiny-space.yaml"
FLAGS = ("model-path: tiny-hybrid\nmem-fraction-static: 0.6\nmax-running-requests: 2\nmax-mamba-cache-size: 24\n"
         "speculative-algorithm: EAGLE\nspeculative-eagle-topk: 1\nspeculative-num-steps: 2\n"
         "speculative-num-draft-tokens: 3\n")

pytestmark = pytest.mark.filterwarnings("ignore")


def study_argv(out: Path, *, space: Path = TINY_SPACE, traffic: str = "demo", budget: str = "20m") -> list[str]:
    return ["--gpu", "sim", "--sim-profile", "tiny-test", "--space", str(space), "--traffic", traffic, "--virtual",
            "--no-live", "--study", "tiny", "--budget", budget, "--out", str(out), "-q"]


def compare_argv(root: Path, out: Path) -> list[str]:
    (root / "a.yaml").write_text(FLAGS)
    (root / "b.yaml").write_text(FLAGS.replace("0.6", "0.7"))
    return ["compare", "--gpu", "sim", "--virtual", "--sim-profile", "tiny-test", "--space", str(TINY_SPACE),
            "--a", str(root / "a.yaml"), "--b", str(root / "b.yaml"), "--budget", "20m", "--out", str(out), "-q"]


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *, code: int, cause: str, fix: str) -> str:
    got = main(argv)
    err = capsys.readouterr().err.strip()
    assert got == code, (got, err[-2000:])
    assert "Traceback" not in err and err.startswith("elsa-tune: error: "), err
    message, remedy = err.split("\n  remedy: ", 1)
    assert cause in message, err
    assert fix in remedy, err
    return err


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished virtual study (``runs/study``), with the ledger beside it."""
    out = tmp_path_factory.mktemp("finished") / "runs" / "study"
    logger = logging.getLogger("elsa_tune")    # set up before the per-test fixture that restores it
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    try:
        assert main(study_argv(out)) == exit_codes.OK
    finally:
        for handler in [h for h in logger.handlers if h not in handlers]:
            logger.removeHandler(handler)
            handler.close()
        logger.setLevel(level)
        logger.propagate = propagate
    assert json.loads((out / "study.json").read_text())["status"] == "finished"
    return out


def copy_of(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run.parent, tmp_path / "runs")
    return tmp_path / "runs" / run.name


def interrupted(run: Path) -> None:
    """Make ``run`` a study stopped before its end (what Ctrl-C leaves): a rerun continues it."""
    data = json.loads((run / "study.json").read_text())
    data["status"] = "interrupted"
    (run / "study.json").write_text(json.dumps(data))


def test_rerunning_a_finished_study_is_refused_and_changes_no_byte(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_of(finished, tmp_path)
    before = snapshot(run.parent)
    refused(capsys, study_argv(run), code=exit_codes.USAGE, cause="which has finished",
            fix="give --out a fresh folder")
    refused(capsys, [*study_argv(run), "--resume", "--budget", "8h"], code=exit_codes.USAGE,
            cause="which has finished", fix=f"elsa-tune report {run}")
    assert snapshot(run.parent) == before


def test_extend_continues_a_finished_study_with_more_budget_and_records_it(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_of(finished, tmp_path)
    first = json.loads((run / "study.json").read_text())
    boots = {p.name: (p / "boot.json").read_bytes() for p in (run / "boots").iterdir()}
    assert main([*study_argv(run), "--extend", "20m"]) == exit_codes.OK
    capsys.readouterr()
    study = json.loads((run / "study.json").read_text())
    assert study["status"] == "finished" and study["budget_s"] == first["budget_s"] + 1200
    [extension] = study["extensions"]
    assert extension["from_budget_s"] == first["budget_s"] and extension["added_s"] == 1200
    for name, record in boots.items():      # every boot of the finished study is kept as it was, and reused
        assert (run / "boots" / name / "boot.json").read_bytes() == record
    before = snapshot(run.parent)           # extended and finished: a plain rerun is refused again
    refused(capsys, study_argv(run), code=exit_codes.USAGE, cause="which has finished", fix="--extend")
    assert snapshot(run.parent) == before


def test_extend_without_a_finished_study_is_refused(finished: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, [*study_argv(tmp_path / "nothing"), "--extend", "1h"], code=exit_codes.USAGE,
            cause="holds no study to extend", fix="drop --extend")
    assert not (tmp_path / "nothing").exists()
    run = copy_of(finished, tmp_path)
    data = json.loads((run / "study.json").read_text())
    data["status"] = "interrupted"
    (run / "study.json").write_text(json.dumps(data))
    before = snapshot(run.parent)
    refused(capsys, [*study_argv(run), "--extend", "1h"], code=exit_codes.USAGE, cause="has not finished",
            fix="without --extend")
    assert snapshot(run.parent) == before


def test_the_console_counts_the_boots_the_report_counts_after_a_resume(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A study stopped during a boot leaves that boot's record (outcome ``interrupted``); the resumed study boots it
    again. The console counted only the boots the resumed run asked for, the report every record ("132 boots" vs
    "149"): both now count the records."""
    run = copy_of(finished, tmp_path)
    data = json.loads((run / "study.json").read_text())
    data["status"] = "interrupted"
    (run / "study.json").write_text(json.dumps(data))
    last = sorted((run / "boots").iterdir())[-1]
    number = int(last.name.split("-", 1)[0]) + 1
    stopped = run / "boots" / f"{number:04d}-stopped"
    shutil.copytree(last, stopped)
    record = json.loads((stopped / "boot.json").read_text())
    record.update(boot_id=stopped.name, boot_number=number, outcome="interrupted")
    record["extra"]["tag"] = "stopped:0"
    (stopped / "boot.json").write_text(json.dumps(record))
    assert main([*study_argv(run)[:-1]]) == exit_codes.OK     # without -q: the console's summary
    console = capsys.readouterr().out
    assert main(["report", "--json", "--no-plots", str(run)]) == exit_codes.OK
    report = json.loads(capsys.readouterr().out)
    assert f"  {report['boots']} boots, " in console, (report["boots"], console)


def test_ctrl_c_during_the_rerun_of_a_finished_study_leaves_it_byte_identical(finished: Path,
                                                                              tmp_path: Path) -> None:
    """The issue's case: SIGINT while rerunning a finished study rewound it (finished → interrupted, trial-18 →
    baseline). The rerun is stopped at random moments, from its start to past where it used to rewrite the study."""
    run = copy_of(finished, tmp_path)
    before = snapshot(run.parent)
    rng = random.Random(31)
    for delay in (start + rng.uniform(0.0, 1.0) for start in (0.5, 3.0, 7.0)):
        proc = subprocess.Popen([sys.executable, "-m", "elsa_tune", *study_argv(run)], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        assert snapshot(run.parent) == before, f"SIGINT after {delay:.1f} s changed the finished study"


def test_a_study_on_another_space_or_traffic_is_refused_before_anything_is_written(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_of(finished, tmp_path)
    interrupted(run)
    other = tmp_path / "other.yaml"
    other.write_text(TINY_SPACE.read_text().replace("name: tiny-distributed", "name: other"))
    before = snapshot(run.parent)
    refused(capsys, study_argv(run, space=other), code=exit_codes.USAGE,
            cause="space: tiny-distributed (sha256", fix="give --out a fresh folder for this study")
    trace = tmp_path / "other.parquet"
    _write_trace(trace)
    refused(capsys, study_argv(run, traffic=str(trace)), code=exit_codes.USAGE,
            cause="traffic: demo (sha256", fix="rerun that study's own command")
    refused(capsys, [*study_argv(run), "--study", "another"], code=exit_codes.USAGE,
            cause="study name: tiny → another", fix="give --out a fresh folder")
    assert snapshot(run.parent) == before


def test_a_folder_written_before_its_identity_was_recorded_is_known_by_its_study_json(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_of(finished, tmp_path)
    interrupted(run)
    (run / "identity.json").unlink()
    other = tmp_path / "other.yaml"
    other.write_text(TINY_SPACE.read_text().replace("name: tiny-distributed", "name: other"))
    before = snapshot(run.parent)
    refused(capsys, study_argv(run, space=other), code=exit_codes.USAGE, cause="space: ", fix="fresh folder")
    assert snapshot(run.parent) == before


def test_compare_into_a_study_and_a_study_into_a_comparison_are_refused(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_of(finished, tmp_path)
    interrupted(run)
    before = snapshot(run.parent)
    refused(capsys, compare_argv(tmp_path, run), code=exit_codes.USAGE,
            cause="holds a study (tiny), not a comparison", fix="give --out a fresh folder")
    assert snapshot(run.parent) == before
    compared = tmp_path / "cmp"
    assert main(compare_argv(tmp_path, compared)) in (exit_codes.OK, exit_codes.NO_DIFFERENCE, exit_codes.EQUIVALENT)
    capsys.readouterr()
    before = snapshot(compared)
    refused(capsys, study_argv(compared), code=exit_codes.USAGE,
            cause="holds a comparison (compare-a-vs-b), not a study (tiny)", fix="give --out a fresh folder")
    assert snapshot(compared) == before


def test_a_study_db_of_another_application_is_refused_untouched(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with sqlite3.connect(run / "study.db") as db:
        db.execute("CREATE TABLE invoices (id INTEGER, total REAL)")
        db.execute("INSERT INTO invoices VALUES (1, 99.5)")
    db.close()
    before = snapshot(tmp_path)
    refused(capsys, study_argv(run), code=exit_codes.HISTORY, cause="belongs to another application (it holds the "
            "tables invoices", fix="move that file out of the run folder")
    assert snapshot(tmp_path) == before
    (run / "study.db").write_text("not a database\n")
    before = snapshot(tmp_path)
    refused(capsys, study_argv(run), code=exit_codes.HISTORY, cause="is not a SQLite database",
            fix="move it aside")
    assert snapshot(tmp_path) == before


def _write_trace(path: Path) -> None:
    from elsa_tune.traffic.imports import import_trace
    from elsa_tune.traffic.trace import write_trace

    source = path.with_suffix(".jsonl")
    source.write_text("".join(json.dumps({"timestamp": 1000 * i, "input_length": 600 + i, "output_length": 20,
                                          "hash_ids": [1, 2]}) + "\n" for i in range(40)))
    write_trace(import_trace(source, "mooncake").trace, path)
