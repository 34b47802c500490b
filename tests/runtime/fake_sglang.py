#!/usr/bin/env python3
"""A scripted stand-in for ``python -m sglang.launch_server``, driven through the real ``SGLangProcess``.

It prints SGLang 0.5.23-format startup lines (the f-strings of ``sglang.md`` §2; the failure texts are
the real lines of ``tests/runtime/logs``), serves ``/health``, ``/server_info`` and ``/v1/models`` on the
given ``--host``/``--port``, and fails the way ``FAKE_SGLANG_SCENARIO`` says:

    ok                 boot, serve until signalled
    bad_flag           (any flag 0.5.23 removed) argparse error, exit 2
    oom_at_boot        CUDA OOM while loading the weights, then SIGKILL itself like SGLang does
    dies_after_ready   serve, then after FAKE_SGLANG_DIE_AFTER_S a Prefill OOM, SIGKILL itself
    hang               print the first lines and never become ready; ignores SIGTERM
    slow_stop          boot normally but ignore SIGTERM (stop must escalate to SIGKILL)
    no_sglang          "No module named 'sglang'" and exit 1

Like SGLang it forks a "scheduler" child that holds the GPU memory: the child writes its pid and a byte
count into ``FAKE_SGLANG_GPU_DIR`` (read by ``fake_gpu.DirectoryGpu``) and lives until killed. All pids
are appended to ``FAKE_SGLANG_PIDS`` so tests can prove nothing is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REMOVED_IN_0523 = ("--cuda-graph-max-bs", "--mamba-scheduler-strategy", "--collect-tokens-histogram")
READY = "The server is fired up and ready to roll!"
SCENARIO = os.environ.get("FAKE_SGLANG_SCENARIO", "ok")


def say(message: str, tag: str | None = "TP0") -> None:
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp} {tag}] {message}" if tag else f"[{stamp}] {message}", flush=True)


def parse(argv: list[str]) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        name = argv[i]
        if name in REMOVED_IN_0523:
            print("usage: sglang serve [-h] --model-path MODEL_PATH [--port PORT] ...", file=sys.stderr)
            print(f"sglang serve: error: unrecognized arguments: {' '.join(argv[i:i + 2])}", file=sys.stderr)
            sys.exit(2)
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            flags[name[2:].replace("-", "_")] = argv[i + 1]
            i += 2
        else:
            flags[name[2:].replace("-", "_")] = True
            i += 1
    return flags


def hold_memory(nbytes: int) -> None:
    """The child: hold 'GPU memory' until killed."""
    gpu_dir = os.environ.get("FAKE_SGLANG_GPU_DIR")
    if gpu_dir:
        Path(gpu_dir, str(os.getpid())).write_text(str(nbytes))
    while True:
        time.sleep(1)


def record_pid(pid: int) -> None:
    pid_file = os.environ.get("FAKE_SGLANG_PIDS")
    if pid_file:
        with open(pid_file, "a") as handle:
            handle.write(f"{pid}\n")


def die_like_sglang(child: subprocess.Popen[bytes], lines: list[str]) -> None:
    say("Received sigquit from a child process. It usually means the child failed.", None)
    say("Scheduler hit an exception: Traceback (most recent call last):")
    for line in lines:
        print(line, flush=True)
    child.kill()
    os.kill(os.getpid(), signal.SIGKILL)


def server_info(args: dict[str, Any], slots: int) -> dict[str, Any]:
    resolved = {k: _num(v) for k, v in args.items()}
    return {**resolved, "version": "0.5.23-fake", "max_total_num_tokens": 134016,
            "internal_states": [{**resolved, "effective_max_running_requests_per_dp": slots,
                                 "memory_usage": {"weight": 18.59, "kvcache": 3.88, "graph": {"decode": 0.12}}}]}


def _num(value: Any) -> Any:
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
    return value


def serve(args: dict[str, Any], child: subprocess.Popen[bytes], slots: int) -> None:
    info = server_info(args, slots)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path in ("/health", "/health_generate"):
                self._send(200, b"")
            elif self.path in ("/server_info", "/get_server_info"):
                self._send(200, json.dumps(info).encode())
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"data": [{"id": "fake", "max_model_len": 159776}]}).encode())
            else:
                self._send(404, b"")

        def _send(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *items: Any) -> None:
            pass

    host, port = str(args.get("host", "127.0.0.1")), int(args.get("port", 30000))
    try:
        httpd = ThreadingHTTPServer((host, port), Handler)
    except OSError:
        say(f"ERROR:    [Errno 98] error while attempting to bind on address ('{host}', {port}): "
            "address already in use", None)
        child.kill()
        sys.exit(1)
    say(f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)", None)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    time.sleep(0.2)
    say(READY, None)
    if SCENARIO == "dies_after_ready":
        time.sleep(float(os.environ.get("FAKE_SGLANG_DIE_AFTER_S", "2")))
        die_like_sglang(child, ["RuntimeError: Prefill out of memory. Try to lower your batch size.",
                                "Try to allocate 8192 tokens."])
    while True:
        time.sleep(1)


def main() -> None:
    if sys.argv[1:2] == ["--hold-memory"]:
        hold_memory(int(sys.argv[2]))
    if SCENARIO == "no_sglang":
        print("/usr/bin/python3: Error while finding module specification for 'sglang.launch_server' "
              "(ModuleNotFoundError: No module named 'sglang')", flush=True)
        sys.exit(1)
    args = parse(sys.argv[1:])
    if SCENARIO in ("hang", "slow_stop"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    record_pid(os.getpid())
    requested = int(args.get("max_running_requests", 48))
    slots = min(requested, int(os.environ.get("FAKE_SGLANG_SLOTS", "2")))
    mixed = False if args.get("speculative_algorithm") else bool(args.get("enable_mixed_chunk"))
    resolved = {**{k: _num(v) for k, v in args.items()}, "max_running_requests": requested, "enable_mixed_chunk": mixed,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    say(f"server_args={resolved!r}", None)
    held = os.environ.get("FAKE_SGLANG_BYTES", "1000000")
    child = subprocess.Popen([sys.executable, __file__, "--hold-memory", held])
    record_pid(child.pid)
    say("Load weight begin. avail mem=30.52 GB")
    if SCENARIO == "hang":
        while True:
            time.sleep(1)
    if SCENARIO == "oom_at_boot":
        say("Failed to initialize lk_moe: CUDA out of memory. Tried to allocate 24.00 MiB. GPU 1 has a total "
            "capacity of 47.37 GiB of which 4.31 MiB is free.", "TP1")
        die_like_sglang(child, ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 24.00 MiB."])
    say("Load weight end. elapsed=1.20 s, type=Qwen3_5ForConditionalGeneration, quant=modelopt_fp4, "
        "avail mem=11.93 GB, mem usage=18.59 GB.")
    say("Mamba Cache is allocated. max_mamba_cache_size: 8, conv_state size: 0.05GB, ssm_state size: 1.89GB ")
    say("KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 134016, K size: 1.94 GB, V size: 1.94 GB")
    say("Memory pool end. avail mem=2.10 GB")
    say("Capture target decode CUDA graph end. bs=[1, 2], elapsed=0.40 s, mem usage=0.12 GB, avail mem=1.98 GB.")
    if slots < requested:
        say(f"max_running_requests is capped to {slots} by the mamba state cache (max_mamba_cache_size=8, "
            "4 state slots per request). To raise it: increase --mamba-full-memory-ratio or --max-mamba-cache-size, "
            "or halve the state size with --mamba-ssm-dtype bfloat16.")
    say(f"max_total_num_tokens=134016, chunked_prefill_size=2048, max_prefill_tokens=16384, "
        f"max_running_requests={slots}, context_len=159776, available_gpu_mem=0.68 GB")
    serve(args, child, slots)


if __name__ == "__main__":
    main()
