"""vLLM 0.33.0's own ``vllm serve`` flags, so the simulated server parses a command line exactly like vLLM.

The table below was harvested from the real parser (``make_arg_parser(FlexibleArgumentParser())`` of the
``vllm==0.33.0`` wheel, built with ``VLLM_TARGET_DEVICE=cpu``) by ``harvest()``; regenerate it with
``render_table(harvest(python))`` when the version moves. A parser built from it behaves like vLLM's where the
tuner can tell: an unknown flag exits 2 with ``vllm: error: unrecognized arguments: …`` after the usage block,
typed values, JSON values and choices are checked, ``--enable-x``/``--disable-x`` pairs and ``--no-x`` negations
work, ``--flag_name`` is read as ``--flag-name`` and ``--flag=value`` as ``--flag value`` (``FlexibleArgumentParser``),
and the model may be given as ``vllm serve MODEL`` or ``--model MODEL``. Like vLLM's own parser it accepts
abbreviated prefixes and values only the engine configuration rejects (``--kv-cache-dtype fp7``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NoReturn

from elsa_tune.errors import RuntimeUnavailable
from elsa_tune.search_spaces.candidate import FlagValue

VLLM_VERSION = "0.33.0"

#: (option strings, negative option strings, dest, kind, nargs, choices, default); kinds: a value type (``str``,
#: ``int``, ``float``, ``json``, ``json_or_str``, ``hint`` = human-readable int, ``hint_auto`` = the same or
#: ``auto``/-1), ``bool`` (an enable/disable pair or ``--x``/``--no-x``), ``true`` (store_true), ``append:str``.
Row = tuple[str, str | None, str, str, str | None, str | None, Any]


@dataclass(frozen=True)
class VllmFlag:
    """One ``vllm serve`` flag: its option strings, the ones that turn it off, the ``EngineArgs`` field it sets."""

    names: tuple[str, ...]
    negatives: tuple[str, ...]
    dest: str
    kind: str
    nargs: str | None
    choices: tuple[str, ...] | None
    default: Any

    @property
    def name(self) -> str:
        """The primary flag name without dashes, the form ``Candidate.flags`` uses."""
        return self.names[0][2:]

    @property
    def takes_value(self) -> bool:
        return self.kind not in ("bool", "true")


def flag_shapes() -> dict[str, VllmFlag]:
    """Every ``vllm serve`` option name without dashes (aliases and negations included) → its flag, the form
    ``SearchSpace.validate_flags`` takes."""
    return {name.lstrip("-"): flag for flag in _FLAGS for name in (*flag.names, *flag.negatives)
            if name.startswith("--")}


def vllm_flags() -> tuple[VllmFlag, ...]:
    return _FLAGS


def flag_by_name(name: str) -> VllmFlag | None:
    """The flag whose option string is ``--name`` (any alias, dashes or underscores), or ``None``."""
    return _BY_OPTION.get(f"--{name.lstrip('-').replace('_', '-')}")


class VllmArgumentParser(argparse.ArgumentParser):
    """``vllm serve``'s parser: vLLM's usage errors (exit 2) and ``FlexibleArgumentParser``'s spellings."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        return super().parse_known_args(normalize(sys.argv[1:] if args is None else args), namespace)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, rest = self.parse_known_args(args, namespace)
        if rest:
            # the top-level ``vllm`` parser reports what the ``serve`` sub-parser left over
            self.print_usage(sys.stderr)
            self.exit(2, f"vllm: error: unrecognized arguments: {' '.join(rest)}\n")
        return parsed

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def parser(prog: str = "vllm serve", *, add_help: bool = True) -> VllmArgumentParser:
    """A parser of every ``vllm serve`` flag with defaults suppressed (the namespace holds only what was given)."""
    built = VllmArgumentParser(prog=prog, add_help=add_help)
    add_vllm_arguments(built)
    return built


def add_vllm_arguments(target: argparse.ArgumentParser) -> None:
    """Add every ``vllm serve`` flag and its optional positional ``model_tag`` to ``target``, defaults suppressed."""
    target.add_argument("model_tag", nargs="?", default=argparse.SUPPRESS, help="the model (as --model)")
    for flag in _FLAGS:
        kwargs: dict[str, Any] = {"dest": flag.dest, "default": argparse.SUPPRESS}
        if flag.kind == "bool":
            target.add_argument(*flag.names, action="store_const", const=True, **kwargs)
            target.add_argument(*flag.negatives, action="store_const", const=False, **kwargs)
            continue
        if flag.kind == "true":
            kwargs["action"] = "store_true"
        else:
            kind = flag.kind.removeprefix("append:")
            if flag.kind.startswith("append:"):
                kwargs["action"] = "append"
            kwargs["type"] = _TYPES[kind]
            if flag.nargs is not None:
                kwargs["nargs"] = flag.nargs
            if flag.choices is not None:
                kwargs["choices"] = tuple(int(c) for c in flag.choices) if kind == "int" else flag.choices
        target.add_argument(*flag.names, **kwargs)


def normalize(args: Sequence[str]) -> list[str]:
    """``FlexibleArgumentParser``'s spellings: ``--flag_name`` is ``--flag-name``; ``--flag=value`` is split."""
    out: list[str] = []
    for arg in args:
        if arg.startswith("--") and len(arg) > 2:
            key, sep, value = arg.partition("=")
            out.append(key.replace("_", "-"))
            if sep:
                out.append(value)
        else:
            out.append(arg)
    return out


def given_args(namespace: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
    """The ``EngineArgs`` fields that were given (``model_tag`` read as ``model``, as ``vllm serve`` does)."""
    values = dict(vars(namespace) if isinstance(namespace, argparse.Namespace) else namespace)
    tag = values.pop("model_tag", None)
    if tag is not None and "model" not in values:
        values["model"] = tag
    known = {flag.dest for flag in _FLAGS}
    return {k: v for k, v in values.items() if k in known}


def requested_flags(given: Mapping[str, Any]) -> dict[str, FlagValue]:
    """The flags that were given, keyed by primary flag name (``Candidate`` convention); lists and dicts as JSON."""
    flags: dict[str, FlagValue] = {}
    for dest, value in given.items():
        flag = _BY_DEST.get(dest)
        if flag is None:
            continue
        if isinstance(value, (list, dict)):
            flags[flag.name] = json.dumps(value) if not (isinstance(value, list) and len(value) == 1
                                                         and isinstance(value[0], str)) else value[0]
        else:
            flags[flag.name] = value
    return flags


def non_default_args(given: Mapping[str, Any]) -> dict[str, Any]:
    """What ``non-default args: {…}`` prints: the given fields whose value differs from vLLM's default."""
    return {dest: value for dest, value in given.items()
            if dest in _BY_DEST and value != _BY_DEST[dest].default}


def harvest(python: str, timeout_s: float = 300.0) -> tuple[VllmFlag, ...]:
    """Read the flag table from an installed vLLM by building its real parser in ``python``."""
    try:
        done = subprocess.run([python, "-c", _HARVEST], capture_output=True, text=True, timeout=timeout_s,
                              check=False, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeUnavailable(f"cannot run {python} to read vLLM's flags: {exc}",
                                 remedy="point at the python of a venv where vllm is installed") from exc
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-5:])
        raise RuntimeUnavailable(f"{python} could not build vLLM's parser:\n{tail}",
                                 remedy="check that vllm imports in that environment (VLLM_TARGET_DEVICE=cpu)")
    return tuple(_flag(("|".join(names), "|".join(negatives) or None, dest, kind, nargs,
                        "|".join(choices) if choices else None, default))
                 for names, negatives, dest, kind, nargs, choices, default in json.loads(done.stdout)["rows"])


def render_table(flags: Sequence[VllmFlag]) -> str:
    """The ``_TABLE`` literal for this module, one flag per line (long rows one value per line)."""
    lines: list[str] = []
    for flag in flags:
        choices = "|".join(flag.choices) if flag.choices else None
        row = ("|".join(flag.names), "|".join(flag.negatives) or None, flag.dest, flag.kind, flag.nargs, choices,
               flag.default)
        line = f"    {row!r},"
        if len(line) <= 120:
            lines.append(line)
            continue
        values = ["\n     ".join(_pieces(v)) if isinstance(v, str) and len(repr(v)) > 100 else repr(v) for v in row]
        lines.append("    (" + ",\n     ".join(values) + "),")
    return "\n".join(lines)


def _pieces(text: str) -> list[str]:
    pieces: list[str] = []
    while text:
        cut = text.rfind("|", 0, 100) + 1 if len(text) > 100 else len(text)
        pieces.append(repr(text[:cut]))
        text = text[cut:]
    return pieces


def _human_readable_int(value: str, *, auto: bool = False) -> int:
    # vLLM's utils/argparse_utils.py: k/m/g/t decimal (1k = 1,000), K/M/G/T binary (1K = 1,024).
    value = value.strip()
    if auto and (value == "-1" or value.lower() == "auto"):
        return -1
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
        binary = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
        if suffix in decimal:
            return int(Decimal(number) * decimal[suffix])
        if "." in number:
            raise argparse.ArgumentTypeError(f"Decimals are not allowed with binary suffixes like {suffix}. "
                                             f"Did you mean to use {number}{suffix.lower()} instead?")
        return int(number) * binary[suffix]
    try:
        return int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"Invalid number: {value!r}") from exc


def _human_readable_int_or_auto(value: str) -> int:
    return _human_readable_int(value, auto=True)


def _json_value(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"Invalid JSON: {value}: {exc}") from exc


def _json_or_str(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


_TYPES: dict[str, Any] = {"str": str, "int": int, "float": float, "json": _json_value, "json_or_str": _json_or_str,
                          "hint": _human_readable_int, "hint_auto": _human_readable_int_or_auto}


def _flag(row: Row) -> VllmFlag:
    names, negatives, dest, kind, nargs, choices, default = row
    return VllmFlag(names=tuple(names.split("|")), negatives=tuple(negatives.split("|")) if negatives else (),
                    dest=dest, kind=kind, nargs=nargs, choices=tuple(choices.split("|")) if choices else None,
                    default=default)


_HARVEST = r'''
import argparse, json, sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.entrypoints.common.cli_args import make_arg_parser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
    from vllm.entrypoints.openai.cli_args import make_arg_parser
import vllm
p = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
def tname(t):
    if t is None: return None
    n = getattr(t, "__name__", "")
    if n == "_optional_type":
        for c in (t.__closure__ or ()):
            inner = c.cell_contents
            if callable(inner): return tname(inner)
    return {"str": "str", "int": "int", "float": "float", "human_readable_int": "hint",
            "human_readable_int_or_auto": "hint_auto", "loads": "json", "parse_dataclass": "json",
            "union_dict_and_str": "json_or_str", "_parse_type": "json"}.get(n, "str")
rows = []
for a in p._actions:
    if not a.option_strings or a.dest == "help":
        continue
    cls = type(a).__name__
    neg = sorted(getattr(a, "negative_option_strings", ()) or ())
    if cls in ("EnableDisableAction", "BooleanOptionalAction"):
        kind = "bool"
        if not neg:
            neg = [o for o in a.option_strings if o.startswith("--no-")]
    elif cls == "_StoreTrueAction": kind = "true"
    elif cls == "_AppendAction": kind = "append:" + (tname(a.type) or "str")
    else: kind = tname(a.type) or "str"
    d = a.default
    try: json.dumps(d)
    except TypeError: d = None
    ch = list(a.choices) if a.choices is not None else None
    if ch is not None:
        ch = [str(c) for c in ch]
    pos = [o for o in a.option_strings if o not in neg]
    rows.append([pos, neg, a.dest, kind, a.nargs if a.nargs not in (0, None) else None, ch, d])
json.dump({"version": vllm.__version__, "rows": rows}, sys.stdout)
'''

# Harvested from vllm==0.33.0 (vllm serve): (names, negatives, dest, kind, nargs, choices, default).
_TABLE: tuple[Row, ...] = (
    ('--headless', None, 'headless', 'true', None, None, False),
    ('--api-server-count|-asc', None, 'api_server_count', 'int', None, None, None),
    ('--config', None, 'config', 'str', None, None, None),
    ('--grpc', None, 'grpc', 'true', None, None, False),
    ('--lora-modules', None, 'lora_modules', 'str', '+', None, None),
    ('--chat-template', None, 'chat_template', 'str', None, None, None),
    ('--chat-template-content-format', None, 'chat_template_content_format', 'str', None, 'auto|openai|string', 'auto'),
    ('--trust-request-chat-template',
     '--no-trust-request-chat-template',
     'trust_request_chat_template',
     'bool',
     None,
     None,
     False),
    ('--trust-request-mm-kwargs', '--no-trust-request-mm-kwargs', 'trust_request_mm_kwargs', 'bool', None, None, False),
    ('--default-chat-template-kwargs', None, 'default_chat_template_kwargs', 'json', None, None, None),
    ('--reasoning-effort-map', None, 'reasoning_effort_map', 'json', None, None, None),
    ('--response-role', None, 'response_role', 'str', None, None, 'assistant'),
    ('--return-tokens-as-token-ids',
     '--no-return-tokens-as-token-ids',
     'return_tokens_as_token_ids',
     'bool',
     None,
     None,
     False),
    ('--enable-auto-tool-choice',
     '--disable-auto-tool-choice|--no-enable-auto-tool-choice',
     'enable_auto_tool_choice',
     'bool',
     None,
     None,
     False),
    ('--exclude-tools-when-tool-choice-none',
     '--no-exclude-tools-when-tool-choice-none',
     'exclude_tools_when_tool_choice_none',
     'bool',
     None,
     None,
     False),
    ('--tool-call-parser', None, 'tool_call_parser', 'str', None, None, None),
    ('--tool-parser-plugin', None, 'tool_parser_plugin', 'str', None, None, ''),
    ('--tool-strict-level', None, 'tool_strict_level', 'str', None, 'auto|function|parameter|None', None),
    ('--tool-server', None, 'tool_server', 'str', None, None, None),
    ('--max-log-len', None, 'max_log_len', 'int', None, None, None),
    ('--enable-prompt-tokens-details',
     '--disable-prompt-tokens-details|--no-enable-prompt-tokens-details',
     'enable_prompt_tokens_details',
     'bool',
     None,
     None,
     False),
    ('--enable-per-request-metrics',
     '--disable-per-request-metrics|--no-enable-per-request-metrics',
     'enable_per_request_metrics',
     'bool',
     None,
     None,
     False),
    ('--enable-server-load-tracking',
     '--disable-server-load-tracking|--no-enable-server-load-tracking',
     'enable_server_load_tracking',
     'bool',
     None,
     None,
     False),
    ('--enable-force-include-usage',
     '--disable-force-include-usage|--no-enable-force-include-usage',
     'enable_force_include_usage',
     'bool',
     None,
     None,
     False),
    ('--sse-keep-alive-interval', None, 'sse_keep_alive_interval', 'int', None, None, 0),
    ('--enable-tokenizer-info-endpoint',
     '--disable-tokenizer-info-endpoint|--no-enable-tokenizer-info-endpoint',
     'enable_tokenizer_info_endpoint',
     'bool',
     None,
     None,
     False),
    ('--enable-log-outputs',
     '--disable-log-outputs|--no-enable-log-outputs',
     'enable_log_outputs',
     'bool',
     None,
     None,
     False),
    ('--enable-log-deltas',
     '--disable-log-deltas|--no-enable-log-deltas',
     'enable_log_deltas',
     'bool',
     None,
     None,
     True),
    ('--cohere-is-reasoning-model',
     '--no-cohere-is-reasoning-model',
     'cohere_is_reasoning_model',
     'bool',
     None,
     None,
     True),
    ('--cohere-format', None, 'cohere_format', 'str', None, None, 'cmd4'),
    ('--anthropic-disabled-thinking-effort',
     None,
     'anthropic_disabled_thinking_effort',
     'str',
     None,
     'auto|high|low|max|medium|none|xhigh',
     'auto'),
    ('--log-error-stack', '--no-log-error-stack', 'log_error_stack', 'bool', None, None, False),
    ('--tokens-only', '--no-tokens-only', 'tokens_only', 'bool', None, None, False),
    ('--enable-scale-out', '--disable-scale-out|--no-enable-scale-out', 'enable_scale_out', 'bool', None, None, False),
    ('--fingerprint-mode', None, 'fingerprint_mode', 'str', None, 'custom|full|hash|none', 'full'),
    ('--fingerprint-value', None, 'fingerprint_value', 'str', None, None, None),
    ('--host', None, 'host', 'str', None, None, None),
    ('--port', None, 'port', 'int', None, None, 8000),
    ('--grpc-port', None, 'grpc_port', 'int', None, None, None),
    ('--data-parallel-supervisor-port', None, 'data_parallel_supervisor_port', 'int', None, None, 9256),
    ('--dp-supervisor-probe-interval-s', None, 'dp_supervisor_probe_interval_s', 'float', None, None, 5.0),
    ('--dp-supervisor-probe-timeout-s', None, 'dp_supervisor_probe_timeout_s', 'float', None, None, 5.0),
    ('--dp-supervisor-probe-failure-threshold', None, 'dp_supervisor_probe_failure_threshold', 'int', None, None, 3),
    ('--uds', None, 'uds', 'str', None, None, None),
    ('--uvicorn-log-level', None, 'uvicorn_log_level', 'str', None, 'critical|debug|error|info|trace|warning', 'info'),
    ('--disable-uvicorn-access-log',
     '--enable-uvicorn-access-log|--no-disable-uvicorn-access-log',
     'disable_uvicorn_access_log',
     'bool',
     None,
     None,
     False),
    ('--disable-access-log-for-endpoints', None, 'disable_access_log_for_endpoints', 'str', None, None, None),
    ('--allow-credentials', '--no-allow-credentials', 'allow_credentials', 'bool', None, None, False),
    ('--allowed-origins', None, 'allowed_origins', 'json', None, None, []),
    ('--allowed-methods', None, 'allowed_methods', 'json', None, None, ['*']),
    ('--allowed-headers', None, 'allowed_headers', 'json', None, None, ['*']),
    ('--api-key', None, 'api_key', 'str', '+', None, None),
    ('--ssl-keyfile', None, 'ssl_keyfile', 'str', None, None, None),
    ('--ssl-certfile', None, 'ssl_certfile', 'str', None, None, None),
    ('--ssl-ca-certs', None, 'ssl_ca_certs', 'str', None, None, None),
    ('--enable-ssl-refresh',
     '--disable-ssl-refresh|--no-enable-ssl-refresh',
     'enable_ssl_refresh',
     'bool',
     None,
     None,
     False),
    ('--ssl-cert-reqs', None, 'ssl_cert_reqs', 'int', None, None, 0),
    ('--ssl-ciphers', None, 'ssl_ciphers', 'str', None, None, None),
    ('--root-path', None, 'root_path', 'str', None, None, None),
    ('--middleware', None, 'middleware', 'append:str', None, None, []),
    ('--enable-request-id-headers',
     '--disable-request-id-headers|--no-enable-request-id-headers',
     'enable_request_id_headers',
     'bool',
     None,
     None,
     False),
    ('--disable-fastapi-docs',
     '--enable-fastapi-docs|--no-disable-fastapi-docs',
     'disable_fastapi_docs',
     'bool',
     None,
     None,
     False),
    ('--h11-max-incomplete-event-size', None, 'h11_max_incomplete_event_size', 'int', None, None, 4194304),
    ('--h11-max-header-count', None, 'h11_max_header_count', 'int', None, None, 256),
    ('--enable-offline-docs',
     '--disable-offline-docs|--no-enable-offline-docs',
     'enable_offline_docs',
     'bool',
     None,
     None,
     False),
    ('--enable-flash-late-interaction',
     '--disable-flash-late-interaction|--no-enable-flash-late-interaction',
     'enable_flash_late_interaction',
     'bool',
     None,
     None,
     True),
    ('--model', None, 'model', 'str', None, None, 'Qwen/Qwen3-0.6B'),
    ('--runner', None, 'runner', 'str', None, 'auto|draft|generate|pooling', 'auto'),
    ('--convert', None, 'convert', 'str', None, 'auto|classify|embed|none', 'auto'),
    ('--tokenizer', None, 'tokenizer', 'str', None, None, None),
    ('--tokenizer-mode', None, 'tokenizer_mode', 'str', None, None, 'auto'),
    ('--trust-remote-code', '--no-trust-remote-code', 'trust_remote_code', 'bool', None, None, False),
    ('--dtype', None, 'dtype', 'str', None, 'auto|bfloat16|float|float16|float32|half', 'auto'),
    ('--seed', None, 'seed', 'int', None, None, 0),
    ('--hf-config-path', None, 'hf_config_path', 'str', None, None, None),
    ('--allowed-local-media-path', None, 'allowed_local_media_path', 'str', None, None, ''),
    ('--allowed-media-domains', None, 'allowed_media_domains', 'str', '+', None, None),
    ('--revision', None, 'revision', 'str', None, None, None),
    ('--code-revision', None, 'code_revision', 'str', None, None, None),
    ('--tokenizer-revision', None, 'tokenizer_revision', 'str', None, None, None),
    ('--max-model-len', None, 'max_model_len', 'hint_auto', None, None, None),
    ('--quantization|-q', None, 'quantization', 'str', None, None, None),
    ('--quantization-config', None, 'quantization_config', 'json', None, None, None),
    ('--allow-deprecated-quantization',
     '--no-allow-deprecated-quantization',
     'allow_deprecated_quantization',
     'bool',
     None,
     None,
     False),
    ('--enforce-eager', '--no-enforce-eager', 'enforce_eager', 'bool', None, None, False),
    ('--enable-return-routed-experts',
     '--disable-return-routed-experts|--no-enable-return-routed-experts',
     'enable_return_routed_experts',
     'bool',
     None,
     None,
     False),
    ('--return-sampling-mask', '--no-return-sampling-mask', 'return_sampling_mask', 'bool', None, None, False),
    ('--max-logprobs', None, 'max_logprobs', 'int', None, None, 20),
    ('--logprobs-mode',
     None,
     'logprobs_mode',
     'str',
     None,
     'processed_logits|processed_logprobs|raw_logits|raw_logprobs',
     'raw_logprobs'),
    ('--use-fp64-gumbel', '--no-use-fp64-gumbel', 'use_fp64_gumbel', 'bool', None, None, False),
    ('--enable-trace-replay',
     '--disable-trace-replay|--no-enable-trace-replay',
     'enable_trace_replay',
     'bool',
     None,
     None,
     False),
    ('--disable-sliding-window',
     '--enable-sliding-window|--no-disable-sliding-window',
     'disable_sliding_window',
     'bool',
     None,
     None,
     False),
    ('--disable-cascade-attn',
     '--enable-cascade-attn|--no-disable-cascade-attn',
     'disable_cascade_attn',
     'bool',
     None,
     None,
     None),
    ('--skip-tokenizer-init', '--no-skip-tokenizer-init', 'skip_tokenizer_init', 'bool', None, None, False),
    ('--enable-prompt-embeds',
     '--disable-prompt-embeds|--no-enable-prompt-embeds',
     'enable_prompt_embeds',
     'bool',
     None,
     None,
     False),
    ('--served-model-name', None, 'served_model_name', 'str', '+', None, None),
    ('--config-format', None, 'config_format', 'str', None, None, 'auto'),
    ('--hf-token', None, 'hf_token', 'str', '?', None, None),
    ('--hf-overrides', None, 'hf_overrides', 'json_or_str', None, None, {}),
    ('--model-class-overrides', None, 'model_class_overrides', 'json', None, None, {}),
    ('--pooler-config', None, 'pooler_config', 'json', None, None, None),
    ('--generation-config', None, 'generation_config', 'str', None, None, 'auto'),
    ('--override-generation-config', None, 'override_generation_config', 'json', None, None, {}),
    ('--enable-sleep-mode',
     '--disable-sleep-mode|--no-enable-sleep-mode',
     'enable_sleep_mode',
     'bool',
     None,
     None,
     False),
    ('--sleep-mode-backend', None, 'sleep_mode_backend', 'str', None, None, 'cumem'),
    ('--sleep-mode-offload-cudagraph',
     '--no-sleep-mode-offload-cudagraph',
     'sleep_mode_offload_cudagraph',
     'bool',
     None,
     None,
     False),
    ('--sleep-preserve-parameter-names', None, 'sleep_preserve_parameter_names', 'str', '+', None, []),
    ('--enable-cumem-allocator',
     '--disable-cumem-allocator|--no-enable-cumem-allocator',
     'enable_cumem_allocator',
     'bool',
     None,
     None,
     False),
    ('--enable-nccl-comm-suspend',
     '--disable-nccl-comm-suspend|--no-enable-nccl-comm-suspend',
     'enable_nccl_comm_suspend',
     'bool',
     None,
     None,
     False),
    ('--model-impl', None, 'model_impl', 'str', None, None, 'auto'),
    ('--logits-processors', None, 'logits_processors', 'str', '+', None, None),
    ('--io-processor-plugin', None, 'io_processor_plugin', 'str', None, None, None),
    ('--renderer-num-workers', None, 'renderer_num_workers', 'int', None, None, 1),
    ('--load-format', None, 'load_format', 'str', None, None, 'auto'),
    ('--download-dir', None, 'download_dir', 'str', None, None, None),
    ('--safetensors-load-strategy',
     None,
     'safetensors_load_strategy',
     'str',
     None,
     'eager|lazy|prefetch|torchao|None',
     None),
    ('--safetensors-prefetch-num-threads', None, 'safetensors_prefetch_num_threads', 'int', None, None, 8),
    ('--safetensors-prefetch-block-size', None, 'safetensors_prefetch_block_size', 'hint', None, None, 16777216),
    ('--model-loader-extra-config', None, 'model_loader_extra_config', 'json_or_str', None, None, {}),
    ('--ignore-patterns', None, 'ignore_patterns', 'str', '+', None, ['original/**/*']),
    ('--use-tqdm-on-load', '--no-use-tqdm-on-load', 'use_tqdm_on_load', 'bool', None, None, True),
    ('--pt-load-map-location', None, 'pt_load_map_location', 'json_or_str', None, None, 'cpu'),
    ('--attention-backend', None, 'attention_backend', 'str', None, None, None),
    ('--mamba-backend', None, 'mamba_backend', 'str', None, None, None),
    ('--mamba-ssu-algorithm', None, 'mamba_ssu_algorithm', 'str', None, 'auto|horizontal|simple|vertical|None', None),
    ('--enable-mamba-cache-stochastic-rounding',
     '--disable-mamba-cache-stochastic-rounding|--no-enable-mamba-cache-stochastic-rounding',
     'enable_mamba_cache_stochastic_rounding',
     'bool',
     None,
     None,
     False),
    ('--mamba-cache-philox-rounds', None, 'mamba_cache_philox_rounds', 'int', None, None, 0),
    ('--reasoning-parser', None, 'reasoning_parser', 'str', None, None, ''),
    ('--reasoning-parser-plugin', None, 'reasoning_parser_plugin', 'str', None, None, ''),
    ('--distributed-executor-backend', None, 'distributed_executor_backend', 'str', None, None, None),
    ('--pipeline-parallel-size|-pp', None, 'pipeline_parallel_size', 'int', None, None, 1),
    ('--master-addr', None, 'master_addr', 'str', None, None, '127.0.0.1'),
    ('--master-port', None, 'master_port', 'int', None, None, 29501),
    ('--nnodes|-n', None, 'nnodes', 'int', None, None, 1),
    ('--node-rank|-r', None, 'node_rank', 'int', None, None, 0),
    ('--distributed-timeout-seconds', None, 'distributed_timeout_seconds', 'int', None, None, None),
    ('--cpu-distributed-timeout-seconds', None, 'cpu_distributed_timeout_seconds', 'int', None, None, None),
    ('--numa-bind', '--no-numa-bind', 'numa_bind', 'bool', None, None, False),
    ('--numa-bind-nodes', None, 'numa_bind_nodes', 'int', '+', None, None),
    ('--numa-bind-cpus', None, 'numa_bind_cpus', 'str', '+', None, None),
    ('--device-ids', None, 'device_ids', 'str', None, None, None),
    ('--tensor-parallel-size|-tp', None, 'tensor_parallel_size', 'int', None, None, 1),
    ('--decode-context-parallel-size|-dcp', None, 'decode_context_parallel_size', 'int', None, None, 1),
    ('--dcp-comm-backend', None, 'dcp_comm_backend', 'str', None, 'a2a|ag_rs|None', None),
    ('--dcp-q-replicate', '--no-dcp-q-replicate', 'dcp_q_replicate', 'bool', None, None, None),
    ('--dcp-kv-cache-interleave-size', None, 'dcp_kv_cache_interleave_size', 'int', None, None, 1),
    ('--cp-kv-cache-interleave-size', None, 'cp_kv_cache_interleave_size', 'int', None, None, None),
    ('--prefill-context-parallel-size|-pcp', None, 'prefill_context_parallel_size', 'int', None, None, 1),
    ('--data-parallel-size|-dp', None, 'data_parallel_size', 'int', None, None, 1),
    ('--data-parallel-rank|-dpn', None, 'data_parallel_rank', 'int', None, None, None),
    ('--data-parallel-start-rank|-dpr', None, 'data_parallel_start_rank', 'int', None, None, None),
    ('--data-parallel-size-local|-dpl', None, 'data_parallel_size_local', 'int', None, None, None),
    ('--data-parallel-address|-dpa', None, 'data_parallel_address', 'str', None, None, None),
    ('--data-parallel-rpc-port|-dpp', None, 'data_parallel_rpc_port', 'int', None, None, None),
    ('--data-parallel-backend|-dpb', None, 'data_parallel_backend', 'str', None, None, 'mp'),
    ('--data-parallel-hybrid-lb|-dph',
     '--no-data-parallel-hybrid-lb',
     'data_parallel_hybrid_lb',
     'bool',
     None,
     None,
     False),
    ('--data-parallel-external-lb|-dpe',
     '--no-data-parallel-external-lb',
     'data_parallel_external_lb',
     'bool',
     None,
     None,
     False),
    ('--data-parallel-multi-port-external-lb|-dpm',
     None,
     'data_parallel_multi_port_external_lb',
     'true',
     None,
     None,
     False),
    ('--enable-hc-sp', '--disable-hc-sp|--no-enable-hc-sp', 'enable_hc_sp', 'bool', None, None, False),
    ('--enable-expert-parallel|-ep',
     '--disable-expert-parallel|--no-enable-expert-parallel',
     'enable_expert_parallel',
     'bool',
     None,
     None,
     False),
    ('--enable-batch-sharded-sampling',
     '--disable-batch-sharded-sampling|--no-enable-batch-sharded-sampling',
     'enable_batch_sharded_sampling',
     'bool',
     None,
     None,
     None),
    ('--enable-ep-weight-filter',
     '--disable-ep-weight-filter|--no-enable-ep-weight-filter',
     'enable_ep_weight_filter',
     'bool',
     None,
     None,
     False),
    ('--all2all-backend',
     None,
     'all2all_backend',
     'str',
     None,
     'allgather_reducescatter|deepep_high_throughput|deepep_low_latency|deepep_v2|flashinfer_all2allv|'
     'flashinfer_nvlink_one_sided|flashinfer_nvlink_two_sided|moonep|mori_high_throughput|'
     'mori_low_latency|naive|nixl_ep|pplx',
     'allgather_reducescatter'),
    ('--enable-dbo', '--disable-dbo|--no-enable-dbo', 'enable_dbo', 'bool', None, None, False),
    ('--enable-shm-tensor-arena',
     '--disable-shm-tensor-arena|--no-enable-shm-tensor-arena',
     'enable_shm_tensor_arena',
     'bool',
     None,
     None,
     False),
    ('--ubatch-size', None, 'ubatch_size', 'int', None, None, 0),
    ('--enable-elastic-ep',
     '--disable-elastic-ep|--no-enable-elastic-ep',
     'enable_elastic_ep',
     'bool',
     None,
     None,
     False),
    ('--elastic-ep-max-dp-size', None, 'elastic_ep_max_dp_size', 'int', None, None, None),
    ('--dbo-decode-token-threshold', None, 'dbo_decode_token_threshold', 'int', None, None, 32),
    ('--dp-sync-interval', None, 'dp_sync_interval', 'int', None, None, 16),
    ('--dbo-prefill-token-threshold', None, 'dbo_prefill_token_threshold', 'int', None, None, 512),
    ('--disable-nccl-for-dp-synchronization',
     '--enable-nccl-for-dp-synchronization|--no-disable-nccl-for-dp-synchronization',
     'disable_nccl_for_dp_synchronization',
     'bool',
     None,
     None,
     None),
    ('--enable-eplb', '--disable-eplb|--no-enable-eplb', 'enable_eplb', 'bool', None, None, False),
    ('--eplb-config', None, 'eplb_config', 'json', None, None, None),
    ('--expert-placement-strategy', None, 'expert_placement_strategy', 'str', None, 'linear|round_robin', 'linear'),
    ('--max-parallel-loading-workers', None, 'max_parallel_loading_workers', 'int', None, None, None),
    ('--ray-workers-use-nsight', '--no-ray-workers-use-nsight', 'ray_workers_use_nsight', 'bool', None, None, False),
    ('--disable-custom-all-reduce',
     '--enable-custom-all-reduce|--no-disable-custom-all-reduce',
     'disable_custom_all_reduce',
     'bool',
     None,
     None,
     False),
    ('--worker-cls', None, 'worker_cls', 'str', None, None, 'auto'),
    ('--worker-extension-cls', None, 'worker_extension_cls', 'str', None, None, ''),
    ('--enable-fault-tolerance',
     '--disable-fault-tolerance|--no-enable-fault-tolerance',
     'enable_fault_tolerance',
     'bool',
     None,
     None,
     False),
    ('--fault-tolerance-config', None, 'fault_tolerance_config', 'json', None, None, None),
    ('--block-size', None, 'block_size', 'int', None, None, None),
    ('--gpu-memory-utilization|--device-memory-utilization', None, 'gpu_memory_utilization', 'float', None, None, 0.92),
    ('--kv-cache-memory-bytes', None, 'kv_cache_memory_bytes', 'hint', None, None, None),
    ('--kv-cache-dtype', None, 'kv_cache_dtype', 'str', None, None, 'auto'),
    ('--num-gpu-blocks-override', None, 'num_gpu_blocks_override', 'int', None, None, None),
    ('--enable-prefix-caching',
     '--disable-prefix-caching|--no-enable-prefix-caching',
     'enable_prefix_caching',
     'bool',
     None,
     None,
     None),
    ('--prefix-caching-hash-algo',
     None,
     'prefix_caching_hash_algo',
     'str',
     None,
     'sha256|sha256_cbor|xxhash|xxhash_cbor',
     'sha256'),
    ('--prefix-cache-retention-interval', None, 'prefix_cache_retention_interval', 'int', None, None, 0),
    ('--kv-cache-dtype-skip-layers', None, 'kv_cache_dtype_skip_layers', 'str', '+', None, []),
    ('--kv-sharing-fast-prefill', '--no-kv-sharing-fast-prefill', 'kv_sharing_fast_prefill', 'bool', None, None, False),
    ('--swa-bounded-replay', '--no-swa-bounded-replay', 'swa_bounded_replay', 'bool', None, None, True),
    ('--mamba-cache-dtype', None, 'mamba_cache_dtype', 'str', None, 'auto|bfloat16|float16|float32', 'auto'),
    ('--mamba-ssm-cache-dtype', None, 'mamba_ssm_cache_dtype', 'str', None, 'auto|bfloat16|float16|float32', 'auto'),
    ('--mamba-block-size', None, 'mamba_block_size', 'int', None, None, None),
    ('--prefix-match-unit', None, 'prefix_match_unit', 'int', None, None, None),
    ('--mamba-cache-mode', None, 'mamba_cache_mode', 'str', None, 'align|none', None),
    ('--enable-mamba-shared-prefix-checkpoint',
     '--disable-mamba-shared-prefix-checkpoint|--no-enable-mamba-shared-prefix-checkpoint',
     'enable_mamba_shared_prefix_checkpoint',
     'bool',
     None,
     None,
     False),
    ('--replayssm-buffer-len', None, 'replayssm_buffer_len', 'int', None, None, 16),
    ('--use-replayssm', '--no-use-replayssm', 'use_replayssm', 'bool', None, None, False),
    ('--kv-offloading-size', None, 'kv_offloading_size', 'float', None, None, None),
    ('--kv-offloading-backend', None, 'kv_offloading_backend', 'str', None, 'lmcache|native', 'native'),
    ('--offload-backend', None, 'offload_backend', 'str', None, 'auto|prefetch|uva', 'auto'),
    ('--cpu-offload-gb', None, 'cpu_offload_gb', 'float', None, None, 0),
    ('--cpu-offload-params', None, 'cpu_offload_params', 'str', '+', None, None),
    ('--offload-group-size', None, 'offload_group_size', 'int', None, None, 0),
    ('--offload-num-in-group', None, 'offload_num_in_group', 'int', None, None, 1),
    ('--offload-prefetch-step', None, 'offload_prefetch_step', 'int', None, None, 1),
    ('--offload-params', None, 'offload_params', 'str', '+', None, None),
    ('--language-model-only', '--no-language-model-only', 'language_model_only', 'bool', None, None, False),
    ('--limit-mm-per-prompt', None, 'limit_mm_per_prompt', 'json', None, None, {}),
    ('--enable-mm-embeds', '--disable-mm-embeds|--no-enable-mm-embeds', 'enable_mm_embeds', 'bool', None, None, False),
    ('--media-io-kwargs', None, 'media_io_kwargs', 'json', None, None, {}),
    ('--mm-processor-kwargs', None, 'mm_processor_kwargs', 'json', None, None, None),
    ('--mm-processor-cache-gb', None, 'mm_processor_cache_gb', 'float', None, None, 4),
    ('--mm-processor-cache-type', None, 'mm_processor_cache_type', 'str', None, 'lru|shm', 'lru'),
    ('--mm-hasher-algorithm', None, 'mm_hasher_algorithm', 'str', None, 'blake3|sha256|sha512', 'blake3'),
    ('--mm-shm-cache-max-object-size-mb', None, 'mm_shm_cache_max_object_size_mb', 'int', None, None, 128),
    ('--mm-encoder-only', '--no-mm-encoder-only', 'mm_encoder_only', 'bool', None, None, False),
    ('--mm-encoder-tp-mode', None, 'mm_encoder_tp_mode', 'str', None, 'data|weights', 'weights'),
    ('--mm-encoder-attn-backend', None, 'mm_encoder_attn_backend', 'str', None, None, None),
    ('--mm-encoder-attn-dtype', None, 'mm_encoder_attn_dtype', 'str', None, 'fp8|None', None),
    ('--mm-encoder-fp8-scale-path', None, 'mm_encoder_fp8_scale_path', 'str', None, None, None),
    ('--mm-encoder-fp8-scale-save-path', None, 'mm_encoder_fp8_scale_save_path', 'str', None, None, None),
    ('--mm-encoder-fp8-scale-save-margin', None, 'mm_encoder_fp8_scale_save_margin', 'float', None, None, 1.5),
    ('--interleave-mm-strings', '--no-interleave-mm-strings', 'interleave_mm_strings', 'bool', None, None, False),
    ('--skip-mm-profiling', '--no-skip-mm-profiling', 'skip_mm_profiling', 'bool', None, None, False),
    ('--video-pruning-rate', None, 'video_pruning_rate', 'float', None, None, None),
    ('--video-pruning-method', None, 'video_pruning_method', 'str', None, 'evs|vidcom2', 'evs'),
    ('--mm-tensor-ipc', None, 'mm_tensor_ipc', 'str', None, 'direct_rpc|torch_shm', 'direct_rpc'),
    ('--mm-processor-device', None, 'mm_processor_device', 'str', None, 'auto|cpu', 'auto'),
    ('--mm-ipc-gpu-memory-gb', None, 'mm_ipc_gpu_memory_gb', 'float', None, None, 0),
    ('--mm-device-do-normalize', '--no-mm-device-do-normalize', 'mm_device_do_normalize', 'bool', None, None, None),
    ('--enable-lora', '--disable-lora|--no-enable-lora', 'enable_lora', 'bool', None, None, None),
    ('--max-loras', None, 'max_loras', 'int', None, None, 1),
    ('--max-lora-rank', None, 'max_lora_rank', 'int', None, '1|8|16|32|64|128|256|320|512', 16),
    ('--lora-dtype', None, 'lora_dtype', 'str', None, 'auto|bfloat16|float16', 'auto'),
    ('--enable-tower-connector-lora',
     '--disable-tower-connector-lora|--no-enable-tower-connector-lora',
     'enable_tower_connector_lora',
     'bool',
     None,
     None,
     False),
    ('--max-cpu-loras', None, 'max_cpu_loras', 'int', None, None, None),
    ('--fully-sharded-loras', '--no-fully-sharded-loras', 'fully_sharded_loras', 'bool', None, None, False),
    ('--lora-target-modules', None, 'lora_target_modules', 'str', '+', None, None),
    ('--default-mm-loras', None, 'default_mm_loras', 'json', None, None, None),
    ('--specialize-active-lora', '--no-specialize-active-lora', 'specialize_active_lora', 'bool', None, None, False),
    ('--enable-mixed-moe-lora-format',
     '--disable-mixed-moe-lora-format|--no-enable-mixed-moe-lora-format',
     'enable_mixed_moe_lora_format',
     'bool',
     None,
     None,
     False),
    ('--enable-moe-shared-loras',
     '--disable-moe-shared-loras|--no-enable-moe-shared-loras',
     'enable_moe_shared_loras',
     'bool',
     None,
     None,
     False),
    ('--max-lora-cls-labels', None, 'max_lora_cls_labels', 'int', None, None, None),
    ('--logging-config', None, 'logging_config', 'json', None, None, '==SUPPRESS=='),
    ('--log-level', None, 'log_level', 'str', None, 'CRITICAL|ERROR|WARNING|INFO|DEBUG|NOTSET', '==SUPPRESS=='),
    ('--log-config-file', None, 'log_config_file', 'str', None, None, '==SUPPRESS=='),
    ('--show-hidden-metrics-for-version', None, 'show_hidden_metrics_for_version', 'str', None, None, None),
    ('--otlp-traces-endpoint', None, 'otlp_traces_endpoint', 'str', None, None, None),
    ('--collect-detailed-traces', None, 'collect_detailed_traces', 'str', '+', 'all|model|worker|None', None),
    ('--per-request-spec-decode-metrics',
     None,
     'per_request_spec_decode_metrics',
     'str',
     None,
     'detailed|none|summary',
     'none'),
    ('--kv-cache-metrics', '--no-kv-cache-metrics', 'kv_cache_metrics', 'bool', None, None, False),
    ('--kv-cache-metrics-sample', None, 'kv_cache_metrics_sample', 'float', None, None, 0.01),
    ('--custom-histogram-buckets', None, 'custom_histogram_buckets', 'json', None, None, None),
    ('--cudagraph-metrics', '--no-cudagraph-metrics', 'cudagraph_metrics', 'bool', None, None, False),
    ('--enable-layerwise-nvtx-tracing',
     '--disable-layerwise-nvtx-tracing|--no-enable-layerwise-nvtx-tracing',
     'enable_layerwise_nvtx_tracing',
     'bool',
     None,
     None,
     False),
    ('--enable-mfu-metrics',
     '--disable-mfu-metrics|--no-enable-mfu-metrics',
     'enable_mfu_metrics',
     'bool',
     None,
     None,
     False),
    ('--enable-logging-iteration-details',
     '--disable-logging-iteration-details|--no-enable-logging-iteration-details',
     'enable_logging_iteration_details',
     'bool',
     None,
     None,
     False),
    ('--jit-monitor-mode', None, 'jit_monitor_mode', 'str', None, 'error|warn', 'warn'),
    ('--jit-monitor-verbose', '--no-jit-monitor-verbose', 'jit_monitor_verbose', 'bool', None, None, False),
    ('--max-num-batched-tokens', None, 'max_num_batched_tokens', 'hint', None, None, None),
    ('--max-num-scheduled-tokens', None, 'max_num_scheduled_tokens', 'hint', None, None, None),
    ('--max-num-seqs', None, 'max_num_seqs', 'int', None, None, None),
    ('--max-num-active-seqs', None, 'max_num_active_seqs', 'int', None, None, None),
    ('--max-num-queued-reqs', None, 'max_num_queued_reqs', 'int', None, None, None),
    ('--max-num-queued-tokens', None, 'max_num_queued_tokens', 'hint', None, None, None),
    ('--long-prefill-token-threshold', None, 'long_prefill_token_threshold', 'int', None, None, 0),
    ('--long-prefill-token-threshold-adaptive',
     '--no-long-prefill-token-threshold-adaptive',
     'long_prefill_token_threshold_adaptive',
     'bool',
     None,
     None,
     False),
    ('--scheduling-policy', None, 'scheduling_policy', 'str', None, 'fcfs|priority', 'fcfs'),
    ('--enable-chunked-prefill',
     '--disable-chunked-prefill|--no-enable-chunked-prefill',
     'enable_chunked_prefill',
     'bool',
     None,
     None,
     None),
    ('--disable-chunked-mm-input',
     '--enable-chunked-mm-input|--no-disable-chunked-mm-input',
     'disable_chunked_mm_input',
     'bool',
     None,
     None,
     False),
    ('--scheduler-cls', None, 'scheduler_cls', 'str', None, None, None),
    ('--scheduler-reserve-full-isl',
     '--no-scheduler-reserve-full-isl',
     'scheduler_reserve_full_isl',
     'bool',
     None,
     None,
     True),
    ('--watermark', None, 'watermark', 'float', None, None, 0.0),
    ('--prefill-schedule-interval', None, 'prefill_schedule_interval', 'int', None, None, 1),
    ('--disable-hybrid-kv-cache-manager',
     '--enable-hybrid-kv-cache-manager|--no-disable-hybrid-kv-cache-manager',
     'disable_hybrid_kv_cache_manager',
     'bool',
     None,
     None,
     None),
    ('--async-scheduling', '--no-async-scheduling', 'async_scheduling', 'bool', None, None, None),
    ('--stream-interval', None, 'stream_interval', 'int', None, None, 1),
    ('--cudagraph-capture-sizes', None, 'cudagraph_capture_sizes', 'int', '+', None, None),
    ('--max-cudagraph-capture-size', None, 'max_cudagraph_capture_size', 'int', None, None, None),
    ('--ir-op-priority', None, 'ir_op_priority', 'json', None, None, None),
    ('--enable-flashinfer-autotune',
     '--disable-flashinfer-autotune|--no-enable-flashinfer-autotune',
     'enable_flashinfer_autotune',
     'bool',
     None,
     None,
     None),
    ('--monokernel', '--no-monokernel', 'monokernel', 'bool', None, None, False),
    ('--moe-backend',
     None,
     'moe_backend',
     'str',
     None,
     'aiter|aiter_mega_moe|aiter_triton_mxfp4_bf16|aiter_triton_mxfp4_mxfp4|auto|b12x|batched_triton|'
     'cutlass|deep_gemm|deep_gemm_mega_moe|emulation|flashinfer_b12x|flashinfer_cutedsl|'
     'flashinfer_cutlass|flashinfer_moe_ep_cutedsl|flashinfer_moe_ep_mega_deep_gemm|flashinfer_trtllm|'
     'flydsl|hpc|humming|marlin|rdna3|triton|triton_unfused',
     'auto'),
    ('--linear-backend',
     None,
     'linear_backend',
     'str',
     None,
     'aiter|auto|b12x|conch|cutlass|deep_gemm|emulation|exllama|fbgemm|flashinfer_b12x|flashinfer_cudnn|'
     'flashinfer_cutedsl|flashinfer_cutlass|flashinfer_trtllm|humming|machete|marlin|torch|triton|xpu|'
     'xpu_woq',
     'auto'),
    ('--sparse-indexer-topk-backend',
     None,
     'sparse_indexer_topk_backend',
     'str',
     None,
     'aiter|auto|cooperative|deep_select|flashinfer|per_row|persistent|torch',
     'auto'),
    ('--speculative-config|-sc', None, 'speculative_config', 'json', None, None, None),
    ('--spec-method',
     None,
     'spec_method',
     'str',
     None,
     'bailing_hybrid_mtp|bailing_hybrid_v3_mtp|custom_class|deepseek_mtp|dflash|dots3_note_mtp|'
     'draft_model|dspark|eagle|eagle3|ernie_mtp|exaone4_5_mtp|exaone_moe_mtp|extract_hidden_states|'
     'gemma4_mtp|glm4_moe_lite_mtp|glm4_moe_mtp|glm5_next_mtp|glm_ocr_mtp|hy_v3_mtp|hy_v4_mtp|inkling_mtp|'
     'kimi_k3_mtp|longcat_flash_mtp|mimo_mtp|mimo_v2_mtp|minimax_m3_mtp|mtp|nemotron_h_mtp|ngram|'
     'ngram_gpu|pangu_ultra_moe_mtp|qwen3_5_mtp|qwen3_next_mtp|qwen4_exp_mtp|step3p5_mtp|step5_mtp|suffix|'
     'None',
     None),
    ('--spec-model', None, 'spec_model', 'str', None, None, None),
    ('--spec-tokens', None, 'spec_tokens', 'int', None, None, None),
    ('--watermark-config', None, 'watermark_config', 'json', None, None, None),
    ('--diffusion-config|-dc', None, 'diffusion_config', 'json', None, None, None),
    ('--kv-transfer-config', None, 'kv_transfer_config', 'json', None, None, None),
    ('--kv-events-config', None, 'kv_events_config', 'json', None, None, None),
    ('--ec-transfer-config', None, 'ec_transfer_config', 'json', None, None, None),
    ('--ec-manager-config', None, 'ec_manager_config', 'json', None, None, None),
    ('--compilation-config|-cc', None, 'compilation_config', 'json', None, None, None),
    ('--attention-config|-ac', None, 'attention_config', 'json', None, None, None),
    ('--engram-config', None, 'engram_config', 'json', None, None, None),
    ('--reasoning-config', None, 'reasoning_config', 'json', None, None, None),
    ('--kernel-config', None, 'kernel_config', 'json', None, None, None),
    ('--additional-config', None, 'additional_config', 'json_or_str', None, None, {}),
    ('--structured-outputs-config', None, 'structured_outputs_config', 'json', None, None, None),
    ('--aux-output-config', None, 'aux_output_config', 'json', None, None, None),
    ('--profiler-config', None, 'profiler_config', 'json', None, None, None),
    ('--watchdog-config', None, 'watchdog_config', 'json', None, None, None),
    ('--optimization-level', None, 'optimization_level', 'str', None, None, 2),
    ('--performance-mode', None, 'performance_mode', 'str', None, 'balanced|interactivity|throughput', 'balanced'),
    ('--weight-transfer-config', None, 'weight_transfer_config', 'json', None, None, None),
    ('--disable-log-stats', None, 'disable_log_stats', 'true', None, None, False),
    ('--aggregate-engine-logging', None, 'aggregate_engine_logging', 'true', None, None, False),
    ('--fail-on-environ-validation',
     '--no-fail-on-environ-validation',
     'fail_on_environ_validation',
     'bool',
     None,
     None,
     False),
    ('--shutdown-timeout', None, 'shutdown_timeout', 'int', None, None, 0),
    ('--gdn-prefill-backend',
     None,
     'gdn_prefill_backend',
     'str',
     None,
     'flashinfer|triton|cutedsl|aiter_flydsl|sycl',
     None),
    ('--kda-prefill-backend', None, 'kda_prefill_backend', 'str', None, 'auto|triton|flashkda|flashinfer|fused', None),
    ('--kda-decode-backend', None, 'kda_decode_backend', 'str', None, 'auto|native|flashinfer|triton', None),
    ('--enable-log-requests',
     '--disable-log-requests|--no-enable-log-requests',
     'enable_log_requests',
     'bool',
     None,
     None,
     False),
)

_FLAGS: tuple[VllmFlag, ...] = tuple(_flag(row) for row in _TABLE)
_BY_DEST: dict[str, VllmFlag] = {flag.dest: flag for flag in _FLAGS}
_BY_OPTION: dict[str, VllmFlag] = {name: flag for flag in _FLAGS for name in (*flag.names, *flag.negatives)}
