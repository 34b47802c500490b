"""How often ``elsa-tune compare`` gets the verdict right, over noise seeds, on the virtual runtime.

    python benchmarks/compare/run.py                 # 20 seeds per pair, ~2-4 minutes on one core
    python benchmarks/compare/run.py --seeds 5       # quicker, coarser
    python benchmarks/compare/run.py --seeds 100 --only identical   # the false "better" rate, finer

For pairs of flag sets on the tiny simulated card (``tiny-test``, ``benchmarks/workers/tiny-space.yaml``, the demo
traffic) whose noiseless worth the simulator knows (``VirtualBench.truth``), it runs the comparison exactly as the
command does (preflight, A's noise boots, B's probed boot, the gate with the CI futility rule) once per seed; the
seed moves every boot's noise draw and the block schedule. It prints, per pair, the true B/A ratio of the
simulator's noiseless truth, how often each outcome came out, and the mean boots. Every number is simulated.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path

from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.tuner.flow.flag_comparison import Outcome, compare_flags
from elsa_tune.tuner.flow.preflight import run_preflight
from elsa_tune.tuner.flow.settings import Settings
from elsa_tune.tuner.flow.virtual import VirtualBench, VirtualTestbed

REPO = Path(__file__).resolve().parents[2]
SPACE = str(REPO / "benchmarks" / "workers" / "tiny-space.yaml")
PROFILE = "tiny-test"
A = {"model-path": "tiny-hybrid", "mem-fraction-static": 0.6, "max-running-requests": 2, "max-mamba-cache-size": 24,
     "speculative-algorithm": "EAGLE", "speculative-eagle-topk": 1, "speculative-num-steps": 2,
     "speculative-num-draft-tokens": 3}
#: (name, A's changes, B's changes, the outcome that is right)
PAIRS = (
    ("B faster (static fraction 0.6 → 0.7)", {}, {"mem-fraction-static": 0.7}, Outcome.BETTER),
    ("B identical", {}, {}, None),
    ("B slower (static fraction 0.7 → 0.6)", {"mem-fraction-static": 0.7}, {}, Outcome.WORSE),
    ("B crashes (hierarchical cache on a hybrid model)", {}, {"enable-hierarchical-cache": True}, Outcome.B_FAILED),
)


def run_pair(a: Candidate, b: Candidate, seeds: int) -> tuple[collections.Counter[Outcome], list[int]]:
    outcomes: collections.Counter[Outcome] = collections.Counter()
    boots: list[int] = []
    for seed in range(seeds):
        settings = Settings(gpu="sim", runtime="sim", virtual=True, sim_profile=PROFILE, space=SPACE, traffic="demo",
                            seed=seed, live=False, study="compare-bench")
        bed = VirtualTestbed.of(run_preflight(settings))
        with tempfile.TemporaryDirectory() as folder:
            result = compare_flags(bed.pre, a, b, files=("a", "b"), run_dir=Path(folder) / "run", clock=bed.clock,
                                   load=bed.load, seed=seed)
        outcomes[result.outcome] += 1
        boots.append(result.boots)
    return outcomes, boots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="noise seeds per pair (default 20)")
    parser.add_argument("--only", default="", help="run the pairs whose name contains this text, e.g. identical")
    args = parser.parse_args(argv)
    bench = VirtualBench(profile=PROFILE, space=SPACE)
    started = time.process_time()
    print(f"# compare: verdicts over {args.seeds} noise seeds per pair (virtual runtime, {PROFILE}; simulated)\n")
    print("| pair | true B/A (simulated) | right | better | worse | equivalent | no difference | B failed "
          "| mean boots |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, a_changes, b_changes, right in PAIRS:
        if args.only not in name:
            continue
        a = Candidate(flags={**A, **a_changes}, label="a")
        b = Candidate(flags={**A, **b_changes}, label="b")
        ta, tb = bench.truth(a), bench.truth(b)
        ratio = (f"{tb.output_tokens_per_s / ta.output_tokens_per_s:.3f}" if ta and tb and ta.output_tokens_per_s
                 and tb.output_tokens_per_s else "crashes")
        counts, boots = run_pair(a, b, args.seeds)
        n = sum(counts.values())
        correct = (counts[right] if right is not None else n - counts[Outcome.BETTER] - counts[Outcome.WORSE])
        cells = " | ".join(str(counts[o]) for o in (Outcome.BETTER, Outcome.WORSE, Outcome.EQUIVALENT,
                                                       Outcome.NO_DIFFERENCE, Outcome.B_FAILED))
        print(f"| {name} | {ratio} | {correct}/{n} | {cells} | {statistics.fmean(boots):.1f} |")
    print(f"\n'right' for identical flags: neither better nor worse. CPU: {time.process_time() - started:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
