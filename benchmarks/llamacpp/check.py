"""Independent re-measurement of a llama.cpp study's recommendation, on the machine the study ran on.

The study decides with its own gate; this script does not trust it. It reads the study's run folder, rebuilds the
baseline and the recommended candidate from the search space, and boots them alternately on fresh servers
(``--boots`` each, interleaved A B A B …), then boots every one-parameter move around the recommendation
(``--move-boots`` each): a boot is a fresh ``llama-server`` through the same ``ServerProcess`` the study uses,
one warm-up pass of the study's workload and ``--passes`` measured passes through the same load generator;
its throughput is the mean of its measured passes. Nothing here reads the study's boots.

It prints and writes (``--json``) each configuration's mean output tok/s with a 95% t-interval over boots, the
recommended/baseline ratio with a Welch interval, and the recommendation against the best configuration
measured. Every number is a real measurement on the machine it ran on (which it names).

    python benchmarks/llamacpp/check.py --run RUN_DIR --space llamacpp-gpu-1b --gpu 0 --traffic demo-chat \\
        --boots 8 --move-boots 3 --json check.json
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scipy import stats

from elsa_tune.errors import BootFailed, MeasurementFailed, StudyError
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.search_spaces.parameter import Value
from elsa_tune.search_spaces.space import SearchSpace
from elsa_tune.traffic.loadgen import LoadGenerator
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.tuner.flow.preflight import Preflight, run_preflight
from elsa_tune.tuner.flow.settings import Settings


@dataclass
class Config:
    """One configuration re-measured: its name, candidate and the throughput of each boot (``None``: failed)."""

    name: str
    candidate: Candidate
    boots: list[float | None] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def ok(self) -> list[float]:
        return [b for b in self.boots if b is not None]

    def summary(self) -> dict[str, Any]:
        values = self.ok()
        mean = statistics.fmean(values) if values else None
        half = _half_width(values)
        return {"name": self.name, "flags": dict(self.candidate.flags), "boots": self.boots,
                "failures": self.failures, "mean_tok_s": mean, "ci95_tok_s": half,
                "cv": statistics.stdev(values) / mean if mean and len(values) > 1 else None}


def _half_width(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    return float(stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)))


def welch_ratio(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """``mean(b)/mean(a)`` with a 95% interval from Welch's t on the difference, divided by ``mean(a)``."""
    if len(a) < 2 or len(b) < 2:
        return None
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    dof = (va + vb) ** 2 / ((va ** 2) / (len(a) - 1) + (vb ** 2) / (len(b) - 1)) if se > 0 else len(a) + len(b) - 2
    half = float(stats.t.ppf(0.975, dof)) * se
    return mb / ma, (mb - ma - half) / ma + 1, (mb - ma + half) / ma + 1


def values_of(space: SearchSpace, candidate: Candidate) -> tuple[dict[str, Value], list[str]]:
    """The parameter values and techniques that rebuild ``candidate`` from ``space``."""
    values = {p.name: candidate.flags.get(p.flag, p.baseline) for p in space.parameters if p.flag}
    techniques = [t.name for t in space.techniques
                  if t.flags and all(candidate.flags.get(k) == v for k, v in t.flags.items())
                  and any(space.baseline().flags.get(k) != v for k, v in t.flags.items())]
    return values, techniques


def moves(space: SearchSpace, values: dict[str, Value], techniques: list[str]) -> list[tuple[str, Candidate]]:
    """Every one-parameter move around ``values`` (with the same techniques) that the space's rules allow."""
    out: list[tuple[str, Candidate]] = []
    for p in space.parameters:
        for v in p.neighbours(values[p.name]):
            try:
                out.append((f"{p.name}={v}", space.candidate({**values, p.name: v}, techniques)))
            except (StudyError, ValueError):
                continue
    return out


def boot_once(pre: Preflight, candidate: Candidate, folder: Path, passes: int) -> float:
    """One fresh boot: start, one warm-up pass and ``passes`` measured passes, stop; the mean measured tok/s."""
    runtime = pre.runtime
    prompts = PromptSynth(pre.workload.block_size, pre.token_source())   # as the study's boots build them
    server = runtime.start(candidate, folder)
    try:
        gen = LoadGenerator(server.base_url, prompts, slots=server.report.max_running_requests)
        measured = []
        for i in range(1 + passes):
            m = gen.measure(pre.workload, i)
            if i >= 1:
                measured.append(m.output_throughput_tok_s)
        return statistics.fmean(measured)
    finally:
        runtime.stop(server)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="the study's run folder (its study.json)")
    parser.add_argument("--space", required=True)
    parser.add_argument("--gpu", default="0", help="the GPU index or UUID, or cpu")
    parser.add_argument("--traffic", default="demo-chat")
    parser.add_argument("--pass-seconds", type=float, default=None)
    parser.add_argument("--boots", type=int, default=8, help="fresh boots each of baseline and recommendation")
    parser.add_argument("--move-boots", type=int, default=3, help="fresh boots of each one-parameter move")
    parser.add_argument("--passes", type=int, default=2, help="measured passes per boot (after one warm-up)")
    parser.add_argument("--work", type=Path, default=Path("check-boots"), help="where the boots' logs go")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)   # a stopped check stops the server it booted (``finally``)

    study = json.loads((args.run / "study.json").read_text())
    settings = Settings(gpu=args.gpu, runtime="process", family="llamacpp", space=args.space, traffic=args.traffic,
                        pass_seconds=args.pass_seconds,
                        budget_s=3600.0, live=False)
    pre = run_preflight(settings)
    space = pre.space
    recommended = Candidate(flags=study["incumbent"]["flags"], env=study["incumbent"].get("env", {}),
                            label=study["incumbent"].get("label", "recommended"))
    values, techniques = values_of(space, recommended)
    rec = Config("recommended " + (recommended.label or "?"), space.candidate(values, techniques))
    base = Config("baseline", space.baseline())
    head = [base, rec] if rec.candidate.key() != base.candidate.key() else [base]
    around: list[Config] = []
    for name, cand in moves(space, values, techniques):
        if cand.key() not in {c.candidate.key() for c in (*head, *around)}:
            around.append(Config(name, cand))
    configs = [*head, *around]
    started = time.time()
    plan: list[Config] = []
    for _ in range(args.boots):
        plan += head
    for _ in range(args.move_boots):
        plan += around
    print(f"{pre.gpu_state.name if pre.gpu_state else '?'} · {pre.runtime_name} {pre.runtime_version}: "
          f"{len(plan)} boots of {len(configs)} configurations", flush=True)
    for n, config in enumerate(plan):
        if args.json and n:
            args.json.write_text(json.dumps({"partial": True, "boots_done": n,
                                             "configs": [c.summary() for c in configs]}, indent=2, default=str))
        folder = args.work / f"{n:04d}"
        try:
            tput = boot_once(pre, config.candidate, folder, args.passes)
            config.boots.append(tput)
            print(f"boot {n:3d} {config.name}: {tput:.1f} tok/s", flush=True)
        except (BootFailed, MeasurementFailed) as exc:
            config.boots.append(None)
            config.failures.append(str(exc)[:200])
            print(f"boot {n:3d} {config.name}: failed: {str(exc)[:160]}", flush=True)
    summaries = [c.summary() for c in configs]
    ratio = welch_ratio(base.ok(), rec.ok()) if len(head) > 1 else None
    best = max((s for s in summaries if s["mean_tok_s"]), key=lambda s: s["mean_tok_s"], default=None)
    result = {"machine": pre.gpu_state.name if pre.gpu_state else None,
              "gpu_uuid": pre.gpu_state.uuid if pre.gpu_state else None,
              "runtime": f"{pre.runtime_name} {pre.runtime_version}", "space": space.name,
              "workload_requests": len(pre.workload), "boots": len(plan), "seconds": round(time.time() - started, 1),
              "configs": summaries,
              "recommended_over_baseline": ratio,
              "best": best["name"] if best else None,
              "recommended_is_baseline": len(head) == 1,
              "recommended_of_best": (summaries[len(head) - 1]["mean_tok_s"] / best["mean_tok_s"])
              if best and summaries[len(head) - 1]["mean_tok_s"] else None}
    for s in summaries:
        ci = f" ± {s['ci95_tok_s']:.1f}" if s["ci95_tok_s"] is not None else ""
        mean = f"{s['mean_tok_s']:.1f}{ci}" if s["mean_tok_s"] else "—"
        print(f"{s['name']:<40} {mean:>16} tok/s over {len(s['boots'])} boots ({len(s['failures'])} failed)")
    if ratio:
        print(f"recommended / baseline: ×{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}]")
    if result["recommended_of_best"]:
        print(f"recommended is {result['recommended_of_best']:.1%} of the best measured ({result['best']})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
