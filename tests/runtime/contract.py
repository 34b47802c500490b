"""``RuntimeContract``: the behaviour every ``Runtime`` implementation must show.

Subclass it in a test module whose class name starts with ``Test`` and implement ``make_runtime``:

    from contract import RuntimeContract

    class TestSimulatedRuntime(RuntimeContract):
        def make_runtime(self, tmp_path, scenario):
            return SimulatedSGLang(..., faults=FAULTS[scenario],
                                   timeouts=RuntimeTimeouts(boot_s=3 if scenario == "hang" else 60))

``scenario`` is one of ``SCENARIOS``; each implementation maps it onto its own means (a fake server's
env var, the simulator's fault injection). ``candidate_for(scenario)`` may be overridden when a
scenario needs particular flags (the default asks ``max-running-requests 4``). Hooks with defaults:

* ``expected_boot_failures``: scenario → the ``FailureKind``s accepted for a failed boot;
* ``leftovers(tmp_path, scenario)``: descriptions of processes/containers still alive (default: none
  known) — the process runtime reports the fake server's recorded pids;
* ``death_timeout_s``: how long ``check`` may take to see a server that died after readiness.
"""

from __future__ import annotations

import abc
import time
from pathlib import Path
from typing import ClassVar

import pytest

from elsa_tune.errors import BootFailed
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.protocol import HealthState, Runtime, Server
from elsa_tune.search_spaces.candidate import Candidate

SCENARIOS = ("ok", "bad_flag", "oom_at_boot", "dies_after_ready", "hang")

_OOM_KINDS = frozenset({FailureKind.WEIGHTS_OOM, FailureKind.NO_ROOM_FOR_KV, FailureKind.MAMBA_POOL_TOO_SMALL,
                        FailureKind.CUDA_GRAPH_FAILED, FailureKind.OOM_UNDER_LOAD})


class RuntimeContract(abc.ABC):
    expected_boot_failures: ClassVar[dict[str, frozenset[FailureKind]]] = {
        "bad_flag": frozenset({FailureKind.BAD_FLAG}),
        "oom_at_boot": _OOM_KINDS,
        "hang": frozenset({FailureKind.BOOT_TIMEOUT, FailureKind.HANG}),
    }
    death_kinds: ClassVar[frozenset[FailureKind]] = _OOM_KINDS | {FailureKind.HOST_OOM_KILLED,
                                                                  FailureKind.TECHNIQUE_CRASH,
                                                                  FailureKind.UNKNOWN_CRASH}
    death_timeout_s: ClassVar[float] = 30.0

    @abc.abstractmethod
    def make_runtime(self, tmp_path: Path, scenario: str) -> Runtime:
        """A runtime that will behave as ``scenario`` says on its next ``start``."""

    def candidate_for(self, scenario: str) -> Candidate:
        return Candidate(flags={"max-running-requests": 4}, label=f"contract-{scenario}")

    def leftovers(self, tmp_path: Path, scenario: str) -> list[str]:
        """Processes or containers of this boot still alive (implementations that can see them override)."""
        return []

    # ---- helpers ------------------------------------------------------------------------------------

    def _boot(self, tmp_path: Path, scenario: str = "ok") -> tuple[Runtime, Server]:
        runtime = self.make_runtime(tmp_path, scenario)
        assert isinstance(runtime, Runtime)
        return runtime, runtime.start(self.candidate_for(scenario), tmp_path / f"boot-{scenario}")

    # ---- the contract -------------------------------------------------------------------------------

    def test_start_returns_a_ready_server_with_its_report(self, tmp_path: Path) -> None:
        runtime, server = self._boot(tmp_path)
        try:
            assert server.base_url.startswith("http://127.0.0.1:") and server.port > 0
            assert server.base_url.endswith(f":{server.port}")
            assert server.log_path.is_file() and server.log_path.parent == server.boot_dir
            assert server.ready_at >= server.started_at
            assert server.candidate == self.candidate_for("ok")
            report = server.report
            assert report.max_total_num_tokens is not None and report.max_total_num_tokens > 0
            assert report.max_running_requests is not None and report.max_running_requests > 0
            asked = self.candidate_for("ok").flags.get("max-running-requests")
            if asked is not None and report.max_running_requests != asked:
                assert any(a.flag == "max-running-requests" and a.evidence for a in report.adjustments)
        finally:
            runtime.stop(server)

    def test_check_sees_a_healthy_server(self, tmp_path: Path) -> None:
        runtime, server = self._boot(tmp_path)
        try:
            health = runtime.check(server)
            assert health.state is HealthState.HEALTHY and health.ok and health.failure is None
        finally:
            runtime.stop(server)

    def test_stop_releases_the_server(self, tmp_path: Path) -> None:
        runtime, server = self._boot(tmp_path)
        ended = runtime.stop(server)
        assert ended.gpu_memory_released, ended.detail
        assert ended.failure is None
        assert ended.seconds >= 0
        assert runtime.check(server).state is HealthState.DEAD
        assert self.leftovers(tmp_path, "ok") == []

    def test_stop_is_idempotent(self, tmp_path: Path) -> None:
        runtime, server = self._boot(tmp_path)
        first = runtime.stop(server)
        second = runtime.stop(server)
        assert second.gpu_memory_released
        assert second.returncode == first.returncode

    @pytest.mark.parametrize("scenario", ["bad_flag", "oom_at_boot", "hang"])
    def test_boot_failure_raises_a_classified_failure_and_leaves_nothing(self, tmp_path: Path, scenario: str) -> None:
        runtime = self.make_runtime(tmp_path, scenario)
        with pytest.raises(BootFailed) as caught:
            runtime.start(self.candidate_for(scenario), tmp_path / f"boot-{scenario}")
        failure = caught.value.failure
        assert failure.kind in self.expected_boot_failures[scenario], failure
        assert failure.phase == "boot"
        assert failure.remedy and failure.summary and failure.evidence
        assert caught.value.remedy == failure.remedy
        assert self.leftovers(tmp_path, scenario) == []

    def test_death_after_ready_is_seen_by_check_and_stop(self, tmp_path: Path) -> None:
        runtime, server = self._boot(tmp_path, "dies_after_ready")
        try:
            deadline = time.monotonic() + self.death_timeout_s
            health = runtime.check(server)
            while health.state is not HealthState.DEAD and time.monotonic() < deadline:
                time.sleep(0.2)
                health = runtime.check(server)
            assert health.state is HealthState.DEAD
            assert health.failure is not None and health.failure.kind in self.death_kinds, health.failure
            assert health.failure.phase == "serve"
        finally:
            ended = runtime.stop(server)
        assert ended.failure is not None and ended.failure.kind == health.failure.kind
        assert ended.gpu_memory_released, ended.detail
        assert self.leftovers(tmp_path, "dies_after_ready") == []
