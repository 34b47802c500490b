"""Imports of the real public traces reproduce what their READMEs (and the raw files) say."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from elsa_tune.errors import TrafficError
from elsa_tune.traffic.imports import import_trace
from elsa_tune.traffic.trace import read_trace, write_trace


def test_mooncake_conversation_matches_its_readme(shared_dir: Path, tmp_path: Path) -> None:
    result = import_trace(shared_dir / "traces" / "mooncake_conversation_trace.jsonl", "mooncake")
    trace = result.trace
    # MOONCAKE_README.md, "Workloads": Conversation, 12,031 requests, avg input 12,035, avg output 343, one hour.
    assert len(trace) == 12_031
    assert round(float(trace.column("input_tokens").mean())) == 12_035
    assert round(float(trace.column("output_tokens").mean())) == 343
    assert 3_000 < trace.duration_s <= 3_600
    assert result.skipped == ()
    assert trace.metadata.block_size == 512
    first = next(trace.requests())
    assert first.block_hashes[:3] == (0, 1, 2)
    write_trace(trace, tmp_path / "m.parquet")
    assert read_trace(tmp_path / "m.parquet").table.equals(trace.table)


def test_azure_conversation_matches_the_raw_csv(shared_dir: Path) -> None:
    path = shared_dir / "traces" / "azure_llm_2023_conv.csv"
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    # AZURE_README.md publishes the schema but no totals; the reference is the CSV read independently.
    trace = import_trace(path, "azure").trace
    assert len(trace) == len(rows) == 19_366
    assert float(trace.column("input_tokens").mean()) == pytest.approx(
        np.mean([int(r["ContextTokens"]) for r in rows]), rel=1e-12)
    assert float(trace.column("output_tokens").mean()) == pytest.approx(
        np.mean([int(r["GeneratedTokens"]) for r in rows]), rel=1e-12)
    assert trace.metadata.start == "2023-11-16T18:15:46.680590+00:00"
    assert trace.duration_s == pytest.approx(3501.72, abs=0.01)
    # No prompt content in this trace: no block may be shared.
    hashes = [h for r in trace.requests() for h in r.block_hashes]
    assert len(hashes) == len(set(hashes))


def test_malformed_mooncake_lines_are_reported_by_number(tmp_path: Path) -> None:
    good = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
    lines = [json.dumps(good), json.dumps({**good, "timestamp": 10}), "{not json",
             json.dumps({**good, "hash_ids": [1]}), json.dumps({**good, "output_length": 0}), json.dumps([1, 2])]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TrafficError, match=r"bad.jsonl:3: not JSON") as info:
        import_trace(path, "mooncake")
    assert "--skip-bad" in info.value.remedy
    result = import_trace(path, "mooncake", skip_bad=True)
    assert [s.line for s in result.skipped] == [3, 4, 5, 6]
    assert "expected 2" in result.skipped[1].reason
    assert len(result.trace) == 2
    assert result.trace.metadata.extra["skipped_lines"] == "4"


def test_malformed_azure_rows_and_wrong_format(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,374,44\n"
                    "yesterday,1,1\n2023-11-16 18:15:47.1,x,2\n")
    with pytest.raises(TrafficError, match=r"a.csv:3: TIMESTAMP 'yesterday'"):
        import_trace(path, "azure")
    assert [s.line for s in import_trace(path, "azure", skip_bad=True).skipped] == [3, 4]
    with pytest.raises(TrafficError, match="no usable requests"):
        import_trace(path, "mooncake", skip_bad=True)
    with pytest.raises(TrafficError, match="unknown trace format"):
        import_trace(path, "sharegpt")
    with pytest.raises(TrafficError, match="no such file"):
        import_trace(tmp_path / "nope.csv", "azure")


def test_cli_import_lists_skipped_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from elsa_tune.tuner.cli import main

    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [5]}\nnot json\n')
    out = tmp_path / "m.parquet"
    assert main(["traffic", "import", str(path), "--format", "mooncake", "-o", str(out)]) == 2
    assert "m.jsonl:2: not JSON" in capsys.readouterr().err and not out.exists()
    assert main(["traffic", "import", str(path), "--format", "mooncake", "--kind", "tool", "--skip-bad",
                 "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "imported 1 requests from 2 lines" in captured.out and "line 2: not JSON" in captured.err
    assert next(read_trace(out).requests()).kind == "tool"
