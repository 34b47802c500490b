"""``StreamingTransport``: a lean HTTP/1.1 keep-alive transport for ``httpx.AsyncClient``, built for SSE.

httpx's default transport (httpcore over h11) turns every HTTP chunk into an event and a trip through
several generator layers, which at tens of thousands of streamed tokens per second makes the client,
not the server, the bottleneck and reads TTFT late (``benchmarks/loadgen`` measures both). This
transport keeps httpx's API (``client.stream``, ``Response``, ``httpx`` exceptions, timeouts, the pool
bound) and does the HTTP/1.1 part itself: one ``asyncio`` stream per connection, the request written in one buffer, and
chunked bodies de-framed per socket read, so a read that carries twenty chunks costs one yield.

Scope, on purpose: plain ``http://`` to one origin at a time, HTTP/1.1, ``Content-Length`` request
bodies, chunked / length-delimited / close-delimited responses, no proxies, no TLS, no HTTP/2. That is
what a load generator on the server's host or LAN needs; anything else should use httpx's default.

Errors are httpx's: ``ConnectError``/``ConnectTimeout`` when no connection can be made,
``WriteError``/``ReadError`` when the peer goes away, ``RemoteProtocolError`` for a body cut short or
a malformed response. A request that fails on a reused idle connection before any response byte
arrived (the server closed it while idle: uvicorn does after 5 s) is retried once on a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import httpx

_READ = 1 << 16
_MAX_HEAD = 1 << 16
#: ``request.extensions`` key: ``time.perf_counter()`` when the request's bytes were handed to the socket.
SENT_AT = "elsa_tune.sent_at"

log = logging.getLogger(__name__)


class _Stale(Exception):
    """A reused connection failed before the response started: safe to retry on a fresh one."""


class _Connection:
    __slots__ = ("reader", "reusable", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reusable = True

    def alive(self) -> bool:
        return not (self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        self.reusable = False
        with contextlib.suppress(Exception):
            self.writer.close()


class StreamingTransport(httpx.AsyncBaseTransport):
    """At most ``max_connections`` keep-alive connections per origin; a request waits for a free one."""

    def __init__(self, max_connections: int = 64) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("the transport is closed")
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"StreamingTransport speaks plain http only, not {url.scheme!r}",
                                            request=request)
        origin = (url.host, url.port or 80)
        body = await request.aread()
        head = _request_head(request, len(body))
        await self._slots.acquire()
        conn: _Connection | None = None
        try:
            for attempt in range(2):
                conn, reused = await self._connect(origin, request, fresh=attempt > 0)
                try:
                    return await self._exchange(conn, reused, origin, head, body, request)
                except _Stale:
                    conn.close()
                    self._open.discard(conn)
                    conn = None
            raise httpx.RemoteProtocolError("the server closed the connection twice before answering",
                                            request=request)
        except BaseException:
            # A failed or cancelled exchange closes its connection, so the server stops working on it.
            if conn is not None:
                conn.close()
                self._open.discard(conn)
            self._slots.release()
            raise

    async def _connect(self, origin: tuple[str, int], request: httpx.Request, *,
                       fresh: bool) -> tuple[_Connection, bool]:
        idle = self._idle.get(origin, [])
        while idle and not fresh:
            conn = idle.pop()
            if conn.alive():
                return conn, True
            conn.close()
            self._open.discard(conn)
        timeout = (request.extensions.get("timeout") or {}).get("connect")
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(origin[0], origin[1], limit=_MAX_HEAD)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connect to {origin[0]}:{origin[1]} timed out", request=request) from exc
        except OSError as exc:
            raise httpx.ConnectError(f"connect to {origin[0]}:{origin[1]}: {exc}", request=request) from exc
        conn = _Connection(reader, writer)
        self._open.add(conn)
        return conn, False

    async def _exchange(self, conn: _Connection, reused: bool, origin: tuple[str, int], head: bytes, body: bytes,
                        request: httpx.Request) -> httpx.Response:
        try:
            request.extensions[SENT_AT] = time.perf_counter()
            conn.writer.write(head + body)
            await conn.writer.drain()
        except OSError as exc:
            if reused:
                raise _Stale() from exc
            conn.close()
            raise httpx.WriteError(f"write failed: {exc}", request=request) from exc
        try:
            raw = await conn.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if reused and not exc.partial:
                raise _Stale() from exc
            conn.close()
            raise httpx.RemoteProtocolError("the server closed the connection without sending a response",
                                            request=request) from exc
        except asyncio.LimitOverrunError as exc:
            conn.close()
            raise httpx.RemoteProtocolError("response headers are too large", request=request) from exc
        except OSError as exc:
            if reused:
                raise _Stale() from exc
            conn.close()
            raise httpx.ReadError(f"read failed: {exc}", request=request) from exc
        status, headers = _parse_head(raw, request)
        names = {k.lower(): v for k, v in headers}
        if names.get(b"connection", b"").lower() == b"close":
            conn.reusable = False
        if request.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            framing, length = "length", 0
        elif b"chunked" in names.get(b"transfer-encoding", b"").lower():
            framing, length = "chunked", 0
        elif b"content-length" in names:
            framing, length = "length", int(names[b"content-length"])
        else:
            framing, length = "close", 0
            conn.reusable = False
        stream = _Body(self, conn, origin, framing, length, request)
        return httpx.Response(status, headers=headers, stream=stream, request=request,
                              extensions={"http_version": b"HTTP/1.1"})

    async def preconnect(self, url: httpx.URL | str, n: int, timeout: float) -> int:
        """Open up to ``n`` idle connections to ``url``'s origin before a run; returns how many are idle.

        A real client (a gateway) holds persistent connections, so a measurement should not time
        TCP handshakes. Connections that cannot be made are left to the requests, which record why.
        """
        target = httpx.URL(url)
        origin = (target.host, target.port or 80)
        idle = self._idle.setdefault(origin, [])
        missing = n - len(idle)

        async def one() -> _Connection | None:
            try:
                async with asyncio.timeout(timeout):
                    reader, writer = await asyncio.open_connection(origin[0], origin[1], limit=_MAX_HEAD)
            except (OSError, TimeoutError) as exc:
                log.debug("preconnect to %s:%s failed: %s", origin[0], origin[1], exc)
                return None
            return _Connection(reader, writer)

        for conn in await asyncio.gather(*(one() for _ in range(max(0, missing)))):
            if conn is not None:
                self._open.add(conn)
                idle.append(conn)
        return len(idle)

    def _release(self, conn: _Connection, origin: tuple[str, int], complete: bool) -> None:
        if complete and conn.reusable and not self._closed and conn.alive():
            self._idle.setdefault(origin, []).append(conn)
        else:
            conn.close()
            self._open.discard(conn)
        self._slots.release()

    async def aclose(self) -> None:
        self._closed = True
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()


class _Body(httpx.AsyncByteStream):
    """The response body, de-framed per socket read; returns its connection to the pool when closed."""

    def __init__(self, transport: StreamingTransport, conn: _Connection, origin: tuple[str, int], framing: str,
                 length: int, request: httpx.Request) -> None:
        self._transport = transport
        self._conn = conn
        self._origin = origin
        self._framing = framing
        self._length = length
        self._request = request
        self._complete = framing == "length" and length == 0
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._complete:
            return
        reader = self._conn.reader
        if self._framing == "length":
            remaining = self._length
            while remaining > 0:
                data = await self._read(reader, min(remaining, _READ))
                remaining -= len(data)
                yield data
            self._complete = True
            return
        if self._framing == "close":
            while data := await reader.read(_READ):
                yield data
            self._complete = True
            return
        decoder = _Dechunker()
        while True:
            buf = await self._read(reader, _READ)
            try:
                out = decoder.feed(buf)
            except ValueError as exc:
                self._conn.close()
                raise httpx.RemoteProtocolError(f"malformed chunked body: {exc}", request=self._request) from exc
            if out:
                yield out
            if decoder.done:
                self._complete = True
                return

    async def _read(self, reader: asyncio.StreamReader, n: int) -> bytes:
        try:
            data = await reader.read(n)
        except OSError as exc:
            self._conn.close()
            raise httpx.ReadError(f"read failed: {exc}", request=self._request) from exc
        if not data:
            self._conn.close()
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body",
                                            request=self._request)
        return data

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            self._transport._release(self._conn, self._origin, self._complete)


class _Dechunker:
    """Incremental ``Transfer-Encoding: chunked`` decoder: ``feed`` returns the payload bytes it completed."""

    __slots__ = ("_buf", "_crlf", "_remaining", "_trailers", "done")

    def __init__(self) -> None:
        self._buf = b""
        self._remaining = 0      # payload bytes still due in the current chunk
        self._crlf = False       # the CRLF after a chunk's payload is due
        self._trailers = False   # after the last chunk: trailer lines until an empty one
        self.done = False

    def feed(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        pos = 0
        end = len(buf)
        out: list[bytes] = []
        find = buf.find
        while pos < end and not self.done:
            if not (self._remaining or self._crlf or self._trailers):
                # Fast path: a whole chunk with a plain hex size line (what servers send).
                nl = find(b"\r\n", pos)
                if nl > pos:
                    try:
                        size = int(buf[pos:nl], 16)
                    except ValueError:
                        size = 0   # extensions or garbage: the careful path below decides
                    stop = nl + 2 + size
                    if size > 0 and stop + 2 <= end:
                        if buf[stop:stop + 2] != b"\r\n":
                            raise ValueError("chunk payload not followed by CRLF")
                        out.append(buf[nl + 2:stop])
                        pos = stop + 2
                        continue
            if self._remaining:
                take = min(self._remaining, end - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._remaining -= take
                if self._remaining:
                    break
                self._crlf = True
            if self._crlf:
                if end - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ValueError("chunk payload not followed by CRLF")
                pos += 2
                self._crlf = False
            nl = buf.find(b"\r\n", pos)
            if nl < 0:
                if end - pos > 1024:
                    raise ValueError("chunk-size line too long")
                break
            line = buf[pos:nl]
            pos = nl + 2
            if self._trailers:
                if not line:
                    self.done = True
                continue
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ValueError(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                self._trailers = True
            else:
                self._remaining = size
        self._buf = buf[pos:]
        return out[0] if len(out) == 1 else b"".join(out)


def _request_head(request: httpx.Request, length: int) -> bytes:
    url = request.url
    target = url.raw_path or b"/"
    lines = [b"%s %s HTTP/1.1" % (request.method.encode(), target)]
    has_host = False
    for name, value in request.headers.raw:
        low = name.lower()
        if low == b"host":
            has_host = True
        if low == b"transfer-encoding":
            continue   # the body is in memory: always sent with Content-Length
        lines.append(name + b": " + value)
    if not has_host:
        lines.insert(1, b"Host: " + url.netloc)
    if b"content-length" not in (n.lower() for n, _ in request.headers.raw):
        lines.append(b"Content-Length: %d" % length)
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _parse_head(raw: bytes, request: httpx.Request) -> tuple[int, list[tuple[bytes, bytes]]]:
    lines = raw[:-4].split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise httpx.RemoteProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}", request=request)
    try:
        status = int(parts[1])
    except ValueError:
        raise httpx.RemoteProtocolError(f"bad status code in {lines[0][:80]!r}", request=request) from None
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise httpx.RemoteProtocolError(f"malformed header line {line[:80]!r}", request=request)
        headers.append((name.strip(), value.strip()))
    return status, headers
