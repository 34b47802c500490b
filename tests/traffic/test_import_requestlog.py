"""OpenAI-style request logs: every supported line shape, kinds, sampling, sessions, prefix structure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from elsa_tune.errors import TrafficError
from elsa_tune.traffic.imports import import_trace
from elsa_tune.traffic.requestlog import DEFAULT_OUTPUT_TOKENS, chained_hashes, pieces

SYSTEM = "You are a careful assistant. " * 40
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def _write(path: Path, records: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _records() -> list[Any]:
    return [
        # 1: a gateway record wrapping a chat request, with the server's usage and a session
        {"timestamp": "2026-11-01T10:00:00Z", "session_id": "s-1",
         "request": {"model": "m", "messages": [{"role": "system", "content": SYSTEM},
                                                {"role": "user", "content": "hello there"}],
                     "temperature": 0.7, "top_p": 0.95, "top_k": 20},
         "response": {"usage": {"prompt_tokens": 300, "completion_tokens": 42}}},
        # 2: a bare chat body with tools; epoch seconds
        {"created": 1793527201, "model": "m", "tools": TOOLS, "max_tokens": 64,
         "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "open a.py"}]},
        # 3: code in the question, an image part, epoch milliseconds
        {"time": 1793527202000, "model": "m", "max_completion_tokens": 10,
         "messages": [{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": [{"type": "text", "text": "fix:\n```py\nx = 1\n```"},
                                                   {"type": "image_url", "image_url": {"url": "data:"}}]}]},
        # 4: /v1/completions with reasoning asked for and no completion length at all
        {"ts": 1793527203.5, "body": json.dumps({"prompt": "Think step by step: 2+2?", "reasoning_effort": "high"})},
        # 5: SGLang native /generate with token ids
        {"timestamp": 1793527204, "input_ids": list(range(1000)),
         "sampling_params": {"max_new_tokens": 7, "temperature": 0.0, "top_k": -1}},
    ]


def test_each_line_shape_becomes_a_request(tmp_path: Path) -> None:
    result = import_trace(_write(tmp_path / "log.jsonl", _records()), "openai-jsonl", block_size=64)
    rows = list(result.trace.requests())
    assert [r.kind for r in rows] == ["chat", "tool", "code", "reasoning", "chat"]
    assert [r.output_tokens for r in rows] == [42, 64, 10, DEFAULT_OUTPUT_TOKENS, 7]
    assert rows[0].input_tokens == 300 and len(rows[0].block_hashes) == 5  # the server's count, ceil(300 / 64)
    assert (rows[0].temperature, rows[0].top_p, rows[0].top_k, rows[0].session) == (0.7, 0.95, 20, "s-1")
    assert rows[4].input_tokens == 1000 and rows[4].top_k is None and rows[4].temperature == 0.0
    assert rows[2].images == 1
    assert [r.arrival_s for r in rows] == pytest.approx([0.0, 1.0, 2.0, 3.5, 4.0])
    meta = result.trace.metadata
    assert meta.start == "2026-11-01T10:00:00+00:00"
    assert meta.extra["output_tokens_defaulted"] == "1"
    assert json.loads(meta.extra["tools"]) == ["read_file"]
    assert "approximation" in meta.extra["tokenizer"]


def test_shared_system_prompts_share_leading_blocks(tmp_path: Path) -> None:
    rows = list(import_trace(_write(tmp_path / "log.jsonl", _records()), "openai-jsonl", block_size=16)
                .trace.requests())
    plain, coded = rows[0], rows[2]  # both start with the same system prompt, no tools before it
    pairs = zip(plain.block_hashes, coded.block_hashes, strict=False)
    shared = next((i for i, (a, b) in enumerate(pairs) if a != b), len(plain.block_hashes))
    assert shared >= 10 and plain.block_hashes[-1] != coded.block_hashes[-1]
    assert not set(rows[3].block_hashes) & set(plain.block_hashes)


def test_chained_hashes_identify_whole_prefixes() -> None:
    a = pieces("alpha beta gamma delta eta zeta")
    assert "".join(a) == "alpha beta gamma delta eta zeta"
    b = pieces("alpha beta gamma DELTA eta zeta")
    ha, hb = chained_hashes(a, 2), chained_hashes(b, 2)
    assert len(ha) == 3 and ha[0] == hb[0] and ha[1] != hb[1] and ha[2] != hb[2]
    assert all(0 <= h < 2**63 for h in ha)
    assert chained_hashes(a, 2, blocks=2) == ha[:2]
    longer = chained_hashes(a, 2, blocks=5)
    assert longer[:3] == ha and len(set(longer)) == 5


def test_bad_lines_are_reported_by_number(tmp_path: Path) -> None:
    records = [*_records()[:2], "{oops", {"messages": [{"role": "user", "content": "no time"}]},
               {"timestamp": 1, "model": "m"}, {"timestamp": "noon", "prompt": "x"}]
    path = _write(tmp_path / "log.jsonl", records)
    with pytest.raises(TrafficError, match=r"log.jsonl:3: not JSON"):
        import_trace(path, "openai-jsonl")
    result = import_trace(path, "openai-jsonl", skip_bad=True)
    assert [(s.line, s.reason.split(" ")[0]) for s in result.skipped] == [(3, "not"), (4, "no"), (5, "no"),
                                                                          (6, "timestamp")]
    assert len(result.trace) == 2


def test_sglang_json_request_log_keeps_one_event_per_request(tmp_path: Path) -> None:
    """``--log-requests --log-requests-format json --log-requests-level 3`` written to a file target."""
    templated = "<|im_start|>system\n<tools>\n{\"name\": \"read_file\"}\n</tools><|im_end|>\n" + SYSTEM
    sampling = {"max_new_tokens": 100, "temperature": 0.6, "top_k": 20}

    def line(stamp: str, payload: dict[str, Any]) -> str:
        return f"[2026-11-29 10:00:{stamp[:2]}] " + json.dumps({"timestamp": f"2026-11-29T10:00:{stamp}", **payload})

    openai = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    abc = {"text": templated + "open a.py", "sampling_params": sampling, "rid": "abc", "stream": True}
    ghi = {"text": templated + "open b.py", "sampling_params": sampling, "rid": "ghi", "image_data": ["x", "y"]}
    lines = [
        line("00.100000", {"event": "request.received.openai", "obj": openai}),
        line("00.120000", {"event": "request.received", "rid": "abc", "obj": abc}),
        line("01.000000", {"event": "request.received.openai", "obj": openai}),
        line("01.020000", {"event": "request.received", "rid": "ghi", "obj": ghi}),  # never finished (aborted)
        line("05.120000", {"event": "request.finished", "rid": "abc", "obj": abc,
                           "out": {"text": "ok", "meta_info": {"id": "abc", "prompt_tokens": 812,
                                                               "completion_tokens": 57, "cached_tokens": 512,
                                                               "e2e_latency": 5.0}}}),
    ]
    path = tmp_path / "host_0.log"
    path.write_text("\n".join(lines) + "\n")
    result = import_trace(path, "openai-jsonl", block_size=64)
    rows = list(result.trace.requests())
    assert result.lines == 5 and result.skipped == ()
    assert [(r.input_tokens, r.output_tokens, r.kind, r.images) for r in rows] == [
        (812, 57, "tool", 0), (len(pieces(ghi["text"])), 100, "tool", 2)]
    assert [r.arrival_s for r in rows] == pytest.approx([0.0, 0.9])  # finished at 5.12 s minus its 5 s latency
    assert (rows[0].temperature, rows[0].top_k) == (0.6, 20)
    assert result.trace.metadata.extra["duplicate_events"] == "3"
    # both prompts share the templated system prompt
    assert rows[0].block_hashes[:5] == rows[1].block_hashes[:5]


def test_lone_surrogates_from_a_broken_producer_do_not_crash(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"timestamp": 1, "session_id": "s\\ud800", "prompt": "half an emoji \\ud83d", "max_tokens": 2}\n')
    row = next(import_trace(path, "openai-jsonl").trace.requests())
    assert row.session == "s?" and row.output_tokens == 2
