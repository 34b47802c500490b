"""``SGLangProcess`` specifics beyond the contract: launch errors, pinning, ports, escalation, memory."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest
from test_process_contract import FAKE, fake_runtime, leftover_pids

import elsa_tune.runtime.process as process_module
from elsa_tune.errors import BootFailed, RuntimeUnavailable
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.process import SGLangProcess
from elsa_tune.runtime.protocol import RuntimeTimeouts
from elsa_tune.search_spaces.candidate import Candidate

CANDIDATE = Candidate(flags={"model-path": "/models/fake", "max-running-requests": 4, "enable-mixed-chunk": True,
                             "speculative-algorithm": "EAGLE"}, label="p")


def test_missing_launch_command_is_runtime_unavailable(tmp_path: Path) -> None:
    runtime = SGLangProcess(("/opt/no-such-fork/bin/python", "-m", "sglang.launch_server"))
    with pytest.raises(RuntimeUnavailable) as caught:
        runtime.start(CANDIDATE, tmp_path / "b")
    assert "/opt/no-such-fork/bin/python" in caught.value.message
    assert "launch command" in caught.value.remedy
    with pytest.raises(RuntimeUnavailable):
        SGLangProcess(("no-such-python-anywhere-xyz",)).start(CANDIDATE, tmp_path / "c")


def test_environment_without_sglang_is_runtime_unavailable(tmp_path: Path) -> None:
    with pytest.raises(RuntimeUnavailable) as caught:
        fake_runtime(tmp_path, "no_sglang").start(CANDIDATE, tmp_path / "b")
    assert "install sglang" in caught.value.remedy


def test_boot_pins_gpu_by_uuid_binds_localhost_and_records_everything(tmp_path: Path) -> None:
    runtime = fake_runtime(tmp_path, "ok")
    server = runtime.start(CANDIDATE.with_flags(port=1234, host="0.0.0.0"), tmp_path / "b")
    try:
        assert runtime.gpu is not None
        args = server.report.server_args
        assert args["cuda_visible_devices"] == runtime.gpu.uuid == server.gpu_uuid
        assert args["host"] == "127.0.0.1" and args["port"] == server.port != 1234
        launch = json.loads((server.boot_dir / "launch.json").read_text())
        assert launch["argv"][:2] == [sys.executable, str(FAKE)] and "--port" in launch["argv"]
        assert launch["gpu_used_before_bytes"] is not None
        stored = json.loads((server.boot_dir / "boot_report.json").read_text())
        assert stored["max_total_num_tokens"] == 134016
        by_flag = {a.flag: a for a in server.report.adjustments}
        assert (by_flag["max-running-requests"].requested, by_flag["max-running-requests"].effective) == (4, 2)
        assert "capped to 2" in by_flag["max-running-requests"].evidence
        assert by_flag["enable-mixed-chunk"].reason == "accepted and silently ignored"
        assert server.report.runtime_version == "0.5.23-fake"      # from /server_info
        assert "The server is fired up" in server.log_path.read_text()
    finally:
        runtime.stop(server)


def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path: Path) -> None:
    runtime = fake_runtime(tmp_path, "slow_stop",
                           timeouts=RuntimeTimeouts(boot_s=30.0, stop_s=0.5, memory_release_s=10.0, health_s=2.0))
    server = runtime.start(CANDIDATE, tmp_path / "b")
    ended = runtime.stop(server)
    assert ended.killed and ended.returncode == -9
    assert ended.failure is None          # our own SIGKILL is no crash, and no host OOM kill
    assert ended.gpu_memory_released
    assert leftover_pids(tmp_path) == []


def test_port_taken_between_choice_and_bind_is_retried_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    ports = iter([taken, process_module.free_port()])
    monkeypatch.setattr(process_module, "free_port", lambda host="127.0.0.1": next(ports))
    try:
        runtime = fake_runtime(tmp_path, "ok")
        server = runtime.start(CANDIDATE, tmp_path / "b")
        assert server.port != taken
        assert "address already in use" in (tmp_path / "b" / "server.port-retry-1.log").read_text()
        runtime.stop(server)
        monkeypatch.setattr(process_module, "free_port", lambda host="127.0.0.1": taken)
        with pytest.raises(BootFailed) as caught:
            fake_runtime(tmp_path, "ok", port_retries=0).start(CANDIDATE, tmp_path / "c")
        assert caught.value.failure.kind is FailureKind.PORT_IN_USE
    finally:
        holder.close()
    assert leftover_pids(tmp_path) == []


def test_stop_reports_memory_that_is_not_given_back(tmp_path: Path) -> None:
    runtime = fake_runtime(tmp_path, "ok",
                           timeouts=RuntimeTimeouts(boot_s=30.0, stop_s=2.0, memory_release_s=0.5, health_s=2.0))
    server = runtime.start(CANDIDATE, tmp_path / "b")
    (tmp_path / "gpu" / str(os.getpid())).write_text(str(4 << 30))   # a foreign process grabbed memory meanwhile
    ended = runtime.stop(server)
    assert not ended.gpu_memory_released
    assert "still" in ended.detail and "pre-boot" in ended.detail
    assert leftover_pids(tmp_path) == []
