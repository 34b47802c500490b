from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from elsa_tune.errors import TrafficError
from elsa_tune.traffic.trace import (
    SCHEMA,
    SCHEMA_VERSION,
    Trace,
    TraceMetadata,
    TraceRequest,
    read_trace,
    write_trace,
)

META = TraceMetadata(schema_version=SCHEMA_VERSION, source="test", block_size=4, start="2026-01-01T00:00:00+00:00",
                     end=None, synthesized=False, notes="n", extra={"provenance": "unit test"})


def _reqs() -> list[TraceRequest]:
    return [
        TraceRequest(0.0, 8, 3, (1, 2), session="s1", kind="chat", temperature=0.7, top_p=0.9, top_k=20),
        TraceRequest(0.5, 9, 1, (1, 2, 3), session="s1", kind="code"),
        TraceRequest(2.0, 1, 2, (7,), session=None, kind="tool", images=2),
    ]


def test_round_trip_keeps_rows_schema_and_metadata(tmp_path: Path) -> None:
    trace = Trace.from_requests(_reqs(), META)
    path = tmp_path / "t.parquet"
    write_trace(trace, path)
    back = read_trace(path)
    assert list(back.requests()) == _reqs()
    assert back.metadata == META
    assert back.table.schema.remove_metadata() == SCHEMA
    raw = pq.ParquetFile(path).schema_arrow.metadata
    assert raw[b"elsa_tune.schema_version"] == str(SCHEMA_VERSION).encode()
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_window_rebases_arrivals_and_shifts_wall_clock() -> None:
    trace = Trace.from_requests(_reqs(), META)
    win = trace.window(0.5, 2.0)
    assert len(win) == 1
    assert next(win.requests()).arrival_s == 0.0
    assert win.metadata.start == "2026-01-01T00:00:00.500000+00:00"
    assert len(trace.window(0.0, 10.0)) == 3


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (TraceRequest(-1.0, 4, 1, (1,)), "negative"),
        (TraceRequest(0.0, 0, 1, ()), "input_tokens"),
        (TraceRequest(0.0, 4, 0, (1,)), "output_tokens"),
        (TraceRequest(0.0, 5, 1, (1,)), "block_hashes"),
    ],
)
def test_validation_names_the_row(bad: TraceRequest, message: str) -> None:
    with pytest.raises(TrafficError, match=message):
        Trace.from_requests([_reqs()[0], bad], META)


def test_unsorted_arrivals_are_refused() -> None:
    reqs = _reqs()
    with pytest.raises(TrafficError, match="row 2: arrival_s decreases"):
        Trace.from_requests([reqs[0], reqs[2], reqs[1]], META)


def test_foreign_or_future_files_are_refused_with_a_remedy(tmp_path: Path) -> None:
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"x": [1]}), plain)
    with pytest.raises(TrafficError, match="not an elsa-tune trace") as info:
        read_trace(plain)
    assert "traffic import" in info.value.remedy
    future = tmp_path / "future.parquet"
    table = Trace.from_requests(_reqs(), META).table
    meta = {**META.to_parquet(), b"elsa_tune.schema_version": b"99"}
    pq.write_table(table.replace_schema_metadata(meta), future)
    with pytest.raises(TrafficError, match="schema version 99"):
        read_trace(future)
    with pytest.raises(TrafficError, match="no such trace file"):
        read_trace(tmp_path / "missing.parquet")
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(TrafficError, match="not a readable Parquet"):
        read_trace(garbage)


def test_from_columns_broadcasts_scalars() -> None:
    trace = Trace.from_columns(META, arrival_s=[0.0, 1.0], input_tokens=[4, 8], output_tokens=[1, 1],
                               block_hashes=[[1], [1, 2]], kind="code")
    assert [r.kind for r in trace.requests()] == ["code", "code"]
    assert trace.duration_s == 1.0


def test_bundled_demo_is_the_busiest_window_of_the_real_mooncake_trace(shared_dir: Path) -> None:
    from elsa_tune.traffic.imports import import_trace
    from elsa_tune.traffic.trace import DEMO_TRACE, DEMO_WINDOW

    demo = read_trace(DEMO_TRACE)
    assert len(demo) == 378 and DEMO_TRACE.stat().st_size < 200_000
    assert "Mooncake" in demo.metadata.extra["provenance"]
    full = import_trace(shared_dir / "traces" / "mooncake_conversation_trace.jsonl", "mooncake").trace
    assert demo.table.equals(full.window(*DEMO_WINDOW).table)


def _random_requests(rng: random.Random, block: int) -> list[TraceRequest]:
    arrival = 0.0
    out = []
    for _ in range(rng.randint(1, 30)):
        arrival += rng.choice([0.0, rng.uniform(0, 100)])
        tokens = rng.randint(1, 40)
        out.append(TraceRequest(
            arrival_s=arrival, input_tokens=tokens, output_tokens=rng.randint(1, 2**31 - 1),
            block_hashes=tuple(rng.randint(-(2**63), 2**63 - 1) for _ in range(-(-tokens // block))),
            session=rng.choice([None, "", "s1", "séance"]), kind=rng.choice(["chat", "code", "tool"]),
            temperature=rng.choice([None, 0.0, rng.uniform(0, 2)]), top_p=rng.choice([None, rng.random()]),
            top_k=rng.choice([None, rng.randint(1, 100)]), images=rng.randint(0, 5)))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_round_trip_and_windows_hold_for_random_valid_traces(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    block = rng.randint(1, 8)
    reqs = _random_requests(rng, block)
    meta = replace(META, block_size=block)
    trace = Trace.from_requests(reqs, meta)
    write_trace(trace, tmp_path / "t.parquet")
    back = read_trace(tmp_path / "t.parquet")
    assert list(back.requests()) == reqs and back.metadata == meta
    middle = trace.duration_s * rng.random()
    first, second = trace.window(0.0, middle), trace.window(middle, trace.duration_s + 1)
    assert len(first) + len(second) == len(trace)
    assert all(0 <= r.arrival_s <= trace.duration_s - middle for r in second.requests())
