"""``elsa-tune --gpu 0,1 --runtime sim``: one study, baseline and screening on GPU 0, the numeric search on both
simulated GPUs at once. Ctrl-C during the search is forwarded to the workers (each finishes its boot, nothing is
left running); rerunning the command resumes (the pool starts again with what is left of the phase's allowance,
nothing finished is measured twice). Then: the study finished, the two GPUs' search boots overlapped, each A/B ran
on one GPU, the report lists both GPUs, the ledger holds each decision once."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from elsa_e2e_helpers import ledger_lines

from elsa_tune.history.records import Phase
from elsa_tune.history.run_dir import RunDir

pytestmark = pytest.mark.slow

SPACE = Path(__file__).resolve().parents[2] / "benchmarks" / "workers" / "tiny-space.yaml"


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _worker_boots(run_dir: Path) -> dict[str, str]:
    return {f"{p.parents[2].name}/{p.parent.name}": hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.glob("*-gpu*/boots/*/boot.json"))}


def test_two_simulated_gpus_run_one_study(tmp_path: Path, small_trace: Path) -> None:
    run_dir = tmp_path / "runs" / "two"
    argv = [sys.executable, "-m", "elsa_tune", "--gpu", "0,1", "--runtime", "sim", "--sim-profile", "tiny-test",
            "--space", str(SPACE), "--traffic", str(small_trace), "--budget", "160s", "--out", str(run_dir),
            "--no-live", "--sim-speedup", "20", "--seed", "4", "--baseline-boots", "3"]
    lead = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 220
        # The workers are searching: a trial's boot finished.
        while not list(run_dir.glob("*-gpu*/boots/*-trial-*/boot.json")):
            assert lead.poll() is None, lead.stdout.read().decode() if lead.stdout else ""
            assert time.monotonic() < deadline, "the workers did not get going"
            time.sleep(0.3)
        lead.send_signal(signal.SIGINT)                      # Ctrl-C reaches the lead only (workers: own sessions)
        out, _ = lead.communicate(timeout=120)
    finally:
        if lead.poll() is None:
            lead.kill()
            lead.wait(timeout=30)
    assert lead.returncode == 130, out.decode()[-3000:]
    assert json.loads((run_dir / "study.json").read_text())["status"] == "interrupted"
    fleet = json.loads((run_dir / "fleet.json").read_text())
    assert [s["outcome"] for s in fleet["starts"]] == ["interrupted"]
    assert not [pid for pid, _ in fleet["starts"][0]["children"] if _alive(pid)]
    assert not list(run_dir.glob("sim-cards/gpu*/proc-*.json"))               # no server left on either card
    for folder in run_dir.glob("*-gpu*"):
        assert json.loads((folder / "study.json").read_text())["status"] == "interrupted"
        assert not RunDir(folder).incomplete_boots()                         # the boot in flight was finished
    before = _worker_boots(run_dir)
    told = {(t.number, t.values) for f in run_dir.glob("*-gpu*") for t in RunDir(f).trials()}

    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "boots on GPU 0" in done.stdout and "boots on GPU 1" in done.stdout
    assert json.loads((run_dir / "study.json").read_text())["status"] == "finished"
    fleet = json.loads((run_dir / "fleet.json").read_text())
    assert [s["outcome"] for s in fleet["starts"]][-1] == "finished" and len(fleet["starts"]) == 2
    # The second start had only what the first left of the search phase's allowance.
    first, second = fleet["starts"]
    assert second["budget_s"] <= first["budget_s"] - (first["ended_at"] - first["started_at"]) + 10
    after = _worker_boots(run_dir)
    assert all(after.get(k) == v for k, v in before.items()), "a finished boot was lost or rewritten"
    assert told <= {(t.number, t.values) for f in run_dir.glob("*-gpu*") for t in RunDir(f).trials()}
    # Nothing finished was measured again: every search candidate was booted once, on one GPU.
    tags = [str(b.tag) for f in run_dir.glob("*-gpu*") for b in RunDir(f).load().boots
            if b.phase is Phase.SEARCH and (b.tag or "").startswith("search:")]
    assert len(tags) == len(set(tags))

    study = RunDir(run_dir).read_study()
    assert study is not None and study.settings["gpu"] == "0"
    workers = {d.name.rsplit("-", 1)[1]: RunDir(d).load() for d in sorted(run_dir.glob("*-gpu*"))}
    assert set(workers) == {"gpu0", "gpu1"}
    uuids = {name: {b.fingerprint.gpu_uuid for b in h.boots} for name, h in workers.items()}
    assert all(len(u) == 1 for u in uuids.values()) and uuids["gpu0"] != uuids["gpu1"]
    # The lead's own boots are on GPU 0's card, and the lead booted nothing during the search.
    ours = RunDir(run_dir).load()
    assert {b.fingerprint.gpu_uuid for b in ours.boots} == uuids["gpu0"]
    assert not [b for b in ours.boots if b.phase is Phase.SEARCH]

    # Search boots of the two GPUs overlapped in time.
    spans = {name: [(b.started_at, b.ended_at) for b in h.boots if b.phase is Phase.SEARCH]
             for name, h in workers.items()}
    assert spans["gpu0"] and spans["gpu1"]
    assert any(a0 < b1 and b0 < a1 for a0, a1 in spans["gpu0"] for b0, b1 in spans["gpu1"])

    # Every A/B ran all its boots on one GPU: the worker that decided it, and its boots are A/B boots there.
    adopted = [d for d in ours.decisions if d.phase is Phase.SEARCH]
    for name, history in workers.items():
        boots = {b.boot_id: b for b in history.boots}
        for d in history.decisions:
            ids = d.boots_incumbent + d.boots_candidate
            assert ids and all(i in boots and (boots[i].tag or "").startswith("ab:") for i in ids), ids
            assert {boots[i].fingerprint.gpu_uuid for i in ids} == uuids[name]
            assert any(a.technique == f"{d.technique} (GPU {name[3:]})" and a.verdict == d.verdict for a in adopted)
    assert len(adopted) == sum(len(h.decisions) for h in workers.values())

    # The report lists the trials of both GPUs with the GPU that measured each.
    md = (run_dir / "report.md").read_text()
    search = md.split("## Numeric search", 1)[1].split("\n## ", 1)[0]
    assert "| GPU 0 |" in search and "| GPU 1 |" in search
    numbers = {t.number for h in workers.values() for t in h.trials}
    assert numbers and all(f"\n| {n} | GPU " in search for n in numbers)

    # The ledger has each decision once: the lead's (screening, confirmation) and each worker's A/B.
    ledger = ledger_lines(run_dir) if (run_dir.parent / "ledger.jsonl").exists() else []
    keys = [(e["evidence"]["study"], e["evidence"]["decision"], e["technique"], e["fingerprint"].get("gpu_uuid"),
             tuple(sorted(e["evidence"]["boot_ids"]))) for e in ledger]
    assert len(keys) == len(set(keys))
    worker_decisions = sum(len(h.decisions) for h in workers.values())
    assert sum(e["technique"].startswith("search trial") for e in ledger) == worker_decisions
    assert len(ledger) == len([d for d in ours.decisions if d.kept.value != "skipped"])
