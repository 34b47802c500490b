"""NVML on a real NVIDIA GPU (run on the device machine: ``pytest -m gpu tests/runtime/test_nvml_gpu.py``).

A torch process allocates GPU memory: the monitor must see it (memory and compute processes); a
``SGLangProcess``-style stop (kill the process group) must then wait until the memory is released. The
second test drives the real ``SGLangProcess`` with a tiny server that allocates on the GPU, which also
proves the UUID pinning (``CUDA_VISIBLE_DEVICES=<uuid>`` shows exactly one device to the child).

The torch interpreter is ``ELSA_TORCH_PYTHON``, else ``ELSA_SGLANG_PYTHON``, else this one if it has torch.
The GPU is ``ELSA_GPU`` (index or UUID), default 0.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elsa_tune.runtime.nvml import open_gpu
from elsa_tune.runtime.process import SGLangProcess, wait_memory_released
from elsa_tune.runtime.protocol import RuntimeTimeouts
from elsa_tune.search_spaces.candidate import Candidate

pytestmark = pytest.mark.gpu

ALLOC_GIB = 4

HOLDER = f"""
import sys, time, torch
x = torch.empty({ALLOC_GIB} << 30, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print("allocated", torch.cuda.device_count(), flush=True)
time.sleep(600)
"""

SERVER = f"""
import sys, time, threading, torch
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
assert torch.cuda.device_count() == 1, torch.cuda.device_count()
uuid = str(torch.cuda.get_device_properties(0).uuid)
x = torch.empty({ALLOC_GIB} << 30, dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize()
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a): pass
srv = ThreadingHTTPServer(("127.0.0.1", port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print("visible device uuid", uuid, flush=True)
print("[2026-01-01 00:00:00 TP0] max_total_num_tokens=1, chunked_prefill_size=1, max_prefill_tokens=1, "
      "max_running_requests=1, context_len=1, available_gpu_mem=1.00 GB", flush=True)
print("The server is fired up and ready to roll!", flush=True)
time.sleep(600)
"""


def torch_python() -> str:
    for var in ("ELSA_TORCH_PYTHON", "ELSA_SGLANG_PYTHON"):
        if os.environ.get(var):
            return os.environ[var]
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    pytest.skip("no Python with torch: set ELSA_TORCH_PYTHON")


def gpu_spec() -> int | str:
    spec = os.environ.get("ELSA_GPU", "0")
    return int(spec) if spec.isdigit() else spec


def test_monitor_sees_a_torch_allocation_and_stop_waits_for_its_release() -> None:
    with open_gpu(gpu_spec()) as gpu:
        state = gpu.state()
        assert state.uuid.startswith("GPU-") and state.memory_total > 0 and state.driver
        before = gpu.memory().used
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu.uuid}
        holder = subprocess.Popen([torch_python(), "-c", HOLDER], env=env, stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        try:
            assert holder.stdout is not None
            line = holder.stdout.readline()
            assert line.startswith("allocated 1"), line
            seen = gpu.memory().used
            assert seen - before >= (ALLOC_GIB << 30) * 0.95, (before, seen)
            procs = gpu.processes()
            assert procs and any((p.used_bytes or 0) >= (ALLOC_GIB << 30) * 0.95 for p in procs), procs
        finally:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait(timeout=30)
            if holder.stdout is not None:
                holder.stdout.close()
        began = time.monotonic()
        released, detail = wait_memory_released(gpu, before, timeout_s=60, margin_bytes=256 << 20)
        assert released, detail
        print(f"released in {time.monotonic() - began:.2f} s: {detail}")


def test_sglang_process_pins_by_uuid_and_stop_waits_for_gpu_memory(tmp_path: Path) -> None:
    script = tmp_path / "gpu_server.py"
    script.write_text(SERVER)
    with open_gpu(gpu_spec()) as gpu:
        before = gpu.memory().used
        runtime = SGLangProcess((torch_python(), str(script)), gpu, timeouts=RuntimeTimeouts(boot_s=300, stop_s=10),
                                memory_margin_bytes=256 << 20)
        server = runtime.start(Candidate(label="gpu"), tmp_path / "boot")
        try:
            assert gpu.memory().used - before >= (ALLOC_GIB << 30) * 0.95
            assert runtime.check(server).ok
        finally:
            ended = runtime.stop(server)
        assert ended.gpu_memory_released, ended.detail
        assert gpu.memory().used <= before + (256 << 20)
        print(f"stop took {ended.seconds:.2f} s: {ended.detail}")
