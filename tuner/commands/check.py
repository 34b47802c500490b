"""``elsa-tune check --gpu N [--space FILE]``: the study's preflight alone, printed.

Shows the GPU state that affects measurements (clocks, persistence, power cap, other processes,
temperature), the runtime's version and the search space validated against the runtime's own flags.
Exits non-zero, with the remedy, when a study would be refused.
"""

from __future__ import annotations

import argparse

NAME = "check"
HELP = "run the preflight alone: GPU state, runtime version, search space against the runtime's flags"


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", default=None, metavar="N|UUID|sim", help="the GPU (NVML index or UUID) or 'sim'")
    parser.add_argument("--space", default=None, metavar="NAME|PATH", help="the search space to validate")
    parser.add_argument("--traffic", default=None, metavar="FILE|demo", help="the traffic to load (default demo)")
    parser.add_argument("--model", default=None, metavar="PATH")
    parser.add_argument("--runtime", default=None, choices=("process", "docker", "sim"))
    parser.add_argument("--launch", default=None, metavar="CMD")
    parser.add_argument("--image", default=None, metavar="IMAGE")
    parser.add_argument("--sim-profile", default=None, metavar="NAME")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from elsa_tune.tuner.preflight import run_preflight
    from elsa_tune.tuner.settings import Settings

    cli = {k: v for k, v in vars(args).items() if k not in ("func", "command", "debug")}
    pre = run_preflight(Settings.resolve(cli))
    for line in pre.lines():
        print(line)
    print("preflight passed" + (f" with {len(pre.problems)} warning(s)" if pre.problems else ""))
    return 0
