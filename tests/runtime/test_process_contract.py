"""The ``Runtime`` contract against the real ``SGLangProcess`` driving scripted fake SGLang servers."""

from __future__ import annotations

import sys
from pathlib import Path

from contract import RuntimeContract
from fake_gpu import DirectoryGpu

from elsa_tune.runtime.process import SGLangProcess
from elsa_tune.runtime.protocol import Runtime, RuntimeTimeouts
from elsa_tune.search_spaces.candidate import Candidate

FAKE = Path(__file__).with_name("fake_sglang.py")


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def fake_runtime(tmp_path: Path, scenario: str, **overrides: object) -> SGLangProcess:
    env = {"FAKE_SGLANG_SCENARIO": scenario, "FAKE_SGLANG_PIDS": str(tmp_path / "pids"),
           "FAKE_SGLANG_GPU_DIR": str(tmp_path / "gpu"), "FAKE_SGLANG_BYTES": str(2 << 30),
           "FAKE_SGLANG_DIE_AFTER_S": "1.5"}
    hang = scenario == "hang"
    timeouts = RuntimeTimeouts(boot_s=2.0 if hang else 30.0, stop_s=1.0 if hang else 2.0, memory_release_s=10.0,
                               health_s=2.0)
    options: dict[str, object] = {"timeouts": timeouts, "extra_env": env}
    options.update(overrides)
    return SGLangProcess((sys.executable, str(FAKE)), DirectoryGpu(tmp_path / "gpu"), **options)  # type: ignore[arg-type]


def leftover_pids(tmp_path: Path) -> list[str]:
    pid_file = tmp_path / "pids"
    pids = [int(p) for p in pid_file.read_text().split()] if pid_file.exists() else []
    return [f"pid {pid} still alive" for pid in pids if alive(pid)]


class TestProcessRuntime(RuntimeContract):
    def make_runtime(self, tmp_path: Path, scenario: str) -> Runtime:
        return fake_runtime(tmp_path, scenario)

    def candidate_for(self, scenario: str) -> Candidate:
        flags: dict[str, str | int | bool] = {"model-path": "/models/fake", "max-running-requests": 4}
        if scenario == "bad_flag":
            flags["cuda-graph-max-bs"] = 16   # gone in 0.5.23 (sglang.md §0)
        return Candidate(flags=flags, label=f"contract-{scenario}")

    def leftovers(self, tmp_path: Path, scenario: str) -> list[str]:
        return leftover_pids(tmp_path)
