"""Run inside a venv with sglang installed: does SGLang read a ``--config`` file as the same server arguments
as a command line?

Reads ``{"config": PATH, "argv": [...]}`` as JSON on stdin, parses ``["--config", PATH]`` and ``argv`` with
``sglang.srt.server_args.prepare_server_args`` (SGLang's own parser and config merger), and writes
``{"sglang": version, "error": str | null, "differences": {field: [from_config, from_argv]}, "compared": n}`` on
stdout, comparing every field SGLang's parser sets (the destinations of ``ServerArgs.add_cli_args``).
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

    item = json.load(sys.stdin)
    result: dict[str, Any] = {"sglang": sglang.__version__, "error": None, "differences": {}}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            from_config = prepare_server_args(["--config", item["config"]])
            from_argv = prepare_server_args(item["argv"])
    except SystemExit as exc:
        result["error"] = f"argparse exit {exc.code}: {err.getvalue().strip()[-2000:]}"
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    else:
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        fields = sorted({a.dest for a in parser._actions if a.dest not in ("help", "config")})
        for name in fields:
            a, b = getattr(from_config, name, None), getattr(from_argv, name, None)
            if a != b:
                result["differences"][name] = [repr(a), repr(b)]
        result["compared"] = len(fields)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
