"""``elsa-tune --gpu 0,1``: Ctrl-C during the search on two GPUs is forwarded to the workers (each finishes its
boot, nothing is left running), and rerunning the command resumes: the pool starts again, the earlier start's
time is charged, nothing finished is measured again."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


def test_ctrl_c_during_the_search_then_resume(tmp_path: Path, small_trace: Path) -> None:
    run_dir = tmp_path / "runs" / "two"
    argv = [sys.executable, "-m", "elsa_tune", "--gpu", "0,1", "--runtime", "sim", "--sim-profile", "tiny-test",
            "--space", str(SPACE), "--traffic", str(small_trace), "--budget", "100s", "--out", str(run_dir),
            "--no-live", "--sim-speedup", "20", "--seed", "4", "--baseline-boots", "3"]
    lead = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 150
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
    tags = [str(b.extra.get("tag")) for f in run_dir.glob("*-gpu*") for b in RunDir(f).load().boots
            if b.phase is Phase.SEARCH and str(b.extra.get("tag", "")).startswith("search:")]
    assert len(tags) == len(set(tags))
