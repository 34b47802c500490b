"""Studies end to end on the simulated vLLM 0.33.0 (tiny profile): a ``--virtual`` study and ``elsa-tune compare``
of two vLLM flag files through the installed entry point (default tier), and a study that boots real simulated
``vllm serve`` processes (``slow``: minutes of wall clock; a single live boot is in
``tests/runtime/test_sim_vllm.py``). Each boot's log is vLLM's V1
log, read by the vLLM family; the winner is written as a vLLM ``--config`` YAML. Every number is simulated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from elsa_e2e_helpers import E2E_DATA, RunStudy

from elsa_tune.history.records import BootOutcome, Phase
from elsa_tune.history.run_dir import RunDir
from elsa_tune.history.study_record import StudyStatus
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.family import FamilyName, detect
from elsa_tune.tuner.flow.virtual import run_virtual_study

VLLM_SPACE = str(E2E_DATA / "vllm-tiny-space.yaml")
A_FLAGS = """\
# today's vLLM flags on the tiny simulated card: an `elsa-tune compare` A side
model: tiny-hybrid
max-model-len: 4096
gpu-memory-utilization: 0.8
max-num-seqs: 2
max-num-batched-tokens: 2048
"""


def _check_study(run_dir: Path, *, screened: bool = True) -> None:
    history = RunDir(run_dir).load()
    decisions = {d.technique: d for d in history.decisions if d.technique}
    if screened:
        # vLLM's parser takes fp7, its engine config refuses it: refused by the runtime, classified as a bad flag
        refused = decisions["fp7-kv"]
        assert refused.failure is not None and refused.failure.kind is FailureKind.BAD_FLAG
        # the model's whole context does not fit the tiny card's KV cache: vLLM refuses to start
        full = decisions["full-context"]
        assert full.failure is not None and full.failure.kind is FailureKind.NO_ROOM_FOR_KV
        assert "max_model_len" in full.result
    booted = [b for b in history.boots if b.report is not None and b.outcome is not BootOutcome.BOOT_FAILED]
    assert booted
    for boot in booted:
        log = (run_dir / boot.log_path).read_text() if boot.log_path else ""
        family = detect(log)
        assert family is not None and family.name is FamilyName.VLLM
        assert boot.report is not None and boot.report.kv_pool_tokens and boot.report.max_concurrency
    assert {b.fingerprint.runtime for b in history.boots} <= {"vllm-sim", "vllm-sim-virtual"}
    best = run_dir / "best"
    config = yaml.safe_load((best / "server-args.yaml").read_text())
    assert config["model"] == "tiny-hybrid" and config["max-model-len"] == 4096
    assert set(config) <= {"model", "max-model-len", "gpu-memory-utilization", "max-num-seqs",
                           "max-num-batched-tokens", "kv-cache-dtype", "enforce-eager", "speculative-config",
                           "host", "port"}
    assert "vllm serve --config server-args.yaml" in (best / "server-args.yaml").read_text()
    assert "vllm" in (best / "docker-compose.yml").read_text()


def test_a_virtual_vllm_study(tmp_path: Path, small_trace: Path) -> None:
    result = run_virtual_study(profile="tiny-test", space=VLLM_SPACE, out=tmp_path / "study",
                               traffic=str(small_trace), budget_s=3600, seed=2)
    assert result.status == "finished"
    _check_study(Path(result.run_dir))


@pytest.mark.slow
def test_a_vllm_study_on_live_simulated_servers(run_study: RunStudy, small_trace: Path) -> None:
    # a short wall-clock budget: the baseline boots, probes and measures; screening needs the slow tier's budget
    outcome = run_study(space=VLLM_SPACE, traffic=str(small_trace), budget_s=25.0, sim_speedup=40.0)
    assert outcome.status is StudyStatus.FINISHED
    run_dir = Path(outcome.run_dir)
    _check_study(run_dir, screened=False)
    history = RunDir(run_dir).load()
    # real processes: each boot's log was written by `elsa-tune sim serve --family vllm`
    assert all(b.log_path and "Starting vLLM server on http://127.0.0.1:" in (run_dir / b.log_path).read_text()
               for b in history.boots if b.outcome is not BootOutcome.BOOT_FAILED)


def test_compare_two_vllm_flag_files(tmp_path: Path, small_trace: Path) -> None:
    (tmp_path / "a.yaml").write_text(A_FLAGS)
    (tmp_path / "b.yaml").write_text(A_FLAGS + "kv-cache-dtype: fp8\n")
    env = {**os.environ, "ELSA_SIM_CARD_DIR": str(tmp_path / "cards")}
    proc = subprocess.run([sys.executable, "-m", "elsa_tune", "compare", "--a", "a.yaml", "--b", "b.yaml",
                           "--gpu", "sim", "--sim-profile", "tiny-test", "--space", VLLM_SPACE, "--traffic",
                           str(small_trace), "--out", "fp8", "--baseline-boots", "3", "--virtual", "--json",
                           "-q"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert proc.returncode == result["exit_code"] and result["outcome"] != "B failed", proc.stderr[-3000:]
    assert result["simulated"] is True and result["context"]["runtime"] == "vllm-sim-virtual"
    history = RunDir(tmp_path / "fp8").load()
    assert all(b.phase is Phase.COMPARE and b.outcome is BootOutcome.MEASURED for b in history.boots)
    pools = {b.candidate.flags.get("kv-cache-dtype"): b.report.kv_pool_tokens for b in history.boots if b.report}
    assert pools[None] and pools["fp8"] and 1.9 < pools["fp8"] / pools[None] < 2.1   # fp8 doubles the pool
    for boot in history.boots:
        log = (tmp_path / "fp8" / boot.log_path).read_text() if boot.log_path else ""
        assert "GPU KV cache size:" in log and "Uvicorn running on" not in log
