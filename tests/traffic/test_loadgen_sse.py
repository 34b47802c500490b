"""``CompletionStream`` (the loadgen's SSE parser): its shortcuts agree with a plain event-by-event parse."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elsa_tune.traffic.sse import CompletionStream


def _token(text: str) -> bytes:
    chunk = {"id": "c", "object": "text_completion", "created": 1, "model": "m",
             "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None, "matched_stop": None}],
             "usage": None}
    return json.dumps(chunk, separators=(",", ":")).encode()


def _final(text: str) -> bytes:
    chunk = {"id": "c", "choices": [{"index": 0, "text": text, "finish_reason": "length"}], "usage": None}
    return json.dumps(chunk, separators=(",", ":")).encode()


USAGE = json.dumps({"id": "c", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3,
                                                         "prompt_tokens_details": {"cached_tokens": 2}}}).encode()
ERROR = json.dumps({"error": {"object": "error", "message": "bad", "code": 400}}).encode()
# texts that try to fool the pattern counts: quotes, the patterns themselves, newlines, unicode
TEXTS = st.sampled_from(['"finish_reason":null', '"usage":{', '"error"', 'data: x', "\n\n", "é", "", " a", '\\"'])
EVENT = st.one_of(TEXTS.map(lambda t: ("token", _token(t))), TEXTS.map(lambda t: ("final", _final(t))),
                  st.just(("usage", USAGE)), st.just(("error", ERROR)), st.just(("comment", b"")))


def _render(kind: str, payload: bytes, crlf: bool) -> bytes:
    raw = b": keep-alive\n\n" if kind == "comment" else b"data: " + payload + b"\n\n"
    return raw.replace(b"\n", b"\r\n") if crlf else raw


def _reference(events: list[tuple[str, bytes]]) -> dict[str, Any]:
    out: dict[str, Any] = {"chunks": 0, "usage": None, "finish": None, "error": "", "texts": []}
    for kind, payload in events:
        if kind == "comment":
            continue
        chunk = json.loads(payload)
        if chunk.get("choices"):
            out["chunks"] += 1
            out["texts"].append(chunk["choices"][0].get("text") or "")
            out["finish"] = chunk["choices"][0].get("finish_reason") or out["finish"]
        out["usage"] = chunk.get("usage") or out["usage"]
        if chunk.get("error"):
            out["error"] = json.dumps(chunk["error"])
    return out


@settings(max_examples=300, deadline=None)
@given(events=st.lists(EVENT, max_size=30), cuts=st.lists(st.integers(0, 10_000), max_size=10), crlf=st.booleans(),
       keep_text=st.booleans())
def test_shortcuts_agree_with_a_full_parse(events: list[tuple[str, bytes]], cuts: list[int], crlf: bool,
                                           keep_text: bool) -> None:
    wire = b"".join(_render(k, p, crlf) for k, p in events) + _render("done", b"[DONE]", crlf) + b"data: {junk"
    points = sorted({c % (len(wire) + 1) for c in cuts} | {0, len(wire)})
    stream = CompletionStream(keep_text=keep_text)
    for i, (a, b) in enumerate(itertools.pairwise(points)):
        stream.feed(wire[a:b], float(i))
    want = _reference(events)
    assert stream.done
    assert len(stream.chunk_times) == want["chunks"]
    assert stream.chunk_times == sorted(stream.chunk_times)
    assert (stream.usage, stream.finish_reason, stream.error) == (want["usage"], want["finish"], want["error"])
    assert stream.text == ("".join(want["texts"]) if keep_text else "")


def test_one_read_of_many_plain_chunks_stamps_them_all_at_its_arrival() -> None:
    stream = CompletionStream()
    stream.feed(b"".join(b"data: " + _token(" t") + b"\n\n" for _ in range(50)) + b"data: " + _token("x")[:10], 1.5)
    assert stream.chunk_times == [1.5] * 50 and not stream.done
    stream.feed(_token("x")[10:] + b"\n\ndata: [DONE]\n\n", 2.0)
    assert stream.chunk_times[-1] == 2.0 and len(stream.chunk_times) == 51 and stream.done


def test_undecodable_data_raises() -> None:
    with pytest.raises(json.JSONDecodeError):
        CompletionStream().feed(b"data: {not json\n\n", 0.0)
