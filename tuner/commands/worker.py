"""``elsa-tune worker --storage postgresql://… --study NAME --gpu N``: join a study shared by several GPUs.

One GPU: this process is the worker (``tuner/fleet/workers.py``). Several (``--gpu 0,1``): one worker process
per GPU is started and owned (``tuner/fleet/worker_pool.py``). Workers on other hosts join the same study by
giving the same ``--storage`` and ``--study``. Each worker's run folder is ``<out>/<host>-gpu<N>``; the
ledger is in the database when ``--storage`` names a server, else ``<out>/ledger.jsonl``. Without
``--storage`` the GPUs of this host share ``sqlite:///<out>/study.db``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from elsa_tune.errors import ConfigError
from elsa_tune.output_path import OutputPath
from elsa_tune.tuner.argument_types import (
    finite_float,
    nonnegative_int,
    positive_float,
    positive_int,
)
from elsa_tune.tuner.flow.settings import FAMILIES, RUNTIMES

if TYPE_CHECKING:  # pragma: no cover - types only
    from elsa_tune.tuner.flow.budget import Budget
    from elsa_tune.tuner.flow.settings import Settings

NAME = "worker"
HELP = "run trial workers of a study shared through a database (several GPUs, several hosts)"
EXAMPLES = ('elsa-tune worker --study night --gpu 0,1 --storage postgresql://elsa@db/elsa --space '
            'qwen3.8-27b-nvfp4-rtx5090 --traffic prod.parquet',)


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage", default=None, metavar="URL",
                        help="the shared study's database, e.g. postgresql://user@db-host/elsa "
                             "(default: sqlite:///<out>/study.db, for the GPUs of one host)")
    parser.add_argument("--study", required=True, metavar="NAME", help="the shared study's name")
    parser.add_argument("--gpu", required=True, metavar="N[,N…]",
                        help="this host's GPU(s): NVML indexes, or simulated card numbers with --runtime sim")
    parser.add_argument("--out", default=None, type=Path, metavar="DIR",
                        help="root of the workers' run folders (default ./elsa-runs/<study>/)")
    parser.add_argument("--traffic", default=None, metavar="FILE|demo")
    parser.add_argument("--space", default=None, metavar="NAME|PATH")
    parser.add_argument("--model", default=None, metavar="PATH")
    parser.add_argument("--runtime", default=None, choices=(*RUNTIMES, *FAMILIES))
    parser.add_argument("--launch", default=None, metavar="CMD")
    parser.add_argument("--image", default=None, metavar="IMAGE")
    parser.add_argument("--sim-profile", default=None, metavar="NAME")
    parser.add_argument("--sim-speedup", type=positive_float, default=None, metavar="X")
    parser.add_argument("--budget", dest="budget_s", default=None, metavar="DURATION",
                        help="this worker's wall time, e.g. 8h (default 8h)")
    parser.add_argument("--deadline", type=finite_float, default=None, metavar="EPOCH",
                        help="also stop by this wall-clock time (Unix seconds): a study's search phase ends then")
    parser.add_argument("--max-trials", type=positive_int, default=None, metavar="N",
                        help="completed trials of the shared study after which workers stop (default 200)")
    parser.add_argument("--techniques", default="", metavar="A,B",
                        help="techniques every candidate carries (e.g. those a single-GPU study kept)")
    parser.add_argument("--pass-seconds", type=positive_float, default=None, metavar="S")
    parser.add_argument("--baseline-boots", type=positive_int, default=None, metavar="N")
    parser.add_argument("--looks", default=None, metavar="2,4,6", help="the A/B gate's looks (blocks per arm)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--heartbeat", type=positive_int, default=5, metavar="S", help="trial heartbeat interval (s)")
    parser.add_argument("--grace", type=nonnegative_int, default=20, metavar="S",
                        help="a trial or work item silent this long belongs to a dead worker (s)")
    parser.add_argument("--no-promote", dest="promote", action="store_false",
                        help="no A/B gate for promising trials (search only)")
    parser.add_argument("--promote-margin", type=finite_float, default=1.0, metavar="K",
                        help="a trial goes to the A/B gate when its boot beats the incumbent on the same GPU by more "
                             "than K boot-noise σ (default 1)")
    parser.add_argument("--worker-name", default="", metavar="NAME", help="this worker's name in the claim table")
    parser.add_argument("--ledger", default=None, metavar="FILE",
                        help="append decisions to this JSONL ledger (default: the storage's, or <out>/ledger.jsonl)")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    parser.add_argument("--log-file", default=None, type=Path, metavar="FILE")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from elsa_tune.tuner.console import setup_logging
    from elsa_tune.tuner.fleet.worker_pool import WorkerPool, parse_gpus

    gpus = parse_gpus(args.gpu)
    root: Path = OutputPath(args.out or Path("elsa-runs") / args.study, "--out", folder=True).check(
        [args.traffic, args.space])
    if args.storage:
        _check_storage(args.storage)
    if args.log_file is not None:
        OutputPath(args.log_file, "--log-file").check([args.traffic, args.space])
    if args.ledger is not None:
        _check_ledger(Path(args.ledger), [args.traffic, args.space, args.log_file])
    storage = args.storage or f"sqlite:///{root.resolve() / 'study.db'}"
    _check_database(storage)
    if len(gpus) > 1:
        _check_inputs(args, gpus[0], root)   # the children check their GPUs; the inputs are checked once, here
        root.mkdir(parents=True, exist_ok=True)
        setup_logging(args.log_file, int(args.verbose), console=True)
        from elsa_tune.tuner.flow.budget import Budget

        settings = _settings(args, gpus[0], root)
        budget = Budget.handed_over(settings.budget_s, args.deadline)
        argv = worker_argv(settings, storage=storage, study=args.study, out=root, budget=budget,
                           techniques=[t for t in args.techniques.split(",") if t], looks=settings.looks,
                           ledger=args.ledger, heartbeat_s=args.heartbeat, grace_s=args.grace,
                           verbose=int(args.verbose), promote=args.promote, promote_margin=args.promote_margin)
        code: int = WorkerPool(gpus, argv, log_dir=root / "logs", timeout_s=budget.total_s + 600.0).run()
        return code
    return _run_one(args, gpus[0], root, storage)


def _run_one(args: argparse.Namespace, gpu: str, root: Path, storage: str) -> int:
    from elsa_tune.tuner.console import setup_logging
    from elsa_tune.tuner.fleet.workers import Worker, WorkerConfig, local_run_dir
    from elsa_tune.tuner.flow.preflight import run_preflight
    from elsa_tune.tuner.flow.run_folder import remove_created

    run_dir = local_run_dir(root, gpu)
    settings = _settings(args, gpu, run_dir)
    card_dir = root.resolve() / "sim-cards" / f"gpu{gpu}" if settings.simulated else None
    existed = root.exists()
    try:   # the preflight before the first file: a refused worker leaves no folder behind
        pre = run_preflight(settings, card_dir=card_dir)
    except BaseException:
        if not existed and card_dir is not None:
            remove_created(card_dir, root)
        raise
    root.mkdir(parents=True, exist_ok=True)
    setup_logging(args.log_file, int(args.verbose), console=True)
    from elsa_tune.tuner.flow.budget import Budget

    budget = Budget.handed_over(settings.budget_s, args.deadline)   # from here: the preflight's seconds are spent
    config = WorkerConfig(storage_url=storage, study=args.study, gpu=gpu, worker=args.worker_name,
                          max_trials=settings.max_trials, heartbeat_s=args.heartbeat,
                          grace_s=args.grace, promote=args.promote, promote_margin=args.promote_margin,
                          techniques=tuple(t for t in args.techniques.split(",") if t), ledger=args.ledger)
    stats = Worker(pre, config, budget=budget).run()
    print(f"worker {stats.worker} (GPU {gpu}): {stats.boots} boots, {stats.trials_told} trials told "
          f"({stats.shared_results} from another worker's boot), {stats.promotions} A/B, {stats.keeps} kept; "
          f"{stats.seconds:.0f} s; report {run_dir / 'report.md'}")
    return 0


def _settings(args: argparse.Namespace, gpu: str, run_dir: Path) -> Settings:
    from elsa_tune.tuner.flow.settings import Settings

    cli = {"gpu": gpu, "traffic": args.traffic, "space": args.space, "model": args.model, "runtime": args.runtime,
           "launch": args.launch, "image": args.image, "sim_profile": args.sim_profile,
           "sim_speedup": args.sim_speedup, "budget_s": args.budget_s, "out": run_dir, "study": args.study,
           "pass_seconds": args.pass_seconds, "baseline_boots": args.baseline_boots, "looks": args.looks,
           "seed": args.seed, "max_trials": args.max_trials}
    return Settings.resolve(cli)


def _check_inputs(args: argparse.Namespace, gpu: str, root: Path) -> None:
    """The settings, the space and the traffic, before the workers' folders exist (their GPUs are theirs to check)."""
    from elsa_tune.search_spaces.loader import load_space
    from elsa_tune.tuner.fleet.workers import local_run_dir
    from elsa_tune.tuner.flow.preflight import load_traffic

    settings = _settings(args, gpu, local_run_dir(root, gpu))
    load_space(settings.space)
    load_traffic(settings.traffic)


def _check_ledger(path: Path, inputs: list[str | Path | None]) -> None:
    """``--ledger`` is appended to: refuse anything but a ledger (or a new file) before a byte is written."""
    from elsa_tune.history.ledger import JsonlLedger

    OutputPath(path, "--ledger").check(inputs)
    if JsonlLedger(path).is_foreign():
        raise ConfigError(f"--ledger {path} is not a ledger (no line of it is a JSON ledger entry): the workers' "
                          "decisions would be appended to it",
                          remedy="give --ledger a ledger.jsonl elsa-tune wrote, or the name of a new file")


def _check_database(storage: str) -> None:
    """A SQLite file of another application is refused before a folder is created or Optuna adds its tables."""
    from elsa_tune.history.store import sqlite_file
    from elsa_tune.history.study_database import check_study_database

    database = sqlite_file(storage)
    if database is not None:
        check_study_database(database, what="the shared study's database",
                             remedy="give --storage a database elsa-tune created or a new file (sqlite:///PATH), or "
                                    "leave --storage out")


def _check_storage(url: str) -> None:
    """Refuse a storage URL that cannot name a study database, before any file or connection is made."""
    import sqlalchemy as sa

    remedy = "give --storage postgresql://USER@HOST/DB (psycopg installed) or sqlite:///PATH, or leave it out"
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise ConfigError(f"--storage {url!r} is not a database URL: {exc}", remedy=remedy) from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise ConfigError(f"--storage {url!r} names no database file", remedy=remedy)
        OutputPath(Path(parsed.database), "--storage").check()
        return
    if backend != "postgresql":
        raise ConfigError(f"--storage {url!r}: {backend!r} is not a supported database", remedy=remedy)
    if not parsed.host:
        raise ConfigError(f"--storage {url!r} names no database host", remedy=remedy)
    try:
        parsed.get_dialect()
    except (ImportError, sa.exc.NoSuchModuleError) as exc:
        raise ConfigError(f"--storage {url!r}: the PostgreSQL driver is not installed ({exc})",
                          remedy="pip install psycopg2-binary (or psycopg), or use sqlite:///PATH") from exc


def worker_argv(settings: Settings, *, storage: str, study: str, out: Path, budget: Budget,
                techniques: Sequence[str], looks: Sequence[int], ledger: str | None, heartbeat_s: int = 5,
                grace_s: int = 20, verbose: int = 0, promote: bool = True,
                promote_margin: float | None = None) -> list[str]:
    """``elsa-tune worker`` arguments every per-GPU child gets (its pool adds ``--gpu N``): the study's settings as
    resolved here (its pass length and gate looks, so a GPU's numbers are measured as this process's are), the
    techniques every candidate carries, the shared storage and ledger, and the time ``budget`` has left."""
    s = settings
    runtime = s.family if s.runtime == "process" and s.family else s.runtime
    argv = ["--storage", storage, "--study", study, "--out", str(out), *budget.to_argv(),
            "--max-trials", str(s.max_trials), "--pass-seconds", repr(s.pass_s), "--baseline-boots",
            str(s.baseline_boots), "--seed", str(s.seed), "--runtime", runtime, "--traffic", s.traffic,
            "--space", s.space, "--heartbeat", str(heartbeat_s), "--grace", str(grace_s)]
    if ledger is not None:
        argv += ["--ledger", ledger]
    if looks:
        argv += ["--looks", ",".join(str(n) for n in looks)]
    if techniques:
        argv += ["--techniques", ",".join(techniques)]
    for flag, value in (("--model", s.model), ("--launch", s.launch), ("--image", s.image),
                        ("--sim-profile", s.sim_profile)):
        if value is not None:
            argv += [flag, str(value)]
    if s.simulated:
        argv += ["--sim-speedup", repr(s.sim_speedup)]
    if not promote:
        argv.append("--no-promote")
    if promote_margin is not None:
        argv += ["--promote-margin", repr(promote_margin)]
    if verbose:
        argv.append("-" + "v" * verbose)
    return argv
