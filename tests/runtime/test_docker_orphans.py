"""``SGLangDocker.reap_orphans``: the container of a SIGKILLed tuner is found by its owner labels and removed.

A child Python process starts a container through the real docker SDK against the fake engine (which runs it
as a local process group) and is SIGKILLed; the container keeps running, like a real one would.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from fake_docker_engine import IMAGE, FakeDockerEngine
from fake_gpu import DirectoryGpu
from test_process_contract import leftover_pids

from elsa_tune.runtime.docker import BASELINE_LABEL, GPU_LABEL, LEASE_LABEL, SGLangDocker
from elsa_tune.runtime.lease import Owner
from elsa_tune.runtime.protocol import RuntimeTimeouts
from elsa_tune.search_spaces.candidate import Candidate

HERE = Path(__file__).resolve().parent
CANDIDATE = Candidate(flags={"model-path": "/model/fake"}, label="orphan")

#: A tuner that starts one container, says which, and waits to be killed.
_OWNER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    import docker
    from fake_gpu import DirectoryGpu
    from elsa_tune.runtime.docker import SGLangDocker
    from elsa_tune.runtime.protocol import RuntimeTimeouts
    from elsa_tune.search_spaces.candidate import Candidate
    base_url, root, env = sys.argv[2], Path(sys.argv[3]), json.loads(sys.argv[4])
    client = docker.DockerClient(base_url=base_url, version="1.43", timeout=60)
    runtime = SGLangDocker("fake/sglang:test", DirectoryGpu(root / "gpu"), client=client, extra_env=env,
                           timeouts=RuntimeTimeouts(boot_s=30.0))
    server = runtime.start(Candidate(flags={"model-path": "/model/fake"}, label="orphan"), root / "boot")
    print(json.dumps({"id": server.handle}), flush=True)
    time.sleep(600)
""")


@pytest.fixture
def engine() -> Iterator[FakeDockerEngine]:
    fake = FakeDockerEngine()
    yield fake
    fake.close()


def fake_env(tmp_path: Path) -> dict[str, str]:
    return {"FAKE_SGLANG_SCENARIO": "ok", "FAKE_SGLANG_PIDS": str(tmp_path / "pids"),
            "FAKE_SGLANG_GPU_DIR": str(tmp_path / "gpu"), "FAKE_SGLANG_BYTES": str(2 << 30)}


def runtime_for(engine: FakeDockerEngine, tmp_path: Path, gpu_uuid: str | None = None) -> SGLangDocker:
    gpu = DirectoryGpu(tmp_path / "gpu") if gpu_uuid is None else DirectoryGpu(tmp_path / "gpu", uuid=gpu_uuid)
    return SGLangDocker(IMAGE, gpu, client=docker.DockerClient(base_url=engine.base_url, version="1.43", timeout=60),
                        extra_env=fake_env(tmp_path),
                        timeouts=RuntimeTimeouts(boot_s=30.0, stop_s=2.0, memory_release_s=10.0))


def start_and_kill_owner(engine: FakeDockerEngine, tmp_path: Path) -> tuple[str, int]:
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(HERE), engine.base_url, str(tmp_path),
                              json.dumps(fake_env(tmp_path))], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                             text=True)
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()   # bounded by the child's boot timeout (30 s)
        assert line, f"the owner exited with {owner.wait(timeout=10)} before its container was ready"
        container_id: str = json.loads(line)["id"]
    finally:
        owner.kill()
        owner.wait(timeout=10)
        if owner.stdout is not None:
            owner.stdout.close()
    return container_id, owner.pid


def test_a_killed_tuners_container_is_stopped_and_removed(engine: FakeDockerEngine, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    container_id, owner_pid = start_and_kill_owner(engine, tmp_path)
    labels = engine.created()[0].body["Labels"]
    assert labels[LEASE_LABEL] == "1" and labels["elsa-tune.owner-pid"] == str(owner_pid)
    assert labels[GPU_LABEL] == DirectoryGpu(tmp_path / "gpu").uuid and int(labels[BASELINE_LABEL]) > 0
    owner = Owner.from_labels(labels)
    assert owner is not None and owner.is_dead()
    assert engine.containers[container_id].status == "running"        # orphaned, still on the GPU
    assert runtime_for(engine, tmp_path, gpu_uuid="GPU-another-card").reap_orphans() == []   # not that GPU's
    assert engine.containers[container_id].status == "running"
    runtime = runtime_for(engine, tmp_path)
    with caplog.at_level(logging.WARNING, logger="elsa_tune.runtime.docker"):
        (reaped,) = runtime.reap_orphans()
    assert reaped.stopped == (container_id,) and reaped.owner.pid == owner_pid and reaped.gpu_memory_released
    assert engine.live() == [] and leftover_pids(tmp_path) == []
    assert container_id[:12] in caplog.text and "orphaned" in caplog.text
    actions = [(r.method, r.path.rsplit("/", 1)[-1]) for r in engine.requests if container_id in r.path]
    assert ("POST", "stop") in actions and ("DELETE", container_id) in actions
    assert runtime.reap_orphans() == []


def test_a_live_owners_container_is_left_alone(engine: FakeDockerEngine, tmp_path: Path) -> None:
    runtime = runtime_for(engine, tmp_path)
    server = runtime.start(CANDIDATE, tmp_path / "boot")
    try:
        assert engine.created()[0].body["Labels"]["elsa-tune.owner-pid"] == str(Owner.me().pid)
        assert runtime_for(engine, tmp_path).reap_orphans() == []
        assert engine.containers[server.handle].status == "running"
    finally:
        runtime.stop(server)
    assert engine.live() == []
