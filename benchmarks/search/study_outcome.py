"""A whole unattended study on the simulated runtime, scored against the simulator's truth.

    python benchmarks/search/study_outcome.py                         # seed 004: Qwen3.8-27B on an RTX 5090, 30 min
    python benchmarks/search/study_outcome.py --skip-run --out DIR                 # score an existing run
    python benchmarks/search/study_outcome.py --profile rtx5090-qwen3.6-35b-a3b-nvfp4 \
        --space qwen3.6-35b-a3b-nvfp4-rtx5090 --budget 30m

It runs ``elsa-tune`` (the real study: real simulated server processes, the load generator over HTTP, the
probes, the gate) with the bundled demo traffic, then prints:

1. the keep/reject table the study wrote, next to the seed's own verdict for each technique (the search
   space's ``prior``);
2. "right reason?" per screened technique (a retested one by its last decision): the category of the study's
   recorded reason (crash, oom, hang, ignored, context drop, memory loss, wrong answers, slower, no gain, kept:
   ``history/reasons.py``) against the categories the prior declares (``category:`` in the space), "N of M
   right" and the mismatches; where the simulator's truth on the study's workload says a reject prior does not
   hold there, ``kept`` is expected;
3. the true throughput (``runtime/sim/truth.py``, noiseless) of the configuration the study recommends, of the
   baseline, and of the best configuration the space allows on the same workload (a coordinate sweep over
   every parameter plus every configuration the study booted), and the recommendation's share of it.

The simulator is calibrated to the seeds' field notes; none of this is a measurement of real hardware.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elsa_tune.history.records import Phase
from elsa_tune.history.run_dir import History, RunDir
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.runtime.sim.truth import TruthWorkload
from elsa_tune.search_spaces.loader import load_space
from elsa_tune.search_spaces.space import ReasonCategory, SearchSpace, TechniqueKind
from elsa_tune.tuner.flow.preflight import load_traffic, measured_concurrency, workloads
from elsa_tune.tuner.flow.settings import Settings

HERE = Path(__file__).resolve().parent
#: the gate's defaults (``tuner/ab/gate.py`` ``GatePolicy``): a speed technique is worth keeping from +3%, a memory
#: one when no more than 2% slower with a pool at least 2% larger
MIN_EFFECT = 0.03
MEMORY_MARGIN = 0.02
#: a true effect smaller than this is invisible to the gate (its noise floor is a few percent)
NO_EFFECT = 0.02
MEMORY_MIN_GAIN = 0.02


def _bench_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("search_bench", HERE / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["search_bench"] = module
    spec.loader.exec_module(module)
    return module


def _with_context_target(space: str, tokens: int) -> str:
    """A copy of the space file whose context target (and context-length guardrail) is ``tokens``."""
    path = Path(load_space(space).path)
    text = re.sub(r"(?m)^(\s*(?:context_target|min_context_tokens):\s*)\d+", rf"\g<1>{tokens}", path.read_text())
    copy = Path(tempfile.mkdtemp(prefix="elsa-outcome-space-")) / path.name
    copy.write_text(text)
    return str(copy)


@dataclass(frozen=True)
class ReasonScore:
    """One screened technique: the category its decision recorded against the ones its prior accepts."""

    technique: str
    got: ReasonCategory | None
    expected: tuple[ReasonCategory, ...]
    result: str
    truth_ratio: float | None      # the simulator's noiseless candidate/incumbent throughput on the study's workload
    note: str = ""

    @property
    def right(self) -> bool:
        return self.got is not None and self.got in self.expected


def score_reasons(history: History, space: SearchSpace, bench: Any) -> list[ReasonScore]:
    """Score each screening decision's reason category against its prior's (``category:`` in the space).

    Where the simulator's truth on this workload contradicts a reject prior — the technique is really worth
    keeping here (faster by the gate's minimum effect, or, for a memory technique, no slower with a larger
    pool, above the context target) — the expected answer is ``kept`` and the note says why: the seed
    measured another regime.
    """
    techniques = {t.name: t for t in space.techniques}
    boots = {b.boot_id: b for b in history.boots}
    scores: list[ReasonScore] = []
    # A technique retested with fresh boots (a promising inconclusive) is scored by its last decision.
    final = {d.technique: d for d in history.decisions if d.phase is Phase.SCREENING and not d.skipped}
    for d in final.values():
        technique = techniques.get(d.technique)
        if d.phase is not Phase.SCREENING or d.skipped or technique is None or technique.prior is None:
            continue
        expected = technique.prior.categories
        if not expected:
            continue
        ratio, note = None, ""
        booted = next((boots[b].candidate for b in d.boots_candidate if b in boots), None)
        incumbent = next((b.candidate for b in history.boots if b.candidate.key() == d.incumbent_key), None)
        if booted is not None:
            cand = bench.worth(booted)
            inc = bench.worth(incumbent or space.baseline())
            if cand.value is not None and inc.value:
                ratio = cand.value / inc.value
                if technique.prior.verdict == "reject" and _worth_keeping(technique.kind, ratio, cand.kv, inc.kv,
                                                                          bench.target):
                    expected = (ReasonCategory.KEPT_FOR_MEMORY if technique.kind is TechniqueKind.MEMORY
                                else ReasonCategory.KEPT,)
                    note = (f"the seed's verdict does not hold on this workload: truth ×{ratio:.2f}, KV pool "
                            f"{inc.kv:,} → {cand.kv:,} tokens")
                elif (ReasonCategory.SLOWER in expected and ReasonCategory.NO_GAIN not in expected
                      and abs(ratio - 1.0) < NO_EFFECT):
                    # the seed measured a slowdown in a regime this workload does not have (e.g. long contexts):
                    # here there is nothing to measure, and "no gain" is the right answer
                    expected = (*expected, ReasonCategory.NO_GAIN)
                    note = f"no effect on this workload (truth ×{ratio:.2f}): the seed's slowdown is in another regime"
        scores.append(ReasonScore(d.technique, d.category, expected, d.result, ratio, note))
    return scores


def _worth_keeping(kind: TechniqueKind, ratio: float, kv: int, incumbent_kv: int, target: int) -> bool:
    if kv < target:
        return False
    if kind is TechniqueKind.MEMORY:
        return ratio >= 1.0 - MEMORY_MARGIN and kv >= incumbent_kv * (1.0 + MEMORY_MIN_GAIN)
    return ratio >= 1.0 + MIN_EFFECT


def print_reasons(scores: list[ReasonScore]) -> None:
    print("\n| technique | study's reason | expected (the prior's; kept where the truth disagrees) | "
          "truth on this workload | right reason? |")
    print("|---|---|---|---|---|")
    for s in scores:
        truth = f"×{s.truth_ratio:.2f}" if s.truth_ratio is not None else "crashes"
        print(f"| {s.technique} | {s.got.value if s.got else '—'} | {' / '.join(c.value for c in s.expected)} | "
              f"{truth} | {'yes' if s.right else 'NO'} |")
    right = sum(s.right for s in scores)
    print(f"\nright reason: {right} of {len(scores)} (mismatches, then notes)")
    for s in scores:
        if not s.right:
            print(f"  - {s.technique}: recorded {s.got.value if s.got else 'nothing'}, expected "
                  f"{' or '.join(c.value for c in s.expected)} — {s.result}" + (f" ({s.note})" if s.note else ""))
        elif s.note:
            print(f"  - {s.technique}: {s.note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="rtx5090-qwen3.8-27b-nvfp4")
    parser.add_argument("--space", default="qwen3.8-27b-nvfp4-rtx5090")
    parser.add_argument("--budget", default="30m")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default: a fresh one under /tmp)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-run", action="store_true", help="score an existing --out without running")
    parser.add_argument("--context-target", type=int, default=None,
                        help="run a copy of the space with this context target (seed 000 stress-tested 200K)")
    args = parser.parse_args(argv)
    if args.context_target:
        args.space = _with_context_target(args.space, args.context_target)
    out = args.out or Path(f"/tmp/elsa-outcome-{args.profile}-{int(time.time())}") / "study"
    cmd = [sys.executable, "-m", "elsa_tune", "--gpu", "sim", "--sim-profile", args.profile, "--space", args.space,
           "--traffic", "demo", "--budget", args.budget, "--out", str(out), "--no-live", "--seed", str(args.seed)]
    started = time.monotonic()
    if not args.skip_run:
        ledger = out.parent / "ledger.jsonl"
        if ledger.exists():
            # The ledger is shared by the studies of a run folder: a second study there skips what the first
            # rejected, and scores nothing a fresh study would be scored on.
            print(f"{ledger} exists: a study in {out} would skip what earlier studies there rejected; give --out a "
                  "folder of its own (e.g. /tmp/outcome-2/study)", file=sys.stderr)
            return 2
        print("$", " ".join(cmd), flush=True)
        env = {**os.environ, "ELSA_SIM_CARD_DIR": str(out.parent / "card")}   # a card of its own
        done = subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        if done.returncode not in (0, 130):
            print(done.stderr[-3000:])
            return done.returncode
    elapsed = time.monotonic() - started
    history = RunDir(out).load()
    space = load_space(args.space)
    priors = {t.name: t.prior for t in space.techniques}
    print(f"\nstudy in {out} ({elapsed / 60:.1f} min wall, {len(history.boots)} boots)\n")
    print("| technique | study: kept? | study: result | seed's verdict |")
    print("|---|---|---|---|")
    decided = set()
    for d in history.decisions:
        decided.add(d.technique)
        prior = priors.get(d.technique)
        print(f"| {d.technique} | {d.kept.value} | {d.result.replace('|', '/')} | "
              f"{(prior.verdict + ': ' + prior.reason) if prior else ''} |")
    for t in space.techniques:
        if t.name not in decided:
            why = "not screened automatically" if not t.screen else "not reached within the budget"
            print(f"| {t.name} | — | {why} | {(t.prior.verdict + ': ' + t.prior.reason) if t.prior else ''} |")

    study = json.loads((out / "study.json").read_text())
    settings = Settings(**{k: v for k, v in (study.get("settings") or study["extra"]["settings"]).items()
                           if k in Settings.__dataclass_fields__ and k not in ("out", "log_file", "looks")})
    trace = load_traffic("demo")
    measured, _ = workloads(trace, settings, measured_concurrency(space))
    reqs = measured.requests
    workload = TruthWorkload(concurrency=measured.concurrency or 1, num_requests=len(reqs),
                             input_tokens=tuple(r.input_tokens for r in reqs),
                             output_tokens=tuple(r.output_tokens for r in reqs),
                             regimes=tuple(r.kind or "chat" for r in reqs))
    bench_mod = _bench_module()
    bench = bench_mod.Bench(load_profile(args.profile), space, workload, measured_passes=2)
    for b in history.boots:
        bench.worth(b.candidate)
    best = bench_mod.optimum(bench)
    from elsa_tune.search_spaces.candidate import Candidate

    print_reasons(score_reasons(history, space, bench))
    winner = bench.worth(Candidate.from_dict(study["incumbent"]))
    base = bench.worth(space.baseline())
    print(f"\ntrue output throughput on the study's workload ({len(reqs)} requests, concurrency "
          f"{workload.concurrency}): baseline {base.value or 0:.2f}, recommended {winner.value or 0:.2f} "
          f"(KV pool {winner.kv:,}), best the space allows {best:.2f} tok/s")
    share = (winner.value or 0.0) / best
    print(f"recommended = {share:.1%} of the best ({'within' if share >= 0.97 else 'NOT within'} 3%); "
          f"recommended: {study['incumbent']['label']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
