"""The flags of ``vllm serve``, read from its own ``--help=all``, and checked by vLLM's own parser and engine config.

vLLM's help is argparse's. An option line lists every spelling, each with its metavar when it takes a value;
a switch made with ``BooleanOptionalAction`` lists its negation beside it; choices appear as ``{a,b}`` or as a
Python list (``['auto', 'fp8', …]``, which argparse itself does not enforce: the engine config does)::

    --tensor-parallel-size TENSOR_PARALLEL_SIZE, -tp TENSOR_PARALLEL_SIZE
    --enable-prefix-caching, --disable-prefix-caching
    --kv-cache-dtype ['auto', 'bfloat16', 'fp8', …]

``parse_help`` turns that into a ``VllmFlagSet``: the names are the first long spelling without dashes; other
spellings of a flag that takes a value (``tp``, ``device-memory-utilization``) are aliases; each spelling of a
switch is a name of its own (``enable-prefix-caching`` and ``disable-prefix-caching`` turn it on and off).
The model is ``serve``'s positional ``model_tag``; ``--model`` is listed too and is the flag name elsa-tune uses.

``rejected_by_vllm`` runs, in the Python of a vLLM environment (a subprocess, bounded), vLLM's
``make_arg_parser(FlexibleArgumentParser())`` and ``AsyncEngineArgs.create_engine_config()`` on each argv, with
the model a local folder holding ``config.json`` and ``HF_HUB_OFFLINE=1``: the parser refuses unknown flags and
bad types, the engine config refuses values (``--kv-cache-dtype fp7``, ``--gpu-memory-utilization 1.5``), a
``--max-model-len`` above the model's limit, ``--max-num-batched-tokens`` below ``--max-model-len`` without
chunked prefill, and a tensor-parallel size the heads do not divide. argparse reads a unique prefix
(``--max-num-seq``) as its flag; the checker refuses it, as elsa-tune never writes one. The values the engine
config resolves on a machine without a GPU (chunked prefill's token budget) are not the GPU's and are not
reported.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from elsa_tune.errors import RuntimeUnavailable
from elsa_tune.runtime.flags import FlagSet
from elsa_tune.runtime.process_group import ProcessGroup

#: The module ``python -m`` runs for vLLM's command line (``vllm serve`` is its console script).
CLI_MODULE = "vllm.entrypoints.cli.main"
#: vLLM needs a device type to build its parser; on a machine without a GPU it cannot infer one.
HELP_ENV: Mapping[str, str] = {"VLLM_TARGET_DEVICE": "cpu"}

_OPTION = re.compile(r"^ {2}(?P<head>-{1,2}[A-Za-z0-9][^ ].*?)(?: {2,}(?P<desc>.*))?$")
_SPELLING = re.compile(r"^(?P<flag>-{1,2}[A-Za-z0-9][\w.-]*)(?: (?P<meta>.+))?$")
_BRACES = re.compile(r"^\{(?P<set>[^{}]+)\}$")
_PYLIST = re.compile(r"^\[(?P<list>'[^']*'(?:, '[^']*')*)\]$")
_UNLISTED = frozenset({"help"})


@dataclass(frozen=True)
class VllmFlag:
    """One flag of ``vllm serve``: its name, every spelling, whether it takes a value, its listed choices."""

    name: str
    spellings: tuple[str, ...]
    takes_value: bool
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True)
class VllmFlagSet(FlagSet):
    """A ``FlagSet`` with each flag's shape (``flags``, by name)."""

    flags: Mapping[str, VllmFlag] = field(default_factory=dict)

    def shapes(self) -> dict[str, VllmFlag]:
        """Every name and alias mapped to its flag: what ``SearchSpace.validate_flags`` takes."""
        shapes = dict(self.flags)
        shapes.update({alias: self.flags[main] for alias, main in self.aliases.items() if main in self.flags})
        return shapes


def _split_head(head: str) -> list[tuple[str, str]]:
    """``--a A, -b A`` → ``[("--a", "A"), ("-b", "A")]``; the metavar may itself contain ``, `` (a Python list)."""
    parts: list[tuple[str, str]] = []
    for piece in re.split(r", (?=-{1,2}[A-Za-z0-9])", head):
        match = _SPELLING.match(piece.strip())
        if match is None:
            return []
        parts.append((match["flag"], (match["meta"] or "").strip()))
    return parts


def _choices(meta: str) -> tuple[str, ...] | None:
    braces = _BRACES.match(meta)
    if braces:
        return tuple(v.strip() for v in braces["set"].split(","))
    listed = _PYLIST.match(meta)
    if listed:
        return tuple(v.strip().strip("'") for v in listed["list"].split(", "))
    return None


def parse_help(text: str, source: str = "") -> VllmFlagSet:
    """The flags of a ``vllm serve --help=all`` text. Never raises; a text with no option line gives no flags."""
    names: set[str] = set()
    aliases: dict[str, str] = {}
    flags: dict[str, VllmFlag] = {}
    for line in text.splitlines():
        match = _OPTION.match(line.rstrip())
        if match is None:
            continue
        parts = _split_head(match["head"])
        if not parts:
            continue
        longs = [flag for flag, _ in parts if flag.startswith("--")]
        if not longs:
            continue
        takes_value = any(meta for _, meta in parts)
        if takes_value:
            main = longs[0].lstrip("-")
            if main in _UNLISTED:
                continue
            choices = _choices(parts[0][1])
            flags[main] = VllmFlag(main, tuple(f for f, _ in parts), True, choices)
            names.add(main)
            for flag, _ in parts:
                if flag.lstrip("-") != main:
                    aliases.setdefault(flag.lstrip("-"), main)
            continue
        for flag, _ in parts:   # switches: each spelling (on, off, short) is a switch of its own
            name = flag.lstrip("-")
            if name in _UNLISTED:
                continue
            flags[name] = VllmFlag(name, (flag,), False)
            names.add(name)
    for name in names:
        aliases.pop(name, None)
    return VllmFlagSet(frozenset(names), aliases, source, flags=flags)


def help_launch(python: str) -> tuple[str, ...]:
    """The command whose ``--help`` lists every flag of ``vllm serve`` in the environment of ``python``."""
    return (python, "-m", CLI_MODULE, "serve", "--help=all")


# Runs inside vLLM's own Python (which cannot import elsa_tune): one JSON list of argv lists on stdin (the model
# folder first), one JSON list of {"ok", "error"} on stdout after a marker (vLLM logs to stdout too).
_CHECK_SCRIPT = r"""
import contextlib, io, json, sys
try:
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils import FlexibleArgumentParser
from vllm.engine.arg_utils import AsyncEngineArgs
parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
known = set(parser._option_string_actions)
results = []
for argv in json.load(sys.stdin):
    abbreviated = []
    for token in argv:
        name = token.split("=", 1)[0]
        if name.startswith("--") and name not in known:
            longer = sorted(k for k in known if k.startswith(name))
            abbreviated.append(f"{name} is not a flag of vllm serve" + (
                f" (argparse would read it as the abbreviation {longer[0]}; write the full flag)" if len(longer) == 1
                else f" (ambiguous: {', '.join(longer[:4])})" if longer else ""))
    if abbreviated:
        results.append({"ok": False, "error": "; ".join(abbreviated)})
        continue
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
        if getattr(args, "model_tag", None):
            args.model = args.model_tag
        AsyncEngineArgs.from_cli_args(args).create_engine_config()
        results.append({"ok": True, "error": ""})
    except SystemExit as exc:
        lines = [l for l in err.getvalue().splitlines() if "error:" in l] or err.getvalue().splitlines()[-1:]
        results.append({"ok": False, "error": (lines[-1] if lines else f"exit {exc.code}").strip()})
    except Exception as exc:
        text = " ".join(str(exc).split())
        results.append({"ok": False, "error": f"{type(exc).__name__}: {text}"[:800]})
sys.stdout.write("\n@@RESULTS@@" + json.dumps(results) + "\n")
"""


def rejected_by_vllm(python: str, argvs: Sequence[Sequence[str]], *,
                     timeout_s: float = 300.0) -> list[tuple[int, str]]:
    """Ask vLLM's own parser and engine-config builder about each argv; ``(index, error)`` for each refusal.

    Each argv is what follows ``vllm serve``: the model (a local folder with ``config.json``; no weights are read)
    then the flags. One process checks them all (the import takes ~10 s, each argv milliseconds), with
    ``HF_HUB_OFFLINE=1`` and ``VLLM_TARGET_DEVICE=cpu``. ``RuntimeUnavailable`` when ``python`` cannot run vLLM.
    """
    env = {**os.environ, **HELP_ENV, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    try:
        done = ProcessGroup.run([python, "-c", _CHECK_SCRIPT], deadline_s=timeout_s, env=env,
                                stdin_text=json.dumps([list(a) for a in argvs]))
    except OSError as exc:
        raise RuntimeUnavailable(f"the runtime interpreter {python!r} does not exist",
                                 remedy="point it at the Python of the vLLM environment "
                                        "(e.g. ~/.cache/elsa-tune/vllm-0.33.0/bin/python)") from exc
    except subprocess.TimeoutExpired as exc:
        raise RuntimeUnavailable(f"vLLM's parser and engine config did not finish within {timeout_s:.0f} s",
                                 remedy="raise the timeout or check the vLLM installation") from exc
    marker = done.stdout.rfind("@@RESULTS@@")
    if done.returncode != 0 or marker < 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        raise RuntimeUnavailable(
            f"{python} could not run vLLM's argument parser (exit {done.returncode}):\n{tail}",
            remedy="install vllm into that environment (pip install vllm==0.33.0)")
    results = json.loads(done.stdout[marker + len("@@RESULTS@@"):].strip().splitlines()[0])
    return [(i, r["error"]) for i, r in enumerate(results) if not r["ok"]]


#: The spellings the boot report and ``log explain`` know without a ``--help`` text, mapped to the flag's name.
KNOWN_ALIASES: Mapping[str, str] = {
    "tp": "tensor-parallel-size", "pp": "pipeline-parallel-size", "dp": "data-parallel-size",
    "device-memory-utilization": "gpu-memory-utilization", "cc": "compilation-config", "sc": "speculative-config",
    "O": "optimization-level", "q": "quantization",
}


def canonical(name: str) -> str:
    """``name`` (any spelling, with or without dashes, ``_`` or ``-``) as the flag name vLLM's help lists."""
    bare = name.lstrip("-")
    bare = bare if bare in KNOWN_ALIASES else bare.replace("_", "-")
    return KNOWN_ALIASES.get(bare, bare)
