from __future__ import annotations

import json
import shlex

import pytest

from elsa_tune.search_spaces import list_shipped_spaces, load_space
from elsa_tune.tuner.cli import main


def test_space_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["space", "list"]) == 0
    assert capsys.readouterr().out.split() == list_shipped_spaces()


def test_space_show_prints_the_baseline_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["space", "show", "qwen3.8-27b-nvfp4-rtx5090"]) == 0
    out = capsys.readouterr().out
    baseline_line = out.splitlines()[out.splitlines().index("baseline:") + 1]
    space = load_space("qwen3.8-27b-nvfp4-rtx5090")
    assert shlex.split(baseline_line) == [*(space.runtime.command or ()), *space.baseline().argv()]
    assert "mamba-cache-32 (speed): --max-mamba-cache-size 32  [prior reject: server hangs with no error]" in out
    assert "speculative-weaver (speed) (on record, not screened)" in out


def test_space_show_json_with_model_override(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["space", "show", "generic-sglang", "--model", "/models/x", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["path"] == "/models/x"
    assert data["schema_version"] == 1 and len(data["digest"]) == 64
    assert {p["name"] for p in data["parameters"]} >= {"mem-fraction-static", "max-running-requests"}


def test_space_check_shipped(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("qwen3.6-35b-a3b-nvfp4-rtx5090", "qwen3.8-27b-nvfp4-rtx5090"):
        assert main(["space", "check", name]) == 0
    assert capsys.readouterr().out.count("ok: ") == 2
