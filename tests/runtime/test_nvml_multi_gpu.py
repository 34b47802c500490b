"""Two real GPUs of one host (run on a 2-GPU device: ``pytest -m gpu tests/runtime/test_nvml_multi_gpu.py``).

``--gpu 0,1`` means one server per GPU, each pinned by UUID, each GPU's memory and processes its own: that is
what keeps one worker's boots from being measured on, or blamed on, the other card (issue 8). Two
``SGLangProcess`` servers run at once; NVML must attribute each server's allocation to its own GPU only, and
stopping one must release that GPU while the other keeps serving.

Skips with fewer than two GPUs. The torch interpreter is found as in ``test_nvml_gpu.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

# the one-GPU tests' server prints the UUID of the one device it sees; their holder just allocates
from test_nvml_gpu import ALLOC_GIB, HOLDER, SERVER, torch_python  # type: ignore[import-not-found]

from elsa_tune.runtime.nvml import list_gpus, open_gpu
from elsa_tune.runtime.process import SGLangProcess, wait_memory_released
from elsa_tune.runtime.protocol import RuntimeTimeouts
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.tuner.fleet.worker_pool import parse_gpus

pytestmark = pytest.mark.gpu

MARGIN = 256 << 20


def _torch_python() -> str:
    return str(torch_python())


def _two_gpus() -> tuple[int, int]:
    gpus = list_gpus()
    if len(gpus) < 2:
        pytest.skip(f"needs two GPUs, this host has {len(gpus)}")
    return 0, 1


def _log_text(folder: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in folder.rglob("*.log"))


def test_gpu_list_maps_to_distinct_cards() -> None:
    first, second = _two_gpus()
    assert parse_gpus(f"{first},{second}") == [str(first), str(second)]
    with open_gpu(first) as a, open_gpu(second) as b:
        assert a.uuid != b.uuid and a.uuid.startswith("GPU-") and b.uuid.startswith("GPU-")
        with open_gpu(b.uuid) as by_uuid:           # a UUID names the same card as its index
            assert by_uuid.index == b.index
        print(f"GPU {a.index}: {a.uuid}; GPU {b.index}: {b.uuid}")


def test_two_servers_are_pinned_and_accounted_per_gpu(tmp_path: Path) -> None:
    first, second = _two_gpus()
    script = tmp_path / "gpu_server.py"
    script.write_text(SERVER)
    python = _torch_python()
    with open_gpu(first) as a, open_gpu(second) as b:
        before = {a.uuid: a.memory().used, b.uuid: b.memory().used}
        runtimes = [SGLangProcess((python, str(script)), gpu, timeouts=RuntimeTimeouts(boot_s=300, stop_s=10),
                                  memory_margin_bytes=MARGIN) for gpu in (a, b)]
        servers = []
        try:
            for runtime, gpu in zip(runtimes, (a, b), strict=True):
                servers.append(runtime.start(Candidate(label=f"gpu{gpu.index}"), tmp_path / f"boot-gpu{gpu.index}"))
            for gpu in (a, b):
                assert gpu.memory().used - before[gpu.uuid] >= (ALLOC_GIB << 30) * 0.95, gpu.index
            # Each server saw exactly its own card: torch's UUID (without the "GPU-" prefix) is NVML's.
            for gpu in (a, b):
                text = _log_text(tmp_path / f"boot-gpu{gpu.index}")
                assert f"visible device uuid {gpu.uuid.removeprefix('GPU-')}" in text, text[-2000:]
            pids_a = {p.pid for p in a.processes()}
            pids_b = {p.pid for p in b.processes()}
            assert pids_a and pids_b and not pids_a & pids_b, (pids_a, pids_b)
            # Stopping GPU 0's server releases GPU 0 only; GPU 1's server keeps serving.
            ended = runtimes[0].stop(servers[0])
            assert ended.gpu_memory_released, ended.detail
            assert a.memory().used <= before[a.uuid] + MARGIN
            assert b.memory().used - before[b.uuid] >= (ALLOC_GIB << 30) * 0.95
            assert runtimes[1].check(servers[1]).ok
            print(f"GPU {a.index} released in {ended.seconds:.2f} s while GPU {b.index} kept serving")
        finally:
            for runtime, server in zip(runtimes, servers, strict=False):
                runtime.stop(server)


def test_a_busy_gpu_does_not_make_the_other_busy() -> None:
    first, second = _two_gpus()
    with open_gpu(first) as a, open_gpu(second) as b:
        before = a.memory().used
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": a.uuid}
        holder = subprocess.Popen([_torch_python(), "-c", HOLDER], env=env, stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().startswith("allocated 1")
            deadline = time.monotonic() + 10
            while holder.pid not in {p.pid for p in a.processes()} and time.monotonic() < deadline:
                time.sleep(0.2)
            assert holder.pid in {p.pid for p in a.processes()}      # preflight refuses this card…
            assert holder.pid not in {p.pid for p in b.processes()}  # …and not the other
        finally:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait(timeout=30)
            if holder.stdout is not None:
                holder.stdout.close()
        released, detail = wait_memory_released(a, before, timeout_s=60, margin_bytes=MARGIN)
        assert released, detail
