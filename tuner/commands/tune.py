"""``elsa-tune [tune] --gpu 0 --traffic prod.parquet``: the unattended study (the default command).

Thin shell: arguments → ``Settings`` (defaults < ``ELSA_TUNE_*`` < these flags) → preflight → ``Study.run``.
Rerunning the same command with the same ``--out`` resumes the study; nothing finished is measured twice. A finished
study, or a folder another study or comparison owns (``history/run_identity.py``), is refused before anything is
written; ``--extend D`` continues a finished study with D more budget, reusing its boots.
``--gpu 0,1``: one study; the first GPU runs baseline, screening and confirmation, and the numeric search runs on
every listed GPU at once (``tuner/fleet/fleet_search.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elsa_tune import exit_codes
from elsa_tune.errors import ConfigError
from elsa_tune.output_path import OutputPath
from elsa_tune.tuner.argument_types import positive_float, positive_int
from elsa_tune.tuner.flow.settings import FAMILIES, RUNTIMES

if TYPE_CHECKING:  # pragma: no cover - types only
    from elsa_tune.history.study_record import Extension
    from elsa_tune.tuner.flow.load import ServerLoad
    from elsa_tune.tuner.flow.night import StudyClock
    from elsa_tune.tuner.flow.preflight import Preflight
    from elsa_tune.tuner.flow.settings import Settings

NAME = "tune"
HELP = "run an unattended tuning study (the default: elsa-tune --gpu 0 --traffic prod.parquet)"
EXAMPLES = ('elsa-tune --gpu 0 --traffic prod.parquet --space qwen3.8-27b-nvfp4-rtx5090 --model '
            '/models/qwen --budget 8h',
            'elsa-tune --gpu sim --sim-profile rtx5090-qwen3.8-27b-nvfp4 --space '
            'qwen3.8-27b-nvfp4-rtx5090 --traffic demo --budget 8h --out elsa-runs/demo',
            'elsa-tune --gpu 0 --traffic prod.parquet --budget 8h --dry-run --json')


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", default=None, metavar="N[,N…]|UUID|sim|cpu",
                        help="the GPU to tune on (NVML index or UUID), 'sim' for the simulated card, or 'cpu' for a "
                             "server on this host's CPU and memory (--runtime llamacpp); several "
                             "(0,1) run the numeric search on all of them at once, one worker per GPU "
                             "(with --runtime sim: simulated cards 0, 1, …)")
    parser.add_argument("--traffic", default=None, metavar="FILE|demo",
                        help="recorded traffic (elsa-tune Parquet trace), or 'demo' for the bundled window")
    parser.add_argument("--space", default=None, metavar="NAME|PATH", help="the search space (elsa-tune space list)")
    parser.add_argument("--model", default=None, metavar="PATH", help="the model to serve (overrides the space's)")
    parser.add_argument("--budget", dest="budget_s", default=None, metavar="DURATION",
                        help="the whole study's time, e.g. 8h, 90m, 1h30m (default 8h): wall-clock time on a "
                             "GPU or CPU, the simulated system's time with --gpu sim")
    parser.add_argument("--out", default=None, type=Path, metavar="DIR",
                        help="the run folder (default ./elsa-runs/<study>/); the ledger is kept beside it")
    parser.add_argument("--study", default=None, metavar="NAME", help="the study's name (default from the space)")
    parser.add_argument("--extend", default=None, metavar="DURATION",
                        help="continue the finished study in --out with this much more budget, e.g. --extend 2h "
                             "(its boots are reused; study.json records the extension); a finished study is "
                             "otherwise never run again")
    parser.add_argument("--resume", action="store_true", default=None,
                        help="require an existing study in --out and continue it (rerunning also resumes)")
    parser.add_argument("--runtime", default=None, choices=(*RUNTIMES, *FAMILIES),
                        help="how the runtime is launched (default process; --gpu sim implies sim), or a runtime "
                             "family run as a process or simulated with --gpu sim (sglang, llamacpp, vllm; default: "
                             "the space's runtime.family)")
    parser.add_argument("--launch", default=None, metavar="CMD",
                        help="the runtime's launch command, e.g. "
                             "\"/opt/sglang-venv/bin/python -m sglang.launch_server\"")
    parser.add_argument("--image", default=None, metavar="IMAGE", help="the container image (--runtime docker)")
    parser.add_argument("--sim-profile", default=None, metavar="NAME", help="the simulator profile (--gpu sim)")
    parser.add_argument("--sim-speedup", type=positive_float, default=None, metavar="X",
                        help="simulated seconds per wall second (default 40)")
    parser.add_argument("--virtual", action="store_true", default=None,
                        help="with --gpu sim: run the study in the simulated system's time, with no server processes "
                             "(a what-if: an 8-hour study on a profile in seconds; every number is simulated)")
    parser.add_argument("--pass-seconds", type=positive_float, default=None, metavar="S",
                        help="target length of one measured pass (default: the budget / 250, within 1-180 s)")
    parser.add_argument("--baseline-boots", type=positive_int, default=None, metavar="N",
                        help="baseline boots (default 4)")
    parser.add_argument("--seed", type=int, default=None, metavar="N",
                        help="seed of the search's sampler and the boot schedule (default 0), e.g. --seed 7")
    parser.add_argument("--dry-run", action="store_true",
                        help="show the plan and stop: phases and their budget, estimated boots, every candidate's "
                             "command line checked against the runtime's flags, what the ledger will skip; "
                             "boots nothing and creates no run folder")
    parser.add_argument("--json", action="store_true",
                        help="print the final summary (or the --dry-run plan) as one JSON object on stdout")
    parser.add_argument("--no-live", dest="live", action="store_false", default=None,
                        help="plain log lines even on a terminal")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more console output")
    parser.add_argument("-q", "--quiet", action="count", default=0, help="less console output")
    parser.add_argument("--log-file", default=None, type=Path, metavar="FILE",
                        help="also log (at DEBUG) here; the run folder always has study.log")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from elsa_tune.history.run_identity import RunKind, check_owner, claim
    from elsa_tune.history.run_lock import RunLock
    from elsa_tune.tuner.console import interactive, setup_logging
    from elsa_tune.tuner.fleet.worker_pool import parse_gpus
    from elsa_tune.tuner.flow.preflight import run_preflight
    from elsa_tune.tuner.flow.run_folder import identity, refuse_before_preflight, remove_created
    from elsa_tune.tuner.flow.settings import Settings

    cli = {k: v for k, v in vars(args).items()
           if k not in ("func", "command", "debug", "verbose", "quiet", "dry_run", "json", "extend")}
    cli["verbosity"] = int(args.verbose) - int(args.quiet) or None
    settings = Settings.resolve(cli)
    # --gpu 0,1: the lead owns the first GPU (baseline, screening, confirmation); the search runs on all of them.
    gpus = parse_gpus(settings.gpu) if "," in settings.gpu else []
    if gpus:
        settings = dataclasses.replace(settings, gpu=gpus[0])
    if settings.resume and not (settings.run_dir / "study.json").exists():
        raise ConfigError(f"--resume: {settings.run_dir} holds no study",
                          remedy="drop --resume to start a new study there, or point --out at the study's folder")
    if gpus and settings.virtual:
        raise ConfigError(f"--gpu {','.join(gpus)} --virtual: a virtual study runs on one simulated card",
                          remedy="pass --gpu sim --virtual")
    if gpus and "sim" in gpus:
        raise ConfigError(f"--gpu {','.join(gpus)}: simulated GPUs are numbered",
                          remedy="pass --gpu 0,1 --runtime sim for two simulated cards")
    if settings.log_file is not None:   # a dry run logs to it too
        OutputPath(settings.log_file, "--log-file").check([settings.traffic, settings.space])
    if args.dry_run:
        return _dry_run(settings, as_json=bool(args.json))
    run_dir = OutputPath(settings.run_dir, "--out", folder=True).check([settings.traffic, settings.space])
    live = interactive() if settings.live is None else settings.live
    setup_logging(None, settings.verbosity, console=True)
    # The lead's simulated card is the first worker's (``elsa-tune worker`` maps GPU N to <out>/sim-cards/gpuN).
    card_dir = run_dir.resolve() / "sim-cards" / f"gpu{gpus[0]}" if gpus and settings.simulated else None
    existed = run_dir.exists()
    RunLock(run_dir).check_free()   # a folder in use is refused before the preflight, which would see a busy GPU
    extending = args.extend is not None
    refuse_before_preflight(run_dir, RunKind.STUDY, settings.study_name, extending=extending)
    settings, extension = _extension(settings, run_dir, args.extend)
    try:   # every check before the study's first file: a refused study leaves the run folder as it was
        pre = run_preflight(settings, card_dir=card_dir)
        owner = identity(pre, RunKind.STUDY)
        check_owner(run_dir, owner)
    except BaseException:
        if not existed and card_dir is not None:
            remove_created(card_dir, run_dir)
        raise
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the run folder {run_dir}: {exc.strerror or exc}",
                          remedy="give --out a folder you can write to") from exc
    with RunLock(run_dir):   # refused: another study holds the folder, and nothing here is touched
        refuse_before_preflight(run_dir, RunKind.STUDY, settings.study_name,   # it may have finished meanwhile
                                extending=extending)
        claim(run_dir, owner)
        return _study(args, pre, settings, gpus, live, extension)


def _extension(settings: Settings, run_dir: Path, extend: str | None) -> tuple[Settings, Extension | None]:
    """The settings of a run in ``run_dir`` and the extension it records, if any.

    ``--extend D`` on a finished study: its recorded budget plus D, recorded as an extension. On a study an extension
    left interrupted (with or without ``--extend``): the recorded budget, which already holds the extension, so a
    resumed extension is not extended twice nor cut back to ``--budget``.
    """
    from elsa_tune.history.run_dir import RunDir
    from elsa_tune.history.study_record import Extension, StudyStatus
    from elsa_tune.tuner.flow.budget import parse_duration

    added = parse_duration(extend) if extend is not None else None
    previous = RunDir(run_dir).read_study() if run_dir.is_dir() else None
    extended = previous is not None and bool(previous.extensions)
    if added is not None and previous is None:
        raise ConfigError(f"--extend: {run_dir} holds no study to extend",
                          remedy="drop --extend to start a study there, or point --out at a finished study's folder")
    if previous is None or (added is None and not extended):
        return settings, None
    recorded = previous.budget_s if previous.budget_s is not None else settings.budget_s
    if added is not None and previous.status is StudyStatus.FINISHED:
        budget = recorded + added
        return (dataclasses.replace(settings, budget_s=budget),
                Extension(from_budget_s=recorded, added_s=added, budget_s=budget, at=time.time()))
    if added is not None and not extended:
        raise ConfigError(f"--extend: study {previous.name} in {run_dir} has not finished ({previous.status.value}), "
                          "so there is nothing to extend yet",
                          remedy="rerun the same command without --extend to resume it; extend it once it finished")
    return dataclasses.replace(settings, budget_s=recorded), None


def _study(args: argparse.Namespace, pre: Preflight, settings: Settings, gpus: list[str], live: bool,
           extension: Extension | None) -> int:
    from elsa_tune.history.study_record import StudyStatus
    from elsa_tune.tuner.console import StudyView, setup_logging
    from elsa_tune.tuner.flow.signals import Interrupts
    from elsa_tune.tuner.flow.study import Study

    setup_logging(settings.log_file, settings.verbosity, console=True)
    _add_run_log(settings.run_dir / "study.log")
    search = None
    if gpus:
        from elsa_tune.tuner.fleet.fleet_search import FleetSearch

        search = FleetSearch(gpus, verbose=int(args.verbose))
    clock: StudyClock | None = None
    load: ServerLoad | None = None
    if settings.virtual:
        from elsa_tune.tuner.flow.virtual import VirtualTestbed

        bed = VirtualTestbed.of(pre)
        pre, clock, load = bed.pre, bed.clock, bed.load
    elif settings.simulated and not gpus:    # the live simulated server: the budget counts in its simulated seconds
        from elsa_tune.tuner.flow.simulated_time import SimulatedTestbed

        sim = SimulatedTestbed.of(pre)
        pre, clock, load = sim.pre, sim.clock, sim.load
    with StudyView(live=live) as view:
        outcome = Study(pre, view=view, interrupts=Interrupts(), search=search, clock=clock, load=load,
                        extension=extension).run()
    if args.json:
        print(json.dumps({"study": settings.study_name, "status": outcome.status.value,
                          "recommended": {"label": outcome.incumbent.label, "argv": outcome.incumbent.argv(),
                                          "env": dict(outcome.incumbent.env)},
                          "boots": outcome.boots, "decisions": outcome.decisions, "run_dir": str(outcome.run_dir),
                          "report": str(Path(outcome.run_dir) / "report.md"),
                          "launch": str(Path(outcome.run_dir) / "best" / "launch.sh"),
                          "simulated_hours": clock.now() / 3600 if clock is not None else None}, indent=2))
        return exit_codes.OK if outcome.status is StudyStatus.FINISHED else exit_codes.INTERRUPTED
    print(f"study {settings.study_name}: {outcome.status.value}; recommended: {outcome.incumbent.label} "
          f"({' '.join(outcome.incumbent.argv())})")
    print(f"  {outcome.boots} boots, {outcome.decisions} decisions; report: {Path(outcome.run_dir) / 'report.md'}")
    if clock is not None:
        print(f"  virtual time: {clock.now() / 3600:.1f} simulated hours on {settings.sim_profile} (a simulation, "
              "not a measurement of real hardware)")
    if gpus:
        from elsa_tune.tuner.fleet.workers import local_run_dir

        folders = [local_run_dir(Path(outcome.run_dir), gpu) for gpu in gpus]
        counts = [len(list(f.glob("boots/*/boot.json"))) for f in folders]
        print(f"  search on GPUs {', '.join(gpus)}: " + ", ".join(f"{n} boots on GPU {gpu} ({f.name}/)"
                                                              for gpu, n, f in zip(gpus, counts, folders, strict=True)))
    return exit_codes.OK if outcome.status is StudyStatus.FINISHED else exit_codes.INTERRUPTED


def _dry_run(settings: Any, *, as_json: bool) -> int:
    """The plan of the study, without booting and without creating its run folder."""
    from elsa_tune.tuner.console import setup_logging
    from elsa_tune.tuner.flow.plan import plan_study
    from elsa_tune.tuner.flow.preflight import run_preflight

    setup_logging(settings.log_file, settings.verbosity, console=True)
    plan = plan_study(run_preflight(settings))
    print(json.dumps(plan.to_dict(), indent=2) if as_json else "\n".join(plan.lines()))
    return 0


def _add_run_log(path: Path) -> None:
    import logging

    root = logging.getLogger("elsa_tune")
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"))
    root.addHandler(handler)
