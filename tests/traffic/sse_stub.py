"""A small real HTTP/1.1 server that streams SGLang-style ``/v1/completions`` SSE chunks, for the tests.

It runs an asyncio loop in a background thread on 127.0.0.1 (a free port). Each request's behaviour
comes from ``plan(body, n)`` (n = arrival order): status, time to first token, gap between chunks,
a disconnect or a stall after some chunks, an error inside the stream, usage or not. It keeps what
it received (with the monotonic arrival time), the highest number of streams it served at once, and
a page-level prefix cache so it can report ``cached_tokens`` like ``--enable-cache-report``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PAGE = 16


@dataclass
class Behaviour:
    status: int = 200
    ttft_s: float = 0.0
    itl_s: float = 0.0
    tokens_per_chunk: int = 1
    disconnect_after: int | None = None   # chunks, then the connection is aborted
    stall_after: int | None = None        # chunks, then silence for stall_s
    stall_s: float = 0.0
    error_in_stream_after: int | None = None
    include_usage: bool = True
    no_done: bool = False                 # end the HTTP body cleanly without data: [DONE]
    finish_reason: str = "length"


@dataclass
class Received:
    n: int
    at: float                  # time.perf_counter() when the body was read
    body: dict[str, Any]


@dataclass
class StubServer:
    plan: Callable[[dict[str, Any], int], Behaviour] = field(default=lambda body, n: Behaviour())
    received: list[Received] = field(default_factory=list)
    max_streams: int = 0
    port: int = 0
    _streams: int = 0
    _generation: int = 0
    _current: int = 0                     # streams of this generation (since the last reset) in flight
    _pages: set[int] = field(default_factory=set)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _server: asyncio.AbstractServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> StubServer:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            self._server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            self._server.close()
            loop.run_until_complete(self._server.wait_closed())
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=5))
            loop.close()

        self._thread = threading.Thread(target=serve, name="sse-stub", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("stub server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def reset(self) -> None:
        with self._lock:
            self.received.clear()
            self._pages.clear()
            self.max_streams = 0
            self._generation += 1
            self._current = 0

    def _cached(self, ids: list[int]) -> int:
        h = 0
        hit = 0
        with self._lock:
            for k in range(len(ids) // PAGE):
                h = hash((h, tuple(ids[k * PAGE:(k + 1) * PAGE])))
                if h in self._pages and hit == k * PAGE:
                    hit = (k + 1) * PAGE
                self._pages.add(h)
        return hit

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                if method == "GET" and path == "/v1/models":
                    await self._json(writer, 200, {"object": "list", "data": [{"id": "stub-model", "object": "model"}]})
                elif method == "POST" and path == "/v1/completions":
                    if not await self._complete(reader, writer, json.loads(raw)):
                        return
                else:
                    await self._json(writer, 404, {"detail": "Not Found"})
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _json(self, writer: asyncio.StreamWriter, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
                     .encode() + data)
        await writer.drain()

    async def _complete(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: dict[str, Any]) -> bool:
        with self._lock:
            n = len(self.received)
            self.received.append(Received(n, time.perf_counter(), body))
        beh = self.plan(body, n)
        if beh.status != 200:
            await self._json(writer, beh.status, {"object": "error", "message": "injected failure", "code": beh.status})
            return True
        prompt = body["prompt"]
        cached = self._cached(prompt)
        generation = self._generation
        self._streams += 1
        self._current += 1
        self.max_streams = max(self.max_streams, self._current)
        counted = True

        def uncount() -> None:
            nonlocal counted
            if counted and generation == self._generation:
                self._current -= 1
            counted = False

        try:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(beh.ttft_s)
            total = int(body["max_tokens"])
            sent = 0
            chunk_no = 0
            while sent < total:
                if reader.at_eof():   # the client went away
                    return False
                if beh.disconnect_after is not None and chunk_no >= beh.disconnect_after:
                    writer.transport.abort()
                    return False
                if beh.error_in_stream_after is not None and chunk_no >= beh.error_in_stream_after:
                    await self._event(writer, {"error": {"message": "injected stream error", "code": 500}})
                    break
                if beh.stall_after is not None and chunk_no == beh.stall_after:
                    await asyncio.sleep(beh.stall_s)
                k = min(beh.tokens_per_chunk, total - sent)
                sent += k
                chunk_no += 1
                finish = beh.finish_reason if sent >= total else None
                await self._event(writer, {"id": "x", "object": "text_completion", "model": "stub-model",
                                           "choices": [{"index": 0, "text": " t" * k, "logprobs": None,
                                                        "finish_reason": finish}], "usage": None})
                if sent < total:
                    await asyncio.sleep(beh.itl_s)
            if beh.include_usage:
                usage = {"prompt_tokens": len(prompt), "completion_tokens": sent, "total_tokens": len(prompt) + sent,
                         "prompt_tokens_details": {"cached_tokens": cached}}
                await self._event(writer, {"id": "x", "object": "text_completion", "choices": [], "usage": usage})
            if not beh.no_done:
                self._write_event(writer, "[DONE]")
            uncount()   # before the client can see the end and send its next request
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        finally:
            uncount()
            self._streams -= 1

    def _write_event(self, writer: asyncio.StreamWriter, obj: Any) -> None:
        payload = obj if isinstance(obj, str) else json.dumps(obj)
        data = f"data: {payload}\n\n".encode()
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    async def _event(self, writer: asyncio.StreamWriter, obj: Any) -> None:
        self._write_event(writer, obj)
        await writer.drain()
