"""``elsa-tune check --gpu N [--space FILE]``: the study's preflight alone, printed.

Shows the GPU state that affects measurements (clocks, persistence, power cap, other processes,
temperature), the runtime's version and the search space validated against the runtime's own flags.
Exits non-zero, with the remedy, when a study would be refused.
"""

from __future__ import annotations

import argparse
import json

from elsa_tune.tuner.flow.settings import FAMILIES, RUNTIMES

NAME = "check"
HELP = "run the preflight alone: GPU state, runtime version, search space against the runtime's flags"
EXAMPLES = ('elsa-tune check --gpu 0 --space qwen3.8-27b-nvfp4-rtx5090 --model '
            '/models/qwen3.8-27b-nvfp4',
            'elsa-tune check --gpu sim --sim-profile rtx5090-qwen3.8-27b-nvfp4 --space '
            'qwen3.8-27b-nvfp4-rtx5090 --json')


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", default=None, metavar="N|UUID|sim|cpu",
                        help="the GPU (NVML index or UUID), 'sim' for the simulated card or 'cpu' for this host's CPU "
                             "and memory, e.g. --gpu 0")
    parser.add_argument("--space", default=None, metavar="NAME|PATH",
                        help="the search space to validate, e.g. --space qwen3.8-27b-nvfp4-rtx5090")
    parser.add_argument("--traffic", default=None, metavar="FILE|demo",
                        help="the traffic to load (default demo), e.g. --traffic prod.parquet")
    parser.add_argument("--model", default=None, metavar="PATH",
                        help="the model to serve instead of the space's, e.g. --model /models/qwen3.8-27b-nvfp4")
    parser.add_argument("--runtime", default=None, choices=(*RUNTIMES, *FAMILIES),
                        help="how the runtime is launched (default process; --gpu sim implies sim)")
    parser.add_argument("--launch", default=None, metavar="CMD",
                        help="the runtime's launch command, e.g. "
                             "--launch \"/opt/fork/bin/python -m sglang.launch_server\"")
    parser.add_argument("--image", default=None, metavar="IMAGE",
                        help="the container image (--runtime docker), e.g. --image lmsysorg/sglang:v0.5.23")
    parser.add_argument("--sim-profile", default=None, metavar="NAME",
                        help="the simulator profile (--gpu sim), e.g. --sim-profile rtx5090-qwen3.8-27b-nvfp4")
    parser.add_argument("--json", action="store_true",
                        help="print what preflight found (setup, warnings, report lines) as one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from elsa_tune.tuner.flow.preflight import run_preflight
    from elsa_tune.tuner.flow.settings import Settings

    cli = {k: v for k, v in vars(args).items() if k not in ("func", "command", "debug", "json")}
    pre = run_preflight(Settings.resolve(cli))
    if args.json:
        print(json.dumps({"passed": True, "runtime": pre.runtime_name, "runtime_version": pre.runtime_version,
                          "fingerprint": pre.fingerprint.to_dict(), "launch": list(pre.launch),
                          "flags_checked": pre.flags is not None, "warnings": list(pre.problems),
                          "lines": pre.lines()}, indent=2))
        return 0
    for line in pre.lines():
        print(line)
    print("preflight passed" + (f" with {len(pre.problems)} warning(s)" if pre.problems else ""))
    return 0
