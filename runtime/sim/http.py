"""The simulated server's HTTP/1.1 plumbing on ``asyncio`` streams: read a request, write a response or SSE.

Hand-written rather than a framework because the server must keep up with a dozen streams at thousands of
tokens per second on two shared cores; it speaks only what SGLang's clients use (Content-Length request
bodies, keep-alive, chunked responses for SSE).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 256 * 1024 * 1024
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 413: "Payload Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]
    body: bytes
    received_at: float = 0.0    # time.monotonic() when its head had been read (before any parsing)

    def json(self) -> Any:
        return json.loads(self.body or b"{}")


class HttpError(Exception):
    def __init__(self, status: int, message: str, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    received_at = time.monotonic()
    if len(head) > MAX_HEADER_BYTES:
        raise ValueError("header too large")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    if length > MAX_BODY_BYTES:
        raise ValueError("body too large")
    body = await reader.readexactly(length) if length else b""
    parts = urlsplit(target)
    return Request(method=method.upper(), path=parts.path, query=parse_qs(parts.query), headers=headers, body=body,
                   received_at=received_at)


async def send(writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str) -> int:
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\ncontent-type: {content_type}\r\n"
            f"content-length: {len(body)}\r\nserver: uvicorn\r\n\r\n").encode()
    writer.write(head + body)
    await writer.drain()
    return status


async def send_json(writer: asyncio.StreamWriter, status: int, payload: Any) -> int:
    return await send(writer, status, json.dumps(payload, separators=(",", ":")).encode(), "application/json")


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def write_event(writer: asyncio.StreamWriter, payload: Mapping[str, Any]) -> None:
    writer.write(chunk(b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"))


def error_body(message: str, err_type: str, status: int) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}


def require_post(request: Request) -> None:
    if request.method != "POST":
        raise HttpError(405, "Method Not Allowed", "MethodNotAllowed")
