"""Generated scenarios: how close the study's recommendation comes to the best the space allows, and why.

    python benchmarks/scenarios/run.py --scenarios 100 --seeds 0-2 --budget 8h --json out.json --workers 16
    python benchmarks/scenarios/run.py --profile rtx5090-qwen3.8-27b-nvfp4 --space qwen3.8-27b-nvfp4-rtx5090 \
        --seeds 0-9 --budget 8h --json shipped.json
    python benchmarks/scenarios/run.py --scenarios 20 --traffic prod.parquet --seeds 0-4 --json out.json
    python benchmarks/scenarios/run.py --held-out 100 --compare --scenarios 100 --seeds 0-2 --json out.json

``--held-out N`` draws N scenario indices and ``--held-out-seeds`` seeds at run time (``draw_held_out``: from
indices and seeds no earlier reported run used, ``NAMED``), prints them and records them in the JSON (``sets``);
``--draw`` names the draw to run the same set again. ``--compare`` also runs the studied set (``--scenarios``,
``--first``, ``--seeds``) in the same run, and the table puts the two sets side by side.

Each scenario (``scenario.py``: a generated card, model, space and traffic; or ``--profile``/``--space``) is run as a
virtual-time study per seed (``elsa_tune.tuner.flow.virtual.run_virtual_study``), and, on the same virtual boots and the
same simulated budget, by random search with the same gate, a vLLM-style grid and the naive protocol
(``comparators.py``). Everything is scored against the simulator's noiseless truth (``oracle.py``, ``score.py``):
the recommendation's share of the best the space allows (exhaustive truth over the space), each technique's
recorded reason category beside the one its truth implies, false keeps, keeps of a technique that damages answers.

The JSON is ``{"runs": [{"seed", "recommended_share", "recommended_label", "decisions": [{"technique", "category",
"kept", ...}], "scenario", "regret", "false_keeps", "damage_keeps", "boots", "sim_seconds", "cpu_seconds",
"comparators": {"random"|"grid"|"naive": {...}}, "set": "studied"|"held-out", ...}], "sets": {name: {"scenarios",
"seeds", ...}}, "budget"}`` with categories as ``ReasonCategory`` values. The table
printed at the end puts the study beside the comparators. The simulator is calibrated to the seeds' field notes;
none of this is a measurement of real hardware.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import secrets
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from comparators import METHODS, run_protocol  # noqa: E402
from oracle import Oracle  # noqa: E402
from scenario import generate  # noqa: E402
from score import score_protocol, score_study  # noqa: E402

from elsa_tune.errors import ElsaTuneError  # noqa: E402
from elsa_tune.tuner.flow.budget import parse_duration  # noqa: E402
from elsa_tune.tuner.flow.virtual import VirtualBench, run_virtual_study  # noqa: E402

REGRET_BAD = 0.10
#: generated scenario indices and study seeds an earlier reported run used (``last_run.md``: scenarios 0–99, seeds
#: 0–4); a held-out set is drawn outside both
NAMED = (range(0, 100), range(0, 5))
#: the ranges a held-out set is drawn from (above the named ones)
HELD_OUT_INDICES = range(100, 1_000_000)
HELD_OUT_SEEDS = range(5, 1_000_000)
STUDIED, HELD_OUT = "studied", "held-out"


@dataclass(frozen=True)
class Case:
    """One scenario to run: its files, the traffic, and the oracle's best (filled in before the studies)."""

    name: str
    profile: str
    space: str
    traffic: str
    shape: str = ""
    noise_family: str = ""
    best: float = 0.0
    best_label: str = ""
    best_method: str = ""
    set: str = STUDIED


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds.extend(range(int(low), int(high or low) + 1))
    return seeds


@dataclass(frozen=True)
class HeldOut:
    """A held-out set: ``scenarios`` generated indices × ``seeds`` study seeds, drawn by ``draw``."""

    draw: int
    scenarios: tuple[int, ...]
    seeds: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"draw": self.draw, "scenarios": list(self.scenarios), "seeds": list(self.seeds),
                "drawn_from": {"scenarios": [HELD_OUT_INDICES.start, HELD_OUT_INDICES.stop - 1],
                               "seeds": [HELD_OUT_SEEDS.start, HELD_OUT_SEEDS.stop - 1]},
                "excluded": {"scenarios": [NAMED[0].start, NAMED[0].stop - 1],
                             "seeds": [NAMED[1].start, NAMED[1].stop - 1]}}


def draw_held_out(scenarios: int, seeds: int, draw: int | None = None) -> HeldOut:
    """``scenarios`` distinct indices and ``seeds`` distinct seeds, none named by an earlier run (``NAMED``).

    ``draw`` seeds the drawing (the same draw gives the same set); without one a fresh draw is taken from the
    operating system's entropy, so every reported run is on a set nobody has seen."""
    if scenarios < 1 or seeds < 1:
        raise ValueError("a held-out set needs at least one scenario and one seed")
    draw = secrets.randbelow(2**63) if draw is None else draw
    rng = random.Random(f"held-out:{draw}")
    indices = tuple(sorted(rng.sample(HELD_OUT_INDICES, scenarios)))
    drawn_seeds = tuple(sorted(rng.sample(HELD_OUT_SEEDS, seeds)))
    return HeldOut(draw, indices, drawn_seeds)


# ---- work in the pool ------------------------------------------------------------------------------------


def _generate(job: tuple[int, str, str | None, str]) -> Case:
    index, root, traffic, which = job
    s = generate(index, Path(root), traffic=traffic)
    return Case(s.name, str(s.profile), str(s.space), s.traffic, s.shape, s.noise_family, set=which)


def _best(job: tuple[Case, float]) -> Case:
    case, budget_s = job
    oracle = Oracle(case.profile, case.space, case.traffic, budget_s=budget_s)   # the workload depends on the budget
    best, candidate, method = oracle.best()
    return replace(case, best=best, best_label=candidate.label, best_method=method)


def _study(job: tuple[Case, int, float, str, Sequence[str]]) -> dict[str, Any]:
    case, seed, budget_s, out_root, methods = job
    oracle = Oracle(case.profile, case.space, case.traffic, budget_s=budget_s)
    out = Path(tempfile.mkdtemp(prefix=f"{case.name}-s{seed}-", dir=out_root)) / "study"
    started = time.process_time()
    try:
        result = run_virtual_study(profile=case.profile, space=case.space, traffic=case.traffic, budget_s=budget_s,
                                   seed=seed, out=out)
    except Exception as exc:        # a study that crashes is a result (the worst one), never a hung pool
        return _crashed(case, seed, out, exc, time.process_time() - started)
    values = _values_of(oracle, result.recommended)
    score = score_study(oracle, result.recommended, result.decisions, case.best, values)
    run: dict[str, Any] = {
        "set": case.set, "seed": seed, "scenario": case.name, "shape": case.shape, "noise_family": case.noise_family,
        "traffic": case.traffic, "best_label": case.best_label, "best_tok_s": case.best,
        "best_method": case.best_method,
        **score.to_dict(), "status": result.status, "boots": result.boots, "sim_seconds": result.sim_seconds,
        "cpu_seconds": result.cpu_seconds, "run_dir": str(result.run_dir),
        "decisions": [j.to_dict() for j in score.judged],
    }
    comparators: dict[str, Any] = {}
    for method in methods:
        started = time.process_time()
        bench = VirtualBench(profile=case.profile, space=case.space, traffic=case.traffic, budget_s=budget_s,
                             seed=seed)
        proto = run_protocol(method, bench, oracle.space, budget_s, seed)
        s = score_protocol(oracle, proto.values, proto.techniques, case.best)
        comparators[method] = {**s.to_dict(), "boots": proto.boots, "sim_seconds": proto.sim_seconds,
                               "cpu_seconds": time.process_time() - started}
    run["comparators"] = comparators
    return run


def _write(path: Path, runs: Sequence[dict[str, Any]], sets: dict[str, Any], budget: str) -> None:
    path.write_text(json.dumps({"budget": budget, "sets": sets, "runs": list(runs)}, indent=1, default=str))


def _key(name: str, shape: str, traffic: str) -> tuple[str, str, str]:
    """A scenario's identity across runs: its name, traffic shape and traffic file name (not its folder)."""
    return name, shape, Path(traffic).name


def _crashed(case: Case, seed: int, out: Path, exc: Exception, cpu_s: float) -> dict[str, Any]:
    """The record of a study that raised: nothing recommended (regret 1), the error and where it was raised."""
    where = traceback.format_exception(exc)[-3:]
    return {"set": case.set, "seed": seed, "scenario": case.name, "shape": case.shape,
            "noise_family": case.noise_family,
            "traffic": case.traffic, "best_label": case.best_label, "best_tok_s": case.best,
            "best_method": case.best_method, "recommended_share": 0.0, "regret": 1.0, "recommended_label": "(crashed)",
            "false_keeps": 0, "damage_keeps": 0, "harmful_total": 0, "right_categories": 0, "judged": 0,
            "noops": 0, "noops_slower": 0, "memory_gains": 0, "memory_gains_filed": 0,
            "status": f"crashed: {type(exc).__name__}: {exc}", "error": "".join(where), "boots": 0,
            "sim_seconds": 0.0, "cpu_seconds": cpu_s, "run_dir": str(out), "decisions": [], "comparators": {}}


def _known_bests(path: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Best-the-space-allows per scenario from an earlier run's JSON."""
    runs = json.loads(path.read_text())["runs"]
    return {_key(r["scenario"], r["shape"], r["traffic"]): {
        "best": r["best_tok_s"], "best_label": r["best_label"], "best_method": r["best_method"]} for r in runs}


def _values_of(oracle: Oracle, candidate: Any) -> dict[str, Any] | None:
    """The parameter values behind a recommended candidate, read back from its flags and env."""
    values: dict[str, Any] = {}
    for p in oracle.space.parameters:
        raw = candidate.flags.get(p.flag) if p.flag else candidate.env.get(p.env or "")
        if raw is None:
            return None
        try:
            values[p.name] = p.coerce(type(p.baseline)(raw) if not isinstance(p.baseline, bool) else raw)
        except (TypeError, ValueError):
            return None
    return values


# ---- summary ---------------------------------------------------------------------------------------------


def _ratio(hits: int, total: int) -> str:
    return f"{hits} / {total} ({hits / total:.1%})" if total else f"{hits} / 0"


def summary(runs: Sequence[dict[str, Any]], methods: Sequence[str]) -> str:
    """The table: per set (studied, held-out) the study's row and each comparator's, on the same studies."""
    sets = [name for name in (STUDIED, HELD_OUT) if any(r.get("set", STUDIED) == name for r in runs)]
    rows: list[tuple[str, list[dict[str, Any]], bool]] = []
    for which in sets:
        mine = [r for r in runs if r.get("set", STUDIED) == which]
        label = f" ({which})" if len(sets) > 1 or which == HELD_OUT else ""
        rows.append((f"elsa-tune{label}", mine, True))
        rows += [(f"{m}{label}", [r["comparators"][m] for r in mine if m in r.get("comparators", {})], False)
                 for m in methods]
    lines = ["| method | runs | median regret | P(regret > 10%) | false keeps / techniques with true effect ≤ 0 | "
             "quality-damage keeps | right category | no-ops filed slower | memory-gain techniques filed as kept | "
             "median boots | median sim h | median CPU s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rs, study in rows:
        if not rs:
            continue
        regrets = [r["regret"] for r in rs]
        false_keeps, harmful = sum(r["false_keeps"] for r in rs), sum(r["harmful_total"] for r in rs)

        def total(key: str, rs: list[dict[str, Any]] = rs) -> int:
            return sum(int(r.get(key, 0)) for r in rs)

        right = _ratio(total("right_categories"), total("judged")) if study else "—"
        slower = _ratio(total("noops_slower"), total("noops")) if study else "—"
        memory = _ratio(total("memory_gains_filed"), total("memory_gains")) if study else "—"
        lines.append(f"| {name} | {len(rs)} | {statistics.median(regrets):.1%} | "
                     f"{sum(g > REGRET_BAD for g in regrets) / len(rs):.1%} | {false_keeps} / {harmful} "
                     f"({false_keeps / max(1, harmful):.1%}) | {sum(r['damage_keeps'] for r in rs)} | {right} | "
                     f"{slower} | {memory} | "
                     f"{statistics.median(r['boots'] for r in rs):.0f} | "
                     f"{statistics.median(r['sim_seconds'] for r in rs) / 3600:.1f} | "
                     f"{statistics.median(r['cpu_seconds'] for r in rs):.1f} |")
    infeasible = [r for r in runs if r["recommended_share"] == 0 and not str(r["status"]).startswith("crashed")]
    if infeasible:      # a recommendation whose truth breaks a guardrail, misses the context or crashes
        lines.append(f"\n{len(infeasible)} of {len(runs)} studies recommend a configuration the truth finds "
                     "infeasible: " + "; ".join(f"{r['scenario']} seed {r['seed']} ({r['recommended_label']})"
                                                for r in infeasible[:5]))
    crashed = [r for r in runs if str(r["status"]).startswith("crashed")]
    if crashed:
        lines.append(f"\n{len(crashed)} studies crashed (counted with regret 100%): "
                     + "; ".join(f"{r['scenario']} seed {r['seed']}: {r['status']}" for r in crashed[:5]))
    return "\n".join(lines)


def mismatches(runs: Sequence[dict[str, Any]]) -> list[str]:
    out = []
    for r in runs:
        for d in r["decisions"]:
            if not d["right"]:
                ratio = f"×{d['true_ratio']:.3f}" if d["true_ratio"] is not None else "crashes"
                out.append(f"- {r['scenario']} seed {r['seed']}: {d['technique']}: recorded {d['category']} "
                           f"({d['kept']}), truth {ratio}, expected {' / '.join(d['expected'])}")
    return out


# ---- CLI -------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--scenarios", type=int, default=10, help="generated scenarios (default 10)")
    parser.add_argument("--first", type=int, default=0, help="index of the first generated scenario")
    parser.add_argument("--profile", help="a sim profile (name or YAML path) instead of generated scenarios")
    parser.add_argument("--space", help="the search space (name or YAML path) that goes with --profile")
    parser.add_argument("--traffic", default=None,
                        help="demo or a Parquet trace (default: each generated scenario's own shape; "
                             "demo with --profile)")
    parser.add_argument("--seeds", default="0-2", help="study seeds, e.g. 0-4 or 0,3,7")
    parser.add_argument("--budget", default="8h", help="simulated budget per study (e.g. 8h, 30m)")
    parser.add_argument("--json", type=Path, required=True, help="where to write the runs")
    parser.add_argument("--workers", type=int, default=1, help="processes (scenarios × seeds run in parallel)")
    parser.add_argument("--root", type=Path, default=None, help="where scenarios and run folders go (default: /tmp)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comparators to run beside the study ('' = none)")
    parser.add_argument("--held-out", type=int, default=0, metavar="N",
                        help="draw N scenario indices and --held-out-seeds seeds nobody reported on, at run time, and "
                             "run them (printed and recorded in the JSON's sets)")
    parser.add_argument("--held-out-seeds", type=int, default=3, metavar="K", help="seeds of the held-out set (3)")
    parser.add_argument("--draw", type=int, default=None,
                        help="the held-out draw to run again (printed by an earlier run; default: a fresh draw)")
    parser.add_argument("--compare", action="store_true",
                        help="with --held-out: also run the studied set (--scenarios, --first, --seeds) and put the "
                             "two side by side")
    parser.add_argument("--best-from", type=Path, default=None,
                        help="an earlier run's JSON (same scenarios, budget and traffic): reuse its best-the-space-"
                             "allows instead of computing it again (the truth does not depend on the tuner)")
    args = parser.parse_args(argv)
    if bool(args.profile) != bool(args.space):
        print("--profile and --space go together: give both (a shipped profile and its space) or neither to run "
              "generated scenarios.", file=sys.stderr)
        return 2
    try:
        budget_s = parse_duration(args.budget)
        seeds = parse_seeds(args.seeds)
    except (ElsaTuneError, ValueError) as exc:
        print(f"{exc}; give --budget like 8h or 30m and --seeds like 0-4 or 0,3,7.", file=sys.stderr)
        return 2
    if args.compare and not args.held_out:
        print("--compare puts the studied set beside a held-out one: give --held-out N (e.g. --held-out 100) too.",
              file=sys.stderr)
        return 2
    if args.held_out and args.profile:
        print("--held-out draws generated scenarios; a shipped profile (--profile) is held out by its seeds: give "
              "--seeds outside the ones reported (e.g. --seeds 10-29) instead.", file=sys.stderr)
        return 2
    held_out: HeldOut | None = None
    if args.held_out:
        try:
            held_out = draw_held_out(args.held_out, args.held_out_seeds, args.draw)
        except ValueError as exc:
            print(f"{exc}; give --held-out N and --held-out-seeds K of at least 1.", file=sys.stderr)
            return 2
        print(f"held-out set (draw {held_out.draw}; again with --draw {held_out.draw}): scenarios "
              f"{', '.join(map(str, held_out.scenarios))}; seeds {', '.join(map(str, held_out.seeds))}", flush=True)
    sets: dict[str, Any] = {}
    if held_out is not None:
        sets[HELD_OUT] = held_out.to_dict()
    if held_out is None or args.compare:
        sets[STUDIED] = ({"profile": args.profile, "space": args.space, "seeds": seeds} if args.profile else
                         {"scenarios": list(range(args.first, args.first + args.scenarios)), "seeds": seeds})
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        print(f"unknown comparator {unknown[0]!r}; use some of {', '.join(METHODS)}.", file=sys.stderr)
        return 2
    root = args.root or Path(tempfile.mkdtemp(prefix="elsa-scenarios-"))
    (root / "runs").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        with multiprocessing.get_context("fork").Pool(max(1, args.workers)) as pool:
            if args.profile:
                name = Path(args.space).name.removesuffix(".yaml")
                cases = [Case(name, args.profile, args.space, args.traffic or "demo", "given")]
            else:
                jobs = [(i, str(root), args.traffic, which) for which, spec in sets.items()
                        for i in spec["scenarios"]]
                cases = pool.map(_generate, jobs, chunksize=1)
            known = _known_bests(args.best_from) if args.best_from else {}
            todo = [c for c in cases if _key(c.name, c.shape, c.traffic) not in known]
            best = {c.name: c for c in pool.map(_best, [(c, budget_s) for c in todo], chunksize=1)}
            cases = [replace(best[c.name], set=c.set) if c.name in best else
                     replace(c, **known[_key(c.name, c.shape, c.traffic)]) for c in cases]
            seeds_of = {which: spec["seeds"] for which, spec in sets.items()}
            print(f"{len(cases)} scenario(s) ready, best the space allows computed "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
            work = [(c, seed, budget_s, str(root / "runs"), methods) for c in cases for seed in seeds_of[c.set]]
            runs = []
            for run in pool.imap_unordered(_study, work, chunksize=1):
                runs.append(run)
                _write(args.json, runs, sets, args.budget)   # a killed run keeps these
                print(f"  {run['scenario']} seed {run['seed']}: {run['recommended_share']:.1%} of the best "
                      f"({run['recommended_label']}), {run['right_categories']}/{run['judged']} right, "
                      f"{run['false_keeps']} false keeps", flush=True)
    except ElsaTuneError as exc:
        print(f"{exc}", file=sys.stderr)
        return 2
    runs.sort(key=lambda r: (r["set"], r["scenario"], r["seed"]))
    _write(args.json, runs, sets, args.budget)
    described = "; ".join(f"{which}: {len(spec.get('scenarios', [1]))} scenario(s) × {len(spec['seeds'])} seed(s)"
                          for which, spec in sets.items())
    print(f"\n{len(runs)} studies ({described}), budget {args.budget} simulated, "
          f"{time.monotonic() - started:.0f} s wall; scenarios in {root}\n")
    print(summary(runs, methods))
    wrong = mismatches(runs)
    if wrong:
        print(f"\nwrong categories ({len(wrong)}):")
        print("\n".join(wrong))
    return 0


if __name__ == "__main__":
    sys.exit(main())
