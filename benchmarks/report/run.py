"""How long re-rendering the outputs takes for a long study (the tuner does it after every decision).

    python benchmarks/report/run.py [--boots 300] [--decisions 60]

Builds a synthetic history of N boots (with RunMeasurement-sized pass summaries) and D decisions through
the store API in a temporary folder, then times ``write_outputs`` (with and without plots) and
``build_report``. Target: a full render well under 10 s for 300 boots on the 2-core dev machine.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "history"))

from elsa_history_factory import BASELINE, HistoryBuilder, boot_report, verdict

from elsa_tune.history.records import Arm, BootOutcome, Phase
from elsa_tune.history.verdict import Decision
from elsa_tune.reports.build import write_outputs
from elsa_tune.reports.model import build_report


def build(root: Path, boots: int, decisions: int) -> HistoryBuilder:
    rng = random.Random(7)
    h = HistoryBuilder(root)
    ids: list[str] = []
    for i in range(boots):
        outcome = BootOutcome.MEASURED if rng.random() > 0.1 else BootOutcome.PROBE_FAILED
        cand = BASELINE.merged(flags={"chunked-prefill-size": 1024 * (1 + i % 8)}, label=f"c{i % 8}")
        rec = h.boot(cand, Phase.SEARCH, Arm.CANDIDATE, outcome, values=[rng.gauss(160, 5) for _ in range(5)],
                     report=boot_report(1 + i % 4, 134016 - 1000 * (i % 30)), min_free_mib=rng.randint(100, 900))
        ids.append(rec.boot_id)
    for d in range(decisions):
        effect = rng.uniform(0.85, 1.1)
        h.decide(Phase.SCREENING, f"technique-{d}", {f"flag-{d}": True},
                 verdict=verdict(Decision.KEEP if effect > 1.04 else Decision.REJECT, effect, effect - 0.04,
                                 effect + 0.04, 4), incumbent=ids[:4], candidate=ids[4:8])
    return h


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--boots", type=int, default=300)
    parser.add_argument("--decisions", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        h = build(Path(tmp), args.boots, args.decisions)
        t1 = time.perf_counter()
        build_report(h.run_dir)
        t2 = time.perf_counter()
        write_outputs(h.run_dir, with_plots=False)
        t3 = time.perf_counter()
        write_outputs(h.run_dir)
        t4 = time.perf_counter()
    print(f"history of {args.boots} boots, {args.decisions} decisions written in {t1 - t0:.2f} s "
          f"({(t1 - t0) / args.boots * 1000:.1f} ms per boot incl. Optuna registry)")
    print(f"build_report: {t2 - t1:.2f} s; write_outputs without plots: {t3 - t2:.2f} s; with plots: {t4 - t3:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
