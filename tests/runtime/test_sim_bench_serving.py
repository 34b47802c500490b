"""SGLang's own client, ``sglang.bench_serving`` 0.5.23, against the simulated server at the studies' speed-up.

bench_serving knows nothing of the simulator: it is served at the plain speed-up (``runtime/sim/plain_speed.py``)
and its wall-clock TTFT, converted on the clock the server declares (``/sim/clock``), is the simulated system's:
within ±15% of the truth (the same engine, no host) for its own Poisson arrivals. Uses ``benchmarks/sim/parity.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks" / "sim"))
import parity

pytestmark = pytest.mark.sglang

STUDY_SPEEDUP = 40.0


def test_bench_serving_reads_the_truths_ttft_at_the_studies_speedup(tmp_path: Path) -> None:
    python = os.environ.get("ELSA_SGLANG_PYTHON")
    if not python:
        pytest.skip("ELSA_SGLANG_PYTHON is not set")
    tokenizer = parity.train_tokenizer(tmp_path / "tokenizer")
    proc, url = parity.start_server(STUDY_SPEEDUP, str(tmp_path / "card"))
    try:
        bench = parity.run_bench_serving(python, url, 30, 2.0, tokenizer, tmp_path)
    finally:
        parity.stop(proc)
    assert not isinstance(bench, str), bench
    assert bench.plain_speedup < STUDY_SPEEDUP
    assert bench.effective_speedup == pytest.approx(bench.plain_speedup, rel=0.02)
    expected = parity.truth_of(bench.arrivals, 30, parity.STREAMS)
    assert bench.ttft_p50_s is not None and expected.ttft_p50_s is not None
    assert bench.ttft_p50_s == pytest.approx(expected.ttft_p50_s, rel=0.15), (bench, expected.ttft_p50_s)
    assert bench.tok_s == pytest.approx(expected.output_tokens_per_s, rel=0.10), bench
