"""``FlagFile``: a flat SGLang config file (``best/server-args.yaml``) read as the flags of one ``Candidate``.

The file is what SGLang's ``--config`` reads and ``reports/deploy.py`` writes: one dashed flag name per line
mapped to a scalar, ``true`` for a switch, comments allowed::

    # Verdict: +12% throughput
    model-path: /models/qwen3.8-27b-nvfp4
    mem-fraction-static: 0.88
    enable-metrics: true

The environment a study measured is not a flag: ``server-args.yaml`` keeps it in ``ENV_COMMENT`` lines
(``# Environment (not a flag; export it first): NAME=value``), which are read back as the candidate's env.

``read_flag_file`` refuses what is no such file (bad YAML, not a mapping, a list or ``null`` value, a name with
underscores or dashes in front, a key given twice) with the file and line; ``check_flags`` refuses a flag the
runtime does not have, a switch given a value, a value of the wrong type or outside the flag's choices. ``host`` and
``port`` are dropped: elsa-tune serves every boot on an address of its own. A ``false`` switch is the flag left
out, as in a study's candidates, so equal command lines have equal keys.
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import yaml

from elsa_tune.errors import ConfigError
from elsa_tune.input_file import check_input
from elsa_tune.search_spaces.candidate import Candidate, FlagValue
from elsa_tune.search_spaces.document import BoundedLoader, Problem
from elsa_tune.search_spaces.space import value_problem

SCHEMA_VERSION = 1
#: Flags of the deployment's address: the runtime of every boot chooses its own.
OWNED_FLAGS = ("host", "port")
#: The largest flag file read (a config is a few dozen lines; anything this big is the wrong file).
MAX_BYTES = 1 << 20
#: The comment that carries one environment variable of the configuration (``reports/deploy.py`` writes it).
ENV_COMMENT = "# Environment (not a flag; export it first): "
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXAMPLE = "write one flag per line, e.g. `mem-fraction-static: 0.85` (best/server-args.yaml of a study is one)"


class FlagType(Protocol):
    """What checking a flag's value needs to know about one runtime flag (``runtime`` provides these).

    ``kind`` is the value's type in SGLang's parser: ``str``, ``int``, ``float``, ``json`` …, or ``true`` /
    ``boolopt`` / ``const`` for a switch.
    """

    @property
    def takes_value(self) -> bool: ...

    @property
    def choices(self) -> tuple[str, ...] | None: ...

    @property
    def kind(self) -> str: ...


@dataclass(frozen=True)
class FlagFile:
    """The flags of one file, the line each came from, and the address flags left out (``dropped``)."""

    path: str
    flags: Mapping[str, FlagValue]
    env: Mapping[str, str] = field(default_factory=dict)
    lines: Mapping[str, int] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION

    @property
    def name(self) -> str:
        return Path(self.path).name

    def candidate(self, label: str | None = None) -> Candidate:
        """The candidate that boots these flags (``label`` defaults to the file's name without its suffix)."""
        return Candidate(flags={k: v for k, v in self.flags.items() if v is not False}, env=self.env,
                         label=label if label is not None else Path(self.path).stem)

    def where(self, flag: str) -> str:
        line = self.lines.get(flag)
        return f"{self.path}:{line}" if line else self.path


def read_flag_file(path: str | Path) -> FlagFile:
    """Parse ``path``; raises ``ConfigError`` naming the file (and line) and the remedy when it is no flag file."""
    where = str(path)
    check_input(path, "the flag file")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except IsADirectoryError:
        raise ConfigError(f"{where} is a folder, not a flag file",
                          remedy="pass a YAML file such as best/server-args.yaml of a study") from None
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such flag file",
                          remedy="check the path; a study writes one as <run folder>/best/server-args.yaml") from None
    except OSError as exc:
        raise ConfigError(f"cannot read the flag file {where}: {exc.strerror or exc}",
                          remedy="pass a file you can read") from exc
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{where} is larger than {MAX_BYTES // 1024} KiB: not a flag file", remedy=_EXAMPLE)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where} is not UTF-8 text (byte {exc.start}): not a flag file", remedy=_EXAMPLE) from None
    return parse_flag_text(text, where)


def parse_flag_text(text: str, where: str) -> FlagFile:
    """The flags of ``text`` (the contents of the file ``where``)."""
    try:
        loader = BoundedLoader(text)
    except Problem as exc:
        raise ConfigError(f"{where}: {exc}", remedy=_EXAMPLE) from None
    except yaml.YAMLError as exc:    # a character YAML does not allow (a NUL byte)
        raise ConfigError(f"{where}: malformed YAML: {str(exc).splitlines()[0]}",
                          remedy="fix the YAML syntax (a flag file is `name: value` lines)") from None
    try:
        node = loader.get_single_node()
        if node is None:
            raise ConfigError(f"{where} holds no flags", remedy=_EXAMPLE)
        if not isinstance(node, yaml.MappingNode):
            raise ConfigError(f"{where}:{node.start_mark.line + 1}: a flag file is a mapping of flag names to "
                              f"values, not a YAML {_node_kind(node)}", remedy=_EXAMPLE)
        flags: dict[str, FlagValue] = {}
        lines: dict[str, int] = {}
        dropped: list[str] = []
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str) or not key:
                raise ConfigError(f"{where}:{line}: the key {key!r} is not a flag name", remedy=_EXAMPLE)
            name = _flag_name(key, f"{where}:{line}")
            if name in lines:
                raise ConfigError(f"{where}:{line}: {name} is given twice (first on line {lines[name]})",
                                  remedy="keep one line per flag")
            lines[name] = line
            value = _value(loader.construct_object(value_node, deep=True), name, f"{where}:{line}")
            if name in OWNED_FLAGS:
                dropped.append(name)
                continue
            flags[name] = value
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}{at}: malformed YAML: {problem}",
                          remedy="fix the YAML syntax (a flag file is `name: value` lines)") from None
    except Problem as exc:
        raise ConfigError(f"{where}:{exc.line or 1}: {exc}: not a flag file", remedy=_EXAMPLE) from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply to be a flag file", remedy=_EXAMPLE) from None
    finally:
        loader.dispose()
    if not flags:
        raise ConfigError(f"{where} holds no flags" + (f" but {', '.join(dropped)}" if dropped else ""),
                          remedy=_EXAMPLE)
    return FlagFile(path=where, flags=flags, env=_environment(text, where), lines=lines, dropped=tuple(dropped))


def _environment(text: str, where: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.startswith(ENV_COMMENT):
            continue
        try:
            words = shlex.split(line.removeprefix(ENV_COMMENT))
        except ValueError as exc:
            raise ConfigError(f"{where}:{number}: the environment comment cannot be read: {exc}",
                              remedy="write it as NAME=value, quoted as in a shell") from None
        name, sep, value = words[0].partition("=") if len(words) == 1 else ("", "", "")
        if not sep or not _ENV_NAME.fullmatch(name):
            raise ConfigError(f"{where}:{number}: the environment comment is not one NAME=value",
                              remedy="write it as NAME=value, quoted as in a shell")
        env[name] = value
    return env


def check_flags(file: FlagFile, known: Mapping[str, FlagType | None]) -> None:
    """Refuse a flag the runtime does not have, or a value its parser would refuse.

    ``known`` maps every flag name the runtime accepts (aliases included, without dashes) to its type, or to
    ``None`` where only the name is known (the installed runtime's ``--help``). Raises ``ConfigError`` at the line.
    """
    for name, value in file.flags.items():
        at = file.where(name)
        if name not in known:
            hint = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
            raise ConfigError(f"{at}: --{name} is not a flag of the runtime",
                              remedy=(f"did you mean --{hint[0]}? " if hint else "")
                              + "check the flag against the runtime's --help (`python -m sglang.launch_server "
                              "--help`, `vllm serve --help=all`)")
        shape = known[name]
        if shape is None:
            continue
        problem = _type_problem(shape, value)
        if problem:
            raise ConfigError(f"{at}: --{name} {problem}", remedy="use a value the runtime accepts (see its --help)")


def _flag_name(key: str, at: str) -> str:
    if key.startswith("-"):
        raise ConfigError(f"{at}: write the flag {key!r} without its leading dashes",
                          remedy=f"write `{key.lstrip('-')}: …`, as SGLang's --config file does")
    if "_" in key or key != key.strip() or not key.replace("-", "").isalnum():
        dashed = key.strip().replace("_", "-")
        raise ConfigError(f"{at}: {key!r} is not a flag name (SGLang's flags are lowercase words joined by dashes)",
                          remedy=f"write it as on SGLang's command line, e.g. `{dashed}`")
    return key


def _value(value: object, name: str, at: str) -> FlagValue:
    if value is None:
        raise ConfigError(f"{at}: {name} has no value",
                          remedy="give it a value (true for a switch) or delete the line to leave the flag out")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{at}: {name} is {value}, not a finite number", remedy="give it a finite value")
    if isinstance(value, (bool, int, float, str)):
        return value
    raise ConfigError(f"{at}: {name} is a YAML {type(value).__name__}, not one value",
                      remedy="a flag takes one value: write a JSON argument as the quoted text SGLang's command "
                             "line takes, e.g. '{\"key\": 1}'")


def _type_problem(shape: FlagType, value: FlagValue) -> str | None:
    return value_problem(shape, value)


def _node_kind(node: yaml.Node) -> str:
    return "list" if isinstance(node, yaml.SequenceNode) else "scalar"
