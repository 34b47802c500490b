"""The CLI: a thin shell that parses arguments, calls into the layers, maps errors to exit codes.

Subcommands live in ``tuner/commands/``, one module each, named like the command word. A module
exposes ``NAME`` (the word on the command line, e.g. ``"sim"``), ``HELP`` and ``register(parser)`` that
adds its arguments and sets ``func`` (``argparse.Namespace -> int``). ``elsa-tune --gpu 0 --traffic X``
with no subcommand runs the ``tune`` command (only when the first word is an option: a mistyped command
word is argparse's "invalid choice", never a study). Only the module of the command being run is imported
(all of them only for the top-level ``--help``): every boot of the simulated runtime starts this CLI,
so start-up time is paid once per boot.

This is the only place that turns an ``ElsaTuneError`` into an exit status and prints it; ``--debug``
re-raises to show the traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import importlib
import logging
import pkgutil
import sys
import textwrap
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from elsa_tune import __version__, exit_codes
from elsa_tune.errors import ElsaTuneError

DEFAULT_COMMAND = "tune"
EXIT_INTERRUPTED = exit_codes.INTERRUPTED
EXIT_INTERNAL = exit_codes.INTERNAL

log = logging.getLogger("elsa_tune")


def _command_names() -> list[str]:
    import elsa_tune.tuner.commands as package

    return sorted(info.name for info in pkgutil.iter_modules(package.__path__) if not info.name.startswith("_"))


def _command_modules(only: str | None = None) -> list[ModuleType]:
    modules = []
    for name in _command_names():
        if only is not None and name != only:
            continue
        module = importlib.import_module(f"elsa_tune.tuner.commands.{name}")
        if hasattr(module, "NAME") and hasattr(module, "register"):
            modules.append(module)
    return modules


class _Parser(argparse.ArgumentParser):
    """argparse with the house's error: one paragraph naming the argument, a remedy, exit ``USAGE``."""

    #: set on the parser of ``sim serve``, the simulated SGLang: it fails on a bad flag as SGLang does (usage, exit 2)
    sglang_errors = False

    def error(self, message: str) -> NoReturn:
        if self.sglang_errors or self.prog.startswith("elsa-tune sim serve"):
            super().error(message)
        self.exit(exit_codes.USAGE, f"elsa-tune: error: {self.prog}: {message}\n"
                                    f"  remedy: see `{self.prog} --help` for the arguments it takes\n")


#: Every exit status a command returns (the ``exit_code`` of the ``elsa_tune.errors`` classes, then the CLI's own).
EXIT_STATUSES = (
    (exit_codes.OK, "success"),
    (exit_codes.FAILED, "an error without a more precise class"),
    (exit_codes.USAGE, "a bad argument, flag, search space or traffic file (also argparse's usage errors)"),
    (exit_codes.CANDIDATE, "a candidate failed where the command's result was that candidate"),
    (exit_codes.ENVIRONMENT, "the machine or the runtime is not fit (no GPU, busy GPU, runtime missing)"),
    (exit_codes.HISTORY, "the study store or the ledger is unreadable or inconsistent"),
    (exit_codes.WORSE, "compare: B is worse than A (interval below 1, or a guardrail confidently worse)"),
    (exit_codes.NO_DIFFERENCE, "compare: no difference shown (the gate was inconclusive)"),
    (exit_codes.EQUIVALENT, "compare: B is equivalent to A (interval within ± the minimum effect)"),
    (exit_codes.INTERNAL, "a bug in elsa-tune (rerun with --debug and report the traceback)"),
    (exit_codes.INTERRUPTED, "interrupted (Ctrl-C or SIGTERM); rerunning the same command resumes a study"),
)
#: Environment variables read outside ``Settings`` (whose ``ELSA_TUNE_<NAME>`` are listed from its fields).
ENVIRONMENT = (
    ("ELSA_TUNE_<SETTING>", "the default of a study setting, below the command line: e.g. ELSA_TUNE_BUDGET_S=8h, "
                            "ELSA_TUNE_GPU=0, ELSA_TUNE_BASELINE_BOOTS=5 (a typo is warned about)"),
    ("ELSA_TUNE_CACHE", "a folder where the gate caches its computed boundaries (default: none, computed each time)"),
    ("ELSA_LEASE_DIR", "the lease folder of servers elsa-tune started (default $XDG_RUNTIME_DIR/elsa-tune/leases)"),
    ("ELSA_SIM_CARD_DIR", "where simulated cards keep their state (default a per-user temporary folder)"),
    ("ELSA_SIM_FAULT", "a fault the simulated server injects (tests; see `elsa-tune sim serve --help`)"),
)


#: Help for options several commands share (``tune``, ``check``, ``worker``), used where a command gave none: the
#: same option means the same thing everywhere.
SHARED_HELP = {
    "--traffic": "recorded traffic (elsa-tune Parquet trace), or 'demo' for the bundled window, e.g. prod.parquet",
    "--space": "the search space: a shipped name (elsa-tune space list) or a YAML file, e.g. generic-sglang",
    "--model": "the model to serve instead of the space's, e.g. /models/qwen3.8-27b-nvfp4",
    "--runtime": "how the runtime is launched: process (default), docker, or sim (implied by --gpu sim); or a "
                 "runtime family run as a process: sglang, llamacpp, vllm",
    "--launch": "the runtime's launch command, e.g. \"/opt/fork/bin/python -m sglang.launch_server\"",
    "--image": "the container image with --runtime docker, e.g. lmsysorg/sglang:v0.5.23",
    "--sim-profile": "the simulator profile with --runtime sim (elsa-tune sim profiles), e.g. tiny-test",
    "--sim-speedup": "simulated seconds per wall second (default 40), e.g. 60",
    "--pass-seconds": "target length of one measured pass in seconds (default: from the budget), e.g. 120",
    "--baseline-boots": "boots of the baseline that measure the boot-to-boot noise (default 4, at least 3), e.g. 5",
    "--seed": "seed of the search's sampler and the boot schedule (default 0), e.g. 7",
    "--verbose": "more console output (repeat for more: -vv)",
    "--log-file": "also log at DEBUG level to this file, e.g. worker.log",
}


def _fill_shared_help(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if action.help is None and action.option_strings:
            action.help = next((SHARED_HELP[o] for o in action.option_strings if o in SHARED_HELP), None)


def epilog() -> str:
    """The top-level help's tail: examples, exit statuses, environment variables."""
    from elsa_tune.tuner.flow.settings import ENV_PREFIX, Settings

    names = ", ".join(ENV_PREFIX + f.name.upper() for f in dataclasses.fields(Settings) if f.name != "schema_version")
    lines = ["examples:",
             "  elsa-tune --gpu sim --sim-profile rtx5090-qwen3.8-27b-nvfp4 --space qwen3.8-27b-nvfp4-rtx5090 "
             "--traffic demo --budget 8h",
             "  elsa-tune --gpu 0 --traffic prod.parquet --model /models/qwen --budget 8h --dry-run",
             "  elsa-tune report elsa-runs/demo --json",
             "  eval \"$(elsa-tune completion bash)\"",
             "", "exit status:"]
    lines += [f"  {code:<4} {text}" for code, text in EXIT_STATUSES]
    lines += ["", "environment:"]
    lines += [f"  {name:<20} {text}" for name, text in ENVIRONMENT]
    lines += ["  settings:", *textwrap.wrap(names, width=100, initial_indent="    ", subsequent_indent="    ")]
    return "\n".join(lines)


def build_parser(only: str | None = None) -> _Parser:
    parser = _Parser(
        prog="elsa-tune",
        description="Unattended launch-flag tuner for SGLang. Run `elsa-tune --gpu 0 --traffic prod.parquet`.",
        epilog=epilog(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"elsa-tune {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-paragraph errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules(only):
        examples = getattr(module, "EXAMPLES", ())
        command = sub.add_parser(module.NAME, help=getattr(module, "HELP", None),
                                 description=getattr(module, "HELP", None),
                                 epilog="examples:\n" + "\n".join(f"  {e}" for e in examples) if examples else None,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show tracebacks instead of one-paragraph errors")
        module.register(command)
        _fill_shared_help(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    commands = set(_command_names())
    first = next((a for a in args_list if a != "--debug"), None)
    if first is not None and first.startswith("-") and first not in ("-h", "--help", "--version"):
        args_list.insert(args_list.index(first), DEFAULT_COMMAND)
        first = DEFAULT_COMMAND
    parser = build_parser(first if first in commands else None)
    parser.sglang_errors = args_list[args_list.index(first):][:2] == ["sim", "serve"] if first else False
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:   # --help, --version, or a usage error already printed as one paragraph
        return exc.code if isinstance(exc.code, int) else (exit_codes.OK if exc.code is None else exit_codes.USAGE)
    if not getattr(args, "func", None):
        parser.print_help()
        return exit_codes.USAGE
    debug = bool(getattr(args, "debug", False))
    try:
        return int(args.func(args))
    except ElsaTuneError as exc:
        if debug:
            raise
        print(f"elsa-tune: error: {exc.explain()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("elsa-tune: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away (`elsa-tune traffic show X --json | head`): not an error of ours
        _silence_stdout()
        return 0
    except OSError as exc:
        if not _stdout_failed(exc):
            if debug:
                raise
            return _internal(exc)
        _silence_stdout()   # stdout is a full disk (`> /dev/full`) or closed: the output could not be written
        print(f"elsa-tune: error: the output could not be written to stdout: {exc.strerror or exc}\n"
              "  remedy: redirect the output to a file system with room, or to a file you can write",
              file=sys.stderr)
        return exit_codes.FAILED
    except Exception as exc:  # the one catch-all: an internal bug, reported as such
        if debug:
            raise
        return _internal(exc)


def _internal(exc: BaseException) -> int:
    log.exception("internal error")
    print(f"elsa-tune: internal error: {type(exc).__name__}: {exc}\n"
          "  remedy: this is a bug in elsa-tune; rerun with --debug and report the traceback",
          file=sys.stderr)
    return EXIT_INTERNAL


def _stdout_failed(exc: OSError) -> bool:
    """``exc`` came from writing stdout: flushing it now fails too (a full disk, a closed descriptor)."""
    try:
        sys.stdout.flush()
    except OSError:
        return True
    return exc.errno in (errno.ENOSPC, errno.EBADF) and not getattr(exc, "filename", None)


def _silence_stdout() -> None:
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    raise SystemExit(main())
