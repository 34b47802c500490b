"""``traffic show``: the summary numbers, the sparkline, the JSON record and the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from elsa_tune.traffic.summary import busiest_window, prefix_reuse, sparkline, summarize
from elsa_tune.traffic.trace import (
    SCHEMA_VERSION,
    Trace,
    TraceMetadata,
    TraceRequest,
    prefix_reuse_curve,
    write_trace,
)
from elsa_tune.traffic.workload import closed_loop
from elsa_tune.tuner.cli import main

META = TraceMetadata(schema_version=SCHEMA_VERSION, source="unit", block_size=10, start=None, end=None,
                     synthesized=False)


def test_prefix_reuse_counts_leading_blocks_already_seen() -> None:
    reqs = [TraceRequest(0.0, 30, 1, (1, 2, 3)),  # nothing seen yet
            TraceRequest(1.0, 25, 1, (1, 2, 9)),  # 20 of 25 tokens reusable
            TraceRequest(2.0, 30, 1, (7, 2, 3)),  # a different first block: nothing reusable after it
            TraceRequest(3.0, 15, 1, (1, 2))]  # fully seen: 15 tokens, not 2 blocks' worth
    trace = Trace.from_requests(reqs, META)
    assert prefix_reuse(trace) == pytest.approx((20 + 15) / 100)


def test_prefix_reuse_curve_is_the_share_after_each_request_and_a_workloads_reads_its_own_order() -> None:
    reqs = [TraceRequest(0.0, 30, 1, (1, 2, 3)), TraceRequest(1.0, 25, 1, (1, 2, 9)),
            TraceRequest(2.0, 30, 1, (7, 2, 3)), TraceRequest(3.0, 15, 1, (1, 2))]
    trace = Trace.from_requests(reqs, META)
    curve = prefix_reuse_curve(((r.block_hashes, r.input_tokens) for r in reqs), 10)
    assert curve == pytest.approx([0.0, 20 / 55, 20 / 85, 35 / 100])
    assert closed_loop(trace, concurrency=2, n_requests=4).prefix_reuse_curve() == pytest.approx(curve)
    assert prefix_reuse_curve([], 10) == [] and math.isnan(prefix_reuse_curve([((), 0)], 10)[0])


def test_busiest_window_and_sparkline() -> None:
    arrivals = np.concatenate([np.linspace(0, 100, 50), np.linspace(200, 210, 40), np.linspace(300, 400, 50)])
    best = busiest_window(arrivals, 20.0)
    assert best is not None and best.requests == 40 and 190 <= best.start_s <= 200
    assert best.rate == pytest.approx(2.0)
    assert busiest_window(arrivals, 1000.0) is None
    assert sparkline([0, 1, 2, 4]) == "▁▃▅█" and sparkline([0, 0]) == "▁▁"


def test_summary_of_a_request_log_shows_sessions_kinds_and_breakers(tmp_path: Path) -> None:
    context = " ".join(f"Rule {i}: be brief and cite section {i}." for i in range(60))
    log = tmp_path / "log.jsonl"
    lines = []
    for i in range(12):
        lines.append(json.dumps({"timestamp": 1_800_000_000 + 5 * i, "session_id": f"agent-{i % 3}",
                                 "temperature": 0.7 if i % 2 else 0.0, "max_tokens": 20,
                                 "tools": [{"type": "function", "function": {"name": "ls"}}] if i % 4 == 0 else None,
                                 "messages": [{"role": "system", "content": f"trace id: a1b2c3d4{i:04d}\n{context}"},
                                              {"role": "user", "content": f"step {i}"}]}))
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "log.parquet"
    assert main(["traffic", "import", str(log), "--format", "openai-jsonl", "-o", str(out)]) == 0
    from elsa_tune.traffic.trace import read_trace

    summary = summarize(read_trace(out))
    assert (summary.requests, summary.sessions, summary.requests_in_sessions) == (12, 3, 12)
    assert dict(summary.kinds) == {"chat": 9, "tool": 3}
    assert summary.sampled_share == pytest.approx(0.5)
    assert summary.span_s == 55.0
    assert [b.pattern for b in summary.breakers] == ["id"]
    assert summary.prefix_reuse < 0.1  # the id at the top spoils the shared context


def test_cli_show_prints_text_and_a_versioned_json_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    arrivals = np.sort(rng.uniform(0, 3 * 3600, 500))
    trace = Trace.from_columns(META, arrival_s=arrivals, input_tokens=[25] * 500, output_tokens=[3] * 500,
                               block_hashes=[[1, 2, 10 + i] for i in range(500)])
    path = tmp_path / "t.parquet"
    write_trace(trace, path)
    assert main(["traffic", "show", str(path)]) == 0
    text = capsys.readouterr().out
    assert "requests   500 over 3.0 h" in text and "busiest    1.0 h" in text
    assert any(ch in text for ch in "▁▂▃▄▅▆▇█")
    assert main(["traffic", "show", str(path), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["schema_version"] == 1 and record["requests"] == 500
    assert record["sampled_share"] is None  # no temperatures logged: unknown, not 0
    assert record["prefix_reuse"] == pytest.approx(499 * 20 / (500 * 25))
    assert len(record["rate"]["sparkline"]) == 60


def test_cli_reports_a_missing_file_as_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["traffic", "show", str(tmp_path / "none.parquet")]) == 2
    assert "remedy" in capsys.readouterr().err
