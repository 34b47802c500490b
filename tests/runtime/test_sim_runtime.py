"""``SimulatedSGLang`` against the Runtime contract, and every injected fault classified as its kind."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from contract import RuntimeContract

from elsa_tune.errors import BootFailed
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.protocol import HealthState, Runtime
from elsa_tune.runtime.sim.faults import BOOT_CRASH_KIND
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.runtime.sim.runtime import SIM_TIMEOUTS, SimulatedSGLang
from elsa_tune.search_spaces.candidate import Candidate

PROFILE = "rtx5090-qwen3.6-35b-a3b-nvfp4"
SPEEDUP = 50.0
BASE_FLAGS = {"moe-runner-backend": "cutlass"}

_SCENARIO_FAULTS = {"ok": None, "bad_flag": None, "oom_at_boot": "no_room_for_kv",
                    "dies_after_ready": "crash_after_requests=0", "hang": "hang"}


def runtime_for(tmp_path: Path, faults: str | None, *, boot_timeout_s: float = 90.0) -> SimulatedSGLang:
    return SimulatedSGLang(PROFILE, card_dir=tmp_path / "card", seed=5, speedup=SPEEDUP, faults=faults,
                           timeouts=replace(SIM_TIMEOUTS, boot_s=boot_timeout_s, stop_s=10.0, memory_release_s=15.0))


@pytest.mark.slow
class TestSimulatedRuntimeContract(RuntimeContract):
    death_timeout_s: ClassVar[float] = 20.0

    def make_runtime(self, tmp_path: Path, scenario: str) -> Runtime:
        return runtime_for(tmp_path, _SCENARIO_FAULTS[scenario], boot_timeout_s=10.0 if scenario == "hang" else 90.0)

    def candidate_for(self, scenario: str) -> Candidate:
        flags: dict[str, object] = {**BASE_FLAGS, "max-running-requests": 4}
        if scenario == "bad_flag":
            flags["enable-turbo-mode"] = True
        return Candidate(flags=flags, label=f"contract-{scenario}")  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(BOOT_CRASH_KIND))
def test_each_boot_fault_is_classified(tmp_path: Path, fault: str) -> None:
    runtime = runtime_for(tmp_path, fault)
    with pytest.raises(BootFailed) as caught:
        runtime.start(Candidate(flags=BASE_FLAGS), tmp_path / "boot")
    failure = caught.value.failure
    assert failure.kind is BOOT_CRASH_KIND[fault], failure
    assert failure.phase == "boot" and failure.exit_code == -9
    assert runtime.gpu.memory().used < 2 * 1024**3   # the dead server's memory is gone


def test_a_real_plan_failure_is_classified_without_any_fault(tmp_path: Path) -> None:
    runtime = runtime_for(tmp_path, None)
    with pytest.raises(BootFailed) as caught:
        runtime.start(Candidate(flags={**BASE_FLAGS, "mem-fraction-static": 0.5}), tmp_path / "boot")
    assert caught.value.failure.kind is FailureKind.NO_ROOM_FOR_KV


def test_crash_after_requests_is_seen_as_oom_under_load(tmp_path: Path) -> None:
    runtime = runtime_for(tmp_path, "crash_after_requests=2")
    server = runtime.start(Candidate(flags=BASE_FLAGS), tmp_path / "boot")
    try:
        for i in range(2):
            try:
                httpx.post(server.base_url + "/v1/completions",
                           json={"prompt": list(range(i, i + 30)), "max_tokens": 4}, timeout=30, trust_env=False)
            except httpx.RemoteProtocolError:
                assert i == 1   # the second request's completion kills the scheduler before the response
        deadline = time.monotonic() + 20
        health = runtime.check(server)
        while health.state is not HealthState.DEAD and time.monotonic() < deadline:
            time.sleep(0.1)
            health = runtime.check(server)
        assert health.failure is not None and health.failure.kind is FailureKind.OOM_UNDER_LOAD
        assert health.failure.phase == "serve"
    finally:
        runtime.stop(server)


@pytest.mark.slow
def test_hang_after_requests_stalls_tokens_while_health_answers(tmp_path: Path) -> None:
    runtime = runtime_for(tmp_path, "hang_after_requests=1")
    server = runtime.start(Candidate(flags=BASE_FLAGS), tmp_path / "boot")
    try:
        ok = httpx.post(server.base_url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 3},
                        timeout=30, trust_env=False)
        assert ok.status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.base_url + "/v1/completions", json={"prompt": [4, 5, 6], "max_tokens": 3},
                       timeout=2, trust_env=False)
        assert runtime.check(server).state is HealthState.HEALTHY
    finally:
        runtime.stop(server)


@pytest.mark.slow
def test_port_taken_is_classified(tmp_path: Path) -> None:
    runtime = runtime_for(tmp_path, "port_taken")
    runtime.port_retries = 0
    with pytest.raises(BootFailed) as caught:
        runtime.start(Candidate(flags=BASE_FLAGS), tmp_path / "boot")
    assert caught.value.failure.kind is FailureKind.PORT_IN_USE


@pytest.mark.slow
def test_slow_boot_times_out(tmp_path: Path) -> None:
    runtime = runtime_for(tmp_path, "slow_boot=50", boot_timeout_s=3.0)
    with pytest.raises(BootFailed) as caught:
        runtime.start(Candidate(flags=BASE_FLAGS), tmp_path / "boot")
    assert caught.value.failure.kind is FailureKind.BOOT_TIMEOUT


@pytest.mark.slow
def test_memory_not_released_holds_the_card_after_stop(tmp_path: Path) -> None:
    runtime = runtime_for(tmp_path, "gpu_not_released=6")
    runtime.timeouts = replace(runtime.timeouts, memory_release_s=0.5)
    server = runtime.start(Candidate(flags=BASE_FLAGS), tmp_path / "boot")
    assert runtime.gpu.memory().used > 20 * 1024**3
    ended = runtime.stop(server)
    assert not ended.gpu_memory_released, ended
    deadline = time.monotonic() + 15
    while runtime.gpu.memory().used > 2 * 1024**3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert runtime.gpu.memory().used < 2 * 1024**3


@pytest.mark.slow
def test_boots_differ_in_drift_but_not_in_greedy_text(tmp_path: Path) -> None:
    runtime = runtime_for(tmp_path, None)
    texts = []
    for i in range(2):
        server = runtime.start(Candidate(flags=BASE_FLAGS), tmp_path / f"boot-{i}")
        try:
            body = {"prompt": list(range(300, 360)), "max_tokens": 30, "temperature": 0}
            texts.append(httpx.post(server.base_url + "/v1/completions", json=body, timeout=30,
                                    trust_env=False).json()["choices"][0]["text"])
            assert "--sim-seed" in (server.boot_dir / "launch.json").read_text()
        finally:
            runtime.stop(server)
    assert texts[0] == texts[1]


@pytest.mark.slow
def test_seed_004_boots_then_dies_on_its_first_generation(tmp_path: Path) -> None:
    # Without MTP at --mem-fraction-static 0.97 the pool leaves no workspace: /v1/models answers, generation dies.
    profile = "rtx5090-qwen3.8-27b-nvfp4"
    config = load_profile(profile).config("no-mtp-0.97")
    runtime = SimulatedSGLang(profile, card_dir=tmp_path / "card", speedup=SPEEDUP,
                              timeouts=replace(SIM_TIMEOUTS, boot_s=90.0))
    server = runtime.start(Candidate(flags=config.flags, env=config.env), tmp_path / "boot")
    try:
        assert httpx.get(server.base_url + "/v1/models", timeout=10, trust_env=False).status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.post(server.base_url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 8},
                       timeout=30, trust_env=False)
        deadline = time.monotonic() + 20
        health = runtime.check(server)
        while health.state is not HealthState.DEAD and time.monotonic() < deadline:
            time.sleep(0.1)
            health = runtime.check(server)
        assert health.failure is not None and health.failure.kind is FailureKind.OOM_UNDER_LOAD
        assert any("Triton Error [CUDA]: out of memory" in line for line in health.failure.evidence)
    finally:
        runtime.stop(server)
