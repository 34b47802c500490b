from __future__ import annotations

import numpy as np
import pytest

from elsa_tune.errors import ConfigError, TrafficError
from elsa_tune.traffic.trace import Trace, TraceMetadata, TraceRequest
from elsa_tune.traffic.workload import (
    ReplayMode,
    Workload,
    busiest_window,
    closed_loop,
    context_target,
    open_loop,
    synthetic,
)

BS = 16


def _trace(arrivals: list[float], *, shared: bool = True) -> Trace:
    reqs = []
    for i, t in enumerate(arrivals):
        n_in = 40 + (i % 5) * 7
        blocks = -(-n_in // BS)
        hashes = tuple((1000 + j) if shared and j == 0 else (i * 100 + j) for j in range(blocks))
        reqs.append(TraceRequest(arrival_s=t, input_tokens=n_in, output_tokens=10 + i % 3, block_hashes=hashes,
                                 session=f"s{i % 4}", kind="code" if i % 2 else "chat",
                                 temperature=0.7 if i % 3 == 0 else None, images=1 if i == 3 else 0))
    meta = TraceMetadata(schema_version=1, source="test", block_size=BS, start=None, end=None, synthesized=True)
    return Trace.from_requests(reqs, meta)


def _bursty() -> Trace:
    sparse = [float(t) for t in range(0, 3000, 100)]          # 1 request / 100 s
    burst = list(np.linspace(1500.0, 1599.0, 200))             # 200 requests in 100 s
    return _trace(sorted(sparse + burst))


def test_open_loop_replays_arrivals_scaled_by_speed() -> None:
    trace = _trace([0.0, 1.0, 2.5, 4.0])
    w = open_loop(trace, speed=2.0)
    assert w.mode is ReplayMode.OPEN_LOOP
    assert [r.arrival_s for r in w.requests] == [0.0, 0.5, 1.25, 2.0]
    assert [r.input_tokens for r in w.requests] == [r.input_tokens for r in trace.requests()]
    assert w.duration_s == 2.0
    assert w.requests[0].temperature == 0.7 and w.requests[1].temperature is None
    assert any("images" in n for n in w.notes)


def test_open_loop_window_and_cap() -> None:
    trace = _trace([float(t) for t in range(20)])
    w = open_loop(trace, start_s=5.0, end_s=15.0, max_requests=4)
    assert len(w) == 4
    assert [r.arrival_s for r in w.requests] == [0.0, 1.0, 2.0, 3.0]   # rebased to the window
    assert any("capped at 4 of 10" in n for n in w.notes)


def test_busiest_window_finds_the_burst_and_compresses_it() -> None:
    w = busiest_window(_bursty(), duration_s=10.0, compress=10.0)
    assert 1490.0 <= w.params["window_start_s"] <= 1500.0
    assert len(w) >= 200
    arrivals = [r.arrival_s for r in w.requests]
    assert arrivals == sorted(arrivals)
    assert arrivals[0] == 0.0 and max(arrivals) < 10.0
    # shape is kept: the burst's evenly spaced arrivals stay evenly spaced after compression
    gaps = np.diff([a for a in arrivals if a > 0.5])
    assert np.allclose(gaps[gaps > 0].min(), gaps.max(), rtol=0.5)


def test_busiest_window_by_tokens_prefers_heavy_requests() -> None:
    light = [TraceRequest(float(t), 16, 1, (t,)) for t in range(0, 50)]
    heavy = [TraceRequest(100.0 + t, 16 * 20, 500, tuple(range(1000 * t, 1000 * t + 20))) for t in range(5)]
    meta = TraceMetadata(schema_version=1, source="t", block_size=BS, start=None, end=None, synthesized=True)
    trace = Trace.from_requests(light + heavy, meta)
    assert busiest_window(trace, 10.0, by="requests").params["window_start_s"] < 50
    assert busiest_window(trace, 10.0, by="tokens").params["window_start_s"] == 100.0
    with pytest.raises(ConfigError):
        busiest_window(trace, 10.0, by="bytes")


def test_closed_loop_cycles_with_fresh_prefixes() -> None:
    trace = _trace([0.0, 1.0, 2.0])
    w = closed_loop(trace, concurrency=2, n_requests=7)
    assert w.mode is ReplayMode.CLOSED_LOOP and w.concurrency == 2 and len(w) == 7
    assert all(r.arrival_s is None for r in w.requests)
    first, second = w.requests[:3], w.requests[3:6]
    # inside a cycle the trace's sharing holds (all share block 0) ...
    assert len({r.block_hashes[0] for r in first}) == 1
    assert len({r.block_hashes[0] for r in second}) == 1
    # ... and cycles share nothing with each other
    assert not set(h for r in first for h in r.block_hashes) & set(h for r in second for h in r.block_hashes)
    assert [r.input_tokens for r in second] == [r.input_tokens for r in first]


def test_workload_id_is_stable_and_content_addressed() -> None:
    trace = _trace([0.0, 1.0, 2.0, 3.0])
    a, b = closed_loop(trace, 2, 4), closed_loop(trace, 2, 4)
    assert a.id == b.id
    assert closed_loop(trace, 3, 4).id != a.id
    assert open_loop(trace, speed=2.0).id != open_loop(trace, speed=1.0).id
    again = Workload.from_dict(a.to_dict())
    assert again == a and again.id == a.id
    tampered = a.to_dict()
    tampered["requests"][0][2] += 1
    with pytest.raises(TrafficError, match="does not match"):
        Workload.from_dict(tampered)


def test_context_target_requests_share_nothing() -> None:
    w = context_target(5000, 8, n_requests=3, block_size=BS)
    assert all(r.input_tokens == 5000 and r.output_tokens == 8 for r in w.requests)
    assert all(len(r.block_hashes) == -(-5000 // BS) for r in w.requests)
    seen = [set(r.block_hashes) for r in w.requests]
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2])
    assert not set(context_target(5000, block_size=BS).requests[0].block_hashes) & set(
        context_target(6000, block_size=BS).requests[0].block_hashes)


def test_synthetic_shares_exactly_the_requested_prefix() -> None:
    w = synthetic(4, 10 * BS + 3, 5, 2, shared_prefix_tokens=3 * BS + 5, block_size=BS)
    hashes = [r.block_hashes for r in w.requests]
    assert all(h[:3] == hashes[0][:3] for h in hashes)
    assert len({h[3] for h in hashes}) == 4
    assert w.params["shared_prefix_tokens"] == 3 * BS


def test_bad_workloads_are_refused() -> None:
    trace = _trace([0.0, 1.0])
    with pytest.raises(TrafficError):
        open_loop(trace, start_s=100.0, end_s=200.0)
    with pytest.raises(ConfigError):
        open_loop(trace, speed=0)
    with pytest.raises(ConfigError):
        closed_loop(trace, concurrency=0, n_requests=2)
    with pytest.raises(ConfigError):
        busiest_window(trace, duration_s=-1)
