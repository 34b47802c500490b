"""``CompletionStream``: the server-sent events of one streamed ``/v1/completions`` response, parsed as they arrive.

Fed the body bytes of each socket read with the time they arrived, it keeps what a measurement needs:
the arrival time of every content chunk (one per chunk with a choice; SGLang sends one per decode step,
several tokens each under speculative decoding), the final ``usage``, the finish reason, an error the
server put in the stream (``data: {"error": {...}}``) and whether ``data: [DONE]`` came.

It is on the hot path of the load generator, so it avoids work per token: a read whose complete events
are all plain token chunks is recognised by counting patterns over the whole read (C-level scans) and
costs a handful of calls however many chunks it carries; a plain chunk on its own skips ``json.loads``.
The patterns cannot match inside a JSON string (its quotes are escaped), so the shortcut is exact for
the compact JSON SGLang writes, and any other layout falls through to a full parse.
"""

from __future__ import annotations

import json
from typing import Any


class CompletionStream:
    """Incremental parser of one response's SSE body. ``keep_text`` also collects the completion text."""

    __slots__ = ("_buf", "_error_limit", "_keep_text", "chunk_times", "done", "error", "finish_reason", "texts",
                 "usage")

    def __init__(self, *, keep_text: bool = False, error_limit: int = 2000) -> None:
        self._buf = b""
        self._keep_text = keep_text
        self._error_limit = error_limit
        self.chunk_times: list[float] = []
        self.texts: list[str] = []
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.error = ""
        self.done = False

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def feed(self, raw: bytes, now: float) -> None:
        """Parse the complete events in ``raw`` (plus what an earlier read left); stop at ``[DONE]``.

        Raises ``json.JSONDecodeError`` for an event whose data is not JSON.
        """
        if self.done:
            return
        data = self._buf + raw if self._buf else raw
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        cut = data.rfind(b"\n\n") + 2        # complete events end here
        if cut < 2:
            self._buf = data
            return
        self._buf = data[cut:]
        block = data[:cut]
        n_events = block.count(b"\n\n")
        if not self._keep_text and _all_plain_tokens(block, n_events):
            self.chunk_times.extend([now] * n_events)
            return
        start = 0
        while (stop := block.find(b"\n\n", start)) >= 0:
            payload = _data(block[start:stop])
            start = stop + 2
            if payload is None:
                continue
            if payload == b"[DONE]":
                self.done = True
                return
            if not self._keep_text and _is_plain_token(payload):
                self.chunk_times.append(now)
                continue
            self._event(json.loads(payload), now)

    def _event(self, chunk: dict[str, Any], now: float) -> None:
        choices = chunk.get("choices")
        if choices:
            self.chunk_times.append(now)
            first = choices[0]
            if self._keep_text:
                self.texts.append(first.get("text") or "")
            if first.get("finish_reason"):
                self.finish_reason = first["finish_reason"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if chunk.get("error"):
            self.error = json.dumps(chunk["error"])[:self._error_limit]


def _all_plain_tokens(block: bytes, n_events: int) -> bool:
    """Whether every one of the ``n_events`` events in ``block`` is a plain single-choice token chunk.

    A final chunk, usage, an error, ``[DONE]`` or a comment makes the counts disagree.
    """
    return (block.count(b"data:") == n_events and block.count(b'"finish_reason":null') == n_events
            and block.count(b'"choices":[{') == n_events and b'"usage":{' not in block
            and b'"error"' not in block)


def _is_plain_token(payload: bytes) -> bool:
    """A compact chunk that only carries text: a choice, no finish reason, no usage, no error."""
    return (b'"finish_reason":null' in payload and b'"usage":' not in payload.replace(b'"usage":null', b"")
            and b'"error"' not in payload and b'"choices":[{' in payload)


def _data(event: bytes) -> bytes | None:
    """The data of one SSE event (``data:`` lines joined), ``None`` for comments and data-less events."""
    if event.startswith(b"data:") and b"\n" not in event:
        return event[5:].strip()
    lines = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None
