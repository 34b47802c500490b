"""The flags of ``llama-server``, read from its own ``--help``.

llama.cpp's help is not argparse. Each option starts at column 0 with every spelling of the flag, then its
value placeholder, then (from column 40, or on the next lines) the description; the ``(env: LLAMA_ARG_…)``
line names the environment variable that sets the same flag::

    -c,    --ctx-size N                     size of the prompt context (default: 0, 0 = loaded from model)
                                            (env: LLAMA_ARG_CTX_SIZE)
    -fa,   --flash-attn [on|off|auto]       set Flash Attention use ('on', 'off', or 'auto', default: 'auto')
    -kvu,  --kv-unified, -no-kvu, --no-kv-unified

``parse_help`` turns that into a ``LlamaFlagSet``: a ``FlagSet`` whose names are the long names without dashes
and whose aliases map every other spelling (``c``, ``np``, ``ngl``, ``gpu-layers``) to them. A flag's name is
its last long spelling (``n-gpu-layers``, ``model-draft``: the spellings llama.cpp's documentation uses). A
negatable flag is two switches: ``kv-unified`` and ``no-kv-unified`` (``Candidate`` leaves a ``False`` flag
out, so turning a default-on feature off needs the ``no-`` switch). Each flag also records whether it takes a
value, its choices where the help lists them, and its environment variable; flags the help calls removed
(``--draft-max``) are kept apart, with the sentence that names their replacement.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from elsa_tune.runtime.flags import FlagSet

_OPTION = re.compile(r"^-{1,2}[A-Za-z0-9]")
_SPELLINGS = re.compile(r"^(?P<list>-{1,2}[A-Za-z0-9][\w.+-]*(?:,\s+-{1,2}[A-Za-z0-9][\w.+-]*)*)(?P<rest>.*)$")
_ENV = re.compile(r"\(env: (?P<env>[A-Z][A-Z0-9_]*)\)")
_ALLOWED = re.compile(r"allowed values: (?P<values>[\w.]+(?:, [\w.]+)+)")
_BRACKETS = re.compile(r"^\[(?P<choices>[\w.-]+(?:\|[\w.-]+)+)\]$|^\{(?P<set>[\w.-]+(?:,[\w.-]+)+)\}$"
                       r"|^<(?P<angle>[\w.-]+(?:\|[\w.-]+)+)>$")
_REMOVED = "the argument has been removed"
_UNLISTED = frozenset({"help", "usage"})


@dataclass(frozen=True)
class LlamaFlag:
    """One flag of ``llama-server``: its name, every spelling, its value shape and its environment variable.

    ``negates`` is set on a ``no-…`` switch: the name of the flag it turns off. ``takes_value`` and
    ``choices`` satisfy ``search_spaces.space.FlagShape``.
    """

    name: str
    spellings: tuple[str, ...]
    takes_value: bool
    choices: tuple[str, ...] | None = None
    env: str | None = None
    negates: str | None = None
    placeholder: str = ""


@dataclass(frozen=True)
class LlamaFlagSet(FlagSet):
    """A ``FlagSet`` with each flag's shape (``flags``, by name) and the removed flags (``removed``, by every
    spelling without dashes, mapped to the help's sentence naming the replacement)."""

    flags: Mapping[str, LlamaFlag] = field(default_factory=dict)
    removed: Mapping[str, str] = field(default_factory=dict)

    def shapes(self) -> dict[str, LlamaFlag]:
        """Every name and alias mapped to its flag: what ``SearchSpace.validate_flags`` takes."""
        shapes = dict(self.flags)
        shapes.update({alias: self.flags[main] for alias, main in self.aliases.items() if main in self.flags})
        return shapes

    def env_vars(self) -> dict[str, str]:
        """Every environment variable that sets a flag, mapped to the flag's name.

        A negatable flag is also set by its ``LLAMA_ARG_NO_…`` variable (llama.cpp reads both), which maps
        to the ``no-…`` switch.
        """
        found: dict[str, str] = {}
        for flag in self.flags.values():
            if flag.env:
                found[flag.env] = flag.name
        return found


@dataclass
class _Entry:
    spellings: list[str]
    placeholder: str
    description: list[str]


def _entries(text: str) -> list[_Entry]:
    entries: list[_Entry] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.startswith("-----"):
            continue
        if _OPTION.match(line):
            match = _SPELLINGS.match(line)
            if match is None:
                continue
            spellings = [s.strip() for s in match["list"].split(",")]
            rest = match["rest"]
            placeholder = "" if rest.startswith("  ") or not rest.strip() else re.split(r"\s{2,}", rest.strip())[0]
            described = rest.strip()[len(placeholder):]
            entries.append(_Entry(spellings, placeholder, [described.strip()] if described.strip() else []))
        elif entries and line.startswith(" "):
            entries[-1].description.append(line.strip())
    return entries


def _split_negative(spellings: list[str]) -> tuple[list[str], list[str]]:
    """Positive spellings and ``no-`` spellings: the negative group starts after the last long positive
    spelling that precedes the first ``--no-…``."""
    longs = [i for i, s in enumerate(spellings) if s.startswith("--")]
    first_no = next((i for i in longs if spellings[i].startswith("--no-")), None)
    if first_no is None:
        return spellings, []
    positives = [i for i in longs if i < first_no]
    if not positives:
        return spellings, []
    cut = positives[-1] + 1
    return spellings[:cut], spellings[cut:]


def _main_name(spellings: list[str]) -> str:
    longs = [s for s in spellings if s.startswith("--")]
    return (longs[-1] if longs else spellings[-1]).lstrip("-")


def _choices(placeholder: str, description: str) -> tuple[str, ...] | None:
    match = _BRACKETS.match(placeholder)
    if match:
        listed = match["choices"] or match["angle"]
        return tuple(listed.split("|")) if listed else tuple(match["set"].split(","))
    allowed = _ALLOWED.search(description)
    if allowed:
        return tuple(v.strip() for v in allowed["values"].split(","))
    return None


def parse_help(text: str, source: str = "") -> LlamaFlagSet:
    """The flags of a ``llama-server --help`` text. Never raises; a text with no option line gives no flags."""
    names: set[str] = set()
    aliases: dict[str, str] = {}
    flags: dict[str, LlamaFlag] = {}
    removed: dict[str, str] = {}
    for entry in _entries(text):
        description = " ".join(entry.description)
        env_match = _ENV.search(description)
        env = env_match["env"] if env_match else None
        if description.startswith(_REMOVED):
            for spelling in entry.spellings:
                removed[spelling.lstrip("-")] = description.split("(env:")[0].strip()
            continue
        positive, negative = _split_negative(entry.spellings)
        main = _main_name(positive)
        if main in _UNLISTED:
            continue
        takes_value = bool(entry.placeholder)
        flags[main] = LlamaFlag(main, tuple(positive), takes_value, _choices(entry.placeholder, description), env,
                                placeholder=entry.placeholder)
        groups = [(positive, main)]
        if negative:
            negated = _main_name(negative)
            negative_env = env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_", 1) if env and "LLAMA_ARG_" in env else None
            flags[negated] = LlamaFlag(negated, tuple(negative), False, None, negative_env, negates=main)
            groups.append((negative, negated))
        for spellings, name in groups:
            names.add(name)
            for spelling in spellings:
                alias = spelling.lstrip("-")
                if alias != name:
                    aliases.setdefault(alias, name)
    for name in names:
        aliases.pop(name, None)
    return LlamaFlagSet(frozenset(names), aliases, source, flags=flags, removed=removed)


#: The spellings ``startup_log``, ``classify`` and the family's ``argv`` recognise without a ``--help`` text,
#: mapped to the flag's name (``tests/runtime/test_llamacpp_flags.py`` checks them against the real help).
KNOWN_ALIASES: Mapping[str, str] = {
    "c": "ctx-size", "np": "parallel", "b": "batch-size", "ub": "ubatch-size", "fa": "flash-attn",
    "ctk": "cache-type-k", "ctv": "cache-type-v", "ngl": "n-gpu-layers", "gpu-layers": "n-gpu-layers",
    "kvu": "kv-unified", "no-kvu": "no-kv-unified", "md": "model-draft", "spec-draft-model": "model-draft",
    "m": "model", "lv": "log-verbosity", "verbosity": "log-verbosity", "v": "log-verbose", "verbose": "log-verbose",
    "t": "threads", "tb": "threads-batch", "cram": "cache-ram", "nkvo": "no-kv-offload",
    "kvo": "kv-offload", "ngld": "n-gpu-layers-draft", "spec-draft-ngl": "n-gpu-layers-draft",
    "gpu-layers-draft": "n-gpu-layers-draft", "hf": "hf-repo", "hfr": "hf-repo",
}

#: The environment variable of each flag the boot report reads, from the same ``--help`` (and checked the same way).
KNOWN_ENV: Mapping[str, str] = {
    "LLAMA_ARG_CTX_SIZE": "ctx-size", "LLAMA_ARG_N_PARALLEL": "parallel", "LLAMA_ARG_BATCH": "batch-size",
    "LLAMA_ARG_UBATCH": "ubatch-size", "LLAMA_ARG_FLASH_ATTN": "flash-attn", "LLAMA_ARG_CACHE_TYPE_K": "cache-type-k",
    "LLAMA_ARG_CACHE_TYPE_V": "cache-type-v", "LLAMA_ARG_N_GPU_LAYERS": "n-gpu-layers",
    "LLAMA_ARG_KV_UNIFIED": "kv-unified", "LLAMA_ARG_NO_KV_UNIFIED": "no-kv-unified", "LLAMA_ARG_FIT": "fit",
    "LLAMA_ARG_SPEC_DRAFT_MODEL": "model-draft", "LLAMA_ARG_SPEC_TYPE": "spec-type", "LLAMA_ARG_MODEL": "model",
    "LLAMA_ARG_THREADS": "threads", "LLAMA_ARG_CACHE_RAM": "cache-ram", "LLAMA_ARG_LOG_VERBOSITY": "log-verbosity",
    "LLAMA_ARG_HOST": "host", "LLAMA_ARG_PORT": "port", "LLAMA_ARG_ENDPOINT_METRICS": "metrics",
}


def canonical(name: str) -> str:
    """``name`` (any spelling, with or without dashes) as the flag name ``KNOWN_ALIASES`` knows, else itself."""
    bare = name.lstrip("-")
    return KNOWN_ALIASES.get(bare, bare)
