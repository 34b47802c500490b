"""OpenAI-style request logs (JSONL) → trace rows, with real prompts turned into chained block hashes.

A line is either a bare request body (``/v1/chat/completions``, ``/v1/completions`` or SGLang's native
``/generate``) or a gateway record that wraps one (``request``/``body``/``req`` beside ``response`` and a
time field), as LiteLLM or a reverse proxy write them, or an event of SGLang's own request log
(``--log-requests --log-requests-format json --log-requests-level 3``; file targets prefix each line
with ``[date time] ``). SGLang logs a request up to three times (``request.received.openai``,
``request.received``, ``request.finished``): we keep one event per request, the finished one when
there is one (it carries the server's token counts; its arrival is its time minus ``e2e_latency``),
and count the others as duplicates, not as requests. We keep: the arrival
time, the prompt (tools first, then the messages in order, the way chat templates lay them out), the
completion length (``usage.completion_tokens``, else ``max_tokens``), sampling parameters, the session,
images, and the content regime (``kind``).

Prompts are split with a deterministic approximation of a tokenizer (``PIECE``: words in pieces of up
to six characters with their leading space, each punctuation mark alone; token-id prompts are used as
they are). It is not the served model's tokenizer, and the metadata says so; when the log carries
``usage.prompt_tokens`` the lengths are the server's and only the block boundaries are approximate.
Block ids are chained (each hashes its predecessor and its own pieces), so two prompts share leading
ids exactly as long as their leading blocks are identical: the Mooncake convention, and how a
prefix cache matches. When the logged token count differs from the pieces, the chain is cut short or
continued with ids unique to the prompt, so that there are ceil(input_tokens / block_size) of them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from elsa_tune.traffic.imports import BadLine, ImportResult, Row, collect, read_lines
from elsa_tune.traffic.trace import MAX_TOKENS, SCHEMA_VERSION, TraceMetadata, TraceRequest, expected_blocks

PIECE = re.compile(r"\s*\w{1,6}|\s*[^\w\s]|\s+")
TOKENIZER_NOTE = (r"regex-pieces-v1: /\s*\w{1,6}|\s*[^\w\s]|\s+/ (a deterministic approximation, not the "
                  "model's tokenizer; lengths from usage.prompt_tokens when logged)")
DEFAULT_OUTPUT_TOKENS = 256
DEFAULT_SAMPLE = 500
"""Prompts analysed for prefix-cache breakers: they come from templates, so they show in every request,
and the analysis costs microseconds per prompt token (benchmarks/traffic_data)."""
_HASH_MASK = (1 << 63) - 1
_TIME_FIELDS = ("timestamp", "time", "created_at", "startTime", "start_time", "request_time", "ts", "@timestamp",
                "created")
_BODY_FIELDS = ("request", "body", "req", "request_body", "payload", "obj")
_FINISHED, _RECEIVED, _RECEIVED_OPENAI = "request.finished", "request.received", "request.received.openai"
_SESSION_FIELDS = ("session_id", "session", "conversation_id", "thread_id", "user")


def pieces(text: str) -> list[str]:
    """Split text into token-like pieces (see ``PIECE``); ``"".join(pieces(t)) == t``."""
    return PIECE.findall(text)


def chained_hashes(units: Sequence[str], block_size: int, blocks: int | None = None) -> tuple[int, ...]:
    """One id per ``block_size`` units; each id hashes the previous id and the block's units.

    ``blocks`` (when the true token count is known and differs from ``len(units)``) cuts the chain
    short or continues it with ids derived from the last one. Block boundaries always fall every
    ``block_size`` units, so prompts that share a prefix share its ids whatever their total lengths.
    """
    natural = expected_blocks(len(units), block_size)
    count = natural if blocks is None else blocks
    out: list[int] = []
    previous = b""
    for index in range(count):
        if index < natural:
            # surrogatepass: a log may carry lone surrogates (JSON "\ud83d" from a broken producer)
            payload = "\x1f".join(units[index * block_size:(index + 1) * block_size]).encode("utf-8", "surrogatepass")
        else:
            payload = b"\x1e" + str(index).encode()
        previous = hashlib.blake2b(previous + payload, digest_size=8).digest()
        out.append(int.from_bytes(previous, "big") & _HASH_MASK)
    return tuple(out)


@dataclass(frozen=True)
class LoggedRequest:
    """One request read from a log: its trace row and the prompt text behind it."""

    request: TraceRequest
    prompt: str
    output_defaulted: bool
    tools: tuple[str, ...]


def parse_record(record: Mapping[str, Any], block_size: int) -> LoggedRequest:
    """Turn one decoded log record into a ``LoggedRequest``; ``BadLine`` says why it cannot."""
    body = _body(record)
    arrival = _arrival(record, body)
    response = _mapping(record.get("response") or record.get("res") or record.get("out"))
    usage = (_mapping(response.get("usage")) or _mapping(record.get("usage"))
             or _mapping(response.get("meta_info")))  # SGLang's request log: out.meta_info.prompt_tokens
    if record.get("event") == _FINISHED and _number(usage.get("e2e_latency")):
        arrival -= float(usage["e2e_latency"])  # logged at completion
    sampling = _mapping(body.get("sampling_params"))
    images = 0
    tools = body.get("tools") or body.get("functions") or []
    tool_names = tuple(sorted({str((t.get("function") or t).get("name", "?")) for t in tools
                               if isinstance(t, Mapping)}))
    parts: list[str] = []
    if tools:
        parts.append("<|tools|>\n" + json.dumps(tools, sort_keys=True) + "\n")
    units: list[str] | None = None
    last_user = ""
    tool_traffic = bool(tools)
    if isinstance(body.get("messages"), list):
        for message in body["messages"]:
            if not isinstance(message, Mapping):
                raise BadLine("a message is not an object")
            text, count = _content(message.get("content"))
            images += count
            if message.get("tool_calls") or message.get("role") in ("tool", "function"):
                tool_traffic = True
                text += json.dumps(message.get("tool_calls") or [], sort_keys=True)
            if message.get("role") == "user":
                last_user = text
            parts.append(f"<|{message.get('role', 'user')}|>\n{text}\n")
    elif "prompt" in body or "text" in body or "input_ids" in body:
        images += _count_images(body.get("image_data"))
        prompt = body.get("prompt", body.get("text", body.get("input_ids")))
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            units = [str(t) for t in prompt]
        elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            parts.append(prompt[0])
        elif isinstance(prompt, str):
            parts.append(prompt)
        else:
            raise BadLine("prompt is neither text nor a list of token ids (batched prompts are not supported)")
        last_user = "".join(parts)
    else:
        raise BadLine("no messages, prompt, text or input_ids: not an OpenAI-style or SGLang request")
    text = "".join(parts)
    if units is None:
        units = pieces(text)
    if not units:
        raise BadLine("empty prompt")
    input_tokens = _positive(usage.get("prompt_tokens")) or len(units)
    output_tokens = (_positive(usage.get("completion_tokens"))
                     or _positive(body.get("max_completion_tokens")) or _positive(body.get("max_tokens"))
                     or _positive(sampling.get("max_new_tokens")))
    request = TraceRequest(
        arrival_s=arrival,
        input_tokens=input_tokens,
        output_tokens=output_tokens or DEFAULT_OUTPUT_TOKENS,
        block_hashes=chained_hashes(units, block_size, expected_blocks(input_tokens, block_size)),
        session=_session(record, body),
        kind=infer_kind(body, tool_traffic, last_user or text),
        temperature=_number(body.get("temperature", sampling.get("temperature"))),
        top_p=_number(body.get("top_p", sampling.get("top_p"))),
        top_k=_top_k(body.get("top_k", sampling.get("top_k"))),
        images=images,
    )
    return LoggedRequest(request=request, prompt=text, output_defaulted=output_tokens is None, tools=tool_names)


def infer_kind(body: Mapping[str, Any], tool_traffic: bool, asked: str) -> str:
    """The content regime: ``tool`` (tools or tool turns), ``reasoning``, ``code`` (code fences), ``chat``."""
    if tool_traffic:
        return "tool"
    template = _mapping(body.get("chat_template_kwargs"))
    if body.get("reasoning_effort") or template.get("enable_thinking") or body.get("thinking"):
        return "reasoning"
    if "<tools>" in asked or "<tool_call>" in asked or "<tool_response>" in asked:
        return "tool"  # a chat template already rendered the tools into the prompt text (SGLang's request log)
    if "```" in asked or re.search(r"^\s*(def|class|import|#include|function)\b", asked, re.MULTILINE):
        return "code"
    return "chat"


def import_request_log(source: Path, *, skip_bad: bool, block_size: int,
                       breakers_sample: int = DEFAULT_SAMPLE) -> ImportResult:
    """Import a JSONL request log; prefix-cache breakers found in its first ``breakers_sample`` prompts
    (in arrival order; 0 skips the analysis) go into the metadata."""
    from elsa_tune.traffic.breakers import breakers_to_json, find_breakers

    parsed: list[tuple[int, LoggedRequest | BadLine, str | None, str | None]] = []
    lines = 0
    for number, line in read_lines(source):
        lines = number
        try:
            record = json_line(line)
            parsed.append((number, parse_record(record, block_size), _event(record), _rid(record)))
        except BadLine as exc:
            parsed.append((number, exc, None, None))
    kept, duplicates = _one_event_per_request(parsed)
    logged = [item for number, item, _, _ in parsed if number in kept and isinstance(item, LoggedRequest)]

    def rows() -> Iterator[Row]:
        for number, item, _, _ in parsed:
            if isinstance(item, BadLine):
                yield number, item, None
            elif number in kept:
                yield number, item.request, None

    def meta(start: str | None, end: str | None, skipped: int) -> TraceMetadata:
        ordered = sorted(logged, key=lambda item: item.request.arrival_s)
        first, last = ordered[0].request.arrival_s, ordered[-1].request.arrival_s
        sample = [item.prompt for item in ordered[:max(breakers_sample, 0)]]
        findings = find_breakers(sample) if sample else []
        defaulted = sum(item.output_defaulted for item in logged)
        tools = sorted({name for item in logged for name in item.tools})
        return TraceMetadata(
            schema_version=SCHEMA_VERSION, source=f"openai-jsonl:{source.name}", block_size=block_size,
            start=datetime.fromtimestamp(first, UTC).isoformat(), end=datetime.fromtimestamp(last, UTC).isoformat(),
            synthesized=False,
            notes="request log: prompts hashed into chained blocks with an approximate tokenizer"
                  + (f"; {defaulted} requests had no completion length and got {DEFAULT_OUTPUT_TOKENS}"
                     if defaulted else "")
                  + (f"; {duplicates} duplicate SGLang log events of the same requests left out" if duplicates
                     else ""),
            extra={"provenance": str(source), "format": "openai-jsonl", "tokenizer": TOKENIZER_NOTE,
                   "skipped_lines": str(skipped), "output_tokens_defaulted": str(defaulted),
                   "duplicate_events": str(duplicates), "tools": json.dumps(tools),
                   "breakers": breakers_to_json(findings), "breakers_sample": str(len(sample))})

    return collect(source, rows(), skip_bad, meta, lines=lines)


def json_line(line: str) -> Mapping[str, Any]:
    """A JSON object from a log line, allowing a logger's ``[date time] `` prefix before it."""
    text = line.strip()
    if not text.startswith("{") and text.startswith("[") and "] {" in text:
        text = text[text.index("] {") + 2:]
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadLine(f"not JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise BadLine("JSON nested too deeply") from None
    if not isinstance(record, dict):
        raise BadLine("not a JSON object")
    return record


def _event(record: Mapping[str, Any]) -> str | None:
    event = record.get("event")
    return event if event in (_FINISHED, _RECEIVED, _RECEIVED_OPENAI) else None


def _rid(record: Mapping[str, Any]) -> str | None:
    rid = record.get("rid") or _mapping(record.get("obj")).get("rid")
    return str(rid) if rid not in (None, "") else None


def _one_event_per_request(parsed: list[tuple[int, LoggedRequest | BadLine, str | None, str | None]]
                           ) -> tuple[set[int], int]:
    """Line numbers to keep, and how many SGLang log events were duplicates of a kept request.

    Plain records (no SGLang event) are all kept. Among SGLang events: every ``finished``; a
    ``received`` whose request never finished; ``received.openai`` only when the log has nothing else
    (it carries no request id to match).
    """
    good = [(number, event, rid) for number, item, event, rid in parsed if isinstance(item, LoggedRequest)]
    finished = {rid for _, event, rid in good if event == _FINISHED and rid}
    has_engine_events = any(event in (_FINISHED, _RECEIVED) for _, event, _ in good)
    def wanted(event: str | None, rid: str | None) -> bool:
        if event == _RECEIVED:
            return not (rid and rid in finished)
        if event == _RECEIVED_OPENAI:
            return not has_engine_events
        return True  # a plain record, or a finished event

    kept = {number for number, event, rid in good if wanted(event, rid)}
    return kept, len(good) - len(kept)


def _body(record: Mapping[str, Any]) -> Mapping[str, Any]:
    if any(key in record for key in ("messages", "prompt", "input_ids")) or (
            "text" in record and "sampling_params" in record):
        return record
    for key in _BODY_FIELDS:
        value = record.get(key)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (json.JSONDecodeError, RecursionError):
                continue
        if isinstance(value, Mapping):
            return value
    raise BadLine("no request body (expected messages/prompt, or one of " + ", ".join(_BODY_FIELDS) + ")")


def _arrival(record: Mapping[str, Any], body: Mapping[str, Any]) -> float:
    for source in (record, body):
        for key in _TIME_FIELDS:
            if key in source:
                return _seconds(source[key], key)
    raise BadLine("no arrival time (expected one of " + ", ".join(_TIME_FIELDS) + ")")


def _seconds(value: Any, key: str) -> float:
    if isinstance(value, bool):
        raise BadLine(f"{key} is {value!r}, not a time")
    if isinstance(value, int | float):
        # Epoch seconds, milliseconds or microseconds, told apart by magnitude.
        seconds = float(value)
        if not math.isfinite(seconds) or seconds < 0:
            raise BadLine(f"{key} is {value!r}, not a time")
        while seconds > 1e11:
            seconds /= 1000.0
        return seconds
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            try:
                return _seconds(float(value), key)
            except ValueError:
                raise BadLine(f"{key} {value!r} is not a time") from None
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    raise BadLine(f"{key} is {value!r}, not a time")


def _content(content: Any) -> tuple[str, int]:
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        raise BadLine("message content is neither text nor a list of parts")
    text: list[str] = []
    images = 0
    for part in content:
        if not isinstance(part, Mapping):
            raise BadLine("a content part is not an object")
        kind = part.get("type")
        if kind in ("image_url", "image", "input_image"):
            images += 1
            text.append("<image>")
        elif isinstance(part.get("text"), str):
            text.append(part["text"])
    return "".join(text), images


def _session(record: Mapping[str, Any], body: Mapping[str, Any]) -> str | None:
    for source in (record, body, body.get("metadata") or {}, record.get("metadata") or {}):
        if not isinstance(source, Mapping):
            continue
        for key in _SESSION_FIELDS:
            if source.get(key) not in (None, ""):
                return _utf8(str(source[key]))
    headers = record.get("headers") or {}
    if isinstance(headers, Mapping):
        for key, value in headers.items():
            if str(key).lower() in ("x-session-id", "x-conversation-id"):
                return _utf8(str(value))
    return None


def _utf8(text: str) -> str:
    """``text`` with anything UTF-8 cannot carry (lone surrogates) replaced, as Parquet strings need."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _count_images(value: Any) -> int:
    if value is None:
        return 0
    return len(value) if isinstance(value, list) else 1


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _positive(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return None
    if value > MAX_TOKENS:
        raise BadLine(f"a token count is {value}, more than the {MAX_TOKENS:,} tokens any request may have")
    return int(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _top_k(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None  # SGLang's -1 (and 0) mean "no top-k"
    return int(value)
