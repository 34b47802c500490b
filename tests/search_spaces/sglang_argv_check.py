"""Run inside a venv with sglang installed: check launch argvs with SGLang's own parser.

Reads ``[{"label": ..., "argv": [...]}, ...]`` as JSON on stdin and writes ``{"sglang": version,
"checked": n, "failures": [...]}`` on stdout. For each argv it runs
``sglang.srt.server_args.prepare_server_args`` (SGLang's argparse parser from ``ServerArgs.add_cli_args``,
then the ``ServerArgs`` record built from the namespace), catching argparse's exit and any exception,
then compares every given flag with the field it landed in, so a flag that parses into another field
(an alias or a prefix match) is caught too. Resolution (``resolve_once``) is not run: it needs a GPU and
the real model's config.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from typing import Any


def main() -> int:
    import sglang
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    actions = {option: action for action in parser._actions for option in action.option_strings}
    items = json.load(sys.stdin)
    failures = []
    for item in items:
        argv = item["argv"]
        problem = _check(argv, actions, prepare_server_args)
        if problem:
            failures.append({"label": item["label"], "argv": argv, "problem": problem})
    json.dump({"sglang": sglang.__version__, "checked": len(items), "failures": failures}, sys.stdout)
    return 0


def _check(argv: list[str], actions: dict[str, argparse.Action], prepare: Any) -> str | None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            server_args = prepare(argv)
    except SystemExit as exc:
        return f"argparse exit {exc.code}: {err.getvalue().strip().splitlines()[-1:]}"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    i = 0
    while i < len(argv):
        option = argv[i]
        action = actions.get(option)
        if action is None:
            return f"{option} is not an option string of the parser (accepted as a prefix?)"
        got = getattr(server_args, action.dest, "<missing>")
        if action.nargs == 0:
            if got is not True and got != getattr(action, "const", True):
                return f"{option} set {action.dest}={got!r}"
            i += 1
            continue
        given = argv[i + 1]
        expected = action.type(given) if callable(action.type) else given
        if got != expected:
            return f"{option} {given} set {action.dest}={got!r}, expected {expected!r}"
        i += 2
    return None


if __name__ == "__main__":
    raise SystemExit(main())
