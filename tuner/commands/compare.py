"""``elsa-tune compare --a A.yaml --b B.yaml …``: one A/B of two flag sets through the gate, with a verdict scripts use.

Thin shell: the two flag files (``search_spaces/flag_file.py``) → ``Settings`` → preflight → the files checked
against the runtime's flags → ``compare_flags`` (``tuner/flow/flag_comparison.py``) in a run folder of its own, every
boot recorded there, ``compare.json`` beside them. The exit status says what the comparison showed: 0 B is better,
3 B failed, 10 worse, 11 no difference shown, 12 equivalent. Rerunning the same command with the same ``--out``
reuses the boots already recorded there.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from elsa_tune import exit_codes
from elsa_tune.errors import ConfigError
from elsa_tune.output_path import OutputPath
from elsa_tune.tuner.argument_types import positive_float, positive_int
from elsa_tune.tuner.flow.settings import FAMILIES, RUNTIMES

if TYPE_CHECKING:  # pragma: no cover - types only
    from elsa_tune.search_spaces.candidate import Candidate
    from elsa_tune.search_spaces.flag_file import FlagFile
    from elsa_tune.tuner.flow.load import ServerLoad
    from elsa_tune.tuner.flow.night import StudyClock
    from elsa_tune.tuner.flow.preflight import Preflight
    from elsa_tune.tuner.flow.settings import Settings

NAME = "compare"
#: The flags that name the model in a flag file (SGLang's, vLLM's): the comparison's model, not a compared flag.
_MODEL_FLAGS = ("model-path", "model")
HELP = ("A/B two SGLang flag files through the gate: a verdict on B against A, its interval, and an exit status "
        "(0 B better, 3 B failed, 10 worse, 11 no difference shown, 12 equivalent)")
EXAMPLES = ("elsa-tune compare --a today.yaml --b elsa-runs/demo/best/server-args.yaml --gpu 0 --traffic prod.parquet",
            "elsa-tune compare --a a.yaml --b b.yaml --gpu sim --virtual --sim-profile tiny-test --space "
            "benchmarks/workers/tiny-space.yaml --json",
            "elsa-tune compare --a a.yaml --b b.yaml --gpu sim --sim-profile tiny-test --looks 2,4,6 --min-effect 5 "
            "--out elsa-runs/a-vs-b")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--a", required=True, type=Path, metavar="A.yaml",
                        help="the reference flag set: a flat SGLang config (dashed flag: value lines, what "
                             "best/server-args.yaml of a study is), e.g. --a today.yaml")
    parser.add_argument("--b", required=True, type=Path, metavar="B.yaml",
                        help="the flag set compared with A, same format, e.g. --b elsa-runs/demo/best/server-args.yaml")
    parser.add_argument("--gpu", default=None, metavar="N|UUID|sim|cpu",
                        help="the GPU both run on (NVML index or UUID), 'sim' for the simulated card or 'cpu' for "
                             "this host's CPU and memory, e.g. --gpu 0")
    parser.add_argument("--traffic", default=None, metavar="FILE|demo",
                        help="recorded traffic to replay (default demo), e.g. --traffic prod.parquet")
    parser.add_argument("--space", default=None, metavar="NAME|PATH",
                        help="the search space whose guardrails (TTFT margins, quality gate, context target) and "
                             "probe limits judge B (default generic-sglang), e.g. --space qwen3.8-27b-nvfp4-rtx5090")
    parser.add_argument("--model", default=None, metavar="PATH",
                        help="the model, when neither file names its model-path, e.g. --model /models/qwen")
    parser.add_argument("--runtime", default=None, choices=(*RUNTIMES, *FAMILIES),
                        help="how the runtime is launched (default process; --gpu sim implies sim), "
                             "e.g. --runtime docker")
    parser.add_argument("--launch", default=None, metavar="CMD",
                        help="the runtime's launch command, e.g. --launch \"/opt/fork/bin/python -m "
                             "sglang.launch_server\"")
    parser.add_argument("--image", default=None, metavar="IMAGE",
                        help="the container image (--runtime docker), e.g. --image lmsysorg/sglang:v0.5.23")
    parser.add_argument("--sim-profile", default=None, metavar="NAME",
                        help="the simulator profile (--gpu sim), e.g. --sim-profile tiny-test")
    parser.add_argument("--sim-speedup", type=positive_float, default=None, metavar="X",
                        help="simulated seconds per wall second (default 40), e.g. --sim-speedup 60")
    parser.add_argument("--virtual", action="store_true", default=None,
                        help="with --gpu sim: compare in the simulated system's time, with no server processes "
                             "(seconds of CPU; every number is simulated)")
    parser.add_argument("--out", default=None, type=Path, metavar="DIR",
                        help="the run folder for the boots and compare.json (default ./elsa-runs/compare-A-vs-B/), "
                             "e.g. --out elsa-runs/a-vs-b")
    parser.add_argument("--budget", dest="budget_s", default=None, metavar="DURATION",
                        help="the most time the comparison may take; spent before the gate decides is 'no difference "
                             "shown' (default 8h), e.g. --budget 2h")
    parser.add_argument("--baseline-boots", type=positive_int, default=None, metavar="N",
                        help="boots of A that measure the boot-to-boot noise before the A/B (default 4, at least 3), "
                             "e.g. --baseline-boots 5")
    parser.add_argument("--looks", type=_looks, default=None, metavar="N,N,…",
                        help="boots per arm at each look of the sequential gate; the last is the cap (default 4,8,12), "
                             "e.g. --looks 2,4,6")
    parser.add_argument("--min-effect", type=positive_float, default=None, metavar="PERCENT",
                        help="the smallest gain worth having, in percent: below it B is not better, within ± it B is "
                             "equivalent (default 3), e.g. --min-effect 5")
    parser.add_argument("--pass-seconds", type=positive_float, default=None, metavar="S",
                        help="target length of one measured pass (default: from the budget), e.g. --pass-seconds 120")
    parser.add_argument("--seed", type=int, default=None, metavar="N",
                        help="seed of the boot schedule and of the simulated runtime's noise (default 0), "
                             "e.g. --seed 7")
    parser.add_argument("--json", action="store_true",
                        help="print the result (outcome, exit status, effect, interval, both arms) as one JSON object")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more console output, e.g. -vv")
    parser.add_argument("-q", "--quiet", action="count", default=0, help="less console output, e.g. -q")
    parser.add_argument("--log-file", default=None, type=Path, metavar="FILE",
                        help="also log (at DEBUG) here; the run folder always has compare.log, e.g. --log-file c.log")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from elsa_tune.history.run_identity import RunKind, check_owner, claim
    from elsa_tune.history.run_lock import RunLock
    from elsa_tune.search_spaces.flag_file import read_flag_file
    from elsa_tune.tuner.console import setup_logging
    from elsa_tune.tuner.flow.preflight import run_preflight
    from elsa_tune.tuner.flow.run_folder import identity, refuse_before_preflight
    from elsa_tune.tuner.flow.settings import Settings

    file_a, file_b = read_flag_file(args.a), read_flag_file(args.b)    # refuses a loop, a FIFO, a device first
    if os.path.samefile(args.a, args.b):
        raise ConfigError(f"--a and --b are the same file ({args.a})",
                          remedy="pass two flag files; to measure one configuration's noise, copy it to a second file")
    models = {str(m) for m in (args.model, *(f.flags.get(flag) for f in (file_a, file_b) for flag in _MODEL_FLAGS))
              if m}
    if len(models) > 1:
        raise ConfigError(f"A and B serve different models ({', '.join(sorted(models))})",
                          remedy="compare flag sets of one model: give both files (and --model) the same model-path")
    cli = {k: v for k, v in vars(args).items()
           if k not in ("func", "command", "debug", "verbose", "quiet", "json", "a", "b", "min_effect")}
    cli["model"] = next(iter(models), None)
    cli["study"] = f"compare-{args.a.stem}-vs-{args.b.stem}"
    cli["verbosity"] = int(args.verbose) - int(args.quiet) or None
    cli["live"] = False
    settings = Settings.resolve(cli)
    inputs = [args.a, args.b, settings.traffic, settings.space]
    run_dir = OutputPath(settings.run_dir, "--out", folder=True).check(inputs)
    if settings.log_file is not None:
        OutputPath(settings.log_file, "--log-file").check(inputs)
    _check_same_comparison(run_dir, file_a, file_b)
    setup_logging(None, settings.verbosity, console=True)
    RunLock(run_dir).check_free()
    refuse_before_preflight(run_dir, RunKind.COMPARISON, settings.study_name)
    pre = run_preflight(settings)        # every check before the run folder is created
    model = pre.space.model.path
    if not model:
        raise ConfigError("neither flag file names the model (model-path), and the space names none",
                          remedy="add `model-path: /models/NAME` to the files or pass --model PATH")
    from elsa_tune.runtime.family import family

    model_flag = family(pre.space.runtime.family).model_flag
    a = file_a.candidate().merged(flags={model_flag: model})
    b = file_b.candidate().merged(flags={model_flag: model})
    _check_against_runtime(pre, file_a, file_b)
    owner = identity(pre, RunKind.COMPARISON, arms=(a.key(), b.key()))
    check_owner(run_dir, owner)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the run folder {run_dir}: {exc.strerror or exc}",
                          remedy="give --out a folder you can write to") from exc
    with RunLock(run_dir):
        refuse_before_preflight(run_dir, RunKind.COMPARISON, settings.study_name)
        claim(run_dir, owner)
        return _compare(args, pre, settings, a, b, run_dir)


def _compare(args: argparse.Namespace, pre: Preflight, settings: Settings, a: Candidate, b: Candidate,
             run_dir: Path) -> int:
    from elsa_tune.durable_file import write_json
    from elsa_tune.tuner.console import setup_logging
    from elsa_tune.tuner.flow.flag_comparison import RECORD_FILE, compare_flags
    from elsa_tune.tuner.flow.night import StopStudy
    from elsa_tune.tuner.flow.signals import Interrupts

    setup_logging(settings.log_file, settings.verbosity, console=True)
    _add_run_log(run_dir / "compare.log")
    clock: StudyClock | None = None
    load: ServerLoad | None = None
    if settings.virtual:
        from elsa_tune.tuner.flow.virtual import VirtualTestbed

        bed = VirtualTestbed.of(pre)
        pre, clock, load = bed.pre, bed.clock, bed.load
    elif settings.simulated:         # the live simulated server: the budget counts in its simulated seconds
        from elsa_tune.tuner.flow.simulated_time import SimulatedTestbed

        sim = SimulatedTestbed.of(pre)
        pre, clock, load = sim.pre, sim.clock, sim.load
    min_effect = args.min_effect / 100.0 if args.min_effect is not None else None
    try:
        with Interrupts() as interrupts:
            result = compare_flags(pre, a, b, files=(str(args.a), str(args.b)), run_dir=run_dir, clock=clock,
                                   load=load, interrupts=interrupts, looks=settings.looks,
                                   min_effect=min_effect, seed=settings.seed)
    except StopStudy as stop:
        print(f"elsa-tune: compare interrupted: {stop}; rerun the same command to continue with the recorded boots",
              flush=True)
        return exit_codes.INTERRUPTED
    write_json(run_dir / RECORD_FILE, result.to_dict())
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        print("\n".join(result.lines()))
    return result.exit_code


def _check_same_comparison(run_dir: Path, a: FlagFile, b: FlagFile) -> None:
    """Refuse a run folder that holds a comparison of other flags (its boots would be mixed with these)."""
    from elsa_tune.durable_file import read_json
    from elsa_tune.errors import HistoryError
    from elsa_tune.tuner.flow.flag_comparison import RECORD_FILE

    path = run_dir / RECORD_FILE
    if not path.is_file():
        return
    try:
        data = read_json(path)
        stored = [{k: v for k, v in data[side]["flags"].items() if k not in _MODEL_FLAGS} for side in ("a", "b")]
    except (HistoryError, KeyError, TypeError, AttributeError):
        stored = None
    given = [{k: v for k, v in f.candidate().flags.items() if k not in _MODEL_FLAGS} for f in (a, b)]
    if stored != given:
        raise ConfigError(f"--out {run_dir} holds another comparison ({RECORD_FILE} names other flags)",
                          remedy="pass a fresh --out, or the same two files to continue that comparison")


def _check_against_runtime(pre: Preflight, *files: FlagFile) -> None:
    """Every flag of both files against the runtime: the simulated runtime's own table (names, types, choices), or
    the installed runtime's ``--help`` (names); a container's flags are checked by its first boot."""
    import logging

    from elsa_tune.search_spaces.flag_file import FlagType, check_flags

    known: dict[str, FlagType | None]
    if pre.settings.simulated:
        from elsa_tune.runtime.sim.dialect import dialect

        known = dialect(pre.space.runtime.family.value).flag_shapes()
    elif pre.flags is not None:
        known = dict.fromkeys(pre.flags.all_names())
    else:
        logging.getLogger("elsa_tune").warning("the flag files are not checked against the image before the first "
                                               "boot (--runtime docker)")
        return
    for file in files:
        check_flags(file, known)


def _add_run_log(path: Path) -> None:
    import logging

    root = logging.getLogger("elsa_tune")
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"))
    root.addHandler(handler)


def _looks(text: str) -> tuple[int, ...]:
    try:
        looks = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of whole numbers like 4,8,12") from None
    if not looks or any(n < 1 for n in looks) or list(looks) != sorted(set(looks)):
        raise argparse.ArgumentTypeError(f"{text!r}: looks are increasing boots per arm, at least 1, e.g. 4,8,12")
    return looks

