"""Helpers of the end-to-end tests: a small trace file, the tiny space, a study run in-process on the simulator."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from elsa_tune.tuner.console import StudyView
from elsa_tune.tuner.flow.preflight import run_preflight
from elsa_tune.tuner.flow.settings import Settings
from elsa_tune.tuner.flow.study import Study, StudyOutcome

E2E_DATA = Path(__file__).parent / "data"
TINY_SPACE = str(E2E_DATA / "tiny-space.yaml")


def write_small_trace(path: Path, n: int = 60, seed: int = 5) -> Path:
    """A chat trace of short prompts (300–900 tokens, 24–64 out) that the tiny card can hold."""
    from elsa_tune.traffic.trace import Trace, TraceMetadata, write_trace

    rng = np.random.default_rng(seed)
    inputs = rng.integers(300, 900, n)
    block = 128
    hashes = [[int(rng.integers(1, 2**40)) for _ in range(-(-int(i) // block))] for i in inputs]
    meta = TraceMetadata(schema_version=1, source="e2e-test", block_size=block, start=None, end=None,
                         synthesized=True, notes="short chat prompts for the tiny simulated card")
    trace = Trace.from_columns(meta, arrival_s=np.sort(rng.uniform(0, 30, n)), input_tokens=inputs,
                               output_tokens=rng.integers(24, 64, n), block_hashes=hashes)
    write_trace(trace, path)
    return path


RunStudy = Callable[..., StudyOutcome]


def study_runner(tmp_path: Path) -> RunStudy:
    """Run a whole study in this process on the simulator; keyword arguments become ``Settings``."""

    def run(**overrides: object) -> StudyOutcome:
        values: dict[str, object] = {"gpu": "sim", "sim_profile": "tiny-test", "space": TINY_SPACE,
                                     "traffic": "demo", "budget_s": 60.0, "out": tmp_path / "runs" / "study",
                                     "sim_speedup": 20.0, "baseline_boots": 3, "seed": 1}
        values.update(overrides)
        settings = Settings(**values)  # type: ignore[arg-type,unused-ignore]
        pre = run_preflight(settings, card_dir=tmp_path / "card")
        return Study(pre, view=StudyView(live=False), with_plots=False).run()

    return run


def ledger_lines(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir.parent / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
