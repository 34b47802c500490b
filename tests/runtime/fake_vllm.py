"""A scripted stand-in for ``vllm serve`` (stdlib only): vLLM 0.33.0's boot log lines, no ready line, and
``/health`` answering 200 only once the engine is up, plus ``/metrics`` (``vllm:cache_config_info``) and
``/v1/models``.

``FAKE_VLLM_SCENARIO``: ``ok`` (boots after ``FAKE_VLLM_WARMUP_S`` with ``/health`` 503 until then) or
``no_room`` (prints vLLM's "To serve at least one request" failure and exits 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PID = os.getpid()


def say(process: str, level: str, where: str, message: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"({process} pid={PID}) {level} {stamp} [{where}] {message}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(prog="vllm serve")
    parser.add_argument("subcommand")
    parser.add_argument("model_tag")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-model-len", type=int, default=4096)
    args, _ = parser.parse_known_args()
    given = {"model_tag": args.model_tag, "host": args.host, "port": args.port, "model": args.model_tag}
    if args.max_num_seqs is not None:
        given["max_num_seqs"] = args.max_num_seqs
    say("APIServer", "INFO", "startup.py:96", f"non-default args: {given!r}")
    say("APIServer", "INFO", "scheduler.py:311", "Chunked prefill is enabled with max_num_batched_tokens=2048.")
    if os.environ.get("FAKE_VLLM_SCENARIO") == "no_room":
        say("EngineCore_DP0", "ERROR", "core.py:1012", "EngineCore failed to start.")
        say("EngineCore_DP0", "ERROR", "core.py:1012",
            f"ValueError: To serve at least one request with the model's max seq len ({args.max_model_len}), "
            "(2.0 GiB KV cache is needed, which is larger than the available KV cache memory (0.5 GiB). Based on "
            "the available memory, the estimated maximum model length is 1024. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
        return 1
    ready = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200 if ready.is_set() else 503, "text/plain", "")
            elif self.path == "/metrics":
                self._send(200, "text/plain", 'vllm:cache_config_info{block_size="16",cache_dtype="auto",'
                           'engine="0",kv_cache_max_concurrency="24.0",kv_cache_size_tokens="98304",'
                           'num_gpu_blocks="6144"} 1.0\n')
            elif self.path == "/v1/models":
                self._send(200, "application/json", json.dumps(
                    {"data": [{"id": args.model_tag, "max_model_len": args.max_model_len}]}))
            else:
                self._send(404, "text/plain", "")

        def _send(self, code: int, kind: str, body: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: object) -> None:
            return

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    say("APIServer", "INFO", "entry.py:139", f"Starting vLLM server on http://{args.host}:{args.port}")
    time.sleep(float(os.environ.get("FAKE_VLLM_WARMUP_S", "1.0")))
    say("EngineCore_DP0", "INFO", "gpu_worker.py:773", "Available KV cache memory: 6.00 GiB")
    ready.set()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
