"""The CLI as an operator meets it: a mistyped command is "invalid choice", every argument has help, every command
has examples that parse, --help lists the exit statuses and environment variables, and the completion script
completes in a real bash."""

from __future__ import annotations

import argparse
import importlib
import shlex
import subprocess

import pytest

import elsa_tune.errors as errors
from elsa_tune.tuner.cli import EXIT_STATUSES, build_parser, main
from elsa_tune.tuner.commands.completion import script

SGLANG_FLAG_TABLES = ("sim serve", "sim truth")     # SGLang's own flags, mirrored from SGLang's parser


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _walk(sub, (*path, name))
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            found.append((" ".join(path), action))
    return found


def test_a_mistyped_command_is_an_invalid_choice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reprot", "elsa-runs/demo"]) == 2      # in-process, main returns the usage status
    err = capsys.readouterr().err
    assert "invalid choice: 'reprot'" in err and "unrecognized arguments" not in err


def test_every_argument_has_help() -> None:
    missing = [f"{path}: {action.option_strings or action.dest}" for path, action in _walk(build_parser(), ())
               if not path.startswith(SGLANG_FLAG_TABLES) and (not action.help or action.help == argparse.SUPPRESS)]
    assert missing == []


def test_every_command_has_examples_that_parse() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in commands:
        module = importlib.import_module(f"elsa_tune.tuner.commands.{name}")
        examples = getattr(module, "EXAMPLES", ())
        assert examples, f"{name} has no EXAMPLES"
        for example in examples:
            if "$(" in example:
                continue
            words = shlex.split(example.split(" > ")[0])
            assert words[0] == "elsa-tune"
            argv = words[1:] if words[1] in commands else ["tune", *words[1:]]
            parser.parse_args(argv)                  # raises SystemExit on any argument it does not take


def test_help_lists_every_exit_status_and_the_environment() -> None:
    page = build_parser().format_help()
    codes = {code for code, _ in EXIT_STATUSES}
    raised = {cls.exit_code for cls in vars(errors).values()
              if isinstance(cls, type) and issubclass(cls, errors.ElsaTuneError)}
    assert raised <= codes and {0, 70, 130} <= codes
    for code in codes:
        assert f"\n  {code:<4} " in page
    for name in ("ELSA_TUNE_<SETTING>", "ELSA_TUNE_BUDGET_S", "ELSA_LEASE_DIR", "ELSA_TUNE_CACHE"):
        assert name in page


@pytest.mark.parametrize(("line", "expected"), [
    ("elsa-tune rep", {"report"}),
    ("elsa-tune space ", {"show", "check", "list"}),
    ("elsa-tune report --j", {"--json"}),
    ("elsa-tune --dry", {"--dry-run"}),
])
def test_bash_completion_completes(line: str, expected: set[str]) -> None:
    words = line.split(" ")
    probe = (f"{script('bash')}\nCOMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); "
             f"COMP_CWORD={len(words) - 1}; _elsa_tune; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30, check=True).stdout
    assert set(out.split()) == expected
