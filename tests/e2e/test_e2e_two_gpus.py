"""``elsa-tune --gpu 0,1 --runtime sim``: one study, baseline and screening on GPU 0, the numeric search on both
simulated GPUs at once, each A/B on one GPU, the report listing both GPUs, the ledger holding each decision once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from elsa_e2e_helpers import ledger_lines

from elsa_tune.history.records import Phase
from elsa_tune.history.run_dir import RunDir

pytestmark = pytest.mark.slow

SPACE = Path(__file__).resolve().parents[2] / "benchmarks" / "workers" / "tiny-space.yaml"


def test_two_simulated_gpus_run_one_study(tmp_path: Path, small_trace: Path) -> None:
    run_dir = tmp_path / "runs" / "two"
    argv = [sys.executable, "-m", "elsa_tune", "--gpu", "0,1", "--runtime", "sim", "--sim-profile", "tiny-test",
            "--space", str(SPACE), "--traffic", str(small_trace), "--budget", "75s", "--out", str(run_dir),
            "--no-live", "--sim-speedup", "20", "--seed", "2", "--baseline-boots", "3"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "boots on GPU 0" in done.stdout and "boots on GPU 1" in done.stdout

    study = json.loads((run_dir / "study.json").read_text())
    assert study["status"] == "finished"
    assert study["extra"]["settings"]["gpu"] == "0"
    fleet = json.loads((run_dir / "fleet.json").read_text())
    assert [s["outcome"] for s in fleet["starts"]] == ["finished"]
    workers = {d.name.rsplit("-", 1)[1]: RunDir(d).load() for d in sorted(run_dir.glob("*-gpu*"))}
    assert set(workers) == {"gpu0", "gpu1"}
    uuids = {name: {b.fingerprint.gpu_uuid for b in h.boots} for name, h in workers.items()}
    assert all(len(u) == 1 for u in uuids.values()) and uuids["gpu0"] != uuids["gpu1"]
    # The lead's own boots are on GPU 0's card, and the lead booted nothing during the search.
    lead = RunDir(run_dir).load()
    assert {b.fingerprint.gpu_uuid for b in lead.boots} == uuids["gpu0"]
    assert not [b for b in lead.boots if b.phase is Phase.SEARCH]

    # Search boots of the two GPUs overlapped in time.
    spans = {name: [(b.started_at, b.ended_at) for b in h.boots if b.phase is Phase.SEARCH]
             for name, h in workers.items()}
    assert spans["gpu0"] and spans["gpu1"]
    assert any(a0 < b1 and b0 < a1 for a0, a1 in spans["gpu0"] for b0, b1 in spans["gpu1"])

    # Every A/B ran all its boots on one GPU: the worker that decided it, and its boots are A/B boots there.
    adopted = [d for d in lead.decisions if d.phase is Phase.SEARCH]
    for name, history in workers.items():
        boots = {b.boot_id: b for b in history.boots}
        for d in history.decisions:
            ids = d.boots_incumbent + d.boots_candidate
            assert ids and all(i in boots and str(boots[i].extra.get("tag", "")).startswith("ab:") for i in ids), ids
            assert {boots[i].fingerprint.gpu_uuid for i in ids} == uuids[name]
            assert any(a.technique == f"{d.technique} (GPU {name[3:]})" and a.verdict == d.verdict for a in adopted)
    assert len(adopted) == sum(len(h.decisions) for h in workers.values())

    # The report lists the trials of both GPUs with the GPU that measured each.
    md = (run_dir / "report.md").read_text()
    search = md.split("## Numeric search", 1)[1].split("\n## ", 1)[0]
    assert "| GPU 0 |" in search and "| GPU 1 |" in search
    told = {t.number for h in workers.values() for t in h.trials}
    assert all(f"\n| {n} | GPU " in search for n in told)

    # The ledger has each decision once: the lead's (screening, confirmation) and each worker's A/B.
    ledger = ledger_lines(run_dir) if (run_dir.parent / "ledger.jsonl").exists() else []
    keys = [(e["evidence"]["study"], e["evidence"]["decision"], e["technique"], e["fingerprint"].get("gpu_uuid"),
             tuple(sorted(e["evidence"]["boot_ids"]))) for e in ledger]
    assert len(keys) == len(set(keys))
    worker_decisions = sum(len(h.decisions) for h in workers.values())
    assert sum(e["technique"].startswith("search trial") for e in ledger) == worker_decisions
    assert len(ledger) == len([d for d in lead.decisions if d.kept.value != "skipped"])
