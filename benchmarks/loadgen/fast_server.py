"""A minimal, fast SGLang-style streaming server for measuring load generators (not for tests).

Raw asyncio ``Protocol``, pre-built SSE chunks in HTTP/1.1 chunked framing, one token per chunk on
an absolute schedule per stream (``--tokens-per-s``; 0 = as fast as the socket takes them) after a
fixed time to first token (``--ttft-ms``). It stamps, on the shared monotonic clock, when each
request's body arrived, when its first chunk was written and when its last one was, so a client's
TTFT and throughput can be compared with what the server really did:

    GET  /stats   {"requests", "tokens", "ttft_s": [...], "first_recv", "last_end", "late_s": [...]}
    POST /reset   forget the stamps

Usage ``include_usage`` is honoured like SGLang (a final ``choices: []`` chunk); ``/v1/models`` and
``/server_info`` answer enough for ``python -m sglang.bench_serving``.

    python benchmarks/loadgen/fast_server.py --port 8123 --tokens-per-s 2212 --ttft-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

_CHUNK = (b'data: {"id":"cmpl","object":"text_completion","created":0,"model":"fast","choices":[{"index":0,'
          b'"text":" hi","logprobs":null,"finish_reason":%s,"matched_stop":null}],"usage":null}\n\n')
_DONE = b"data: [DONE]\n\n"


def _frame(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


TOKEN = _frame(_CHUNK % b"null")
LAST = _frame(_CHUNK % b'"length"')
DONE = _frame(_DONE) + b"0\r\n\r\n"
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class Stats:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.tokens = 0
        self.ttft: list[float] = []
        self.late: list[float] = []
        self.recv: list[float] = []
        self.first_recv: float | None = None
        self.last_end: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "tokens": self.tokens, "ttft_s": self.ttft, "late_s": self.late,
                "recv": self.recv,
                "first_recv": self.first_recv, "last_end": self.last_end}


class Stream:
    """One response: writes its chunks at ``t_first + k * interval`` for k = 0..n-1."""

    __slots__ = ("include_usage", "interval", "k", "loop", "n", "prompt_tokens", "proto", "recv", "t_first")

    def __init__(self, proto: Http, n: int, interval: float, ttft: float, include_usage: bool,
                 prompt_tokens: int, recv: float) -> None:
        self.proto, self.n, self.interval, self.k = proto, n, interval, 0
        self.include_usage, self.prompt_tokens, self.recv = include_usage, prompt_tokens, recv
        self.loop = asyncio.get_running_loop()
        self.t_first = recv + ttft
        self.loop.call_at(self.loop.time() + ttft, self.tick)

    def tick(self) -> None:
        proto = self.proto
        if proto.closed:
            return
        stats = proto.stats
        write = proto.transport.write
        now = time.perf_counter()
        if self.k == 0:
            stats.ttft.append(now - self.recv)
        if self.interval == 0:
            write(TOKEN * (self.n - 1) + LAST)
            self.k = self.n
        else:
            due = self.t_first + self.k * self.interval
            stats.late.append(now - due)
            write(LAST if self.k == self.n - 1 else TOKEN)
            self.k += 1
        if self.k < self.n:
            self.loop.call_at(self.loop.time() + (self.t_first + self.k * self.interval - time.perf_counter()),
                              self.tick)
            return
        tail = b""
        if self.include_usage:
            usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.n,
                     "total_tokens": self.prompt_tokens + self.n}
            tail = _frame(b"data: " + json.dumps({"id": "cmpl", "object": "text_completion", "choices": [],
                                                  "usage": usage}).encode() + b"\n\n")
        write(tail + DONE)
        stats.tokens += self.n
        stats.last_end = time.perf_counter()
        proto.busy = False
        proto.pump()


class Http(asyncio.Protocol):
    def __init__(self, args: argparse.Namespace, stats: Stats) -> None:
        self.args, self.stats = args, stats
        self.buf = b""
        self.closed = False
        self.busy = False
        self.transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP server's transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.pump()

    def pump(self) -> None:
        while not self.busy and not self.closed:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4:head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length:]
            method, path = head.split(" ", 2)[:2]
            self.route(method, path.split("?")[0], body)

    def reply(self, obj: Any, status: int = 200) -> None:
        data = json.dumps(obj).encode()
        self.transport.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (status, len(data), data))

    def route(self, method: str, path: str, body: bytes) -> None:
        if path == "/v1/completions" and method == "POST":
            recv = time.perf_counter()
            req = json.loads(body)
            stats = self.stats
            stats.requests += 1
            stats.recv.append(recv)
            stats.first_recv = recv if stats.first_recv is None else stats.first_recv
            prompt = req.get("prompt")
            n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
            rate = self.args.tokens_per_s
            self.busy = True
            self.transport.write(HEAD)
            Stream(self, max(1, int(req.get("max_tokens", 16))), 1.0 / rate if rate > 0 else 0.0,
                   self.args.ttft_ms / 1000.0, bool((req.get("stream_options") or {}).get("include_usage")),
                   n_prompt, recv)
        elif path == "/v1/models":
            self.reply({"object": "list", "data": [{"id": "fast", "object": "model", "max_model_len": 1 << 20}]})
        elif path in ("/server_info", "/get_server_info"):
            self.reply({"internal_states": [{}], "version": "fast-server"})
        elif path == "/stats":
            self.reply(self.stats.to_dict())
        elif path == "/reset":
            self.stats.reset()
            self.reply({"ok": True})
        elif path in ("/health", "/flush_cache"):
            self.reply({"ok": True})
        else:
            self.reply({"detail": "Not Found"}, 404)


async def serve(args: argparse.Namespace) -> None:
    stats = Stats()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Http(args, stats), "127.0.0.1", args.port, backlog=4096)
    print(f"listening on 127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--tokens-per-s", type=float, default=2212.0, help="per stream; 0 = unthrottled")
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    args = parser.parse_args()
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
