"""Prefix-cache breakers: found where they break sharing, with their cost and place; silent otherwise."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

from elsa_tune.traffic.breakers import breakers_from_json, breakers_to_json, find_breakers
from elsa_tune.traffic.imports import import_trace
from elsa_tune.traffic.requestlog import pieces

CONTEXT = " ".join(f"Rule {i}: answer politely and cite section {i % 7} of the handbook." for i in range(80))


def _agent_prompts(volatile_first: bool, n: int = 40) -> list[str]:
    rng = random.Random(4)
    prompts = []
    for _ in range(n):
        volatile = f"session_id: {uuid.UUID(int=rng.getrandbits(128))}\n"
        question = f"\nuser asks about item {rng.randrange(10**6)}"
        prompts.append(volatile + CONTEXT + question if volatile_first else CONTEXT + question + "\n" + volatile)
    return prompts


def test_a_session_id_at_the_top_is_found_with_its_cost_and_place() -> None:
    found = find_breakers(_agent_prompts(volatile_first=True))
    assert len(found) == 1
    top = found[0]
    assert (top.pattern, top.label) == ("uuid", "session_id:")
    assert top.requests == 39  # every request after the first would have reused the context
    context_tokens = len(pieces(CONTEXT))
    assert context_tokens - 16 <= top.tokens_lost_mean <= context_tokens + 16  # chunk resolution
    assert top.position_tokens_median < 10 and top.position_fraction_median < 0.01
    assert "end of the prompt" in top.remedy


def test_volatile_content_at_the_end_costs_nothing() -> None:
    assert find_breakers(_agent_prompts(volatile_first=False)) == []


def test_constant_ids_and_genuinely_different_prompts_are_not_breakers() -> None:
    constant = [f"request_id: req_00000001\n{CONTEXT}\nq{i}" for i in range(10)]
    assert find_breakers(constant) == []
    distinct = [f"Topic {chr(65 + i)} " * 200 for i in range(10)]
    assert find_breakers(distinct) == []


def test_counters_timestamps_and_files_are_named() -> None:
    prompts = []
    for turn in range(12):
        prompts.append(f"Turn: {turn}\n{CONTEXT}")
        prompts.append(f"Now: 2026-11-29T14:{turn:02d}:05Z\n{CONTEXT} tail")
        prompts.append(f"Current file: src/mod_{turn}.py\n{CONTEXT} other tail")
    patterns = {(b.pattern, b.label) for b in find_breakers(prompts)}
    assert {("counter", "Turn:"), ("timestamp", "Now:"), ("file", "Current file:")} <= patterns


def test_json_round_trip_and_tolerance() -> None:
    found = find_breakers(_agent_prompts(volatile_first=True))
    assert breakers_from_json(breakers_to_json(found)) == found
    assert breakers_from_json(None) == [] and breakers_from_json("{bad") == []


def test_request_log_import_stores_breakers_in_metadata(tmp_path: Path) -> None:
    lines = [json.dumps({"timestamp": 1_800_000_000 + i, "max_tokens": 16,
                         "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "go"}]})
             for i, prompt in enumerate(_agent_prompts(volatile_first=True, n=20))]
    path = tmp_path / "agents.jsonl"
    path.write_text("\n".join(lines) + "\n")
    trace = import_trace(path, "openai-jsonl").trace
    stored = breakers_from_json(trace.metadata.extra["breakers"])
    assert [(b.pattern, b.requests) for b in stored] == [("uuid", 19)]


def test_the_breaker_analysis_is_bounded_by_its_sample(tmp_path: Path) -> None:
    lines = [json.dumps({"timestamp": 1_800_000_000 + i, "max_tokens": 16,
                         "messages": [{"role": "system", "content": prompt}]})
             for i, prompt in enumerate(_agent_prompts(volatile_first=True, n=20))]
    path = tmp_path / "agents.jsonl"
    path.write_text("\n".join(lines) + "\n")
    sampled = import_trace(path, "openai-jsonl", breakers_sample=5).trace.metadata.extra
    assert sampled["breakers_sample"] == "5"
    assert [b.requests for b in breakers_from_json(sampled["breakers"])] == [4]
    assert breakers_from_json(import_trace(path, "openai-jsonl", breakers_sample=0).trace.metadata
                              .extra["breakers"]) == []


def test_stacked_volatile_fields_are_all_reported() -> None:
    rng = random.Random(9)
    prompts = [f"session_id: {uuid.UUID(int=rng.getrandbits(128))}\nturn: {i}\nnow: 2026-11-29T10:{i:02d}:00Z\n"
               f"{CONTEXT}\nuser: q{rng.randrange(10**6)}" for i in range(30)]
    found = find_breakers(prompts)
    assert [(b.pattern, b.label, b.requests) for b in found] == [
        ("uuid", "session_id:", 29), ("counter", "turn:", 29), ("timestamp", "now:", 29)]
    # each would still cost the whole shared context once the ones above it were moved
    assert all(b.tokens_lost_mean > len(pieces(CONTEXT)) - 32 for b in found)
