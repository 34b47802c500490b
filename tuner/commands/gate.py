"""``elsa-tune gate plan|simulate``: what the A/B gate can detect at a given noise, before spending a night on it.

``plan`` prints the calibrated boundaries of a gate design, the planned MDE at each look and the boots per arm a
fixed-n test would need for common effect sizes. ``simulate`` runs the real gate against the gate's
noise model with a known true effect and prints how often it keeps and how many boots it spends: a quick
check of a policy (``benchmarks/gate/run.py`` is the full table).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from elsa_tune.errors import ConfigError
from elsa_tune.tuner.ab.comparison import InsufficientData, boots_per_arm_for, mde_for
from elsa_tune.tuner.ab.gate import GatePolicy, run_ab
from elsa_tune.tuner.ab.noise_model import NoiseModelSampler
from elsa_tune.tuner.argument_types import (
    float_in,
    int_in,
    positive_float,
)

NAME = "gate"
HELP = "plan or simulate the A/B gate: boundaries, detectable effects, keep rates at a given noise"
EXAMPLES = ('elsa-tune gate plan --sigma-boot 0.05 --looks 2,4,6 --json',
            'elsa-tune gate simulate --effect 1.05 --effect 1.10 --runs 200 --sigma-boot 0.05')
MDES = (0.02, 0.03, 0.05, 0.10, 0.15, 0.20)


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="gate_command", metavar="ACTION", required=True)
    plan = sub.add_parser("plan", help="boundaries, MDE per look and boots needed per effect size")
    _policy_args(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(func=_plan)
    simulate = sub.add_parser("simulate", help="keep rate and boots spent for a known true effect (noise model)")
    _policy_args(simulate)
    simulate.add_argument("--effect", type=float_in(-0.99, 10.0), action="append", metavar="RATIO",
                          help="true change as a fraction, e.g. 0.05 for +5%% (repeatable; default 0 and 0.10)")
    simulate.add_argument("--runs", type=int_in(1, 100_000), default=200, help="A/B runs per effect (default 200)")
    simulate.set_defaults(func=_simulate)


def _policy_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sigma-boot", type=float_in(0.0, 10.0), default=0.10,
                        help="boot-to-boot σ of log throughput (0.10)")
    parser.add_argument("--sigma-run", type=float_in(0.0, 10.0), default=0.03,
                        help="pass-to-pass σ within a boot (0.03)")
    parser.add_argument("--passes", type=int_in(1, 100), default=2, help="measured passes per boot (2)")
    parser.add_argument("--looks", default="4,8,12", help="blocks per arm at each look (4,8,12)")
    parser.add_argument("--alpha", type=positive_float, default=0.05, help="one-sided false-keep rate (0.05)")
    parser.add_argument("--shape", choices=("obf", "pocock"), default="obf", help="boundary shape (obf)")
    parser.add_argument("--min-effect", type=float_in(0.0, 10.0, open_low=True), default=0.03,
                        help="minimum worthwhile effect (0.03)")


def _policy(args: argparse.Namespace) -> GatePolicy:
    try:
        looks = tuple(int(x) for x in str(args.looks).split(","))
        policy = GatePolicy(sigma_boot=args.sigma_boot, sigma_run=args.sigma_run, measured_passes=args.passes,
                            looks=looks, alpha=args.alpha, shape=args.shape, min_effect=args.min_effect)
        policy.boundaries()     # a level the Monte Carlo cannot calibrate is refused here, as a setting
        return policy
    except ValueError as exc:
        raise ConfigError(f"bad gate settings: {exc}", remedy="looks are increasing integers ≥ 2 such as 4,8,12; "
                                                              "alpha in (0, 0.5); σ's non-negative") from exc


def _plan(args: argparse.Namespace) -> int:
    policy = _policy(args)
    bounds = policy.boundaries()
    looks = []
    for i, n in enumerate(policy.looks):
        mde = mde_for(n, sigma_boot=policy.sigma_boot, sigma_run=policy.sigma_run,
                      measured_passes=policy.measured_passes, alpha=bounds.nominal_p[i], power=policy.power)
        looks.append({"look": i + 1, "boots_per_arm": n, "boots_total": 2 * n, "nominal_p": bounds.nominal_p[i],
                      "planned_mde": mde})
    needs: dict[str, int | None] = {}
    for mde in MDES:
        try:
            needs[f"{mde:.0%}"] = boots_per_arm_for(mde, sigma_boot=policy.sigma_boot, sigma_run=policy.sigma_run,
                                                    measured_passes=policy.measured_passes, alpha=policy.alpha,
                                                    power=policy.power, max_boots=10_000)
        except InsufficientData:
            needs[f"{mde:.0%}"] = None
    if args.json:
        json.dump({"boundaries": bounds.to_dict(), "looks": looks, "fixed_n_boots_per_arm": needs,
                   "guardrail_levels": list(policy.guard_levels())}, sys.stdout, indent=2)
        print()
        return 0
    print(f"gate: {policy.shape.upper()} boundaries over looks at {', '.join(map(str, policy.looks))} blocks, "
          f"one-sided α {policy.alpha} (Monte Carlo, {policy.replicates} replicates; achieved "
          f"{bounds.achieved_alpha:.4f}), σ_boot {policy.sigma_boot:.1%}, σ_run {policy.sigma_run:.1%}, "
          f"k = {policy.measured_passes}")
    print("look  boots  nominal p  MDE (80% power, this look alone)")
    for row in looks:
        print(f"{row['look']:>4}  {row['boots_total']:>5}  {row['nominal_p']:.4f}     {row['planned_mde']:+.1%}")
    levels = policy.guard_levels()
    print(f"guardrails (TTFT non-inferiority): one-sided level {levels[0]:.4f} at every look (Pocock over "
          f"{len(levels)} looks, overall α {policy.guardrails.alpha})")
    print("boots per arm a fixed-n test needs: "
          + ", ".join(f"{k}: {v if v is not None else '>10000'}" for k, v in needs.items()))
    return 0


def _simulate(args: argparse.Namespace) -> int:
    policy = _policy(args)
    if args.runs < 1:
        raise ConfigError("--runs must be at least 1", remedy="pass --runs 200")
    effects = args.effect or [0.0, 0.10]
    print("true change  P(keep)  P(reject)  P(inconclusive)  mean boots")
    for effect in effects:
        counts: Counter[str] = Counter()
        boots = 0
        for seed in range(args.runs):
            sampler = NoiseModelSampler(effect=effect, sigma_boot=policy.sigma_boot, sigma_run=policy.sigma_run,
                                        measured_passes=policy.measured_passes, seed=seed)
            result = run_ab(sampler, policy, seed)
            counts[result.verdict.decision.value] += 1
            boots += result.boots
        n = args.runs
        print(f"{effect:+11.1%}  {counts['keep'] / n:7.3f}  {counts['reject'] / n:9.3f}  "
              f"{counts['inconclusive'] / n:15.3f}  {boots / n:10.1f}")
    return 0
