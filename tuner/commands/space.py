"""``elsa-tune space show|check NAME_OR_PATH``: read a search space, and validate it against a runtime's flags."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Mapping

from elsa_tune.errors import ConfigError
from elsa_tune.runtime import flags as runtime_flags
from elsa_tune.runtime import sglang_flags
from elsa_tune.search_spaces.loader import list_shipped_spaces, load_space
from elsa_tune.search_spaces.space import FlagShape, SearchSpace

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
                       help="python of the venv with SGLang: check against its `-m sglang.launch_server --help` "
                            f"(default: the bundled SGLang {sglang_flags.SGLANG_VERSION} flag table, with choices)")
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


def _check(args: argparse.Namespace) -> int:
    space = _load(args)
    if args.runtime_python:
        # The real runtime's --help: flag names and aliases (value choices are checked with the bundled table).
        launch = (args.runtime_python, "-m", "sglang.launch_server")
        flag_set = runtime_flags.harvest(launch)
        source = f"the --help of {shlex.join(launch)}"
        space.validate_flags(flag_set.all_names())
    else:
        specs = sglang_flags.sglang_flags()
        source = f"the bundled SGLang {sglang_flags.SGLANG_VERSION} flag table"
        known: Mapping[str, FlagShape] = {name[2:]: spec for spec in specs for name in spec.names}
        space.validate_flags(known)
    screened = [t.name for t in space.techniques if t.screen]
    if space.model.path is None:
        raise ConfigError(f"search space {space.name!r} names no model, so no candidate can be built",
                          remedy="pass --model PATH")
    space.baseline()
    for name in screened:
        space.candidate(techniques=[name])
    used = {use.flag for use in space.flag_uses()}
    print(f"ok: {space.name}: {len(used)} flags checked against {source}; the baseline and "
          f"{len(screened)} screened techniques build and obey {len(space.rules)} rules")
    return 0
