"""The quality gate: does a candidate answer as well as the baseline? Catches silent garbage.

A fast candidate that answers fluently and wrongly must never win; a wrong kernel or a cache race
produces one without an error. The gate records a ``QualityReference`` on the baseline's first boot
and compares every candidate with it:

- greedy outputs on a fixed prompt set, compared with a tolerant metric (batching and speculative
  decoding legitimately change low-probability tokens);
- exact-answer accuracy on a built-in set of arithmetic word problems, paired against the baseline
  (McNemar's exact test), so one flipped answer is not a regression but a collapse is;
- tool-call validity: arguments that parse and satisfy the declared schema;
- cache-hit correctness: the same long-context questions asked again once their prefix is cached must
  give the cold answers (a host-cache read race answers every host hit fluently and wrongly);
- speculative acceptance (``/server_info`` ``avg_spec_accept_length``) collapsing against the baseline
  (FR-Spec on a repacked output head: nothing errors, the draft just guesses badly).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import httpx

from elsa_tune.probes import haystack
from elsa_tune.probes.agreement import acceptance_collapsed, agreement, compare_accuracy
from elsa_tune.probes.client import ChatRequest, ProbeClient, Reply, flush_cache, server_info
from elsa_tune.probes.protocol import ProbeBudget, ProbeResult, ProbeStatus
from elsa_tune.runtime.protocol import Server

SCHEMA_VERSION = 1
_INT = re.compile(r"-?\d+")

WEATHER_TOOL: Mapping[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_forecast",
        "description": "Weather forecast for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city", "days"]},
    },
}


def _data(name: str) -> list[dict[str, Any]]:
    text = resources.files("elsa_tune.probes").joinpath("data", name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def knowledge_file() -> Path:
    """The arithmetic problems as a file (JSON lines of ``question`` and ``answer``): what a simulated model
    is told it knows (``SimulatedSGLang(knowledge=...)``), so it answers them with its profile's accuracy."""
    return Path(str(resources.files("elsa_tune.probes").joinpath("data", "arithmetic.jsonl")))


def arithmetic_problems() -> list[dict[str, Any]]:
    return _data("arithmetic.jsonl")


def reference_prompts() -> list[dict[str, Any]]:
    return _data("prompts.jsonl")


def final_integer(text: str) -> int | None:
    """The answer a reply commits to: the first integer after "answer", else the last integer."""
    lowered = text.lower()
    at = lowered.find("answer")
    found = _INT.findall(text[at:] if at >= 0 else text) or _INT.findall(text)
    if not found:
        return None
    return int(found[0] if at >= 0 else found[-1])


def tool_call_valid(call: Mapping[str, Any], tool: Mapping[str, Any] = WEATHER_TOOL) -> bool:
    """Name matches, arguments are JSON, required keys present with the declared JSON types."""
    fn = tool["function"]
    if call.get("name") != fn["name"]:
        return False
    try:
        args = json.loads(call.get("arguments") or "")
    except json.JSONDecodeError:
        return False
    if not isinstance(args, dict):
        return False
    types: dict[str, type | tuple[type, ...]] = {"string": str, "integer": int, "number": (int, float),
                                                 "boolean": bool, "object": dict, "array": list}
    props = fn["parameters"]["properties"]
    for key in fn["parameters"].get("required", ()):
        if key not in args:
            return False
    for key, value in args.items():
        expected = props.get(key, {}).get("type")
        if expected and not isinstance(value, types[expected]):
            return False
        if expected == "integer" and isinstance(value, bool):
            return False
    return True


@dataclass(frozen=True)
class QualitySample:
    """What one server answered to the gate's fixed questions."""

    greedy: tuple[str, ...]
    arithmetic_correct: tuple[bool, ...]
    tools_valid: tuple[bool, ...]
    cache_cold: tuple[str, ...]
    cache_warm: tuple[str, ...]
    accept_length: float | None
    errors: tuple[str, ...] = ()
    needles_cold: tuple[bool, ...] = ()   # the cold long-context answers retrieved their needle
    needles_warm: tuple[bool, ...] = ()   # the same from the prefix cache (or the host tier)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QualitySample:
        kwargs: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items()}
        return cls(**kwargs)


@dataclass(frozen=True)
class QualitySettings:
    greedy_max_tokens: int = 48
    arithmetic_problems: int = 48
    tool_requests: int = 6
    cache_words: int = 1500
    cache_questions: int = 3
    concurrency: int = 4
    min_mean_similarity: float = 0.85
    min_each_similarity: float = 0.35
    max_accuracy_drop: float = 0.10
    max_tool_drop: float = 0.34
    accept_collapse_ratio: float = 0.7
    host_cache_flags: tuple[str, ...] = ("enable-hierarchical-cache",)
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _CacheRound:
    cold: tuple[str, ...]
    warm: tuple[str, ...]
    errors: tuple[str, ...]
    needles_cold: tuple[bool, ...]
    needles_warm: tuple[bool, ...]


class QualityGate:
    """Collects a ``QualitySample`` from a server and judges a candidate's against the baseline's."""

    name = "quality"

    def __init__(self, settings: QualitySettings | None = None) -> None:
        self.settings = settings or QualitySettings()

    def sample(self, server: Server, budget: ProbeBudget) -> QualitySample:
        return asyncio.run(self._sample(server, budget))

    def run(self, server: Server, budget: ProbeBudget, reference: QualitySample) -> ProbeResult:
        started = time.monotonic()
        try:
            sample = self.sample(server, budget)
        except TimeoutError:
            return ProbeResult(self.name, ProbeStatus.FAILED, f"quality questions took over {budget.deadline_s:g} s",
                               seconds=time.monotonic() - started)
        result = self.judge(reference, sample)
        return ProbeResult(self.name, result.status, result.detail, seconds=time.monotonic() - started,
                           metrics={**result.metrics, "sample": sample.to_dict()}, evidence=result.evidence)

    def judge(self, reference: QualitySample, sample: QualitySample) -> ProbeResult:
        s = self.settings
        problems: list[str] = []
        evidence: list[str] = []
        metrics: dict[str, Any] = {}
        if sample.errors:
            return ProbeResult(self.name, ProbeStatus.FAILED, f"{len(sample.errors)} quality requests failed",
                               evidence=sample.errors[:5])
        text = agreement(reference.greedy, sample.greedy)
        metrics["greedy_mean_similarity"] = round(text.mean_similarity, 4)
        metrics["greedy_identical"] = text.identical
        if not text.acceptable(s.min_mean_similarity, s.min_each_similarity):
            problems.append(f"greedy outputs diverge from the baseline (mean similarity {text.mean_similarity:.2f})")
            worst = min(range(len(sample.greedy)), key=lambda i: _sim(reference.greedy[i], sample.greedy[i]))
            evidence.append(f"baseline: {reference.greedy[worst][:100]!r} / candidate: {sample.greedy[worst][:100]!r}")
        acc = compare_accuracy(reference.arithmetic_correct, sample.arithmetic_correct)
        metrics.update(arithmetic_baseline=acc.baseline_correct, arithmetic_candidate=acc.candidate_correct,
                       arithmetic_p=round(acc.p_value, 5))
        if acc.regressed(max_drop=s.max_accuracy_drop):
            problems.append(f"arithmetic accuracy fell from {acc.baseline_correct}/{acc.problems} to "
                            f"{acc.candidate_correct}/{acc.problems} (p={acc.p_value:.3g})")
        base_tools, cand_tools = sum(reference.tools_valid), sum(sample.tools_valid)
        metrics.update(tools_valid_baseline=base_tools, tools_valid_candidate=cand_tools)
        if reference.tools_valid and base_tools - cand_tools > s.max_tool_drop * len(reference.tools_valid):
            problems.append(f"valid tool calls fell from {base_tools} to {cand_tools} of {len(sample.tools_valid)}")
        mismatched = [i for i, (c, w) in enumerate(zip(sample.cache_cold, sample.cache_warm, strict=True)) if c != w]
        metrics["cache_hits_matching_cold"] = len(sample.cache_cold) - len(mismatched)
        if mismatched:
            problems.append(f"{len(mismatched)} of {len(sample.cache_cold)} cached answers differ from the cold ones")
            i = mismatched[0]
            evidence.append(f"cold: {sample.cache_cold[i][:80]!r} / cached: {sample.cache_warm[i][:80]!r}")
        found = (sum(sample.needles_cold), sum(sample.needles_warm))
        metrics.update(needles_cold=found[0], needles_warm=found[1])
        if sample.needles_cold and sum(reference.needles_cold) > found[0]:
            problems.append(f"long-context answers retrieved {found[0]} of {len(sample.needles_cold)} needles cold "
                            f"(baseline {sum(reference.needles_cold)})")
        collapsed = acceptance_collapsed(reference.accept_length, sample.accept_length, s.accept_collapse_ratio)
        metrics.update(accept_length_baseline=reference.accept_length, accept_length_candidate=sample.accept_length)
        if collapsed:
            problems.append(f"speculative acceptance collapsed: {sample.accept_length:.2f} vs "
                            f"{reference.accept_length:.2f} on the baseline")
        if problems:
            return ProbeResult(self.name, ProbeStatus.REGRESSED, "; ".join(problems), metrics=metrics,
                               evidence=tuple(evidence))
        return ProbeResult(self.name, ProbeStatus.PASSED, "answers match the baseline", metrics=metrics)

    async def _sample(self, server: Server, budget: ProbeBudget) -> QualitySample:
        s = self.settings
        client = ProbeClient(server.base_url, first_token_s=budget.request_timeout_s, hang_s=budget.hang_s)
        gate = asyncio.Semaphore(s.concurrency)
        async with asyncio.timeout(budget.deadline_s), httpx.AsyncClient(trust_env=False) as http:

            async def ask(request: ChatRequest) -> Reply:
                async with gate:
                    return await client.chat(http, request)

            prompts = reference_prompts()
            greedy = await asyncio.gather(*(ask(ChatRequest(
                messages=[{"role": "user", "content": p["prompt"]}], max_tokens=s.greedy_max_tokens))
                for p in prompts))
            problems = arithmetic_problems()[:s.arithmetic_problems]
            arithmetic = await asyncio.gather(*(ask(ChatRequest(
                messages=[{"role": "user", "content": p["question"] + " End with 'The answer is N.'"}],
                max_tokens=64)) for p in problems))
            tools = await asyncio.gather(*(ask(ChatRequest(
                messages=[{"role": "user", "content": f"What will the weather be in city number {i} for the next "
                                                      f"{i + 2} days? Use the tool."}],
                max_tokens=64, tools=(WEATHER_TOOL,))) for i in range(s.tool_requests)))
            info = await server_info(server.base_url)
            cache = await self._cache_round(server, client, http, budget)
        replies = [*greedy, *arithmetic, *tools]
        errors = tuple(r.error for r in replies if not r.ok) + cache.errors
        return QualitySample(
            greedy=tuple(r.text for r in greedy),
            arithmetic_correct=tuple(final_integer(r.text) == p["answer"] for r, p in zip(arithmetic, problems,
                                                                                           strict=True)),
            tools_valid=tuple(bool(r.tool_calls) and all(tool_call_valid(c) for c in r.tool_calls) for r in tools),
            cache_cold=cache.cold, cache_warm=cache.warm, accept_length=_accept_length(info), errors=errors,
            needles_cold=cache.needles_cold, needles_warm=cache.needles_warm)

    async def _cache_round(self, server: Server, client: ProbeClient, http: httpx.AsyncClient,
                           budget: ProbeBudget) -> _CacheRound:
        """Ask long-context questions cold, then again from the prefix cache (after eviction to host
        memory when the candidate enables a host tier); answers must match."""
        s = self.settings
        hay = haystack.build(s.cache_words, depths=tuple((i + 1) / (s.cache_questions + 1)
                                                         for i in range(s.cache_questions)), seed=4242)
        requests = [ChatRequest(messages=[{"role": "user", "content": f"{hay.text}\n\n{n.question}"}], max_tokens=24)
                    for n in hay.needles]
        await flush_cache(server.base_url)
        cold = [await client.chat(http, r) for r in requests]
        if any(server.candidate.flags.get(flag) for flag in s.host_cache_flags):
            await self._evict(server, client, http)
        warm = [await client.chat(http, r) for r in requests]
        errors = tuple(r.error for r in (*cold, *warm) if not r.ok)
        return _CacheRound(cold=tuple(r.text for r in cold), warm=tuple(r.text for r in warm), errors=errors,
                           needles_cold=tuple(n.found_in(r.text) for n, r in zip(hay.needles, cold, strict=True)),
                           needles_warm=tuple(n.found_in(r.text) for n, r in zip(hay.needles, warm, strict=True)))

    @staticmethod
    async def _evict(server: Server, client: ProbeClient, http: httpx.AsyncClient) -> None:
        """Push the cached prefixes out of GPU memory by filling the pool with other prompts."""
        pool = server.report.max_total_num_tokens or 0
        context = server.report.context_len or pool
        per_request = max(400, min(pool // 4, context - 1024))
        words = max(60, int(per_request / 1.3))      # filler words tokenize to ~1.2 tokens each
        needed = math.ceil(pool * 1.3 / per_request) + 1
        for i in range(min(needed, 64)):
            filler = haystack.build(words, depths=(0.5,), seed=10_000 + i)
            await client.chat(http, ChatRequest(messages=[{"role": "user", "content": filler.text}], max_tokens=1))


def _sim(a: str, b: str) -> float:
    return float(agreement([a], [b]).mean_similarity)


def _accept_length(info: Mapping[str, Any] | None) -> float | None:
    if not info:
        return None
    value = info.get("avg_spec_accept_length")
    states: Sequence[Any] = info.get("internal_states") or ()
    if value is None and states and isinstance(states[0], Mapping):
        value = states[0].get("avg_spec_accept_length")
    return float(value) if isinstance(value, (int, float)) else None
