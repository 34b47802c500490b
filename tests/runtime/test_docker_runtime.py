"""``SGLangDocker`` through the real docker SDK against a fake Docker Engine API (no engine runs here).

The create payload is asserted exactly as the engine receives it, and the whole ``Runtime`` contract
runs with the fake engine starting scripted fake SGLang servers as its "containers".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from contract import RuntimeContract
from fake_docker_engine import IMAGE, FakeDockerEngine
from fake_gpu import DirectoryGpu
from test_process_contract import leftover_pids

from elsa_tune.errors import RuntimeUnavailable
from elsa_tune.runtime.docker import SGLangDocker
from elsa_tune.runtime.protocol import Runtime, RuntimeTimeouts
from elsa_tune.search_spaces.candidate import Candidate


@pytest.fixture
def engine() -> Iterator[FakeDockerEngine]:
    fake = FakeDockerEngine()
    yield fake
    fake.close()


def docker_runtime(engine: FakeDockerEngine, tmp_path: Path, scenario: str, **overrides: object) -> SGLangDocker:
    env = {"FAKE_SGLANG_SCENARIO": scenario, "FAKE_SGLANG_PIDS": str(tmp_path / "pids"),
           "FAKE_SGLANG_GPU_DIR": str(tmp_path / "gpu"), "FAKE_SGLANG_BYTES": str(2 << 30),
           "FAKE_SGLANG_DIE_AFTER_S": "1.5"}
    options: dict[str, object] = {
        "client": docker.DockerClient(base_url=engine.base_url, version="1.43", timeout=60),
        "model_dir": tmp_path / "models", "hf_cache": tmp_path / "hf", "shm_size": "16g", "extra_env": env,
        "timeouts": RuntimeTimeouts(boot_s=2.0 if scenario == "hang" else 30.0, stop_s=2.0, memory_release_s=10.0,
                                    health_s=2.0)}
    options.update(overrides)
    return SGLangDocker(IMAGE, DirectoryGpu(tmp_path / "gpu"), **options)  # type: ignore[arg-type]


class TestDockerRuntime(RuntimeContract):
    @pytest.fixture(autouse=True)
    def _engine(self, engine: FakeDockerEngine) -> None:
        self.engine = engine

    def make_runtime(self, tmp_path: Path, scenario: str) -> Runtime:
        return docker_runtime(self.engine, tmp_path, scenario)

    def candidate_for(self, scenario: str) -> Candidate:
        flags: dict[str, str | int | bool] = {"model-path": "/model/fake", "max-running-requests": 4}
        if scenario == "bad_flag":
            flags["cuda-graph-max-bs"] = 16
        return Candidate(flags=flags, env={"SGLANG_TEST": "1"}, label=f"contract-{scenario}")

    def leftovers(self, tmp_path: Path, scenario: str) -> list[str]:
        return leftover_pids(tmp_path) + [f"container {name} not removed" for name in self.engine.live()]


def test_create_payload_is_exactly_what_the_engine_receives(engine: FakeDockerEngine, tmp_path: Path) -> None:
    runtime = docker_runtime(engine, tmp_path, "ok", ipc_host=True)
    candidate = Candidate(flags={"model-path": "/model/fake", "mem-fraction-static": 0.9, "enable-metrics": True},
                          env={"SGLANG_X": "1"})
    server = runtime.start(candidate, tmp_path / "boot")
    try:
        (create,) = engine.created()
        body = create.body
        assert create.query["name"] == [f"elsa-tune-{candidate.key()}-{server.port}"]
        assert body["Image"] == IMAGE
        assert body["Cmd"] == ["python3", "-m", "sglang.launch_server", "--enable-metrics", "--mem-fraction-static",
                               "0.9", "--model-path", "/model/fake", "--host", "0.0.0.0", "--port", "30000"]
        env = dict(item.split("=", 1) for item in body["Env"])
        assert env["SGLANG_X"] == "1" and env["PYTHONUNBUFFERED"] == "1" and "CUDA_VISIBLE_DEVICES" not in env
        host = body["HostConfig"]
        assert host["DeviceRequests"] == [{"Driver": "", "Count": 0, "DeviceIDs": [runtime.gpu.uuid if runtime.gpu
                                                                                    else ""],
                                           "Capabilities": [["gpu"]], "Options": {}}]
        assert host["PortBindings"] == {"30000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(server.port)}]}
        assert host["ShmSize"] == 16 << 30
        assert host.get("Privileged", False) is False      # the SDK sends the key only when it is true
        assert host["IpcMode"] == "host"
        assert sorted(host["Binds"]) == sorted([f"{tmp_path / 'models'}:/model:ro",
                                                f"{tmp_path / 'hf'}:/root/.cache/huggingface:rw"])
        assert body["Labels"]["elsa-tune.candidate"] == candidate.key()
        assert server.handle == next(c.id for c in engine.containers.values())
        assert "The server is fired up" in server.log_path.read_text()
        assert server.report.max_total_num_tokens == 134016
    finally:
        ended = runtime.stop(server)
    actions = [(r.method, r.path.rsplit("/", 1)[-1]) for r in engine.requests if r.path.startswith("/containers/")]
    assert ("POST", "stop") in actions and ("DELETE", server.handle) in actions
    assert ended.gpu_memory_released and engine.live() == []


def test_missing_image_and_unreachable_engine_are_runtime_unavailable(engine: FakeDockerEngine,
                                                                      tmp_path: Path) -> None:
    client = docker.DockerClient(base_url=engine.base_url, version="1.43", timeout=10)
    with pytest.raises(RuntimeUnavailable) as caught:
        SGLangDocker("no/such:image", client=client).start(Candidate(), tmp_path / "a")
    assert "docker pull no/such:image" in caught.value.remedy
    dead = docker.DockerClient(base_url="tcp://127.0.0.1:9", version="1.43", timeout=5)
    with pytest.raises(RuntimeUnavailable) as unreachable:
        SGLangDocker(IMAGE, client=dead).start(Candidate(), tmp_path / "b")
    assert "Docker" in unreachable.value.remedy


def test_sigterm_ignored_is_killed_by_the_engine_and_removed(engine: FakeDockerEngine, tmp_path: Path) -> None:
    runtime = docker_runtime(engine, tmp_path, "slow_stop",
                             timeouts=RuntimeTimeouts(stop_s=1.0, memory_release_s=10.0, health_s=2.0))
    server = runtime.start(Candidate(flags={"model-path": "/model/fake"}), tmp_path / "boot")
    ended = runtime.stop(server)
    assert ended.killed and ended.returncode == 137
    assert engine.live() == [] and leftover_pids(tmp_path) == []
