from __future__ import annotations

import subprocess
import sys

from elsa_tune.tuner.cli import main


def test_help_exits_zero(capsys: object) -> None:
    proc = subprocess.run([sys.executable, "-m", "elsa_tune", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "elsa-tune" in proc.stdout


def test_no_command_prints_help() -> None:
    assert main([]) == 2
