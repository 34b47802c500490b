"""``elsa-tune log explain`` through the real CLI entry point, on the real log fixtures."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from elsa_tune.runtime.family import FamilyName, family
from elsa_tune.tuner.cli import main

LOGS = Path(__file__).parents[1] / "runtime" / "logs"


def test_explains_a_boot_with_pools_phases_and_no_failure(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["log", "explain", str(LOGS / "hybrid_mamba_qwen35_tp2.log"), "--flags",
                 "python -m sglang.launch_server --model-path Qwen/Qwen3.5-9B --max-running-requests 128 --tp 2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "327,310" in out and "186 slots" in out and "4.48 GB" in out
    assert "load_weights" in out and "cuda_graph" in out
    assert "--max-running-requests: 128 → 62" in out
    assert "evidence: [2026-04-14 16:09:08 TP0] max_total_num_tokens=327310" in out
    assert "Failure" not in out


def test_explains_a_failure_with_evidence_and_remedy(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["log", "explain", str(LOGS / "cuda_graph_oom_5285.log")])
    out = capsys.readouterr().out
    assert code == 1
    assert "Failure: cuda_graph_failed (boot)" in out
    assert "Exception: Capture cuda graph failed: CUDA out of memory" in out
    assert "remedy: lower --cuda-graph-max-bs-decode" in out


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["log", "explain", str(LOGS / "clamp_mamba_cap_38846.log"), "--json",
                 "--flags", "--max-running-requests 32"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["failure"] is None
    (adj,) = data["report"]["adjustments"]
    assert (adj["flag"], adj["requested"], adj["effective"]) == ("max-running-requests", 32, 9)


def test_bad_inputs_are_one_paragraph_errors_without_traceback(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("\n")
    for target in (str(tmp_path / "missing.log"), str(empty)):
        assert main(["log", "explain", target]) == 2
        err = capsys.readouterr().err
        assert err.startswith("elsa-tune: error: ") and "remedy:" in err
        assert "Traceback" not in err


def test_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO((LOGS / "not_enough_memory_4330.log").read_text()))
    assert main(["log", "explain", "-"]) == 1
    assert "no_room_for_kv" in capsys.readouterr().out


def test_read_flags_handles_switches_inline_values_and_commands() -> None:
    candidate = family(FamilyName.SGLANG).read_flags(
        "python3 -m sglang.launch_server --page-size=32 --enable-mixed-chunk --mem-fraction-static 0.9 "
        "--attention-backend flashinfer")
    assert dict(candidate.flags) == {"page-size": "32", "enable-mixed-chunk": True, "mem-fraction-static": 0.9,
                                     "attention-backend": "flashinfer"}
