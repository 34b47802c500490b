"""Preflight on the simulated card: GPU state, the runtime's own flags against the space, traffic, fingerprint."""

from __future__ import annotations

from pathlib import Path

import pytest

from elsa_tune.errors import ConfigError, SpaceError
from elsa_tune.tuner.cli import main
from elsa_tune.tuner.flow.preflight import SIM_HANG_FLOOR_S, SIM_REQUEST_FLOOR_S, run_preflight
from elsa_tune.tuner.flow.settings import Settings

SPACE = "qwen3.8-27b-nvfp4-rtx5090"
PROFILE = "rtx5090-qwen3.8-27b-nvfp4"


def test_preflight_reports_what_affects_measurements(tmp_path: Path) -> None:
    pre = run_preflight(Settings(gpu="sim", sim_profile=PROFILE, space=SPACE, budget_s=480), card_dir=tmp_path)
    text = "\n".join(pre.lines())
    assert pre.gpu_state is not None and pre.gpu_state.uuid in text
    assert "power cap" in text and "other processes: none" in text and "temperature" in text
    assert pre.flags is not None and "mamba-full-memory-ratio" in pre.flags.all_names()
    assert pre.runtime_version == "0.5.23" and pre.fingerprint.runtime == "sglang-sim"
    assert pre.workload.concurrency == 1                      # the baseline's single running slot
    assert 4 <= len(pre.workload) <= len(pre.trace)
    assert pre.fingerprint.gpu_uuid == pre.gpu_state.uuid


def test_on_the_simulator_the_probes_judge_a_stall_in_its_sped_up_time(tmp_path: Path) -> None:
    # the space: hang_s 120, probe_timeout_s 900; at 40x a 120 s stall is 3 s of wall time, floored at 10 s
    pre = run_preflight(Settings(gpu="sim", sim_profile=PROFILE, space=SPACE, budget_s=480, sim_speedup=40.0),
                        card_dir=tmp_path)
    budget = pre.probe_budget()
    assert budget.hang_s == SIM_HANG_FLOOR_S and budget.request_timeout_s == SIM_REQUEST_FLOOR_S
    assert budget.deadline_s == pre.space.probes.probe_timeout_s == 900
    assert budget.headroom_floor_bytes == pre.space.probes.headroom_floor_mib * 2**20
    slow = run_preflight(Settings(gpu="sim", sim_profile=PROFILE, space=SPACE, budget_s=480, sim_speedup=2.0),
                         card_dir=tmp_path)
    assert slow.probe_budget().hang_s == 60.0 and slow.probe_budget().request_timeout_s == 150.0


def test_a_flag_the_runtime_does_not_have_fails_before_the_night(tmp_path: Path) -> None:
    text = Path(__file__).parents[2].joinpath("search_spaces", f"{SPACE}.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("fp4-gemm-backend: flashinfer_cudnn", "fp4-gemm-backnd: flashinfer_cudnn"))
    with pytest.raises(SpaceError, match="fp4-gemm-backnd"):
        run_preflight(Settings(gpu="sim", sim_profile=PROFILE, space=str(bad)), card_dir=tmp_path / "card")


def test_missing_traffic_names_the_remedy(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such traffic file"):
        run_preflight(Settings(gpu="sim", sim_profile=PROFILE, space=SPACE, traffic=str(tmp_path / "nope.parquet")),
                      card_dir=tmp_path)


def test_check_command_prints_the_preflight(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELSA_SIM_CARD_DIR", str(tmp_path))
    assert main(["check", "--gpu", "sim", "--sim-profile", PROFILE, "--space", SPACE]) == 0
    out = capsys.readouterr().out
    assert "preflight passed" in out and "clocks:" in out and "fingerprint" in out
    assert main(["check", "--gpu", "sim", "--space", SPACE]) == 2   # no profile: a usage error, no traceback
