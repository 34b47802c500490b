"""``elsa-tune compare`` end to end through the simulated SGLang's HTTP server: the installed entry point in a
subprocess, real server processes booted and stopped, their logs parsed, the exit status a script reads. Every number
is simulated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from elsa_e2e_helpers import TINY_SPACE

from elsa_tune.history.records import BootOutcome, Phase
from elsa_tune.history.run_dir import RunDir

pytestmark = pytest.mark.slow

A = (Path(__file__).parent / "data" / "tiny-flags.yaml").read_text()


def compare(tmp_path: Path, trace: Path, b: str, out: str, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "a.yaml").write_text(A)
    (tmp_path / f"{out}.yaml").write_text(b)
    env = {**os.environ, "ELSA_SIM_CARD_DIR": str(tmp_path / "cards")}
    return subprocess.run([sys.executable, "-m", "elsa_tune", "compare", "--a", "a.yaml", "--b", f"{out}.yaml",
                           "--gpu", "sim", "--sim-profile", "tiny-test", "--space", TINY_SPACE, "--traffic",
                           str(trace), "--out", out, "--baseline-boots", "3", "--sim-speedup", "20", "--json", "-q",
                           *extra], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env, check=False)


def test_an_ab_of_two_flag_files_through_the_http_server(tmp_path: Path, small_trace: Path) -> None:
    proc = compare(tmp_path, small_trace, A.replace("mem-fraction-static: 0.6", "mem-fraction-static: 0.65"),
                   "faster", "--looks", "2")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert proc.returncode == result["exit_code"] and result["outcome"] != "B failed", proc.stderr[-3000:]
    assert result["gate_decision"] in ("keep", "reject", "inconclusive") and result["ci_low"] is not None
    assert result["simulated"] is True and result["context"]["runtime"] == "sglang-sim"
    history = RunDir(tmp_path / "faster").load()
    assert len(history.boots) == result["boots"] >= 3 + 1 + 4     # A's noise boots, B's probed boot, two blocks
    assert all(b.phase is Phase.COMPARE and b.outcome is BootOutcome.MEASURED for b in history.boots)
    # every boot was a real server process: its log is on disk and the boot report was parsed from it
    for boot in history.boots:
        assert boot.log_path and "ready to roll" in (tmp_path / "faster" / boot.log_path).read_text()
        assert boot.report is not None and boot.report.max_total_num_tokens
    assert {b.candidate.flags["mem-fraction-static"] for b in history.boots} == {0.6, 0.65}
    assert json.loads((tmp_path / "faster" / "compare.json").read_text())["outcome"] == result["outcome"]


def test_a_b_that_crashes_on_the_http_server(tmp_path: Path, small_trace: Path) -> None:
    proc = compare(tmp_path, small_trace, A + "enable-hierarchical-cache: true\n", "crash")
    assert proc.returncode == 3, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["outcome"] == "B failed" and "HybridLinearKVPool" in result["reason"]
    history = RunDir(tmp_path / "crash").load()
    assert [b.outcome for b in history.boots] == [BootOutcome.MEASURED] * 3 + [BootOutcome.BOOT_FAILED]
