"""SIGKILL the tuner at random points of a study, rerun the same command: no finished boot is lost or redone,
and the ledger ends with each decision exactly once."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from elsa_e2e_helpers import TINY_SPACE, ledger_lines

pytestmark = pytest.mark.slow


def _boot_files(run_dir: Path) -> dict[str, str]:
    return {p.parent.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((run_dir / "boots").glob("*/boot.json"))}


def _kill_servers(card_dir: Path) -> None:
    """The killed tuner could not stop its simulated server: stop the orphans of this test's card, by pid."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "sim serve" in cmdline and str(card_dir) in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def test_sigkill_at_random_points_then_resume(tmp_path: Path, small_trace: Path) -> None:
    run_dir = tmp_path / "runs" / "killed"
    card = tmp_path / "card"
    env = {**os.environ, "ELSA_SIM_CARD_DIR": str(card), "ELSA_TUNE_BASELINE_BOOTS": "3"}
    argv = [sys.executable, "-m", "elsa_tune", "--gpu", "sim", "--sim-profile", "tiny-test", "--space", TINY_SPACE,
            "--traffic", str(small_trace), "--budget", "50m", "--out", str(run_dir), "--no-live",
            "--sim-speedup", "20", "--seed", "2", "-q"]
    rng = random.Random(11)
    seen: dict[str, str] = {}
    for _ in range(3):
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(6.0, 20.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        _kill_servers(card)
        now = _boot_files(run_dir)
        assert all(now.get(k) == v for k, v in seen.items()), "a finished boot was lost or rewritten"
        seen = now
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    _kill_servers(card)
    assert done.returncode == 0, done.stderr[-2000:]
    final = _boot_files(run_dir)
    assert all(final.get(k) == v for k, v in seen.items()), "a finished boot was lost or rewritten"
    assert seen, "the kills came before any boot finished; the test proved nothing"
    tags = [json.loads((run_dir / "boots" / b / "boot.json").read_text()).get("tag") for b in final]
    finished = [t for t in tags if t]
    assert len(finished) == len(set(finished)), "a finished boot was booted again after a resume"
    study = json.loads((run_dir / "study.json").read_text())
    assert study["status"] == "finished"
    decisions = [json.loads(p.read_text()) for p in sorted((run_dir / "decisions").glob("*.json"))]
    entries = [e for e in ledger_lines(run_dir) if e["evidence"]["run_dir"] == str(run_dir.resolve())]
    assert sorted(e["technique"] for e in entries) == sorted(d["technique"] for d in decisions if not d["skipped"])
    by_technique = {e["technique"]: e for e in entries}
    assert "HybridLinearKVPool" in by_technique["hierarchical-cache"]["reason"]
    assert by_technique["mixed-chunk"]["reason"].startswith("accepted and silently ignored")
