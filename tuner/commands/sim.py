"""``elsa-tune sim serve|truth|profiles``: the simulated server, its noiseless truth, its profiles.

``sim serve`` takes SGLang 0.5.23's own flags (an unknown flag exits 2 with argparse's message, as SGLang
does) plus the sim's ``--sim-*`` knobs, and runs one simulated server process until SIGTERM. With
``--family vllm`` (first, before the runtime's flags) it takes ``vllm serve``'s flags instead (vLLM 0.33.0's
table, ``runtime/sim/vllm_flags.py``; an unknown flag exits 2 with ``vllm: error: unrecognized arguments``) and
speaks vLLM: its boot log, endpoints and metric names. It is a simulation calibrated to published measurements,
never a measurement of real hardware.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, cast

from elsa_tune.errors import ConfigError
from elsa_tune.runtime import sglang_flags
from elsa_tune.tuner.argument_types import positive_float

NAME = "sim"
HELP = "the simulated SGLang server (serve), a configuration's noiseless truth (truth), the shipped profiles"
EXAMPLES = ("elsa-tune sim profiles --json",
            "elsa-tune sim serve --sim-profile tiny-test --model-path tiny-hybrid --port 30000",
            "elsa-tune sim truth --sim-profile rtx5090-qwen3.8-27b-nvfp4 --model-path nvidia/Qwen3.8-27B-NVFP4 "
            "--page-size 32 --workload workload.json")


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sim_command", metavar="ACTION", required=True,
                                parser_class=_family_parser_class(type(parser)))
    serve = sub.add_parser("serve", help="run a simulated SGLang server (SGLang's flags + --sim-*), or a simulated "
                                         "vLLM server with --family vllm (vLLM's flags + --sim-*)")
    cast(Any, serve).family_switch = True   # the FamilyParser attribute: only `serve` switches family
    _sim_options(serve)
    serve.add_argument("--family", choices=("sglang", "vllm"), default="sglang",
                       help="the runtime family the server speaks (give it first: the flags after it are that "
                            "family's)")
    _serve_options(serve)
    sglang_flags.add_sglang_arguments(serve)
    serve.set_defaults(func=_serve)

    truth = sub.add_parser("truth", help="what a configuration is truly worth on a workload, without noise (JSON)")
    _sim_options(truth)
    truth.add_argument("--workload", required=True, metavar="JSON_OR_PATH",
                       help="a TruthWorkload as JSON text or a JSON file (see runtime/sim/truth.py)")
    truth.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                       help="an environment variable of the launch (repeatable)")
    sglang_flags.add_sglang_arguments(truth, require_model=False)
    truth.set_defaults(func=_truth)

    profiles = sub.add_parser("profiles", help="list the shipped simulation profiles")
    profiles.add_argument("--json", action="store_true", help="print the names as a JSON list")
    profiles.set_defaults(func=_profiles)


def _family_parser_class(base: type[argparse.ArgumentParser]) -> type[argparse.ArgumentParser]:
    """``base`` whose ``serve`` parser hands a ``--family vllm`` command line to vLLM's own parser."""

    class FamilyParser(base):  # type: ignore[valid-type,misc]
        family_switch = False

        def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
            values = list(sys.argv[1:] if args is None else args)
            family = _family_of(values) if self.family_switch else None
            if family is None or family == "sglang":
                return super().parse_known_args(values, namespace)
            from elsa_tune.runtime.sim.dialect import dialect

            speaks = dialect(family)
            parser = speaks.parser(f"{self.prog} --family {family}")
            _sim_options(parser)
            _serve_options(parser)
            parser.add_argument("--family", choices=(family,), default=family)
            parsed = parser.parse_args(values)
            if namespace is not None:
                for key, value in vars(parsed).items():
                    setattr(namespace, key, value)
                parsed = namespace
            parsed.func = _serve
            return parsed, []

    return FamilyParser


def _family_of(args: list[str]) -> str | None:
    for index, arg in enumerate(args):
        if arg == "--family" and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith("--family="):
            return arg.partition("=")[2]
    return None


def _serve_options(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--sim-seed", type=int, default=0, help="seed of boot drift, run noise and sampling")
    serve.add_argument("--sim-fault", default=None, metavar="FAULT",
                       help="inject faults (comma-separated; also $ELSA_SIM_FAULT): weights_oom, no_room_for_kv, "
                            "mamba_pool_too_small, cuda_graph_failed, host_oom_killed, technique_crash, unknown, "
                            "crash_after_requests=N, hang, hang_after_requests=N, slow_boot[=F], port_taken, "
                            "gpu_not_released[=S]")
    serve.add_argument("--sim-speedup", type=positive_float, default=1.0, metavar="X",
                       help="run simulated time X times faster than real time (boot and serving)")
    serve.add_argument("--sim-noise", choices=("profile", "off"), default="profile",
                       help="the profile's noise (boot drift, run noise, cold first pass) or none at all")
    serve.add_argument("--sim-card-dir", default=None, metavar="DIR",
                       help="the simulated GPU's shared state folder (default: $ELSA_SIM_CARD_DIR or a temp folder)")


def _sim_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sim-profile", required=True, metavar="NAME_OR_PATH",
                        help="a shipped profile name (elsa-tune sim profiles) or a profile YAML")
    parser.add_argument("--sim-config", default=None, metavar="NAME",
                        help="start from one of the profile's named configurations (flags and env, e.g. elsa-1.7); "
                             "flags on the command line win")


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The SGLang arguments given on the command line, over those of ``--sim-config`` (by ``ServerArgs`` field)."""
    known = {spec.dest for spec in sglang_flags.sglang_flags()}
    given = {k: v for k, v in vars(args).items() if k in known}
    if not args.sim_config:
        return given
    base: dict[str, Any] = {}
    for name, value in _config(args).flags.items():
        spec = sglang_flags.flag_by_name(name)
        if spec is None:
            raise ConfigError(f"--sim-config {args.sim_config}: unknown flag {name!r}",
                              remedy="fix the profile's configs section")
        if value is not None and value is not False:
            base[spec.dest] = value
    return {**base, **given}


def _config_env(args: argparse.Namespace) -> dict[str, str]:
    return dict(_config(args).env) if args.sim_config else {}


def _config(args: argparse.Namespace) -> Any:
    from elsa_tune.runtime.sim.profile import load_profile

    return load_profile(args.sim_profile).config(args.sim_config)


def _serve(args: argparse.Namespace) -> int:
    from elsa_tune.runtime.sim.dialect import dialect
    from elsa_tune.runtime.sim.launch import SimOptions, serve

    family = getattr(args, "family", "sglang") or "sglang"
    given = _given(args) if family == "sglang" else dialect(family).given(args)
    port = getattr(args, "port", None)
    if isinstance(port, int) and not 0 < port < 65536:   # a runtime's parser takes any integer; a socket does not
        raise ConfigError(f"--port {port} is not a TCP port", remedy="give --port a number from 1 to 65535")
    options = SimOptions(profile=args.sim_profile, given=given, family=family, seed=args.sim_seed,
                         fault=args.sim_fault,
                         speedup=args.sim_speedup, card_dir=args.sim_card_dir, quiet=args.sim_noise == "off",
                         argv=tuple(sys.argv),
                         env={**os.environ, **_config_env(args)})
    return int(serve(options))


def _truth(args: argparse.Namespace) -> int:
    from elsa_tune.runtime.sim.engine import SimRequest
    from elsa_tune.runtime.sim.profile import load_profile
    from elsa_tune.runtime.sim.truth import TruthWorkload, truth

    text = args.workload
    path = Path(text)
    try:
        data = json.loads(path.read_text() if not text.lstrip().startswith("{") and path.is_file() else text)
    except (OSError, ValueError, RecursionError) as exc:   # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ConfigError(f"--workload: not JSON text or a readable JSON file: {exc}",
                          remedy='pass e.g. --workload \'{"concurrency": 8, "input_tokens": [1024], '
                                 '"output_tokens": [1024]}\'') from exc
    try:
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        if "requests" in fields:
            fields["requests"] = tuple(SimRequest(**{**r, "block_hashes": tuple(r.get("block_hashes", ()))})
                                       for r in fields["requests"])
        workload = TruthWorkload(**fields)
    except (TypeError, AttributeError) as exc:
        raise ConfigError(f"--workload: {exc}", remedy="use the fields of runtime/sim/truth.py TruthWorkload") from exc
    problem = workload.problem()
    if problem is not None:
        raise ConfigError(f"--workload: {problem}", remedy="use the fields of runtime/sim/truth.py TruthWorkload")
    env = _config_env(args)
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--env {item!r}: expected NAME=VALUE", remedy="write --env NAME=VALUE")
        env[name] = value
    result = truth(load_profile(args.sim_profile), sglang_flags.requested_flags(_given(args)), env, workload)
    print(json.dumps(_jsonable(result), indent=2, sort_keys=True, allow_nan=False))
    return 0


def _profiles(args: argparse.Namespace) -> int:
    from elsa_tune.runtime.sim.profile import list_profiles

    if args.json:
        import json

        print(json.dumps(list_profiles()))
        return 0
    for name in list_profiles():
        print(name)
    return 0


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None     # JSON has no NaN: a figure that cannot be computed is null
    return value
