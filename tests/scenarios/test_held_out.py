"""The scenario benchmark's held-out set: drawn at run time outside the reported sets, printed and recorded.

``draw_held_out`` is checked on its own (disjoint from the studied and named sets, distinct, reproducible by its
draw, fresh without one), then ``run.py`` is run end to end on a one-scenario, one-seed held-out set beside a
one-scenario studied set (``--compare``) on a 16-request trace at a short simulated budget: the set is printed,
recorded in the JSON's ``sets``, every run is tagged with its set, and the table has a row per set and method.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run import HELD_OUT, NAMED, STUDIED, draw_held_out, main
from shapes import write_shape


def test_a_held_out_set_is_disjoint_from_every_reported_set() -> None:
    held = draw_held_out(100, 3, draw=7)
    assert len(set(held.scenarios)) == 100 and len(set(held.seeds)) == 3
    assert not set(held.scenarios) & set(range(100)) and not set(held.scenarios) & set(NAMED[0])
    assert not set(held.seeds) & set(range(3)) and not set(held.seeds) & set(NAMED[1])
    assert draw_held_out(100, 3, draw=7) == held          # a named draw runs the same set again
    assert draw_held_out(100, 3, draw=8) != held
    fresh = [draw_held_out(5, 3) for _ in range(3)]      # no draw: the operating system's entropy
    assert len({f.draw for f in fresh}) == 3 and len({f.scenarios for f in fresh}) == 3


def test_an_empty_held_out_set_is_refused() -> None:
    with pytest.raises(ValueError):
        draw_held_out(0, 3)


def test_a_run_prints_records_and_reports_the_held_out_set_beside_the_studied_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    traffic = write_shape("decode-heavy", tmp_path / "traffic.parquet", seed=0, requests=16)
    code = main(["--held-out", "1", "--held-out-seeds", "1", "--draw", "3", "--compare", "--first", "5",
                 "--scenarios", "1", "--seeds", "0", "--budget", "30m", "--methods", "naive", "--json", str(out),
                 "--root", str(tmp_path / "root"), "--traffic", traffic])
    assert code == 0
    held = draw_held_out(1, 1, draw=3)
    printed = capsys.readouterr().out
    assert f"scenarios {held.scenarios[0]}; seeds {held.seeds[0]}" in printed and "--draw 3" in printed
    data = json.loads(out.read_text())
    assert data["sets"][HELD_OUT]["scenarios"] == list(held.scenarios)
    assert data["sets"][HELD_OUT]["seeds"] == list(held.seeds) and data["sets"][HELD_OUT]["draw"] == 3
    assert data["sets"][STUDIED] == {"scenarios": [5], "seeds": [0]}
    by_set = {r["set"]: r for r in data["runs"]}
    assert by_set[HELD_OUT]["scenario"] == f"scenario-{held.scenarios[0]:03d}"
    assert by_set[HELD_OUT]["seed"] == held.seeds[0] and by_set[STUDIED]["scenario"] == "scenario-005"
    assert "naive" in by_set[HELD_OUT]["comparators"]
    for row in ("| elsa-tune (studied) | 1 |", "| naive (studied) | 1 |", "| elsa-tune (held-out) | 1 |",
                "| naive (held-out) | 1 |"):
        assert row in printed


def test_compare_without_a_held_out_set_is_one_paragraph_and_a_nonzero_exit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--compare", "--json", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    assert "--held-out N" in err and "Traceback" not in err
