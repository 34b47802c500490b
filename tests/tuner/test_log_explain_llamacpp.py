"""``elsa-tune log explain`` on real llama-server logs (``tests/runtime/logs/llamacpp/``), through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elsa_tune.runtime.family import FamilyName, family
from elsa_tune.tuner.cli import main

LOGS = Path(__file__).parents[1] / "runtime" / "logs" / "llamacpp"


def test_explains_a_boot_per_slot_with_buffers_and_the_split(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["log", "explain", str(LOGS / "normal_c4096_np4.log"), "--flags",
                 "llama-server -m tiny.gguf -c 4096 -np 4"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("Boot report (llama.cpp)")
    assert "context per slot (n_ctx_seq)  1,024" in out and "slots (-np)                   4" in out
    assert "1.00 MiB, 4,096 cells, type f16" in out and "one share per slot" in out
    assert "CPU kv                        1.00 MiB" in out and "CPU compute" in out
    assert "--ctx-size: 4096 → 1024  [split across 4 slots" in out
    assert "evidence: 0.00.035.062 I llama_context: n_ctx_seq             = 1024" in out or "n_ctx_seq" in out
    assert "Failure" not in out


def test_explains_adjustments_the_log_alone_proves(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "explain", str(LOGS / "draft_unused.log")]) == 0
    out = capsys.readouterr().out
    assert "--model-draft: 'draft.gguf' → unused" in out and "no implementations specified" in out
    assert "CPU_Mapped draft-model" in out


def test_explains_a_failure_with_its_remedy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "explain", str(LOGS / "host_oom_kv.log")]) == 1
    out = capsys.readouterr().out
    assert "Failure: no_room_for_kv (boot)" in out and "ggml_aligned_malloc: insufficient memory" in out
    assert "remedy: lower -c" in out


@pytest.mark.parametrize(("name", "kind"), [("bad_flag", "bad_flag"), ("missing_model", "model_load_failed"),
                                            ("compute_buffer_oom", "compute_buffer_oom"),
                                            ("context_exceeded", "context_exceeded"), ("port_in_use", "port_in_use")])
def test_json_names_the_family_and_the_failure(name: str, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "explain", str(LOGS / f"{name}.log"), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["family"] == "llamacpp" and data["failure"]["kind"] == kind and data["failure"]["remedy"]


def test_read_flags_short_and_long_spellings() -> None:
    candidate = family(FamilyName.LLAMACPP).read_flags(
        "./llama-server -m tiny.gguf -c 4096 -np 4 --flash-attn=on -kvu -lv -1")
    assert dict(candidate.flags) == {"model": "tiny.gguf", "ctx-size": 4096, "parallel": 4, "flash-attn": "on",
                                     "kv-unified": True, "log-verbosity": -1}
