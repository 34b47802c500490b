"""Run by the Python named in ``ELSA_VLLM_PYTHON`` (vLLM 0.33.0): read ``best/server-args.yaml`` with vLLM's own
``--config`` and ``best/launch.sh``'s flags with its own parser, compare every field, and build the engine config.

stdin: ``{"config": PATH, "argv": [MODEL, FLAG, …]}``; stdout: one JSON object with ``vllm`` (the version),
``error`` (``None`` when both parse and the engine config builds), ``differences`` and ``compared``.
"""

import json
import sys

import vllm
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser


def parse(argv):
    args = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(argv)
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    args.model_tag = None
    return args


request = json.load(sys.stdin)
result = {"vllm": vllm.__version__, "error": None, "differences": {}, "compared": 0}
try:
    from_config = vars(parse(["--config", request["config"]]))
    from_launch = vars(parse(request["argv"]))
    result["compared"] = len(from_config)
    result["differences"] = {k: [repr(from_config.get(k)), repr(from_launch.get(k))]
                             for k in sorted(set(from_config) | set(from_launch))
                             if from_config.get(k) != from_launch.get(k)}
    AsyncEngineArgs.from_cli_args(parse(["--config", request["config"]])).create_engine_config()
except BaseException as exc:   # the checker reports every refusal, SystemExit included
    result["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(result))
