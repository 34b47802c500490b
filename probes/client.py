"""A content-level client for probes: chat requests whose *answers* matter, not their speed.

The load generator (``traffic/loadgen.py``) measures throughput on token-id prompts and throws the text
away; probes need the text, the tool calls, the server's token counts, and a hang detector that fires
when no token arrives for ``hang_s`` even though the connection (and ``/health``) stay up.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

#: A probe times deadlines, not latencies: it asks a simulated server for its full speed-up, which it would
#: otherwise lower for a client that does not stamp (``runtime/sim/plain_speed.py``); SGLang ignores the header.
FULL_PACE = {"x-elsa-pace": "full"}

@dataclass(frozen=True)
class Reply:
    """One probe request's outcome. ``error`` is empty on success; ``hung`` marks a stall."""

    text: str = ""
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    ttft_s: float | None = None
    seconds: float = 0.0
    status: int | None = None
    error: str = ""
    hung: bool = False
    disconnected: bool = False

    @property
    def ok(self) -> bool:
        return not self.error and not self.hung and not self.disconnected


@dataclass(frozen=True)
class ChatRequest:
    messages: Sequence[Mapping[str, Any]]
    max_tokens: int = 64
    temperature: float = 0.0
    ignore_eos: bool = False
    tools: Sequence[Mapping[str, Any]] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def body(self, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "messages": list(self.messages), "max_tokens": self.max_tokens,
                                "temperature": self.temperature, "stream": True,
                                "stream_options": {"include_usage": True}}
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.tools:
            body["tools"] = list(self.tools)
        body.update(self.extra)
        return body


class ProbeClient:
    """Streams chat completions from one server with a first-token deadline and a stall (hang) deadline."""

    def __init__(self, base_url: str, *, connect_s: float = 10.0, first_token_s: float = 300.0,
                 hang_s: float = 60.0, model: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.connect_s = connect_s
        self.first_token_s = first_token_s
        self.hang_s = hang_s
        self._model = model

    async def model(self, client: httpx.AsyncClient) -> str:
        if self._model is None:
            resp = await client.get(f"{self.base_url}/v1/models", timeout=self.connect_s)
            resp.raise_for_status()
            self._model = str(resp.json()["data"][0]["id"])
        return self._model

    async def chat(self, client: httpx.AsyncClient, request: ChatRequest) -> Reply:
        started = time.perf_counter()
        try:
            body = request.body(await self.model(client))
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            return Reply(error=f"cannot read /v1/models: {type(exc).__name__}: {exc}", disconnected=True,
                         seconds=time.perf_counter() - started)
        return await self._stream(client, body, started)

    async def _stream(self, client: httpx.AsyncClient, body: Mapping[str, Any], started: float) -> Reply:
        loop = asyncio.get_running_loop()
        text: list[str] = []
        tool_parts: dict[int, dict[str, Any]] = {}
        usage: Mapping[str, Any] = {}
        finish: str | None = None
        first: float | None = None
        status: int | None = None
        try:
            async with asyncio.timeout(self.first_token_s) as deadline:
                async with client.stream("POST", f"{self.base_url}/v1/chat/completions", json=body, headers=FULL_PACE,
                                         timeout=httpx.Timeout(None, connect=self.connect_s)) as resp:
                    status = resp.status_code
                    if status != 200:
                        detail = (await resp.aread()).decode(errors="replace")[:2000]
                        return Reply(status=status, error=f"HTTP {status}: {detail}",
                                     seconds=time.perf_counter() - started)
                    async for line in resp.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        chunk = json.loads(data)
                        if chunk.get("error"):
                            return Reply(status=status, error=json.dumps(chunk["error"])[:2000],
                                         seconds=time.perf_counter() - started, text="".join(text))
                        if chunk.get("usage"):
                            usage = chunk["usage"]
                        for choice in chunk.get("choices") or ():
                            delta = choice.get("delta") or {}
                            if delta.get("content"):
                                text.append(delta["content"])
                                first = first or time.perf_counter()
                            for call in delta.get("tool_calls") or ():
                                part = tool_parts.setdefault(int(call.get("index", 0)), {"name": "", "arguments": ""})
                                fn = call.get("function") or {}
                                part["name"] += fn.get("name") or ""
                                part["arguments"] += fn.get("arguments") or ""
                                first = first or time.perf_counter()
                            finish = choice.get("finish_reason") or finish
                        if first is not None:
                            deadline.reschedule(loop.time() + self.hang_s)
                    else:
                        return self._reply(text, tool_parts, usage, finish, first, started, status,
                                           error="the stream ended without data: [DONE]", disconnected=True)
        except TimeoutError:
            return self._reply(text, tool_parts, usage, finish, first, started, status,
                               error=f"no token for {self.hang_s if first else self.first_token_s:g} s", hung=True)
        except httpx.HTTPError as exc:
            return self._reply(text, tool_parts, usage, finish, first, started, status,
                               error=f"{type(exc).__name__}: {exc}", disconnected=True)
        except json.JSONDecodeError as exc:
            return self._reply(text, tool_parts, usage, finish, first, started, status,
                               error=f"undecodable stream chunk: {exc}")
        return self._reply(text, tool_parts, usage, finish, first, started, status)

    @staticmethod
    def _reply(text: list[str], tool_parts: Mapping[int, Mapping[str, Any]], usage: Mapping[str, Any],
               finish: str | None, first: float | None, started: float, status: int | None, *, error: str = "",
               hung: bool = False, disconnected: bool = False) -> Reply:
        details = usage.get("prompt_tokens_details") or {}
        return Reply(text="".join(text), tool_calls=tuple(tool_parts[i] for i in sorted(tool_parts)),
                     prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
                     cached_tokens=details.get("cached_tokens") if isinstance(details, Mapping) else None,
                     finish_reason=finish, ttft_s=None if first is None else first - started,
                     seconds=time.perf_counter() - started, status=status, error=error, hung=hung,
                     disconnected=disconnected)


async def flush_cache(base_url: str, timeout_s: float = 30.0) -> bool:
    """Ask the server to drop its prefix cache (SGLang ``/flush_cache``); ``False`` when it refused."""
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        try:
            resp = await client.post(f"{base_url.rstrip('/')}/flush_cache")
        except httpx.HTTPError:
            return False
        return resp.status_code == 200


async def server_info(base_url: str, timeout_s: float = 10.0) -> Mapping[str, Any] | None:
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        try:
            resp = await client.get(f"{base_url.rstrip('/')}/server_info")
            resp.raise_for_status()
            data = resp.json()
        except (httpx.HTTPError, ValueError):
            return None
    return data if isinstance(data, Mapping) else None
