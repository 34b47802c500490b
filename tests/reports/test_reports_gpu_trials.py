"""A study that searched on several GPUs (``tune --gpu 0,1``): its report lists the workers' trials, each with the
GPU whose boot measured it, read from the workers' run folders inside the study's own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from elsa_history_factory import BASELINE, HistoryBuilder, copy_history

from elsa_tune.history.records import Arm, BootOutcome, Phase, TrialRecord, TrialState
from elsa_tune.history.run_dir import RunDir
from elsa_tune.history.store import StudyStore
from elsa_tune.reports.build import write_outputs
from elsa_tune.reports.model import build_report


def _worker(h: HistoryBuilder, gpu: str) -> StudyStore:
    """Point the builder at a worker's run folder ``<run_dir>/host-gpu<N>`` with its ``study.json``."""
    folder = h.run_dir / f"host-gpu{gpu}"
    h.store = StudyStore(folder, name=f"study@host-gpu{gpu}", heartbeat_interval=None)
    lead = RunDir(h.run_dir).read_study()
    assert lead is not None
    RunDir(folder).write_study(dataclasses.replace(lead, worker={"gpu": gpu}))
    return h.store


def _trial(store: StudyStore, number: int, boots: tuple[str, ...], value: float) -> None:
    store.files.write_trial(TrialRecord(study="study", number=number, params={"mem-fraction-static": 0.8},
                                        state=TrialState.COMPLETE, values=(value,), constraint=0.0,
                                        boot_ids=boots))


def test_report_lists_every_gpus_trials(history_template: HistoryBuilder, tmp_path: Path) -> None:
    h = copy_history(history_template, tmp_path)
    lead_trials = {t.number for t in RunDir(h.run_dir).trials()}
    first = max(lead_trials, default=0) + 10
    gpu0 = _worker(h, "0")
    cand = BASELINE.merged(flags={"mem-fraction-static": 0.8}, label=f"trial-{first}")
    b0 = h.boot(cand, Phase.SEARCH, Arm.CANDIDATE, BootOutcome.MEASURED, values=[150.0, 151.0], trial=first)
    _trial(gpu0, first, (b0.boot_id,), 151.0)
    gpu1 = _worker(h, "1")
    b1 = h.boot(cand, Phase.SEARCH, Arm.CANDIDATE, BootOutcome.MEASURED, values=[148.0, 149.0], trial=first + 1)
    _trial(gpu1, first + 1, (b1.boot_id,), 149.0)
    _trial(gpu1, first + 2, (b0.boot_id,), 151.0)      # a twin of GPU 0's trial: told its result, no boot here

    report = build_report(h.run_dir)
    assert report.trial_gpus == {first: "GPU 0", first + 1: "GPU 1", first + 2: f"GPU 0 (trial {first}'s boot)"}
    numbers = [t.number for t in report.trials]
    assert numbers == sorted(numbers) and set(numbers) == lead_trials | {first, first + 1, first + 2}
    by_number = {t.number: t for t in report.trials}
    assert by_number[first + 2].boot_ids == (f"host-gpu0/{b0.boot_id}",)

    md = write_outputs(h.run_dir, with_plots=False).markdown.read_text()
    search = md.split("## Numeric search", 1)[1].split("\n## ", 1)[0]
    assert "Searched on 2 GPUs at once" in search
    assert f"| {first} | GPU 0 |" in search and f"| {first + 1} | GPU 1 |" in search
    assert (h.run_dir / "report.html").read_text().count("GPU 1") >= 1


def test_a_one_gpu_report_has_no_gpu_column(history_template: HistoryBuilder, tmp_path: Path) -> None:
    h = copy_history(history_template, tmp_path)
    report = build_report(h.run_dir)
    assert report.trial_gpus == {}
    md = write_outputs(h.run_dir, with_plots=False).markdown.read_text()
    assert "| trial | parameters |" in md and "| GPU |" not in md
