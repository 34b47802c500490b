"""Why a TTFT tail guardrail is hard to resolve: the tail moves with the boot's drift, as throughput does.

    python benchmarks/gate/tail_noise.py                  # seed 004's profile, baseline vs no-mtp, 12 boots each
    python benchmarks/gate/tail_noise.py --noise off      # the same without noise: the configurations' true TTFTs

Boots the simulated server (real processes, the load generator over HTTP, the study's workload on the bundled demo
traffic: a closed loop at the baseline's slots, one warm-up and two measured passes) alternately under two
configurations and keeps every request's TTFT. Per configuration it prints the boot-to-boot σ (log scale) of the
throughput and of four TTFT statistics a guardrail could use, each one's correlation with the boot's throughput,
and the B/A ratio:

- the p50 and the p90 of each pass (the gate's median and its tail below 100 requests a boot);
- the mean log TTFT of a FIXED tail set (the 10% of the workload's requests with the largest mean TTFT over every
  boot, the same prompts in both arms), the request-paired statistic that removes which-request-was-slow noise;
- the mean log TTFT of every request.

On this profile the long-prompt requests make the tail, their TTFT is prefill time, and prefill time scales with
the boot's drift: a fixed tail set is no less noisy than the p90. That is what ``tuner/ab/gate.py``'s guardrail
extension answers with more boots. Simulated boots, calibrated to the seeds: not a measurement of hardware.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from elsa_tune.runtime.sim.runtime import SimulatedSGLang
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.traffic.loadgen import LoadGenerator
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.tuner.flow.preflight import Preflight, run_preflight
from elsa_tune.tuner.flow.settings import Settings


class Boot:
    """One boot's measured passes: throughput and every request's TTFT by its index in the workload."""

    def __init__(self, arm: str, throughput: list[float], ttft: list[dict[int, float]]) -> None:
        self.arm = arm
        self.throughput = throughput
        self.ttft = ttft

    def log_throughput(self) -> float:
        return math.log(statistics.fmean(self.throughput))

    def log_quantile(self, q: float) -> float:
        per_pass = [statistics.quantiles(sorted(p.values()), n=100, method="inclusive")[round(100 * q) - 1]
                    for p in self.ttft]
        return math.log(statistics.median(per_pass))

    def log_mean(self, requests: set[int] | None = None) -> float:
        return statistics.fmean(math.log(t) for p in self.ttft for i, t in p.items()
                                if requests is None or i in requests)


def _boot(runtime: SimulatedSGLang, candidate: Candidate, folder: Path, arm: str, pre: Preflight) -> Boot:
    folder.mkdir(parents=True, exist_ok=True)
    server = runtime.start(candidate, folder)
    try:
        gen = LoadGenerator(server.base_url, PromptSynth(pre.workload.block_size),
                            slots=server.report.max_running_requests)
        tput: list[float] = []
        ttft: list[dict[int, float]] = []
        for i in range(3):
            m = gen.measure(pre.workload, i)
            if i == 0:
                continue                     # the warm-up pass, as the study discards it
            tput.append(m.output_throughput_tok_s)
            ttft.append({r.index: r.ttft_s for r in m.records if r.ttft_s is not None and r.ttft_s > 0})
        return Boot(arm, tput, ttft)
    finally:
        runtime.stop(server)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--profile", default="rtx5090-qwen3.8-27b-nvfp4")
    parser.add_argument("--space", default="qwen3.8-27b-nvfp4-rtx5090")
    parser.add_argument("--technique", default="no-mtp", help="arm B: the baseline with this technique")
    parser.add_argument("--boots", type=int, default=12, help="boots per arm (default 12)")
    parser.add_argument("--noise", choices=("profile", "off"), default="profile")
    args = parser.parse_args(argv)
    out = Path(tempfile.mkdtemp(prefix="elsa-tail-noise-"))
    settings = Settings(gpu="sim", sim_profile=args.profile, space=args.space, traffic="demo", budget_s=1800.0,
                        out=out, live=False)
    pre = run_preflight(settings, card_dir=out / "card", harvest_flags=False)
    noise = ["--sim-noise", "off"] if args.noise == "off" else []

    class Sim(SimulatedSGLang):
        def argv(self, candidate: Candidate, port: int) -> list[str]:
            return [*super().argv(candidate, port), *noise]

    runtime = Sim(args.profile, card_dir=out / "card", speedup=settings.sim_speedup, seed=1)
    a = pre.space.baseline()
    b = pre.space.candidate(pre.space.baseline_values(), [args.technique], label=args.technique)
    started = time.monotonic()
    boots: list[Boot] = []
    for i in range(args.boots):
        for arm, candidate in (("A", a), ("B", b)) if i % 2 == 0 else (("B", b), ("A", a)):
            boots.append(_boot(runtime, candidate, out / f"boot-{len(boots):03d}", arm, pre))
    by_request: dict[int, list[float]] = {}
    for boot in boots:
        for p in boot.ttft:
            for i, t in p.items():
                by_request.setdefault(i, []).append(math.log(t))
    ranked = sorted(by_request, key=lambda i: -statistics.fmean(by_request[i]))
    tail = set(ranked[:max(1, len(ranked) // 10)])
    stats = {"throughput": Boot.log_throughput, "TTFT p50": lambda x: x.log_quantile(0.5),
             "TTFT p90": lambda x: x.log_quantile(0.9), "TTFT, fixed tail set": lambda x: x.log_mean(tail),
             "TTFT, every request": lambda x: x.log_mean()}
    print(f"# TTFT tail noise: {args.profile}, baseline (A) vs {args.technique} (B), {args.boots} boots each, noise "
          f"{args.noise}; {len(by_request)} requests a pass, fixed tail set {sorted(tail)}\n")
    print("| per-boot statistic (log) | σ A | σ B | correlation with throughput, A | B | B/A |")
    print("|---|---|---|---|---|---|")
    for name, fn in stats.items():
        ya = [fn(x) for x in boots if x.arm == "A"]
        yb = [fn(x) for x in boots if x.arm == "B"]
        ta = [x.log_throughput() for x in boots if x.arm == "A"]
        tb = [x.log_throughput() for x in boots if x.arm == "B"]
        corr = (f"{_corr(ya, ta):+.2f} | {_corr(yb, tb):+.2f}" if name != "throughput" else "— | —")
        print(f"| {name} | {statistics.stdev(ya):.3f} | {statistics.stdev(yb):.3f} | {corr} | "
              f"{math.exp(statistics.fmean(yb) - statistics.fmean(ya)):.3f} |")
    print(f"\nElapsed {time.monotonic() - started:.0f} s. Simulated boots: not a measurement of hardware.")
    return 0


def _corr(x: list[float], y: list[float]) -> float:
    try:
        return statistics.correlation(x, y)
    except statistics.StatisticsError:
        return float("nan")


if __name__ == "__main__":
    sys.exit(main())
