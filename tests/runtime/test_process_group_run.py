"""``ProcessGroup.run``: a bounded child program in a group of its own, stopped whole however it ends.

Real subprocesses: a shell script that starts a sleeping grandchild (which keeps the output pipes open) and then
never exits, run directly and through ``elsa-tune space check --runtime-python``; each test reads the pids the
script wrote and checks that none of them is left running.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from elsa_tune import exit_codes
from elsa_tune.runtime.process_group import ProcessGroup, is_running

REPO = Path(__file__).resolve().parents[2]
TS = str(REPO / "benchmarks" / "workers" / "tiny-space.yaml")


def never_exits(folder: Path) -> Path:
    """A program that forks a sleeping grandchild, writes its own and the grandchild's pid, and never exits."""
    script = folder / "py"
    script.write_text(f"#!/bin/sh\nsleep 1000 &\necho $$ $! > {folder / 'pids'}\nsleep 1000\n")
    script.chmod(0o755)
    return script


def written_pids(folder: Path) -> list[int]:
    deadline = time.monotonic() + 10
    while not (folder / "pids").exists() or len((folder / "pids").read_text().split()) < 2:
        assert time.monotonic() < deadline, "the script never wrote its pids"
        time.sleep(0.05)
    return [int(p) for p in (folder / "pids").read_text().split()]


def test_a_child_past_its_deadline_is_stopped_with_its_grandchild(tmp_path: Path) -> None:
    script = never_exits(tmp_path)
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        ProcessGroup.run([str(script)], deadline_s=1.5)
    assert time.monotonic() - started < 15
    child, grandchild = written_pids(tmp_path)
    assert not is_running(child, None) and not is_running(grandchild, None)
    assert ProcessGroup(child).members() == []


def test_a_grandchild_left_behind_by_a_child_that_answered_is_stopped(tmp_path: Path) -> None:
    script = tmp_path / "answers"
    script.write_text(f"#!/bin/sh\nsleep 1000 >/dev/null 2>&1 &\necho $$ $! > {tmp_path / 'pids'}\necho flags\n")
    script.chmod(0o755)
    done = ProcessGroup.run([str(script)], deadline_s=30)
    assert done.returncode == 0 and done.stdout == "flags\n"
    child, grandchild = written_pids(tmp_path)
    assert not is_running(grandchild, None) and ProcessGroup(child).members() == []


def test_input_and_output_pass_through_and_undecodable_bytes_are_replaced() -> None:
    done = ProcessGroup.run([sys.executable, "-c", "import sys; data = sys.stdin.read(); "
                             "sys.stdout.buffer.write(data.upper().encode() + b'\\xff'); sys.exit(3)"],
                            deadline_s=30, stdin_text="abc")
    assert done.returncode == 3 and done.stdout == "ABC\ufffd"


def test_a_program_that_cannot_start_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ProcessGroup.run([str(tmp_path / "missing")], deadline_s=5)


def test_space_check_with_a_runtime_python_that_never_exits_is_refused_in_time_and_leaves_nothing(
        tmp_path: Path) -> None:
    script = never_exits(tmp_path)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "elsa_tune", "space", "check", TS, "--runtime-python", str(script),
                           "--help-timeout", "3"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          check=False)
    assert time.monotonic() - started < 60
    err = done.stderr.strip()
    assert done.returncode == exit_codes.ENVIRONMENT, err
    assert "Traceback" not in err and err.startswith("elsa-tune: error: ") and "\n\n" not in err, err
    message, remedy = err.split("remedy: ", 1)
    assert "did not print its flags and exit within 3 s" in message, err
    assert "--help-timeout" in remedy, err
    child, grandchild = written_pids(tmp_path)
    assert not is_running(child, None) and not is_running(grandchild, None)
    assert ProcessGroup(child).members() == []
