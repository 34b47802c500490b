"""The traffic trace: one row per request in a Parquet file, schema versioned in its key-value metadata.

Columns (design, "The traffic trace"):

    arrival_s      float64               seconds since the start of the trace, non-decreasing
    input_tokens   int32                 prompt length in tokens, > 0
    output_tokens  int32                 completion length in tokens, > 0
    block_hashes   list<int64>           one id per ``block_size`` prompt tokens (ceil); two requests share
                                         a prefix exactly as long as their leading ids agree (Mooncake)
    session        string, nullable      conversation or agent session
    kind           dictionary<string>    content regime: chat, code, tool, reasoning, ...
    temperature    float64, nullable     sampling
    top_p          float64, nullable
    top_k          int32, nullable
    images         int16                 images in the request, >= 0

The file's key-value metadata carries ``elsa_tune.schema_version``, ``elsa_tune.source``,
``elsa_tune.block_size``, ``elsa_tune.start``/``end`` (ISO wall-clock window, when known),
``elsa_tune.synthesized``, ``elsa_tune.notes`` and ``elsa_tune.extra`` (a JSON object of strings:
provenance, prefix-cache breakers, what a recording saw). A ``Trace`` is validated whenever it is built,
so every trace in memory satisfies the invariants above.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from elsa_tune.durable_file import replacing
from elsa_tune.errors import TrafficError
from elsa_tune.input_file import check_input

SCHEMA_VERSION = 1
META_PREFIX = "elsa_tune."
DEFAULT_BLOCK_SIZE = 512
DEMO_TRACE = Path(__file__).resolve().parent / "data" / "demo.parquet"
"""378 real requests: the busiest 90 s of the Mooncake FAST'25 conversation trace (provenance in its metadata)."""
DEMO_WINDOW = (3081.0, 3171.0)

SCHEMA = pa.schema(
    [
        pa.field("arrival_s", pa.float64(), nullable=False),
        pa.field("input_tokens", pa.int32(), nullable=False),
        pa.field("output_tokens", pa.int32(), nullable=False),
        pa.field("block_hashes", pa.list_(pa.int64()), nullable=False),
        pa.field("session", pa.string(), nullable=True),
        pa.field("kind", pa.dictionary(pa.int32(), pa.string()), nullable=False),
        pa.field("temperature", pa.float64(), nullable=True),
        pa.field("top_p", pa.float64(), nullable=True),
        pa.field("top_k", pa.int32(), nullable=True),
        pa.field("images", pa.int16(), nullable=False),
    ]
)
COLUMNS = tuple(SCHEMA.names)


@dataclass(frozen=True)
class TraceMetadata:
    """Where a trace came from. ``start``/``end`` are ISO-8601 wall-clock times of the window, if known.

    ``extra`` holds string values only (JSON-encoded where structured): e.g. ``"provenance"``,
    ``"breakers"`` (prefix-cache breakers found in request logs), ``"recording"`` (what a Prometheus
    recording saw), ``"tokenizer"`` (how prompt text became block hashes).
    """

    schema_version: int
    source: str
    block_size: int
    start: str | None
    end: str | None
    synthesized: bool
    notes: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise TrafficError(f"block_size must be positive, got {self.block_size}",
                               remedy="use the block size the prefix hashes were computed with (Mooncake: 512)")
        object.__setattr__(self, "extra", MappingProxyType({str(k): str(v) for k, v in sorted(self.extra.items())}))

    def with_extra(self, **values: str) -> TraceMetadata:
        """A copy with ``extra`` keys added or replaced."""
        return replace(self, extra={**self.extra, **values})

    def to_parquet(self) -> dict[bytes, bytes]:
        values = {
            "schema_version": str(self.schema_version),
            "source": self.source,
            "block_size": str(self.block_size),
            "start": self.start or "",
            "end": self.end or "",
            "synthesized": "true" if self.synthesized else "false",
            "notes": self.notes,
            "extra": json.dumps(dict(self.extra), sort_keys=True),
        }
        return {(META_PREFIX + k).encode(): v.encode() for k, v in values.items()}

    @classmethod
    def from_parquet(cls, raw: Mapping[bytes, bytes] | None, *, where: str) -> TraceMetadata:
        try:
            values = {k.decode()[len(META_PREFIX):]: v.decode() for k, v in (raw or {}).items()
                      if k.decode(errors="replace").startswith(META_PREFIX)}
        except UnicodeDecodeError as exc:
            raise TrafficError(f"{where}: corrupt trace metadata: not UTF-8 ({exc.reason} at byte {exc.start})",
                               remedy="re-create the trace with `elsa-tune traffic import` or `record`") from exc
        if "schema_version" not in values:
            raise TrafficError(f"{where}: not an elsa-tune trace (no {META_PREFIX}schema_version in its metadata)",
                               remedy="convert it with `elsa-tune traffic import` or `elsa-tune record`")
        try:
            version = int(values["schema_version"])
            block_size = int(values.get("block_size", ""))
            extra = json.loads(values.get("extra") or "{}")
        except (ValueError, RecursionError) as exc:
            raise TrafficError(f"{where}: corrupt trace metadata: {exc}",
                               remedy="re-create the trace with `elsa-tune traffic import` or `record`") from exc
        if version != SCHEMA_VERSION:
            raise TrafficError(f"{where}: trace schema version {version}, this elsa-tune reads {SCHEMA_VERSION}",
                               remedy="re-create the trace with this version of `elsa-tune traffic import`/`record`")
        if not isinstance(extra, dict):
            raise TrafficError(f"{where}: corrupt trace metadata: extra is not an object",
                               remedy="re-create the trace with `elsa-tune traffic import` or `record`")
        return cls(schema_version=version, source=values.get("source", ""), block_size=block_size,
                   start=values.get("start") or None, end=values.get("end") or None,
                   synthesized=values.get("synthesized") == "true", notes=values.get("notes", ""), extra=extra)


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace, as the load generator replays it."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...]
    session: str | None = None
    kind: str = "chat"
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    images: int = 0


@dataclass(frozen=True)
class Trace:
    """An immutable, validated trace: a pyarrow table with ``SCHEMA`` and its ``TraceMetadata``."""

    table: pa.Table
    metadata: TraceMetadata

    def __post_init__(self) -> None:
        object.__setattr__(self, "table", _conform(self.table))
        validate(self.table, self.metadata.block_size)

    def __len__(self) -> int:
        return int(self.table.num_rows)

    @property
    def duration_s(self) -> float:
        """Seconds from 0 to the last arrival (0 for an empty trace)."""
        return float(self.arrivals()[-1]) if len(self) else 0.0

    def arrivals(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        return np.asarray(self.table.column("arrival_s").to_numpy(), dtype=np.float64)

    def column(self, name: str) -> np.ndarray[Any, Any]:
        """A numeric column as numpy (nulls become NaN for floats)."""
        if name not in ("arrival_s", "input_tokens", "output_tokens", "temperature", "top_p", "images"):
            raise KeyError(f"{name} is not a numeric column")
        return np.asarray(self.table.column(name).to_numpy(zero_copy_only=False))

    def requests(self) -> Iterator[TraceRequest]:
        cols = {name: self.table.column(name).to_pylist() for name in COLUMNS}
        for row in zip(*(cols[name] for name in COLUMNS), strict=True):
            arrival, inp, out, hashes, session, kind, temperature, top_p, top_k, images = row
            yield TraceRequest(arrival_s=arrival, input_tokens=inp, output_tokens=out, block_hashes=tuple(hashes),
                               session=session, kind=kind, temperature=temperature, top_p=top_p, top_k=top_k,
                               images=images)

    def window(self, start_s: float, end_s: float) -> Trace:
        """Requests arriving in ``[start_s, end_s)``, arrivals rebased so that ``start_s`` becomes 0."""
        if end_s < start_s:
            raise TrafficError(f"window end {end_s} is before its start {start_s}", remedy="swap the bounds")
        arrivals = self.arrivals()
        lo = int(np.searchsorted(arrivals, start_s, side="left"))
        hi = int(np.searchsorted(arrivals, end_s, side="left"))
        sliced = self.table.slice(lo, hi - lo)
        rebased = pc.subtract(sliced.column("arrival_s"), pa.scalar(float(start_s)))
        sliced = sliced.set_column(0, SCHEMA.field("arrival_s"), rebased)
        meta = replace(self.metadata, start=_shift_iso(self.metadata.start, start_s),
                       end=_shift_iso(self.metadata.start, end_s) if self.metadata.start else None)
        meta = meta.with_extra(window=json.dumps({"start_s": start_s, "end_s": end_s}))
        return Trace(sliced, meta)

    @classmethod
    def from_requests(cls, reqs: Iterable[TraceRequest], metadata: TraceMetadata) -> Trace:
        rows = list(reqs)
        arrays = [
            pa.array([r.arrival_s for r in rows], pa.float64()),
            pa.array([r.input_tokens for r in rows], pa.int32()),
            pa.array([r.output_tokens for r in rows], pa.int32()),
            pa.array([list(r.block_hashes) for r in rows], pa.list_(pa.int64())),
            pa.array([r.session for r in rows], pa.string()),
            pa.array([r.kind for r in rows], pa.string()).dictionary_encode(),
            pa.array([r.temperature for r in rows], pa.float64()),
            pa.array([r.top_p for r in rows], pa.float64()),
            pa.array([r.top_k for r in rows], pa.int32()),
            pa.array([r.images for r in rows], pa.int16()),
        ]
        return cls(pa.Table.from_arrays(arrays, schema=SCHEMA), metadata)

    @classmethod
    def from_columns(cls, metadata: TraceMetadata, *, arrival_s: Any, input_tokens: Any, output_tokens: Any,
                     block_hashes: Any, session: Any = None, kind: Any = "chat", temperature: Any = None,
                     top_p: Any = None, top_k: Any = None, images: Any = 0) -> Trace:
        """Build from column sequences (numpy arrays or lists); scalars broadcast to every row."""
        n = len(arrival_s)

        def col(value: Any, typ: pa.DataType) -> pa.Array:
            if value is None or isinstance(value, (str, int, float)):
                return pa.array([value] * n, typ)
            return pa.array(value, typ)

        arrays = [col(arrival_s, pa.float64()), col(input_tokens, pa.int32()), col(output_tokens, pa.int32()),
                  col(block_hashes, pa.list_(pa.int64())), col(session, pa.string()),
                  col(kind, pa.string()).dictionary_encode(), col(temperature, pa.float64()),
                  col(top_p, pa.float64()), col(top_k, pa.int32()), col(images, pa.int16())]
        return cls(pa.Table.from_arrays(arrays, schema=SCHEMA), metadata)


#: The longest prompt or completion a trace may hold, in tokens: beyond any model's context, and small enough that
#: the int32 columns and a prompt's list of block hashes stay bounded.
MAX_TOKENS = 10_000_000


def prefix_reuse_curve(requests: Iterable[tuple[Sequence[int], int]], block_size: int) -> list[float]:
    """After each request, the share of the prompt tokens so far whose blocks an earlier request already had (an
    infinite prefix cache's hit rate over the first 1, 2, … requests).

    ``requests`` are (block hashes, prompt tokens) in the order they are sent; a request's reuse ends at its first
    block no earlier request had. NaN while there are no prompt tokens.
    """
    seen: set[int] = set()
    reused = total = 0
    curve: list[float] = []
    for hashes, tokens in requests:
        hits = 0
        for block in hashes:
            if block not in seen:
                break
            hits += 1
        reused += min(hits * block_size, tokens)
        total += tokens
        seen.update(hashes)
        curve.append(reused / total if total else float("nan"))
    return curve


def expected_blocks(input_tokens: int, block_size: int) -> int:
    """How many block hashes a prompt of ``input_tokens`` carries: one per started block."""
    return -(-input_tokens // block_size)


def validate(table: pa.Table, block_size: int) -> None:
    """Raise ``TrafficError`` naming the first offending row when the table breaks an invariant."""
    if table.schema.remove_metadata() != SCHEMA:
        raise TrafficError(f"trace columns {table.schema.names} do not match the schema {list(COLUMNS)}",
                           remedy="re-create the trace with `elsa-tune traffic import` or `record`")
    for name in ("arrival_s", "input_tokens", "output_tokens", "block_hashes", "kind", "images"):
        if table.column(name).null_count:
            raise TrafficError(f"trace column {name} has {table.column(name).null_count} missing values",
                               remedy="fill the column or drop those rows before importing")
    if table.num_rows == 0:
        return
    arrival = np.asarray(table.column("arrival_s").to_numpy())
    _check(np.isfinite(arrival), "arrival_s is not finite")
    _check(arrival >= 0, "arrival_s is negative")
    _check(np.concatenate([[True], np.diff(arrival) >= 0]), "arrival_s decreases (arrivals must be sorted)")
    inp = np.asarray(table.column("input_tokens").to_numpy())
    _check(inp > 0, "input_tokens is not positive")
    _check(np.asarray(table.column("output_tokens").to_numpy()) > 0, "output_tokens is not positive")
    _check(np.asarray(table.column("images").to_numpy()) >= 0, "images is negative")
    blocks = np.asarray(pc.list_value_length(table.column("block_hashes")).to_numpy(zero_copy_only=False))
    _check(blocks == -(-inp // block_size), f"block_hashes length is not ceil(input_tokens / {block_size})")


def _check(ok: np.ndarray[Any, np.dtype[np.bool_]], what: str) -> None:
    if not bool(ok.all()):
        row = int(np.argmin(ok))
        raise TrafficError(f"trace row {row}: {what}",
                           remedy="fix the source data and import it again (`elsa-tune traffic import`)")


def _conform(table: pa.Table) -> pa.Table:
    """Cast a table with the right column names to the exact schema (e.g. int64 lengths from pandas)."""
    if table.schema.remove_metadata() == SCHEMA:
        return table.replace_schema_metadata(None)
    if list(table.schema.names) != list(COLUMNS):
        raise TrafficError(f"trace columns {table.schema.names} do not match the schema {list(COLUMNS)}",
                           remedy="re-create the trace with `elsa-tune traffic import` or `record`")
    try:
        return table.replace_schema_metadata(None).cast(SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise TrafficError(f"trace columns cannot be cast to the schema: {exc}",
                           remedy="re-create the trace with `elsa-tune traffic import` or `record`") from exc


def _shift_iso(start: str | None, seconds: float) -> str | None:
    if not start:
        return None
    try:
        return (datetime.fromisoformat(start) + timedelta(seconds=seconds)).isoformat()
    except ValueError:
        return None


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a trace file; ``TrafficError`` with a remedy when it is missing or wrong."""
    where = str(path)
    check_input(path, "the trace")
    try:
        parquet = pq.ParquetFile(where)
        table = parquet.read()
    except FileNotFoundError as exc:
        raise TrafficError(f"{where}: no such trace file",
                           remedy="check the path, or create one with `elsa-tune record` or `traffic import`") from exc
    except (pa.ArrowInvalid, OSError) as exc:
        raise TrafficError(f"{where}: not a readable Parquet file: {exc}",
                           remedy="pass a trace written by `elsa-tune record` or `elsa-tune traffic import`") from exc
    metadata = TraceMetadata.from_parquet(parquet.schema_arrow.metadata, where=where)
    try:
        return Trace(table, metadata)
    except TrafficError as exc:
        raise TrafficError(f"{where}: {exc.message}", remedy=exc.remedy) from exc


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write atomically (``elsa_tune.durable_file.replacing``): a reader sees the old trace or the new one."""
    table = trace.table.replace_schema_metadata(trace.metadata.to_parquet())
    with replacing(Path(path)) as handle:
        pq.write_table(table, handle, compression="zstd")
