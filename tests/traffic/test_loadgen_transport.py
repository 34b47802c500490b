"""``StreamingTransport`` against a raw HTTP/1.1 server on loopback, and its chunked decoder."""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elsa_tune.traffic.transport import SENT_AT, StreamingTransport, _Dechunker


def _chunked(parts: list[bytes], ext: bool = False, trailers: bool = False) -> bytes:
    out = b"".join(b"%x%s\r\n%s\r\n" % (len(p), b";x=y" if ext else b"", p) for p in parts if p)
    return out + b"0\r\n" + (b"X-Trailer: 1\r\n" if trailers else b"") + b"\r\n"


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.binary(min_size=1, max_size=40), max_size=8), cuts=st.lists(st.integers(0, 400), max_size=12),
       ext=st.booleans(), trailers=st.booleans())
def test_dechunker_reassembles_any_split(parts: list[bytes], cuts: list[int], ext: bool, trailers: bool) -> None:
    wire = _chunked(parts, ext, trailers)
    points = sorted({c % (len(wire) + 1) for c in cuts} | {0, len(wire)})
    dec = _Dechunker()
    got = b"".join(dec.feed(wire[a:b]) for a, b in itertools.pairwise(points))
    assert got == b"".join(parts) and dec.done


def test_dechunker_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="chunk size"):
        _Dechunker().feed(b"zz\r\nabc\r\n")
    with pytest.raises(ValueError, match="CRLF"):
        _Dechunker().feed(b"3\r\nabcXY")


class RawServer:
    """Answers by path: /chunked, /length, /close (close-delimited), /cut (body cut short),
    /once (a full response, then it closes the idle connection), /slow (waits before answering),
    /hang (never answers)."""

    def __init__(self) -> None:
        self.connections = 0
        self.open_now = 0
        self.max_open = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._ready = threading.Event()

    def __enter__(self) -> RawServer:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        loop.run_forever()
        server.close()
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=5))
        loop.run_until_complete(server.wait_closed())
        loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                path = lines[0].split(" ")[1]
                fields = (ln.partition(": ") for ln in lines)
                length = next((int(v) for k, _, v in fields if k.lower() == "content-length"), 0)
                body = await reader.readexactly(length)
                if path == "/chunked":
                    head_out = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                    writer.write(head_out + _chunked([b"he", b"llo", body]))
                elif path == "/length":
                    writer.write(b"HTTP/1.1 201 Created\r\ncontent-length: 5\r\nx-a: b\r\n\r\nhello")
                elif path == "/close":
                    writer.write(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
                    await writer.drain()
                    return
                elif path == "/cut":
                    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel")
                    await writer.drain()
                    return
                elif path == "/once":
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    await writer.drain()
                    return
                elif path == "/hang":
                    await reader.read(1)     # never answers; returns when the client closes
                    return
                elif path == "/slow":
                    await asyncio.sleep(0.1)
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open_now -= 1
            writer.close()


@pytest.fixture()
def raw() -> Iterator[RawServer]:
    with RawServer() as server:
        yield server


async def _get(client: httpx.AsyncClient, path: str, content: bytes = b"") -> tuple[int, bytes, httpx.Response]:
    async with client.stream("POST", path, content=content) as resp:
        data = b"".join([part async for part in resp.aiter_raw()])
        return resp.status_code, data, resp


def test_chunked_and_length_bodies_on_one_kept_alive_connection(raw: RawServer) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=raw.url, transport=StreamingTransport(4)) as client:
            status, data, resp = await _get(client, "/chunked", b"!")
            assert (status, data) == (200, b"hello!")
            assert SENT_AT in resp.request.extensions
            status, data, resp = await _get(client, "/length")
            assert (status, data, resp.headers["x-a"]) == (201, b"hello", "b")
            assert (await client.post("/chunked", content=b"?")).text == "hello?"

    asyncio.run(scenario())
    assert raw.connections == 1


def test_close_delimited_body_and_stale_idle_connection_retry(raw: RawServer) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=raw.url, transport=StreamingTransport(1)) as client:
            assert (await _get(client, "/close"))[1] == b"until the end"
            assert (await _get(client, "/once"))[1] == b"ok"
            await asyncio.sleep(0.05)      # the server has closed the idle connection by now
            assert (await _get(client, "/once"))[1] == b"ok"
            assert (await _get(client, "/length"))[1] == b"hello"

    asyncio.run(scenario())
    assert raw.connections == 4


def test_body_cut_short_raises_remote_protocol_error(raw: RawServer) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=raw.url, transport=StreamingTransport(2)) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await _get(client, "/cut")
            assert (await _get(client, "/length"))[1] == b"hello"   # the pool recovered

    asyncio.run(scenario())


def test_pool_bound_and_preconnect(raw: RawServer) -> None:
    async def scenario() -> None:
        transport = StreamingTransport(2)
        async with httpx.AsyncClient(base_url=raw.url, transport=transport) as client:
            assert await transport.preconnect(raw.url, 2, timeout=5) == 2
            results = await asyncio.gather(*(_get(client, "/slow") for _ in range(6)))
            assert [r[1] for r in results] == [b"ok"] * 6

    asyncio.run(scenario())
    assert raw.max_open <= 2 and raw.connections == 2


def test_connect_errors_and_unsupported_schemes() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def scenario() -> None:
        transport = StreamingTransport(1)
        async with httpx.AsyncClient(transport=transport) as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(dead + "/x")
            with pytest.raises(httpx.UnsupportedProtocol):
                await client.get("https://127.0.0.1:1/x")
            assert await transport.preconnect(dead, 2, timeout=1) == 0

    asyncio.run(scenario())
    with pytest.raises(ValueError):
        StreamingTransport(0)


def test_a_cancelled_exchange_closes_its_connection(raw: RawServer) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=raw.url, transport=StreamingTransport(1)) as client:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await _get(client, "/hang")
            for _ in range(100):          # the server sees the close while the client is still open
                if raw.open_now == 0:
                    break
                await asyncio.sleep(0.02)
            assert raw.open_now == 0
            assert (await _get(client, "/length"))[1] == b"hello"   # and the slot was given back

    asyncio.run(scenario())
