"""The CLI: a thin shell that parses arguments, calls into the layers, maps errors to exit codes.

Subcommands live in ``tuner/commands/``, one module each, named like the command word. A module
exposes ``NAME`` (the word on the command line, e.g. ``"sim"``), ``HELP`` and ``register(parser)`` that
adds its arguments and sets ``func`` (``argparse.Namespace -> int``). ``elsa-tune --gpu 0 --traffic X``
with no subcommand runs the ``tune`` command. Only the module of the command being run is imported
(all of them only for the top-level ``--help``): every boot of the simulated runtime starts this CLI,
so start-up time is paid once per boot.

This is the only place that turns an ``ElsaTuneError`` into an exit status and prints it; ``--debug``
re-raises to show the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
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


def build_parser(only: str | None = None) -> _Parser:
    parser = _Parser(
        prog="elsa-tune",
        description="Unattended launch-flag tuner for SGLang. Run `elsa-tune --gpu 0 --traffic prod.parquet`.",
    )
    parser.add_argument("--version", action="version", version=f"elsa-tune {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-paragraph errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules(only):
        command = sub.add_parser(module.NAME, help=getattr(module, "HELP", None),
                                 description=getattr(module, "HELP", None))
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show tracebacks instead of one-paragraph errors")
        module.register(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    commands = set(_command_names())
    first = next((a for a in args_list if a != "--debug"), None)
    if first is not None and first not in commands and first not in ("-h", "--help", "--version"):
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
    except Exception as exc:  # the one catch-all: an internal bug, reported as such
        if debug:
            raise
        log.exception("internal error")
        print(f"elsa-tune: internal error: {type(exc).__name__}: {exc}\n"
              "  remedy: this is a bug in elsa-tune; rerun with --debug and report the traceback",
              file=sys.stderr)
        return EXIT_INTERNAL


def _silence_stdout() -> None:
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    raise SystemExit(main())
