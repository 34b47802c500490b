"""The installed runtime's own flag list, read from ``<launch> --help``, and flag-name validation.

SGLang's flags move between versions (``--cuda-graph-max-bs`` became ambiguous in
0.5.2x and exits 2). Before a night starts, every flag a search space uses is checked against the
flags of the launch command that will run it; a miss is refused with the nearest existing flag:

    known = harvest(("/opt/sglang-venv/bin/python", "-m", "sglang.launch_server"))
    require_known(space_flags, known)        # ConfigError: ... did you mean --cuda-graph-max-bs-decode?

Names are SGLang's dashed names without the leading dashes, as in ``Candidate.flags``.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
import subprocess
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from elsa_tune.errors import ConfigError, RuntimeUnavailable
from elsa_tune.runtime.process_group import ProcessGroup

_OPTION_LINE = re.compile(r"^\s{2,}(-\w, )?--[a-z0-9]")
_FLAG = re.compile(r"(?<![\w-])--([a-z0-9][a-z0-9_-]*)")


@dataclass(frozen=True)
class FlagSet:
    """Flags a launch command accepts. ``aliases`` maps an alternative spelling to its main flag."""

    names: frozenset[str]
    aliases: Mapping[str, str] = field(default_factory=dict)
    source: str = ""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.names or name in self.aliases)

    def canonical(self, name: str) -> str:
        return self.aliases.get(name, name)

    def all_names(self) -> frozenset[str]:
        return self.names | frozenset(self.aliases)

    def shapes(self) -> Mapping[str, Any]:
        """Every name and alias mapped to what validation knows of its values: nothing, for an argparse help text
        (a family that reads more, such as llama.cpp's choices and switches, says more)."""
        return dict.fromkeys(self.all_names())


@dataclass(frozen=True)
class FlagProblem:
    """One flag the runtime would refuse (or read as an abbreviation), with the nearest real flag."""

    flag: str
    message: str
    suggestion: str | None = None

    def explain(self) -> str:
        hint = f"; did you mean --{self.suggestion}?" if self.suggestion else ""
        return f"--{self.flag}: {self.message}{hint}"


def read_command(text: str, *, canonical: Callable[[str], str], single_dash: bool = False,
                 positional_after: str | None = None, positional_flag: str = "") -> dict[str, str | int | float | bool]:
    """The flags of a launch command (or of flags alone) as the shell would split it, under ``canonical`` names.

    Anything before the first flag is the program and is ignored, except the word after ``positional_after``
    (vLLM's ``serve MODEL``), read as ``positional_flag``. ``--name value``, ``--name=value`` and a switch
    (``--name`` followed by another flag or nothing) are read; ``single_dash`` also reads ``-c 4096`` (llama.cpp,
    vLLM's ``-tp 2``). Values are numbers where they read as numbers. ``ConfigError`` for text the shell cannot
    split or a value with no flag before it.
    """
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"--flags cannot be parsed: {exc}", remedy="quote the flags as one shell string") from exc

    def is_flag(token: str) -> bool:
        if single_dash:
            return token.startswith("-") and len(token) > 1 and not isinstance(number(token), int | float)
        return token.startswith("--")

    flags: dict[str, str | int | float | bool] = {}
    i = next((n for n, t in enumerate(tokens) if is_flag(t)), len(tokens))
    if positional_after is not None and positional_after in tokens[:i]:
        at = tokens.index(positional_after) + 1
        if at < i:
            flags[positional_flag] = tokens[at]
    while i < len(tokens):
        token = tokens[i]
        if not is_flag(token):
            raise ConfigError(f"--flags: unexpected value {token!r}", remedy='write flags as "--name value --switch"')
        name, eq, inline = token.lstrip("-").partition("=")
        name = canonical(name.replace("_", "-"))
        if eq:
            flags[name], i = inline, i + 1
        elif i + 1 < len(tokens) and not is_flag(tokens[i + 1]):
            flags[name], i = number(tokens[i + 1]), i + 2
        else:
            flags[name], i = True, i + 1
    return flags


def number(text: str) -> int | float | str:
    """A flag's value as written (on a command line, or in a log's printed server arguments): ``text`` stripped, as
    an int, else a float, else the text itself."""
    text = text.strip()
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_help(text: str, source: str = "") -> FlagSet:
    """Harvest the flags of an argparse ``--help`` text (the option lines, not the prose)."""
    names: set[str] = set()
    aliases: dict[str, str] = {}
    for line in text.splitlines():
        if not _OPTION_LINE.match(line):
            continue
        head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        spellings = [m.group(1) for m in _FLAG.finditer(head)]
        if not spellings:
            continue
        main = spellings[0]
        names.add(main)
        for alias in spellings[1:]:
            if alias != main:
                aliases[alias] = main
    names.discard("help")
    return FlagSet(frozenset(names), aliases, source)


def harvest(launch: Sequence[str], *, timeout_s: float = 300.0, env: Mapping[str, str] | None = None,
            parse: Callable[[str, str], FlagSet] | None = None, help_flag: str = "--help",
            longer: str = "raise the --help timeout") -> FlagSet:
    """Run ``<launch> <help_flag>`` and parse its flags with ``parse`` (an argparse help text by default: SGLang's).

    The run is bounded by ``ProcessGroup.run``: its own process group, one total deadline of ``timeout_s``
    (importing a Python runtime takes a while), and the group stopped afterwards, so a launch command that never
    exits, or leaves a child behind, is stopped and refused as ``RuntimeUnavailable`` whose remedy names
    ``longer``, the way to give a slow runtime more time. ``help_flag`` is the family's (vLLM lists every flag
    only under ``--help=all``); ``env`` replaces the environment when given."""
    argv = [*launch, help_flag]
    try:
        done = ProcessGroup.run(argv, deadline_s=timeout_s, env=env)
    except OSError as exc:
        raise RuntimeUnavailable(f"the launch command {launch[0]!r} does not exist or cannot be run ({exc.strerror})",
                                 remedy="install SGLang (or the runtime you tune) or configure the launch command of "
                                        "its own environment (--launch), e.g. /opt/sglang-venv/bin/python -m "
                                        "sglang.launch_server or /opt/llama.cpp/bin/llama-server") from exc
    except subprocess.TimeoutExpired as exc:
        raise RuntimeUnavailable(f"`{shlex.join(argv)}` did not print its flags and exit within {timeout_s:g} s; it "
                                 "was stopped with every process it started",
                                 remedy=f"run `{shlex.join(argv)}` by hand: it must print the runtime's flags and "
                                        "exit (a wrapper that never exits, or a runtime that hangs while importing, "
                                        f"does not); if it is only slow to import, {longer}") from exc
    flags = (parse or parse_help)(done.stdout, " ".join(launch))
    if done.returncode != 0 or not flags.names:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        raise RuntimeUnavailable(f"`{' '.join(argv)}` exited {done.returncode} without a flag list:\n{tail}",
                                 remedy="fix the runtime installation (the output above says why)")
    return flags


def validate(flags: Iterable[str], known: FlagSet | Collection[str]) -> list[FlagProblem]:
    """Problems with ``flags`` for a runtime that knows ``known``; empty when all are fine.

    An unknown flag gets the nearest real one (difflib). A flag that is only a prefix of real flags
    is reported too: argparse reads it as an abbreviation when it is unique and refuses it (exit 2)
    when it is ambiguous, as ``--cuda-graph-max-bs`` is in 0.5.23.
    """
    flag_set = known if isinstance(known, FlagSet) else FlagSet(frozenset(known))
    every = sorted(flag_set.all_names())
    problems = []
    for raw in flags:
        name = raw.lstrip("-")
        if name in flag_set:
            continue
        longer = [n for n in every if n.startswith(name)]
        if len(longer) > 1:
            problems.append(FlagProblem(name, "ambiguous: the runtime would refuse it (could be "
                                              + ", ".join(f"--{n}" for n in longer[:4]) + ")", longer[0]))
            continue
        if len(longer) == 1:
            problems.append(FlagProblem(name, "only an abbreviation; write the full flag", longer[0]))
            continue
        near = difflib.get_close_matches(name, every, n=1, cutoff=0.6)
        problems.append(FlagProblem(name, "not a flag of this runtime version", near[0] if near else None))
    return problems


def require_known(flags: Iterable[str], known: FlagSet | Collection[str], *, where: str = "") -> None:
    """Raise ``ConfigError`` naming every bad flag and its nearest real flag."""
    problems = validate(flags, known)
    if not problems:
        return
    source = known.source if isinstance(known, FlagSet) and known.source else "the installed runtime"
    place = f"{where}: " if where else ""
    lines = "; ".join(p.explain() for p in problems)
    first = next((p for p in problems if p.suggestion), None)
    remedy = (f"did you mean --{first.suggestion}? rename the flag(s) to ones `{source} --help` lists"
              if first else f"remove the flag(s); `{source} --help` lists what this version accepts")
    raise ConfigError(f"{place}{len(problems)} flag(s) not accepted by {source}: {lines}", remedy=remedy)


# Runs inside the runtime's own Python (which cannot import elsa_tune): one JSON list of argv lists on
# stdin, one JSON list of {"ok", "error"} on stdout. argparse errors go to stderr and SystemExit.
_PREPARE_SCRIPT = r"""
import contextlib, io, json, sys
from sglang.srt.server_args import prepare_server_args
results = []
for argv in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            prepare_server_args(argv)
        results.append({"ok": True, "error": ""})
    except SystemExit as exc:
        lines = [l for l in err.getvalue().splitlines() if "error:" in l] or err.getvalue().splitlines()[-1:]
        results.append({"ok": False, "error": (lines[-1] if lines else f"exit {exc.code}").strip()})
    except Exception as exc:
        results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]})
sys.stdout.write("\n@@RESULTS@@" + json.dumps(results) + "\n")
"""


def rejected_by_runtime(python: str, argvs: Sequence[Sequence[str]], *,
                        timeout_s: float = 600.0) -> list[tuple[int, str]]:
    """Ask the runtime's own ``prepare_server_args`` about each argv; ``(index, error)`` for each refusal.

    ``python`` is the interpreter of the SGLang environment (``/opt/sglang-venv/bin/python``). One
    process checks them all (the import takes ~30 s, each argv a fraction of a second). Used in CI to
    prove that every candidate a search space can generate boots past SGLang's argument resolution.
    """
    try:
        done = ProcessGroup.run([python, "-c", _PREPARE_SCRIPT], deadline_s=timeout_s,
                                stdin_text=json.dumps([list(a) for a in argvs]))
    except OSError as exc:
        raise RuntimeUnavailable(f"the runtime interpreter {python!r} does not exist",
                                 remedy="point it at the Python of the SGLang environment") from exc
    except subprocess.TimeoutExpired as exc:
        raise RuntimeUnavailable(f"SGLang's prepare_server_args did not finish within {timeout_s:.0f} s",
                                 remedy="raise the timeout or check the SGLang installation") from exc
    marker = done.stdout.rfind("@@RESULTS@@")
    if done.returncode != 0 or marker < 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        raise RuntimeUnavailable(
            f"{python} could not run SGLang's prepare_server_args (exit {done.returncode}):\n{tail}",
            remedy="install sglang into that environment")
    results = json.loads(done.stdout[marker + len("@@RESULTS@@"):].strip().splitlines()[0])
    return [(i, r["error"]) for i, r in enumerate(results) if not r["ok"]]
