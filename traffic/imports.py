"""Importing traffic someone else recorded: public traces (Mooncake, Azure) and OpenAI-style request logs.

Every importer reads its file line by line and turns each line into a ``TraceRequest`` or a
``SkippedLine`` naming the line number and the reason. By default the first bad line stops the import
with a ``TrafficError`` that points at it; with ``skip_bad=True`` bad lines are left out and listed in
the ``ImportResult`` (and counted in the trace's metadata), so nobody mistakes a partial import for a
whole one. Rows are sorted by arrival (stable), because logs are often written at completion time.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from elsa_tune.errors import TrafficError
from elsa_tune.traffic.trace import (
    DEFAULT_BLOCK_SIZE,
    MAX_TOKENS,
    SCHEMA_VERSION,
    Trace,
    TraceMetadata,
    TraceRequest,
    expected_blocks,
)

log = logging.getLogger(__name__)

FORMATS = ("mooncake", "azure", "openai-jsonl")
MOONCAKE_BLOCK_SIZE = 512


@dataclass(frozen=True)
class SkippedLine:
    """A source line that did not become a request, and why."""

    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


@dataclass(frozen=True)
class ImportResult:
    """The imported trace, the lines read and the lines left out."""

    trace: Trace
    lines: int
    skipped: tuple[SkippedLine, ...]


class BadLine(ValueError):
    """A line an importer cannot use; the message says why."""


def import_trace(path: str | os.PathLike[str], fmt: str, *, skip_bad: bool = False, kind: str = "chat",
                 block_size: int | None = None, breakers_sample: int = 500) -> ImportResult:
    """Import ``path`` in format ``fmt`` (one of ``FORMATS``) into a validated ``Trace``.

    ``breakers_sample``: request-log prompts analysed for prefix-cache breakers (0: none).
    """
    source = Path(path)
    if fmt not in FORMATS:
        raise TrafficError(f"unknown trace format {fmt!r}", remedy=f"use one of: {', '.join(FORMATS)}")
    if not source.is_file():
        raise TrafficError(f"{source}: no such file", remedy="check the path of the trace or log to import")
    if fmt == "mooncake":
        return collect(source, _mooncake_rows(source, kind), skip_bad, _mooncake_meta(source))
    if fmt == "azure":
        size = block_size or DEFAULT_BLOCK_SIZE
        return collect(source, _azure_rows(source, kind, size), skip_bad, _azure_meta(source, size))
    from elsa_tune.traffic.requestlog import import_request_log

    result: ImportResult = import_request_log(source, skip_bad=skip_bad, block_size=block_size or DEFAULT_BLOCK_SIZE,
                                              breakers_sample=breakers_sample)
    return result


Row = tuple[int, TraceRequest | BadLine, str | None]
"""(line number, request or the reason it is bad, wall-clock start of the source if this row knows it)"""


def collect(source: Path, rows: Iterator[Row], skip_bad: bool,
             meta: Callable[[str | None, str | None, int], TraceMetadata], *, lines: int = 0) -> ImportResult:
    """Gather rows into an ``ImportResult``; ``lines`` is the source's line count when rows skip some."""
    requests: list[TraceRequest] = []
    skipped: list[SkippedLine] = []
    start: str | None = None
    for number, item, wall in rows:
        lines = max(lines, number)
        if isinstance(item, BadLine):
            if not skip_bad:
                raise TrafficError(f"{source}:{number}: {item}",
                                   remedy="fix or delete that line, or pass --skip-bad to leave bad lines out")
            skipped.append(SkippedLine(number, str(item)))
            continue
        if start is None and wall is not None:
            start = wall
        requests.append(item)
    if not requests:
        raise TrafficError(f"{source}: no usable requests in {lines} lines",
                           remedy="check the --format; the first skipped lines say what was wrong"
                           + (f" ({skipped[0]})" if skipped else ""))
    trace = rebase(requests, meta(start, _end(start, requests), len(skipped)))
    if skipped:
        log.warning("%s: skipped %d of %d lines, first: %s", source, len(skipped), lines, skipped[0])
    return ImportResult(trace=trace, lines=lines, skipped=tuple(skipped))


def rebase(requests: list[TraceRequest], metadata: TraceMetadata) -> Trace:
    """Sort by arrival (stable) and shift arrivals so that the first one is at 0 s."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    origin = ordered[0].arrival_s
    if origin:
        ordered = [_shifted(r, origin) for r in ordered]
    return Trace.from_requests(ordered, metadata)


def _shifted(request: TraceRequest, origin: float) -> TraceRequest:
    return replace(request, arrival_s=request.arrival_s - origin)


def _end(start: str | None, requests: list[TraceRequest]) -> str | None:
    if start is None:
        return None
    span = max(r.arrival_s for r in requests) - min(r.arrival_s for r in requests)
    return (datetime.fromisoformat(start) + timedelta(seconds=span)).isoformat()


def read_lines(source: Path) -> Iterator[tuple[int, str]]:
    """Numbered non-empty lines (1-based), decoding errors reported by line."""
    with source.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield number, "\x00not utf-8"
                continue
            if text.strip():
                yield number, text


def _int_field(record: dict[str, Any], name: str, *, minimum: int) -> int:
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value != int(value):
        raise BadLine(f"{name} is {value!r}, expected an integer")
    if value < minimum:
        raise BadLine(f"{name} is {value}, expected >= {minimum}")
    if value > MAX_TOKENS:
        raise BadLine(f"{name} is {value}, more than the {MAX_TOKENS:,} tokens any request may have")
    return int(value)


# ---- Mooncake (FAST'25 traces): {"timestamp": ms, "input_length", "output_length", "hash_ids"} ------------------


def _mooncake_rows(source: Path, kind: str) -> Iterator[Row]:
    for number, text in read_lines(source):
        try:
            record = json.loads(text)
            if not isinstance(record, dict):
                raise BadLine("not a JSON object")
            timestamp = record.get("timestamp")
            if isinstance(timestamp, bool) or not isinstance(timestamp, int | float) \
                    or not math.isfinite(timestamp) or timestamp < 0:
                raise BadLine(f"timestamp is {timestamp!r}, expected milliseconds >= 0")
            inp = _int_field(record, "input_length", minimum=1)
            out = _int_field(record, "output_length", minimum=1)
            hashes = record.get("hash_ids")
            if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool)
                                                       for h in hashes):
                raise BadLine("hash_ids is not a list of integers")
            if len(hashes) != expected_blocks(inp, MOONCAKE_BLOCK_SIZE):
                raise BadLine(f"{len(hashes)} hash_ids for input_length {inp}, expected "
                              f"{expected_blocks(inp, MOONCAKE_BLOCK_SIZE)} (one per {MOONCAKE_BLOCK_SIZE} tokens)")
            yield number, TraceRequest(arrival_s=float(timestamp) / 1000.0, input_tokens=inp, output_tokens=out,
                                       block_hashes=tuple(hashes), kind=kind), None
        except json.JSONDecodeError as exc:
            yield number, BadLine(f"not JSON: {exc.msg} at column {exc.colno}"), None
        except RecursionError:
            yield number, BadLine("JSON nested too deeply"), None
        except BadLine as exc:
            yield number, exc, None


def _mooncake_meta(source: Path) -> Callable[[str | None, str | None, int], TraceMetadata]:
    def build(start: str | None, end: str | None, skipped: int) -> TraceMetadata:
        return TraceMetadata(
            schema_version=SCHEMA_VERSION, source=f"mooncake:{source.name}", block_size=MOONCAKE_BLOCK_SIZE,
            start=None, end=None, synthesized=False,
            notes="Mooncake trace: relative timestamps in ms; hash_ids are remapped prefix block hashes (512 tokens)",
            extra={"provenance": str(source), "format": "mooncake", "skipped_lines": str(skipped)})
    return build


# ---- Azure LLM inference trace 2023: TIMESTAMP,ContextTokens,GeneratedTokens ----------------------------------


def _azure_rows(source: Path, kind: str, block_size: int) -> Iterator[Row]:
    next_hash = 0
    with source.open(newline="", encoding="utf-8", errors="replace") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        wanted = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
        if header is None or [h.strip() for h in header[:3]] != list(wanted):
            yield 1, BadLine(f"header is {header!r}, expected {','.join(wanted)}"), None
            return
        for fields in reader:
            number = reader.line_num
            if not fields or not "".join(fields).strip():
                continue
            try:
                if len(fields) < 3:
                    raise BadLine(f"{len(fields)} fields, expected 3")
                try:
                    when = datetime.fromisoformat(fields[0].strip())
                except ValueError as exc:
                    raise BadLine(f"TIMESTAMP {fields[0]!r} is not a date-time") from exc
                if when.tzinfo is None:
                    when = when.replace(tzinfo=UTC)
                try:
                    inp, out = int(fields[1]), int(fields[2])
                except ValueError as exc:
                    raise BadLine(f"token counts {fields[1]!r},{fields[2]!r} are not integers") from exc
                if inp <= 0 or out <= 0:
                    raise BadLine(f"token counts {inp},{out} must be positive")
                if max(inp, out) > MAX_TOKENS:
                    raise BadLine(f"token counts {inp},{out}: more than the {MAX_TOKENS:,} tokens any request "
                                  "may have")
            except BadLine as exc:
                yield number, exc, None
                continue
            # No prefix information in this trace: every block is unique, so nothing is shared.
            count = expected_blocks(inp, block_size)
            hashes = tuple(range(next_hash, next_hash + count))
            next_hash += count
            yield number, TraceRequest(arrival_s=when.timestamp(), input_tokens=inp, output_tokens=out,
                                       block_hashes=hashes, kind=kind), when.isoformat()


def _azure_meta(source: Path, block_size: int) -> Callable[[str | None, str | None, int], TraceMetadata]:
    def build(start: str | None, end: str | None, skipped: int) -> TraceMetadata:
        return TraceMetadata(
            schema_version=SCHEMA_VERSION, source=f"azure:{source.name}", block_size=block_size, start=start,
            end=end, synthesized=False,
            notes="Azure LLM inference trace 2023: no prompt content, so every prompt block is unique "
                  "(no prefix sharing can be inferred); TIMESTAMP read as UTC",
            extra={"provenance": str(source), "format": "azure", "skipped_lines": str(skipped)})
    return build
