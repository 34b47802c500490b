"""``elsa-tune space show|check NAME_OR_PATH``: read a search space, and validate it against a runtime's flags.

``space check --runtime-python PY`` asks the runtime installed in the environment of ``PY`` (SGLang or vLLM, the
space's ``runtime.family``): its own ``--help`` for the flag names and choices, and for vLLM also its own parser
and engine-config builder on the baseline and each screened technique (``runtime/vllm/flags.py``), with the
space's model a local folder holding ``config.json`` (no weights are read).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from elsa_tune.errors import ConfigError
from elsa_tune.runtime import flags as runtime_flags
from elsa_tune.runtime import sglang_flags
from elsa_tune.runtime.family import FamilyName, RuntimeFamily, family
from elsa_tune.runtime.vllm import flags as vllm_flags
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.search_spaces.loader import list_shipped_spaces, load_space
from elsa_tune.search_spaces.space import FlagShape, SearchSpace
from elsa_tune.tuner.argument_types import float_in

#: How long ``--runtime-python``'s ``--help`` may take in all (a runtime's import is slow; a hang is not).
HELP_DEADLINE_S = 40.0

NAME = "space"
HELP = "show a search space, or check it against the installed runtime's flags"
EXAMPLES = ('elsa-tune space list --json',
            'elsa-tune space show qwen3.8-27b-nvfp4-rtx5090',
            'elsa-tune space check my-space.yaml --runtime-python /opt/sglang/bin/python')


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="space_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print parameters, techniques and the baseline command line")
    _common(show)
    show.add_argument("--json", action="store_true", help="print the space as JSON")
    show.set_defaults(func=_show)
    check = sub.add_parser("check", help="load and validate the space against the runtime's --help flags")
    _common(check)
    check.add_argument("--runtime-python", metavar="PY",
                       help="python of the venv with the space's runtime: check against its own --help (SGLang: "
                            "`-m sglang.launch_server`; vLLM: `vllm serve --help=all`, then vLLM's parser and engine "
                            "config on every screened candidate) (default: the bundled SGLang "
                            f"{sglang_flags.SGLANG_VERSION} flag table, with choices)")
    check.add_argument("--help-timeout", metavar="SECONDS", type=float_in(1.0, 3600.0), default=HELP_DEADLINE_S,
                       help="with --runtime-python: the most its --help may take, in all, before it and every "
                            f"process it started are stopped (default: {HELP_DEADLINE_S:g})")
    check.set_defaults(func=_check)
    shipped = sub.add_parser("list", help="list the shipped search spaces")
    shipped.add_argument("--json", action="store_true", help="print the names as a JSON list")
    shipped.set_defaults(func=_list)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("space", metavar="NAME_OR_PATH", help="a shipped space name or a YAML file")
    parser.add_argument("--model", metavar="PATH", help="serve this model instead of the space's model.path")


def _load(args: argparse.Namespace) -> SearchSpace:
    space = load_space(args.space)
    return space.with_model(args.model) if args.model else space


def _list(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(list_shipped_spaces()))
        return 0
    for name in list_shipped_spaces():
        print(name)
    return 0


def _show(args: argparse.Namespace) -> int:
    space = _load(args)
    if args.json:
        json.dump(space.to_dict(), sys.stdout, indent=2, default=str)
        print()
        return 0
    out = [f"{space.name}  ({space.path})"]
    if space.description:
        out.append(f"  {space.description.strip()}")
    out.append(f"model: {space.model.path or '(none: pass --model PATH)'}"
               + (f"  context target {space.model.context_target}" if space.model.context_target else ""))
    launcher = shlex.join(space.runtime.command) if space.runtime.command else f"docker image {space.runtime.image}"
    out.append(f"runtime: {launcher}" + (f"  (expects {space.runtime.version})" if space.runtime.version else ""))
    out.append("parameters:")
    for p in space.parameters:
        span = (f"[{p.low:g}, {p.high:g}]" + (f" step {p.step:g}" if p.step else "") + (" log" if p.log else "")
                if p.is_numeric else "{" + ", ".join(map(str, p.choices or (False, True))) + "}")
        out.append(f"  {p.name:<28} {p.kind.value:<11} {span:<28} baseline {p.baseline}  -> {p.target}")
    for d in space.derived:
        out.append(f"  derived --{d.flag} = {d.expression}" + (f"  when {d.when}" if d.when else ""))
    out.append("rules:")
    out += [f"  {r.name}: {r.expression}" for r in space.rules] or ["  (none)"]
    out.append("techniques:")
    for t in space.techniques:
        bundle = " ".join([*(_flag_text(k, v) for k, v in t.flags.items()), *(f"{k}={v}" for k, v in t.env.items())])
        prior = f"  [prior {t.prior.verdict}: {t.prior.reason}]" if t.prior else ""
        screened = "" if t.screen else " (on record, not screened)"
        out.append(f"  {t.name} ({t.kind.value}){screened}: {bundle or '-'}{prior}")
    if space.model.path:
        baseline = space.baseline()
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in baseline.env.items())
        launch = shlex.join([*(space.runtime.command or ()), *baseline.argv()])
        out.append("baseline:")
        out.append(f"  {env + ' ' if env else ''}{launch}")
    print("\n".join(out))
    return 0


def _flag_text(flag: str, value: object) -> str:
    if value is None or value is False:
        return f"(no --{flag})"
    return f"--{flag}" if value is True else f"--{flag} {value}"


#: How the Python of an environment runs each Python runtime's server (``--runtime-python``).
_PYTHON_LAUNCH: Mapping[FamilyName, tuple[str, ...]] = {
    FamilyName.SGLANG: ("-m", "sglang.launch_server"),
    FamilyName.VLLM: ("-m", vllm_flags.CLI_MODULE, "serve"),
}


def _python_launch(runtime_family: RuntimeFamily, python: str) -> tuple[str, ...]:
    module = _PYTHON_LAUNCH.get(runtime_family.name)
    if module is None:
        raise ConfigError(f"--runtime-python checks a Python runtime; this space's runtime is "
                          f"{runtime_family.name.value}",
                          remedy="drop --runtime-python (a llama.cpp space is checked by `elsa-tune check`, which "
                                 "reads llama-server --help)")
    return (python, *module)


def _check(args: argparse.Namespace) -> int:
    space = _load(args)
    runtime_family = family(space.runtime.family)
    if args.runtime_python:
        # The real runtime's --help: flag names, aliases and (where its help lists them) choices.
        launch = _python_launch(runtime_family, args.runtime_python)
        flag_set = runtime_flags.harvest(launch, timeout_s=args.help_timeout, parse=runtime_family.parse_help,
                                         help_flag=runtime_family.help_flag,
                                         env={**os.environ, **runtime_family.help_env},
                                         longer="give it longer with --help-timeout SECONDS")
        source = f"the {runtime_family.help_flag} of {shlex.join(launch)}"
        space.validate_flags(flag_set.shapes())
    elif runtime_family.name is FamilyName.VLLM:
        from elsa_tune.runtime.sim import vllm_flags as bundled_vllm

        source = f"the bundled vLLM {bundled_vllm.VLLM_VERSION} flag table"
        space.validate_flags(bundled_vllm.flag_shapes())
    elif runtime_family.name is not FamilyName.SGLANG:
        raise ConfigError(f"space {space.name!r} is for {runtime_family.name.value}; elsa-tune bundles the flag "
                          "tables of SGLang and vLLM only",
                          remedy="check it with `elsa-tune check` (which reads the runtime's own --help)")
    else:
        specs = sglang_flags.sglang_flags()
        source = f"the bundled SGLang {sglang_flags.SGLANG_VERSION} flag table"
        known: Mapping[str, FlagShape] = {name[2:]: spec for spec in specs for name in spec.names}
        space.validate_flags(known)
    screened = [t.name for t in space.techniques if t.screen]
    if space.model.path is None:
        raise ConfigError(f"search space {space.name!r} names no model, so no candidate can be built",
                          remedy="pass --model PATH")
    candidates = [space.baseline(), *(space.candidate(techniques=[name]) for name in screened)]
    used = {use.flag for use in space.flag_uses()}
    deeper = ""
    if args.runtime_python and runtime_family.name is FamilyName.VLLM:
        deeper = _vllm_engine_check(args.runtime_python, space, candidates, ["baseline", *screened])
    print(f"ok: {space.name}: {len(used)} flags checked against {source}; the baseline and "
          f"{len(screened)} screened techniques build and obey {len(space.rules)} rules{deeper}")
    return 0


def _vllm_engine_check(python: str, space: SearchSpace, candidates: list[Candidate], names: list[str]) -> str:
    """Every candidate through vLLM's own parser and engine config; ``ConfigError`` naming each refusal."""
    model = space.model.path or ""
    if not (Path(model).expanduser() / "config.json").is_file():
        raise ConfigError(f"vLLM's engine config needs the model's config.json, and {model!r} is not a local folder "
                          "holding one",
                          remedy="pass --model DIR, a folder with the model's config.json (the weights are not read)")
    argvs = []
    for candidate in candidates:
        flags = {k: v for k, v in candidate.flags.items() if vllm_flags.canonical(k) != "model"}
        argvs.append([str(Path(model).expanduser()), *Candidate(flags=flags).argv()])
    refused = vllm_flags.rejected_by_vllm(python, argvs)
    if refused:
        lines = "; ".join(f"{names[i]}: {why}" for i, why in refused)
        raise ConfigError(f"vLLM refuses {len(refused)} of {len(argvs)} candidates of {space.name!r}: {lines}",
                          remedy="change the flags named above in the space (vLLM's own parser and engine config "
                                 "would refuse these boots)")
    return f"; vLLM's parser and engine config accept all {len(argvs)} ({model})"
