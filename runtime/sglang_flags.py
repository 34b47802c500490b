"""SGLang 0.5.23's own launch flags, so the simulated server parses a command line exactly like SGLang.

The table below was harvested from the real parser (``ServerArgs.add_cli_args`` of the ``sglang==0.5.23``
wheel) by ``harvest()``; regenerate it with ``render_table(harvest(python))`` when the version moves. A
parser built from it behaves like SGLang's where the tuner can tell: unknown flags and ambiguous prefixes
(``--cuda-graph-max-bs``) exit 2 with argparse's message, typed values and choices are checked, and the
resolved ``server_args`` dict has every field with SGLang's default.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from elsa_tune.errors import RuntimeUnavailable
from elsa_tune.search_spaces.candidate import FlagValue

SGLANG_VERSION = "0.5.23"

#: kinds: a value type (``str``, ``int``, ``float``, ``json``, ``hint`` = human-readable int, ``jsonlist``),
#: ``true`` (store_true), ``boolopt`` (``--x/--no-x``), ``const`` (a deprecated store_const).
Row = tuple[str, str, str | None, Any, str | None, Any]


@dataclass(frozen=True)
class FlagSpec:
    """One SGLang flag: its option strings, the ``ServerArgs`` field it sets, how it parses, its default."""

    names: tuple[str, ...]
    dest: str
    kind: str
    nargs: str | int | None
    choices: tuple[str, ...] | None
    default: Any

    @property
    def name(self) -> str:
        """The primary flag name without dashes, the form ``Candidate.flags`` uses."""
        return self.names[0][2:]

    @property
    def takes_value(self) -> bool:
        return self.kind not in ("true", "boolopt", "const")


def sglang_flags() -> tuple[FlagSpec, ...]:
    return _SPECS


def flag_by_name(name: str) -> FlagSpec | None:
    """The flag whose option string is ``--name`` (any alias), or ``None``."""
    return _BY_OPTION.get(f"--{name.lstrip('-')}")


def add_sglang_arguments(parser: argparse.ArgumentParser, *, require_model: bool = True) -> None:
    """Add every SGLang flag to ``parser`` with its default suppressed, so the namespace holds only what was given.

    ``--model-path`` is required as in SGLang unless ``require_model`` is false.

    ``resolve_defaults`` fills the rest; ``requested_flags`` turns the namespace into ``Candidate``-style flags.
    """
    for spec in _SPECS:
        kwargs: dict[str, Any] = {"dest": spec.dest, "default": argparse.SUPPRESS}
        if spec.kind == "true":
            kwargs["action"] = "store_true"
        elif spec.kind == "boolopt":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif spec.kind == "const":
            kwargs["action"] = "store_const"
            kwargs["const"] = spec.choices[0] if spec.choices else True
        else:
            kwargs["type"] = _TYPES[spec.kind]
            if spec.nargs is not None:
                kwargs["nargs"] = spec.nargs
            if spec.choices is not None:
                kwargs["choices"] = _typed_choices(spec)
        if spec.dest == "model_path" and require_model:
            kwargs["required"] = True
        parser.add_argument(*spec.names, **kwargs)


def resolve_defaults(given: Mapping[str, Any]) -> dict[str, Any]:
    """Every ``ServerArgs`` field, in SGLang's field order: the given value or SGLang's default."""
    return {spec.dest: given.get(spec.dest, _copy(spec.default)) for spec in _SPECS}


def requested_flags(given: Mapping[str, Any]) -> dict[str, FlagValue]:
    """The flags that were given, keyed by primary flag name (``Candidate`` convention).

    List and dict values are rendered as their JSON text, since a ``FlagValue`` is a scalar.
    """
    flags: dict[str, FlagValue] = {}
    for dest, value in given.items():
        spec = _BY_DEST.get(dest)
        if spec is None:
            continue
        if isinstance(value, (list, dict)):
            flags[spec.name] = json.dumps(value)
        else:
            flags[spec.name] = value
    return flags


def harvest(python: str, timeout_s: float = 180.0) -> tuple[FlagSpec, ...]:
    """Read the flag table from an installed SGLang by building its real parser in ``python``."""
    try:
        done = subprocess.run([python, "-c", _HARVEST], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeUnavailable(f"cannot run {python} to read SGLang's flags: {exc}",
                                 remedy="point at the python of a venv where sglang is installed") from exc
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-5:])
        raise RuntimeUnavailable(f"{python} could not build SGLang's parser:\n{tail}",
                                 remedy="install sglang in that venv (pip install sglang==0.5.23)")
    return tuple(_spec(tuple(row)) for row in json.loads(done.stdout))


def render_table(specs: Sequence[FlagSpec]) -> str:
    """The ``_TABLE`` literal for this module, one flag per line (long choice lists wrapped)."""
    lines: list[str] = []
    for spec in specs:
        choices = "|".join(spec.choices) if spec.choices else None
        row = ("|".join(spec.names), spec.dest, spec.kind, spec.nargs, choices, spec.default)
        line = f"    {row!r},"
        if len(line) <= 120:
            lines.append(line)
        elif choices is None:
            lines.append(f"    ({row[0]!r},")
            lines.append("     " + ", ".join(repr(v) for v in row[1:]) + "),")
        else:
            lines.append("    (" + ", ".join(repr(v) for v in row[:4]) + ",")
            rest = choices
            while rest:
                cut = rest.rfind("|", 0, 100) + 1 if len(rest) > 100 else len(rest)
                lines.append(f"     {rest[:cut]!r}")
                rest = rest[cut:]
            lines[-1] += ","
            lines.append(f"     {row[5]!r}),")
    return "\n".join(lines)


def _human_readable_int(value: str) -> int:
    # SGLang's own parser (srt/utils/common.py::human_readable_int): SI suffixes k/M/G/T, IEC Ki/Mi/Gi/Ti.
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(f"Decimals are not allowed with IEC suffixes like '{suffix}'.")
            return int(number) * iec[suffix]
        return int(Decimal(number) * {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}[suffix])
    try:
        return int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid integer value: {value!r}") from exc


def _json_value(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"Invalid JSON: {value}. Please provide valid JSON.") from exc


_TYPES: dict[str, Any] = {"str": str, "int": int, "float": float, "json": _json_value, "hint": _human_readable_int,
                          "jsonlist": _json_value}


def _typed_choices(spec: FlagSpec) -> tuple[Any, ...]:
    assert spec.choices is not None
    if spec.kind == "int":
        return tuple(int(c) for c in spec.choices)
    return spec.choices


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def _spec(row: Row) -> FlagSpec:
    names, dest, kind, nargs, choices, default = row
    return FlagSpec(names=tuple(names.split("|")), dest=dest, kind=kind or "str", nargs=nargs,
                    choices=tuple(choices.split("|")) if choices else None, default=default)


_HARVEST = r'''
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
p = argparse.ArgumentParser()
ServerArgs.add_cli_args(p)
kinds = {"loads": "json", "human_readable_int": "hint", "json_list_type": "jsonlist", "nullable_str": "str",
         "parse_cuda_graph_backend_arg": "str", "parse_cuda_graph_config_arg": "json"}
rows = []
for a in p._actions:
    if isinstance(a, argparse._HelpAction):
        continue
    act = type(a).__name__
    if act == "BooleanOptionalAction":
        kind, names = "boolopt", [o for o in a.option_strings if not o.startswith("--no-")]
    elif "StoreTrue" in act:
        kind, names = "true", a.option_strings
    elif "StoreConst" in act:
        kind, names = "const", a.option_strings
    else:
        t = getattr(a.type, "__name__", "str") if a.type else "str"
        kind, names = kinds.get(t, t), a.option_strings
    default = a.default
    try:
        json.dumps(default)
    except TypeError:
        default = repr(default)
    choices = "|".join(map(str, a.choices)) if a.choices else None
    nargs = a.nargs if kind not in ("true", "boolopt", "const") else None
    rows.append(["|".join(names), a.dest, kind, nargs, choices, default])
json.dump(rows, sys.stdout)
'''

# Harvested from sglang==0.5.23 (python -m sglang.launch_server): (names, dest, kind, nargs, choices, default).
_TABLE: tuple[Row, ...] = (
    ('--model-path|--model', 'model_path', 'str', None, None, None),
    ('--tokenizer-path', 'tokenizer_path', 'str', None, None, None),
    ('--tokenizer-mode', 'tokenizer_mode', 'str', None, 'auto|slow', 'auto'),
    ('--tokenizer-backend', 'tokenizer_backend', 'str', None, 'huggingface|fastokens', 'huggingface'),
    ('--tokenizer-worker-num', 'tokenizer_worker_num', 'int', None, None, 1),
    ('--detokenizer-worker-num', 'detokenizer_worker_num', 'int', None, None, 1),
    ('--skip-tokenizer-init', 'skip_tokenizer_init', 'true', None, None, False),
    ('--load-format', 'load_format', 'str', None,
     'auto|pt|safetensors|instanttensor|npcache|dummy|sharded_state|presharded|gguf|expert_pack|'
     'bitsandbytes|mistral|layered|flash_rl|remote|remote_instance|fastsafetensors|private|runai_streamer',
     'auto'),
    ('--model-loader-extra-config', 'model_loader_extra_config', 'str', None, None, '{}'),
    ('--trust-remote-code', 'trust_remote_code', 'true', None, None, False),
    ('--context-length', 'context_length', 'hint', None, None, None),
    ('--is-embedding', 'is_embedding', 'true', None, None, False),
    ('--enable-multimodal', 'enable_multimodal', 'true', None, None, None),
    ('--revision', 'revision', 'str', None, None, None),
    ('--model-impl', 'model_impl', 'str', None, None, 'auto'),
    ('--model-config-parser', 'model_config_parser', 'str', None, None, 'auto'),
    ('--json-model-override-args', 'json_model_override_args', 'str', None, None, '{}'),
    ('--dtype', 'dtype', 'str', None, 'auto|half|float16|bfloat16|float|float32', 'auto'),
    ('--quantization', 'quantization', 'str', None,
     'awq|fp8|mxfp8|gptq|gptq_marlin|awq_marlin|bitsandbytes|gguf|modelopt|modelopt_fp8|modelopt_fp4|'
     'nvfp4_online|modelopt_mixed|petit_nvfp4|w8a8_int8|w8a8_fp8|moe_wna16|w4afp8|mxfp4|auto-round|'
     'auto-round-int8|compressed-tensors|modelslim|mxfp_w4a8|quark|quark_int4fp8_moe|quark_mxfp4|mlx_q4|'
     'mlx_q8|unquant|humming',
     None),
    ('--quantization-param-path', 'quantization_param_path', 'str', None, None, None),
    ('--kv-cache-dtype', 'kv_cache_dtype', 'str', None,
     'auto|fp8_e5m2|fp8_e4m3|mxfp8|bf16|bfloat16|nvfp4|fp4_mx_block16',
     'auto'),
    ('--enable-fp32-lm-head', 'enable_fp32_lm_head', 'true', None, None, False),
    ('--modelopt-quant', 'modelopt_quant', 'str', None, None, None),
    ('--modelopt-checkpoint-restore-path', 'modelopt_checkpoint_restore_path', 'str', None, None, None),
    ('--modelopt-checkpoint-save-path', 'modelopt_checkpoint_save_path', 'str', None, None, None),
    ('--modelopt-export-path', 'modelopt_export_path', 'str', None, None, None),
    ('--quantize-and-serve', 'quantize_and_serve', 'true', None, None, False),
    ('--rl-quant-profile', 'rl_quant_profile', 'str', None, None, None),
    ('--enable-tf32-matmul', 'enable_tf32_matmul', 'boolopt', None, None, None),
    ('--mem-fraction-static', 'mem_fraction_static', 'float', None, None, None),
    ('--max-running-requests', 'max_running_requests', 'int', None, None, None),
    ('--max-queued-requests', 'max_queued_requests', 'int', None, None, None),
    ('--max-total-tokens', 'max_total_tokens', 'hint', None, None, None),
    ('--chunked-prefill-size', 'chunked_prefill_size', 'int', None, None, None),
    ('--prefill-decode-interval', 'prefill_decode_interval', 'int', None, None, None),
    ('--enable-dynamic-chunking', 'enable_dynamic_chunking', 'true', None, None, False),
    ('--max-prefill-tokens', 'max_prefill_tokens', 'hint', None, None, 16384),
    ('--prefill-max-requests', 'prefill_max_requests', 'int', None, None, None),
    ('--schedule-policy', 'schedule_policy', 'str', None,
     'lpm|random|fcfs|dfs-weight|lof|priority|routing-key|hrrn|shortest-prefill-first',
     'fcfs'),
    ('--enable-priority-scheduling', 'enable_priority_scheduling', 'true', None, None, False),
    ('--disable-priority-preemption', 'disable_priority_preemption', 'true', None, None, False),
    ('--default-priority-value', 'default_priority_value', 'int', None, None, None),
    ('--abort-on-priority-when-disabled', 'abort_on_priority_when_disabled', 'true', None, None, False),
    ('--schedule-low-priority-values-first', 'schedule_low_priority_values_first', 'true', None, None, False),
    ('--priority-scheduling-preemption-threshold', 'priority_scheduling_preemption_threshold', 'int', None, None, 10),
    ('--retraction-policy', 'retraction_policy', 'str', None, 'length|priority', 'length'),
    ('--schedule-conservativeness', 'schedule_conservativeness', 'float', None, None, 1.0),
    ('--page-size', 'page_size', 'int', None, None, None),
    ('--c128-page-size', 'c128_page_size', 'int', None, None, 16),
    ('--swa-full-tokens-ratio', 'swa_full_tokens_ratio', 'float', None, None, None),
    ('--disable-hybrid-swa-memory', 'disable_hybrid_swa_memory', 'true', None, None, False),
    ('--radix-eviction-policy', 'radix_eviction_policy', 'str', None, 'lru|lfu|slru|priority|tlru', 'lru'),
    ('--radix-eviction-policy-config', 'radix_eviction_policy_config', 'json', None, None, None),
    ('--prefill-only-disable-kv-cache', 'prefill_only_disable_kv_cache', 'true', None, None, False),
    ('--disable-radix-cache', 'disable_radix_cache', 'true', None, None, False),
    ('--enable-page-major-kv-layout', 'enable_page_major_kv_layout', 'true', None, None, False),
    ('--enable-unified-memory', 'enable_unified_memory', 'true', None, None, False),
    ('--disable-chunked-prefix-cache', 'disable_chunked_prefix_cache', 'true', None, None, False),
    ('--disable-overlap-schedule', 'disable_overlap_schedule', 'true', None, None, False),
    ('--num-continuous-decode-steps', 'num_continuous_decode_steps', 'int', None, None, 1),
    ('--scheduler-recv-interval', 'scheduler_recv_interval', 'int', None, None, 1),
    ('--enable-mixed-chunk', 'enable_mixed_chunk', 'true', None, None, False),
    ('--nccl-port', 'nccl_port', 'int', None, None, None),
    ('--dist-timeout', 'dist_timeout', 'int', None, None, None),
    ('--dist-init-addr|--nccl-init-addr', 'dist_init_addr', 'str', None, None, None),
    ('--gated-launch-port', 'gated_launch_port', 'int', None, None, None),
    ('--nnodes', 'nnodes', 'int', None, None, 1),
    ('--node-rank', 'node_rank', 'int', None, None, 0),
    ('--tp-size|--tensor-parallel-size', 'tp_size', 'int', None, None, 1),
    ('--dcp-size|--decode-context-parallel-size', 'dcp_size', 'int', None, None, 1),
    ('--pp-size|--pipeline-parallel-size', 'pp_size', 'int', None, None, 1),
    ('--pp-max-micro-batch-size', 'pp_max_micro_batch_size', 'int', None, None, None),
    ('--pp-async-batch-depth', 'pp_async_batch_depth', 'int', None, None, 0),
    ('--dp-size|--data-parallel-size', 'dp_size', 'int', None, None, 1),
    ('--attn-dp-size|--attention-data-parallel-size', 'attn_dp_size', 'int', None, None, 1),
    ('--load-balance-method', 'load_balance_method', 'str', None,
     'auto|round_robin|follow_bootstrap_room|total_requests|total_tokens',
     'auto'),
    ('--attn-cp-size|--attention-context-parallel-size', 'attn_cp_size', 'int', None, None, 1),
    ('--moe-dp-size|--moe-data-parallel-size', 'moe_dp_size', 'int', None, None, 1),
    ('--dwdp-size', 'dwdp_size', 'int', None, None, 1),
    ('--dcp-comm-backend', 'dcp_comm_backend', 'str', None, 'ag_rs|a2a|fi_a2a', None),
    ('--dcp-replicate-q-proj', 'dcp_replicate_q_proj', 'boolopt', None, None, None),
    ('--enable-prefill-cp', 'enable_prefill_cp', 'true', None, None, False),
    ('--cp-strategy', 'cp_strategy', 'str', None, 'zigzag|interleave', None),
    ('--enable-dsa-cache-layer-split', 'enable_dsa_cache_layer_split', 'true', None, None, False),
    ('--enable-cp-decode-attn-tp', 'enable_cp_decode_attn_tp', 'true', None, None, False),
    ('--enable-kv-cache-sharding', 'enable_kv_cache_sharding', 'true', None, None, False),
    ('--enable-dp-attention-local-control-broadcast',
     'enable_dp_attention_local_control_broadcast', 'true', None, None, False),
    ('--enable-dp-lm-head', 'enable_dp_lm_head', 'true', None, None, False),
    ('--enable-tp-lm-head-all-to-all', 'enable_tp_lm_head_all_to_all', 'boolopt', None, None, None),
    ('--enable-attn-tp-input-scattered', 'enable_attn_tp_input_scattered', 'true', None, None, False),
    ('--enable-shared-experts-attn-tp', 'enable_shared_experts_attn_tp', 'true', None, None, False),
    ('--shared-experts-tp-size', 'shared_experts_tp_size', 'int', None, None, None),
    ('--enable-dense-mlp-attn-tp', 'enable_dense_mlp_attn_tp', 'true', None, None, False),
    ('--enable-layernorm-sp', 'enable_layernorm_sp', 'true', None, None, False),
    ('--disable-attn-tp-gather', 'disable_attn_tp_gather', 'true', None, None, False),
    ('--enable-p2p-check', 'enable_p2p_check', 'true', None, None, False),
    ('--device', 'device', 'str', None, None, None),
    ('--base-gpu-id', 'base_gpu_id', 'int', None, None, 0),
    ('--gpu-id-step', 'gpu_id_step', 'int', None, None, 1),
    ('--random-seed', 'random_seed', 'int', None, None, None),
    ('--mlx-enable-sampling', 'mlx_enable_sampling', 'true', None, None, False),
    ('--watchdog-timeout', 'watchdog_timeout', 'float', None, None, 300),
    ('--soft-watchdog-timeout', 'soft_watchdog_timeout', 'float', None, None, None),
    ('--sleep-on-idle', 'sleep_on_idle', 'true', None, None, False),
    ('--use-ray', 'use_ray', 'true', None, None, False),
    ('--numa-node', 'numa_node', 'int', '+', None, None),
    ('--gc-threshold', 'gc_threshold', 'int', '+', None, None),
    ('--host', 'host', 'str', None, None, '127.0.0.1'),
    ('--port', 'port', 'int', None, None, 30000),
    ('--fastapi-root-path', 'fastapi_root_path', 'str', None, None, ''),
    ('--smg-grpc-mode', 'smg_grpc_mode', 'true', None, None, False),
    ('--grpc-mode', 'grpc_mode', 'true', None, None, False),
    ('--grpc-port', 'grpc_port', 'int', None, None, None),
    ('--sidecar', 'sidecar', 'str', None, None, None),
    ('--sidecar-args', 'sidecar_args', 'jsonlist', None, None, None),
    ('--skip-server-warmup', 'skip_server_warmup', 'true', None, None, False),
    ('--warmups', 'warmups', 'str', None, None, None),
    ('--enable-http2', 'enable_http2', 'true', None, None, False),
    ('--http2-max-concurrent-streams', 'http2_max_concurrent_streams', 'int', None, None, 200),
    ('--http2-initial-connection-window-size', 'http2_initial_connection_window_size', 'int', None, None, 1048576),
    ('--ssl-keyfile', 'ssl_keyfile', 'str', None, None, None),
    ('--ssl-certfile', 'ssl_certfile', 'str', None, None, None),
    ('--ssl-ca-certs', 'ssl_ca_certs', 'str', None, None, None),
    ('--ssl-keyfile-password', 'ssl_keyfile_password', 'str', None, None, None),
    ('--enable-ssl-refresh', 'enable_ssl_refresh', 'true', None, None, False),
    ('--api-key', 'api_key', 'str', None, None, None),
    ('--admin-api-key', 'admin_api_key', 'str', None, None, None),
    ('--served-model-name', 'served_model_name', 'str', None, None, None),
    ('--weight-version', 'weight_version', 'str', None, None, 'default'),
    ('--chat-template', 'chat_template', 'str', None, None, None),
    ('--trust-request-chat-template', 'trust_request_chat_template', 'true', None, None, False),
    ('--hf-chat-template-name', 'hf_chat_template_name', 'str', None, None, None),
    ('--completion-template', 'completion_template', 'str', None, None, None),
    ('--file-storage-path', 'file_storage_path', 'str', None, None, None),
    ('--enable-cache-report', 'enable_cache_report', 'true', None, None, False),
    ('--return-input-ids', 'return_input_ids', 'true', None, None, False),
    ('--return-output-ids', 'return_output_ids', 'true', None, None, False),
    ('--default-chat-template-kwargs', 'default_chat_template_kwargs', 'json', None, None, None),
    ('--strip-thinking-cache', 'strip_thinking_cache', 'true', None, None, False),
    ('--enable-strict-thinking', 'enable_strict_thinking', 'true', None, None, False),
    ('--tool-server', 'tool_server', 'str', None, None, None),
    ('--sampling-defaults', 'sampling_defaults', 'str', None, 'openai|model', 'model'),
    ('--asr-max-buffer-seconds', 'asr_max_buffer_seconds', 'int', None, None, 60),
    ('--asr-max-concurrent-sessions', 'asr_max_concurrent_sessions', 'int', None, None, 32),
    ('--preferred-sampling-params', 'preferred_sampling_params', 'json', None, None, None),
    ('--allow-auto-truncate', 'allow_auto_truncate', 'true', None, None, False),
    ('--stream-interval', 'stream_interval', 'int', None, None, 1),
    ('--batch-notify-size', 'batch_notify_size', 'int', None, None, 16),
    ('--stream-response-default-include-usage', 'stream_response_default_include_usage', 'true', None, None, False),
    ('--incremental-streaming-output', 'incremental_streaming_output', 'true', None, None, False),
    ('--enable-streaming-session', 'enable_streaming_session', 'true', None, None, False),
    ('--enable-session-radix-cache', 'enable_session_radix_cache', 'true', None, None, False),
    ('--log-level', 'log_level', 'str', None, None, 'info'),
    ('--log-level-http', 'log_level_http', 'str', None, None, None),
    ('--log-requests', 'log_requests', 'true', None, None, False),
    ('--log-requests-level', 'log_requests_level', 'int', None, '0|1|2|3', 2),
    ('--log-requests-format', 'log_requests_format', 'str', None, 'text|json', 'text'),
    ('--log-requests-target', 'log_requests_target', 'str', '+', None, None),
    ('--uvicorn-access-log-exclude-prefixes', 'uvicorn_access_log_exclude_prefixes', 'str', '*', None, []),
    ('--crash-dump-folder', 'crash_dump_folder', 'str', None, None, None),
    ('--show-time-cost', 'show_time_cost', 'true', None, None, False),
    ('--enable-metrics', 'enable_metrics', 'true', None, None, False),
    ('--smg-http-sidecar-port|--grpc-http-sidecar-port', 'smg_http_sidecar_port', 'int', None, None, None),
    ('--enable-mfu-metrics', 'enable_mfu_metrics', 'true', None, None, False),
    ('--enable-metrics-for-all-schedulers', 'enable_metrics_for_all_schedulers', 'true', None, None, False),
    ('--load-snapshot-publish-interval', 'load_snapshot_publish_interval', 'int', None, None, 15),
    ('--tokenizer-metrics-custom-labels-header',
     'tokenizer_metrics_custom_labels_header', 'str', None, None, 'x-custom-labels'),
    ('--tokenizer-metrics-allowed-custom-labels', 'tokenizer_metrics_allowed_custom_labels', 'str', '+', None, None),
    ('--extra-metric-labels', 'extra_metric_labels', 'json', None, None, None),
    ('--bucket-time-to-first-token', 'bucket_time_to_first_token', 'float', '+', None, None),
    ('--bucket-inter-token-latency', 'bucket_inter_token_latency', 'float', '+', None, None),
    ('--bucket-e2e-request-latency', 'bucket_e2e_request_latency', 'float', '+', None, None),
    ('--prompt-tokens-buckets', 'prompt_tokens_buckets', 'str', '+', None, None),
    ('--generation-tokens-buckets', 'generation_tokens_buckets', 'str', '+', None, None),
    ('--gc-warning-threshold-secs', 'gc_warning_threshold_secs', 'float', None, None, 0.0),
    ('--decode-log-interval', 'decode_log_interval', 'int', None, None, 40),
    ('--enable-request-time-stats-logging', 'enable_request_time_stats_logging', 'true', None, None, False),
    ('--kv-events-config', 'kv_events_config', 'str', None, None, None),
    ('--load-publish-endpoint', 'load_publish_endpoint', 'str', None, None, None),
    ('--enable-forward-pass-metrics', 'enable_forward_pass_metrics', 'true', None, None, False),
    ('--forward-pass-metrics-worker-id', 'forward_pass_metrics_worker_id', 'str', None, None, ''),
    ('--forward-pass-metrics-ipc-name', 'forward_pass_metrics_ipc_name', 'str', None, None, None),
    ('--enable-trace', 'enable_trace', 'true', None, None, False),
    ('--trace-modules', 'trace_modules', 'str', None, None, 'request'),
    ('--otlp-traces-endpoint', 'otlp_traces_endpoint', 'str', None, None, 'localhost:4317'),
    ('--export-metrics-to-file', 'export_metrics_to_file', 'true', None, None, False),
    ('--export-metrics-to-file-dir', 'export_metrics_to_file_dir', 'str', None, None, None),
    ('--constrained-json-whitespace-pattern', 'constrained_json_whitespace_pattern', 'str', None, None, None),
    ('--constrained-json-disable-any-whitespace', 'constrained_json_disable_any_whitespace', 'true', None, None, False),
    ('--constrained-json-max-whitespace-cnt', 'constrained_json_max_whitespace_cnt', 'int', None, None, None),
    ('--attention-backend', 'attention_backend', 'str', None,
     'triton|torch_native|flex_attention|dsa|nsa|qsa|dsv4|compressed|fa3|fa4|flashinfer|'
     'llada2_cfg_flashinfer|flashmla|trtllm_mla|cutedsl_mla|tokenspeed_mla|trtllm_mha|hpc_ops|'
     'minicpm_flashattn|minicpm_flashinfer|aiter|wave|intel_amx|ascend|intel_xpu',
     None),
    ('--decode-attention-backend', 'decode_attention_backend', 'str', None,
     'triton|torch_native|flex_attention|dsa|nsa|qsa|dsv4|compressed|fa3|fa4|flashinfer|'
     'llada2_cfg_flashinfer|flashmla|trtllm_mla|cutedsl_mla|tokenspeed_mla|trtllm_mha|hpc_ops|'
     'minicpm_flashattn|minicpm_flashinfer|aiter|wave|intel_amx|ascend|intel_xpu',
     None),
    ('--enable-lean-attention', 'enable_lean_attention', 'true', None, None, None),
    ('--prefill-attention-backend', 'prefill_attention_backend', 'str', None,
     'triton|torch_native|flex_attention|dsa|nsa|qsa|dsv4|compressed|fa3|fa4|flashinfer|'
     'llada2_cfg_flashinfer|flashmla|trtllm_mla|cutedsl_mla|tokenspeed_mla|trtllm_mha|hpc_ops|'
     'minicpm_flashattn|minicpm_flashinfer|aiter|wave|intel_amx|ascend|intel_xpu',
     None),
    ('--grammar-backend', 'grammar_backend', 'str', None, 'xgrammar|outlines|llguidance|none', None),
    ('--radix-cache-backend', 'radix_cache_backend', 'str', None, None, None),
    ('--mm-attention-backend', 'mm_attention_backend', 'str', None,
     'sdpa|fa3|fa4|triton_attn|ascend_attn|aiter_attn|flashinfer_cudnn|amx_attn|xpu_attn',
     None),
    ('--fp8-gemm-backend', 'fp8_gemm_runner_backend', 'str', None,
     'auto|deep_gemm|flashinfer_trtllm|flashinfer_cutlass|flashinfer_deepgemm|flashinfer_cutedsl|cutlass|'
     'triton|aiter',
     'auto'),
    ('--fp4-gemm-backend', 'fp4_gemm_runner_backend', 'str', None,
     'auto|flashinfer_cudnn|flashinfer_cutedsl|flashinfer_cutlass|flashinfer_trtllm|marlin',
     'auto'),
    ('--bf16-gemm-backend', 'bf16_gemm_backend', 'str', None, 'auto|cutedsl|gemv|torch', 'auto'),
    ('--dsa-prefill-backend', 'dsa_prefill_backend', 'str', None,
     'flashmla_sparse|flashmla_sparse_q8|flashmla_kv|flashmla_auto|flashinfer_sparse_mla|'
     'triton_sparse_mla|fa3|tilelang|triton|aiter|trtllm|intel_xpu',
     None),
    ('--dsv4-prefill-backend', 'dsv4_prefill_backend', 'str', None, 'auto|flashmla_sparse|flashmla_sparse_q8', 'auto'),
    ('--dsa-decode-backend', 'dsa_decode_backend', 'str', None,
     'flashmla_sparse|flashmla_sparse_q8|flashmla_kv|flashmla_auto|flashinfer_sparse_mla|fa3|tilelang|'
     'triton|aiter|trtllm|intel_xpu',
     None),
    ('--dsa-paged-mqa-logits-backend', 'dsa_paged_mqa_logits_backend', 'str', None,
     'auto|deepgemm|cutedsl|aiter',
     'auto'),
    ('--dsa-topk-backend', 'dsa_topk_backend', 'str', None, 'sgl-kernel|torch|flashinfer', 'sgl-kernel'),
    ('--disable-flashinfer-autotune', 'disable_flashinfer_autotune', 'true', None, None, False),
    ('--flashinfer-autotune-skip-ops', 'flashinfer_autotune_skip_ops', 'str', '+', None, None),
    ('--mamba-backend', 'mamba_backend', 'str', None, 'triton|flashinfer', 'triton'),
    ('--cuda-graph-config', 'cuda_graph_config', 'json', None, None, None),
    ('--cuda-graph-backend-decode', 'cuda_graph_backend_decode', 'str', None, 'full|breakable|disabled', None),
    ('--cuda-graph-backend-prefill', 'cuda_graph_backend_prefill', 'str', None, 'full|breakable|disabled', None),
    ('--cuda-graph-max-bs-decode', 'cuda_graph_max_bs_decode', 'int', None, None, None),
    ('--cuda-graph-max-bs-prefill', 'cuda_graph_max_bs_prefill', 'int', None, None, None),
    ('--cuda-graph-bs-decode', 'cuda_graph_bs_decode', 'int', '+', None, None),
    ('--cuda-graph-bs-prefill', 'cuda_graph_bs_prefill', 'int', '+', None, None),
    ('--cuda-graph-prefill-max-context|--context-bucket', 'cuda_graph_prefill_max_context', 'hint', None, None, None),
    ('--disable-prefill-cuda-graph', 'disable_prefill_cuda_graph', 'true', None, None, False),
    ('--disable-decode-cuda-graph', 'disable_decode_cuda_graph', 'true', None, None, False),
    ('--disable-cuda-graph-padding', 'disable_cuda_graph_padding', 'true', None, None, False),
    ('--enable-profile-cuda-graph', 'enable_profile_cuda_graph', 'true', None, None, False),
    ('--enable-cudagraph-gc', 'enable_cudagraph_gc', 'true', None, None, False),
    ('--debug-cuda-graph', 'debug_cuda_graph', 'true', None, None, False),
    ('--enable-layerwise-nvtx-marker', 'enable_layerwise_nvtx_marker', 'true', None, None, False),
    ('--enable-nccl-nvls', 'enable_nccl_nvls', 'true', None, None, False),
    ('--enable-symm-mem', 'enable_symm_mem', 'true', None, None, False),
    ('--triton-attention-reduce-in-fp32', 'triton_attention_reduce_in_fp32', 'true', None, None, False),
    ('--triton-attention-num-kv-splits', 'triton_attention_num_kv_splits', 'int', None, None, 8),
    ('--triton-attention-split-tile-size', 'triton_attention_split_tile_size', 'int', None, None, None),
    ('--flashinfer-mla-disable-ragged', 'flashinfer_mla_disable_ragged', 'true', None, None, False),
    ('--enable-fused-qk-norm-rope', 'enable_fused_qk_norm_rope', 'boolopt', None, None, None),
    ('--enable-precise-embedding-interpolation', 'enable_precise_embedding_interpolation', 'true', None, None, False),
    ('--enable-fused-moe-sum-all-reduce', 'enable_fused_moe_sum_all_reduce', 'true', None, None, False),
    ('--enable-deepseek-v4-fp4-indexer', 'enable_deepseek_v4_fp4_indexer', 'true', None, None, False),
    ('--disable-custom-all-reduce', 'disable_custom_all_reduce', 'true', None, None, False),
    ('--enable-mscclpp', 'enable_mscclpp', 'true', None, None, False),
    ('--enable-torch-symm-mem', 'enable_torch_symm_mem', 'true', None, None, False),
    ('--enable-scattered-sconv', 'enable_scattered_sconv', 'true', None, None, False),
    ('--pre-warm-nccl', 'pre_warm_nccl', 'true', None, None, False),
    ('--boundary-reduction', 'boundary_reduction', 'str', None, 'auto|ar|rs|rsv|rs+rsv', 'auto'),
    ('--enable-quant-communications', 'enable_quant_communications', 'true', None, None, False),
    ('--enforce-disable-flashinfer-allreduce-fusion',
     'enforce_disable_flashinfer_allreduce_fusion', 'true', None, None, False),
    ('--flashinfer-allreduce-fusion-backend', 'flashinfer_allreduce_fusion_backend', 'str', None,
     'auto|trtllm|mnnvl|cutedsl',
     None),
    ('--enable-aiter-allreduce-fusion', 'enable_aiter_allreduce_fusion', 'true', None, None, False),
    ('--enable-torch-compile', 'enable_torch_compile', 'true', None, None, False),
    ('--enable-torch-compile-debug-mode', 'enable_torch_compile_debug_mode', 'true', None, None, False),
    ('--torch-compile-max-bs', 'torch_compile_max_bs', 'int', None, None, 32),
    ('--speculative-algorithm', 'speculative_algorithm', 'str', None, None, None),
    ('--uno-lora-path', 'uno_lora_path', 'str', None, None, None),
    ('--speculative-draft-model-path|--speculative-draft-model',
     'speculative_draft_model_path', 'str', None, None, None),
    ('--speculative-draft-model-revision', 'speculative_draft_model_revision', 'str', None, None, None),
    ('--speculative-draft-load-format', 'speculative_draft_load_format', 'str', None,
     'auto|pt|safetensors|instanttensor|npcache|dummy|sharded_state|presharded|gguf|expert_pack|'
     'bitsandbytes|mistral|layered|flash_rl|remote|remote_instance|fastsafetensors|private|runai_streamer',
     None),
    ('--speculative-num-steps', 'speculative_num_steps', 'int', None, None, None),
    ('--speculative-eagle-topk', 'speculative_eagle_topk', 'int', None, None, None),
    ('--speculative-num-draft-tokens', 'speculative_num_draft_tokens', 'int', None, None, None),
    ('--speculative-dflash-block-size', 'speculative_dflash_block_size', 'int', None, None, None),
    ('--speculative-dspark-block-size', 'speculative_dspark_block_size', 'int', None, None, None),
    ('--speculative-dspark-sps-table-path', 'speculative_dspark_sps_table_path', 'str', None, None, None),
    ('--speculative-dspark-confidence-sts-path', 'speculative_dspark_confidence_sts_path', 'str', None, None, None),
    ('--speculative-dspark-align-verify-tokens-to-graph-tier',
     'speculative_dspark_align_verify_tokens_to_graph_tier', 'true', None, None, False),
    ('--speculative-accept-threshold-single', 'speculative_accept_threshold_single', 'float', None, None, 1.0),
    ('--speculative-accept-threshold-acc', 'speculative_accept_threshold_acc', 'float', None, None, 1.0),
    ('--speculative-use-rejection-sampling', 'speculative_use_rejection_sampling', 'true', None, None, False),
    ('--speculative-token-map', 'speculative_token_map', 'str', None, None, None),
    ('--speculative-attention-mode', 'speculative_attention_mode', 'str', None, 'prefill|decode', 'prefill'),
    ('--speculative-draft-attention-backend', 'speculative_draft_attention_backend', 'str', None, None, None),
    ('--speculative-dsa-topk-backend', 'speculative_dsa_topk_backend', 'str', None,
     'sgl-kernel|torch|flashinfer',
     'sgl-kernel'),
    ('--speculative-draft-kv-cache-dtype', 'speculative_draft_kv_cache_dtype', 'str', None,
     'auto|fp8_e5m2|fp8_e4m3|bf16|bfloat16',
     None),
    ('--speculative-draft-window-size', 'speculative_draft_window_size', 'int', None, None, None),
    ('--speculative-moe-runner-backend', 'speculative_moe_runner_backend', 'str', None,
     'auto|deep_gemm|triton|triton_kernel|flashinfer_trtllm|experimental_sgl_trtllm|'
     'flashinfer_trtllm_routed|flashinfer_cutlass|flashinfer_mxfp4|flashinfer_cutedsl|flashinfer_megamoe|'
     'cutlass|aiter|marlin|humming|experimental_sgl_marlin|lora_cutedsl|lora_triton|lora_marlin|hpc_ops|'
     'megamoe|intel_xpu',
     None),
    ('--speculative-moe-a2a-backend', 'speculative_moe_a2a_backend', 'str', None,
     'none|deepep|mooncake|nixl|mori|ascend_fuseep|flashinfer|megamoe|deepep_v2|pplx|ascend_tp',
     None),
    ('--speculative-enable-w4a4-mxfp4-megamoe', 'speculative_enable_w4a4_mxfp4_megamoe', 'boolopt', None, None, None),
    ('--speculative-draft-model-quantization', 'speculative_draft_model_quantization', 'str', None,
     'awq|fp8|mxfp8|gptq|gptq_marlin|awq_marlin|bitsandbytes|gguf|modelopt|modelopt_fp8|modelopt_fp4|'
     'nvfp4_online|modelopt_mixed|petit_nvfp4|w8a8_int8|w8a8_fp8|moe_wna16|w4afp8|mxfp4|auto-round|'
     'auto-round-int8|compressed-tensors|modelslim|mxfp_w4a8|quark|quark_int4fp8_moe|quark_mxfp4|mlx_q4|'
     'mlx_q8|unquant|humming',
     None),
    ('--enable-multi-layer-eagle', 'enable_multi_layer_eagle', 'true', None, None, False),
    ('--speculative-adaptive', 'speculative_adaptive', 'true', None, None, False),
    ('--speculative-adaptive-config', 'speculative_adaptive_config', 'str', None, None, None),
    ('--decoupled-spec-bind-endpoint', 'decoupled_spec_bind_endpoint', 'str', None, None, None),
    ('--decoupled-spec-connect-endpoints', 'decoupled_spec_connect_endpoints', 'jsonlist', None, None, None),
    ('--decoupled-spec-rank', 'decoupled_spec_rank', 'int', None, None, None),
    ('--decoupled-spec-role', 'decoupled_spec_role', 'str', None, 'null|verifier|drafter', 'null'),
    ('--spec-trace-dir', 'spec_trace_dir', 'str', None, None, None),
    ('--speculative-ngram-min-bfs-breadth', 'speculative_ngram_min_bfs_breadth', 'int', None, None, 1),
    ('--speculative-ngram-max-bfs-breadth', 'speculative_ngram_max_bfs_breadth', 'int', None, None, 10),
    ('--speculative-ngram-match-type', 'speculative_ngram_match_type', 'str', None, 'BFS|PROB', 'BFS'),
    ('--speculative-ngram-max-trie-depth', 'speculative_ngram_max_trie_depth', 'int', None, None, 18),
    ('--speculative-ngram-capacity', 'speculative_ngram_capacity', 'int', None, None, 10000000),
    ('--speculative-ngram-external-corpus-path', 'speculative_ngram_external_corpus_path', 'str', None, None, None),
    ('--speculative-ngram-external-sam-budget', 'speculative_ngram_external_sam_budget', 'int', None, None, 0),
    ('--speculative-ngram-external-corpus-max-tokens',
     'speculative_ngram_external_corpus_max_tokens', 'int', None, None, 10000000),
    ('--ep-size|--expert-parallel-size|--ep', 'ep_size', 'int', None, None, 1),
    ('--moe-a2a-backend', 'moe_a2a_backend', 'str', None,
     'none|deepep|mooncake|nixl|mori|ascend_fuseep|flashinfer|megamoe|deepep_v2|pplx|ascend_tp|'
     'flashinfer_megamoe',
     'none'),
    ('--enable-w4a4-mxfp4-megamoe', 'enable_w4a4_mxfp4_megamoe', 'true', None, None, False),
    ('--deepep-v2-mode', 'deepep_v2_mode', 'str', None, 'direct|hybrid', 'direct'),
    ('--moe-runner-backend', 'moe_runner_backend', 'str', None,
     'auto|deep_gemm|triton|triton_kernel|flashinfer_trtllm|experimental_sgl_trtllm|'
     'flashinfer_trtllm_routed|flashinfer_cutlass|flashinfer_mxfp4|flashinfer_cutedsl|flashinfer_megamoe|'
     'cutlass|aiter|marlin|humming|experimental_sgl_marlin|lora_cutedsl|lora_triton|lora_marlin|hpc_ops|'
     'megamoe|intel_xpu',
     'auto'),
    ('--flashinfer-mxfp4-moe-precision', 'flashinfer_mxfp4_moe_precision', 'str', None, 'default|bf16|fp8', 'default'),
    ('--deepep-mode', 'deepep_mode', 'str', None, 'auto|normal|low_latency', 'auto'),
    ('--fuseep-mode', 'fuseep_mode', 'int', None, '1|2', 2),
    ('--deepep-dispatcher-output-dtype', 'deepep_dispatcher_output_dtype', 'str', None,
     'auto|bf16|fp8|int8|nvfp4',
     'auto'),
    ('--ep-num-redundant-experts', 'ep_num_redundant_experts', 'int', None, None, 0),
    ('--ep-dispatch-algorithm', 'ep_dispatch_algorithm', 'str', None, 'static|dynamic|fake|lp', None),
    ('--init-expert-location', 'init_expert_location', 'str', None, None, 'trivial'),
    ('--enable-eplb', 'enable_eplb', 'true', None, None, False),
    ('--eplb-algorithm', 'eplb_algorithm', 'str', None, None, 'auto'),
    ('--eplb-rebalance-num-iterations', 'eplb_rebalance_num_iterations', 'int', None, None, 1000),
    ('--eplb-rebalance-layers-per-chunk', 'eplb_rebalance_layers_per_chunk', 'int', None, None, None),
    ('--eplb-min-rebalancing-utilization-threshold',
     'eplb_min_rebalancing_utilization_threshold', 'float', None, None, 1.0),
    ('--expert-distribution-recorder-mode', 'expert_distribution_recorder_mode', 'str', None,
     'stat|stat_approx|per_pass|per_token',
     None),
    ('--expert-distribution-recorder-buffer-size', 'expert_distribution_recorder_buffer_size', 'int', None, None, None),
    ('--expert-balancedness-report-mode', 'expert_balancedness_report_mode', 'str', None,
     'off|server_log|prometheus|both',
     'off'),
    ('--deepep-config', 'deepep_config', 'str', None, None, None),
    ('--moe-dense-tp-size', 'moe_dense_tp_size', 'int', None, None, None),
    ('--elastic-ep-backend', 'elastic_ep_backend', 'str', None, 'none|mooncake|nixl', None),
    ('--enable-elastic-expert-backup', 'enable_elastic_expert_backup', 'true', None, None, False),
    ('--mooncake-ib-device', 'mooncake_ib_device', 'str', None, None, None),
    ('--enable-waterfill', 'enable_waterfill', 'true', None, None, False),
    ('--elastic-ep-join-mode', 'ep_join_mode', 'str', None, 'scale|recover', None),
    ('--elastic-ep-join-rank-offset', 'ep_join_rank_offset', 'int', None, None, 0),
    ('--elastic-ep-initial-size', 'elastic_ep_initial_size', 'int', None, None, None),
    ('--max-ep-size', 'max_ep_size', 'int', None, None, None),
    ('--elastic-ep-scale-timeout', 'elastic_ep_scale_timeout', 'float', None, None, 600),
    ('--disable-flashinfer-cutlass-moe-fp4-allgather',
     'disable_flashinfer_cutlass_moe_fp4_allgather', 'true', None, None, False),
    ('--disable-shared-experts-fusion', 'disable_shared_experts_fusion', 'true', None, None, False),
    ('--enforce-shared-experts-fusion', 'enforce_shared_experts_fusion', 'true', None, None, False),
    ('--max-mamba-cache-size', 'max_mamba_cache_size', 'int', None, None, None),
    ('--mamba-ssm-dtype', 'mamba_ssm_dtype', 'str', None, 'float32|bfloat16|float16', None),
    ('--mamba-max-states-per-path', 'mamba_max_states_per_path', 'int', None, None, -1),
    ('--enable-mamba-cache-stochastic-rounding', 'enable_mamba_cache_stochastic_rounding', 'true', None, None, False),
    ('--mamba-cache-philox-rounds', 'mamba_cache_philox_rounds', 'int', None, None, 0),
    ('--mamba-full-memory-ratio', 'mamba_full_memory_ratio', 'float', None, None, None),
    ('--mamba-radix-cache-strategy', 'mamba_radix_cache_strategy', 'str', None,
     'auto|no_buffer|extra_buffer|extra_buffer_lazy',
     'auto'),
    ('--mamba-track-interval', 'mamba_track_interval', 'int', None, None, 256),
    ('--enable-int8-mamba-checkpoint', 'enable_int8_mamba_checkpoint', 'true', None, None, False),
    ('--int8-mamba-ckpt-size', 'int8_mamba_ckpt_size', 'int', None, None, None),
    ('--linear-attn-backend', 'linear_attn_backend', 'str', None,
     'triton|cutedsl|flashinfer|flashkda|nvidia_kda|ptx_kda|helion|intel_xpu',
     'triton'),
    ('--linear-attn-decode-backend', 'linear_attn_decode_backend', 'str', None,
     'triton|cutedsl|flashinfer|flashkda|nvidia_kda|ptx_kda|helion|intel_xpu',
     None),
    ('--linear-attn-prefill-backend', 'linear_attn_prefill_backend', 'str', None,
     'triton|cutedsl|flashinfer|flashkda|nvidia_kda|ptx_kda|helion|intel_xpu',
     None),
    ('--linear-attn-verify-backend', 'linear_attn_verify_backend', 'str', None,
     'triton|cutedsl|flashinfer|flashkda|nvidia_kda|ptx_kda|helion|intel_xpu|nv_cutedsl',
     None),
    ('--enable-linear-replayssm', 'enable_linear_replayssm', 'true', None, None, False),
    ('--linear-replayssm-cache-len', 'linear_replayssm_cache_len', 'int', None, None, 16),
    ('--enable-linear-replayssm-spec', 'enable_linear_replayssm_spec', 'true', None, None, False),
    ('--enable-hierarchical-cache|--enable-hicache', 'enable_hierarchical_cache', 'true', None, None, False),
    ('--hicache-host-memory-mode', 'hicache_host_memory_mode', 'str', None, 'cache|buffer_only', 'cache'),
    ('--hicache-ratio', 'hicache_ratio', 'float', None, None, None),
    ('--hicache-size', 'hicache_size', 'int', None, None, 0),
    ('--hicache-write-policy', 'hicache_write_policy', 'str', None,
     'write_back|write_through|write_through_selective',
     'write_through'),
    ('--hicache-io-backend', 'hicache_io_backend', 'str', None, 'direct|kernel|kernel_ascend', 'kernel'),
    ('--hicache-mem-layout', 'hicache_mem_layout', 'str', None,
     'layer_first|page_first|page_first_direct|page_first_kv_split|page_head',
     'page_first'),
    ('--hicache-storage-backend', 'hicache_storage_backend', 'str', None,
     'file|sim|mooncake|npu_memcache|hf3fs|nixl|aibrix|dynamic|eic|simm|mori|shm|tensorcast|seaweedfs',
     None),
    ('--hicache-storage-prefetch-policy', 'hicache_storage_prefetch_policy', 'str', None,
     'best_effort|wait_complete|timeout',
     'timeout'),
    ('--hicache-storage-backend-extra-config', 'hicache_storage_backend_extra_config', 'str', None, None, None),
    ('--hicache-storage-prefetch-retry-poll-interval',
     'hicache_storage_prefetch_retry_poll_interval', 'int', None, None, 8),
    ('--hicache-storage-prefetch-retry-max-attempts',
     'hicache_storage_prefetch_retry_max_attempts', 'int', None, None, 8),
    ('--enable-unified-cache-external-linker', 'enable_unified_cache_external_linker', 'true', None, None, False),
    ('--unified-cache-external-linker-backend', 'unified_cache_external_linker_backend', 'str', None,
     'mooncake|mori|dynamic',
     'mooncake'),
    ('--enable-hisparse', 'enable_hisparse', 'true', None, None, False),
    ('--hisparse-config|--hierarchical-sparse-attention-extra-config', 'hisparse_config', 'str', None, None, None),
    ('--enable-broadcast-mm-inputs-process', 'enable_broadcast_mm_inputs_process', 'true', None, None, False),
    ('--enable-prefix-mm-cache', 'enable_prefix_mm_cache', 'true', None, None, False),
    ('--mm-enable-dp-encoder', 'mm_enable_dp_encoder', 'boolopt', None, None, None),
    ('--mm-process-config', 'mm_process_config', 'json', None, None, None),
    ('--mm-processor-worker-num', 'mm_processor_worker_num', 'int', None, None, 0),
    ('--mm-io-worker-num', 'mm_io_worker_num', 'int', None, None, 0),
    ('--allowed-media-domains', 'allowed_media_domains', 'str', '+', None, []),
    ('--media-url-max-file-size-mb', 'media_url_max_file_size_mb', 'int', None, None, 64),
    ('--mm-preprocess-cache-size-mb', 'mm_preprocess_cache_size_mb', 'int', None, None, None),
    ('--trust-mm-content-hashes', 'trust_mm_content_hashes', 'true', None, None, False),
    ('--limit-mm-data-per-request', 'limit_mm_data_per_request', 'json', None, None, None),
    ('--enable-mm-global-cache', 'enable_mm_global_cache', 'true', None, None, False),
    ('--image-processor-backend', 'image_processor_backend', 'str', None, 'auto|torchvision|pil', 'auto'),
    ('--mm-global-cache-backend', 'mm_global_cache_backend', 'str', None, 'mooncake', 'mooncake'),
    ('--disable-fast-image-processor', 'disable_fast_image_processor', 'true', None, None, False),
    ('--mm-feature-transport', 'mm_feature_transport', 'str', None, 'cpu|cuda_ipc|cuda_vmm', None),
    ('--enable-lora', 'enable_lora', 'true', None, None, None),
    ('--enable-lora-overlap-loading', 'enable_lora_overlap_loading', 'true', None, None, None),
    ('--max-lora-rank', 'max_lora_rank', 'int', None, None, None),
    ('--lora-target-modules', 'lora_target_modules', 'str', '*',
     'q_proj|k_proj|v_proj|o_proj|q_a_proj|kv_a_proj_with_mqa|q_b_proj|kv_b_proj|wq_b|wk|weights_proj|'
     'gate_proj|up_proj|down_proj|qkv_proj|gate_up_proj|embed_tokens|lm_head|qkvr|wo_ud|all',
     None),
    ('--lora-paths', 'lora_paths', 'str', '*', None, None),
    ('--max-loaded-loras', 'max_loaded_loras', 'int', None, None, None),
    ('--max-loras-per-batch', 'max_loras_per_batch', 'int', None, None, 8),
    ('--lora-eviction-policy', 'lora_eviction_policy', 'str', None, 'lru|fifo', 'lru'),
    ('--lora-backend', 'lora_backend', 'str', None, 'triton|csgmv|ascend|torch_native|triton_v2', 'csgmv'),
    ('--max-lora-chunk-size', 'max_lora_chunk_size', 'int', None, '16|32|64|128', 16),
    ('--experts-shared-outer-loras', 'experts_shared_outer_loras', 'boolopt', None, None, None),
    ('--lora-use-virtual-experts', 'lora_use_virtual_experts', 'true', None, None, False),
    ('--lora-strict-loading', 'lora_strict_loading', 'boolopt', None, None, False),
    ('--lora-drain-wait-threshold', 'lora_drain_wait_threshold', 'float', None, None, 0.0),
    ('--enable-two-batch-overlap', 'enable_two_batch_overlap', 'true', None, None, False),
    ('--enable-single-batch-overlap', 'enable_single_batch_overlap', 'true', None, None, False),
    ('--tbo-token-distribution-threshold', 'tbo_token_distribution_threshold', 'float', None, None, 0.48),
    ('--cpu-offload-gb', 'cpu_offload_gb', 'int', None, None, 0),
    ('--offload-group-size', 'offload_group_size', 'int', None, None, -1),
    ('--offload-num-in-group', 'offload_num_in_group', 'int', None, None, 1),
    ('--offload-prefetch-step', 'offload_prefetch_step', 'int', None, None, 1),
    ('--offload-mode', 'offload_mode', 'str', None, None, 'cpu'),
    ('--enable-lmcache', 'enable_lmcache', 'true', None, None, False),
    ('--lmcache-config-file', 'lmcache_config_file', 'str', None, None, None),
    ('--enable-flexkv', 'enable_flexkv', 'true', None, None, False),
    ('--flexkv-config-file', 'flexkv_config_file', 'str', None, None, None),
    ('--kt-weight-path', 'kt_weight_path', 'str', None, None, None),
    ('--kt-method', 'kt_method', 'str', None, None, 'AMXINT4'),
    ('--kt-cpuinfer', 'kt_cpuinfer', 'int', None, None, None),
    ('--kt-threadpool-count', 'kt_threadpool_count', 'int', None, None, 2),
    ('--kt-num-gpu-experts', 'kt_num_gpu_experts', 'int', None, None, None),
    ('--kt-max-deferred-experts-per-token', 'kt_max_deferred_experts_per_token', 'int', None, None, None),
    ('--dllm-algorithm', 'dllm_algorithm', 'str', None, None, None),
    ('--dllm-algorithm-config', 'dllm_algorithm_config', 'str', None, None, None),
    ('--dllm-fdfo', 'dllm_fdfo', 'boolopt', None, None, True),
    ('--disaggregation-mode', 'disaggregation_mode', 'str', None, 'null|prefill|decode', 'null'),
    ('--disaggregation-transfer-backend', 'disaggregation_transfer_backend', 'str', None,
     'mooncake|nixl|ascend|fake|mori|mooncake_tcp',
     'mooncake'),
    ('--disaggregation-bootstrap-port', 'disaggregation_bootstrap_port', 'int', None, None, 8998),
    ('--disaggregation-ib-device', 'disaggregation_ib_device', 'str', None, None, None),
    ('--disaggregation-decode-enable-radix-cache',
     'disaggregation_decode_enable_radix_cache', 'true', None, None, False),
    ('--disaggregation-decode-enable-offload-kvcache',
     'disaggregation_decode_enable_offload_kvcache', 'true', None, None, False),
    ('--disaggregation-decode-retraction-backup', 'disaggregation_decode_retraction_backup', 'str', None,
     'cpu_tensor|host_pool|none',
     None),
    ('--num-reserved-decode-tokens', 'num_reserved_decode_tokens', 'int', None, None, 512),
    ('--disaggregation-decode-extra-slots', 'disaggregation_decode_extra_slots', 'int', None, None, None),
    ('--disaggregation-decode-polling-interval', 'disaggregation_decode_polling_interval', 'int', None, None, 1),
    ('--optimistic-prefill-attempts', 'optimistic_prefill_attempts', 'int', None, None, 0),
    ('--encoder-only', 'encoder_only', 'true', None, None, False),
    ('--language-only', 'language_only', 'true', None, None, False),
    ('--language-model-only', 'language_model_only', 'true', None, None, False),
    ('--encoder-transfer-backend', 'encoder_transfer_backend', 'str', None,
     'auto|zmq_to_scheduler|zmq_to_tokenizer|mooncake',
     'auto'),
    ('--encoder-urls', 'encoder_urls', 'str', '+', None, []),
    ('--encoder-bootstrap-port', 'encoder_bootstrap_port', 'int', None, None, 8997),
    ('--encoder-register-urls', 'encoder_register_urls', 'str', '+', None, []),
    ('--enable-adaptive-dispatch-to-encoder', 'enable_adaptive_dispatch_to_encoder', 'true', None, None, False),
    ('--enable-pdmux', 'enable_pdmux', 'true', None, None, False),
    ('--pdmux-config-path', 'pdmux_config_path', 'str', None, None, None),
    ('--sm-group-num', 'sm_group_num', 'int', None, None, 8),
    ('--startup-weight-load-mode', 'startup_weight_load_mode', 'str', None, 'serial|overlap', 'serial'),
    ('--custom-weight-loader', 'custom_weight_loader', 'str', '*', None, None),
    ('--weight-loader-disable-mmap', 'weight_loader_disable_mmap', 'true', None, None, False),
    ('--weight-loader-prefetch-checkpoints', 'weight_loader_prefetch_checkpoints', 'true', None, None, False),
    ('--weight-loader-prefetch-num-threads', 'weight_loader_prefetch_num_threads', 'int', None, None, 4),
    ('--weight-loader-drop-cache-after-load', 'weight_loader_drop_cache_after_load', 'true', None, None, False),
    ('--remote-instance-weight-loader-seed-instance-ip',
     'remote_instance_weight_loader_seed_instance_ip', 'str', None, None, None),
    ('--remote-instance-weight-loader-seed-instance-service-port',
     'remote_instance_weight_loader_seed_instance_service_port', 'int', None, None, None),
    ('--remote-instance-weight-loader-send-weights-group-ports',
     'remote_instance_weight_loader_send_weights_group_ports', 'jsonlist', None, None, None),
    ('--remote-instance-weight-loader-backend', 'remote_instance_weight_loader_backend', 'str', None,
     'transfer_engine|nccl|modelexpress',
     'nccl'),
    ('--remote-instance-weight-loader-start-seed-via-transfer-engine',
     'remote_instance_weight_loader_start_seed_via_transfer_engine', 'true', None, None, False),
    ('--engine-info-bootstrap-port', 'engine_info_bootstrap_port', 'int', None, None, 6789),
    ('--modelexpress-config', 'modelexpress_config', 'str', None, None, None),
    ('--download-dir', 'download_dir', 'str', None, None, None),
    ('--model-checksum', 'model_checksum', 'str', '?', None, None),
    ('--delete-ckpt-after-loading', 'delete_ckpt_after_loading', 'true', None, None, False),
    ('--decrypted-config-file', 'decrypted_config_file', 'str', None, None, None),
    ('--decrypted-draft-config-file', 'decrypted_draft_config_file', 'str', None, None, None),
    ('--checkpoint-engine-wait-weights-before-ready',
     'checkpoint_engine_wait_weights_before_ready', 'true', None, None, False),
    ('--enable-prefill-delayer', 'enable_prefill_delayer', 'true', None, None, False),
    ('--prefill-delayer-max-delay-passes', 'prefill_delayer_max_delay_passes', 'int', None, None, 30),
    ('--prefill-delayer-token-usage-low-watermark',
     'prefill_delayer_token_usage_low_watermark', 'float', None, None, None),
    ('--prefill-delayer-forward-passes-buckets', 'prefill_delayer_forward_passes_buckets', 'float', '+', None, None),
    ('--prefill-delayer-wait-seconds-buckets', 'prefill_delayer_wait_seconds_buckets', 'float', '+', None, None),
    ('--prefill-delayer-queue-min-ratio', 'prefill_delayer_queue_min_ratio', 'float', None, None, None),
    ('--prefill-delayer-max-delay-ms', 'prefill_delayer_max_delay_ms', 'float', None, None, None),
    ('--min-free-slots-delay', 'min_free_slots_delay', 'int', None, None, None),
    ('--enable-deterministic-inference', 'enable_deterministic_inference', 'true', None, None, False),
    ('--rl-on-policy-target', 'rl_on_policy_target', 'str', None, 'fsdp', None),
    ('--kv-canary', 'kv_canary', 'str', None, 'none|log|raise', 'none'),
    ('--kv-canary-sweep-interval', 'kv_canary_sweep_interval', 'int', None, None, 0),
    ('--enable-dynamic-batch-tokenizer', 'enable_dynamic_batch_tokenizer', 'true', None, None, False),
    ('--dynamic-batch-tokenizer-batch-size', 'dynamic_batch_tokenizer_batch_size', 'int', None, None, 32),
    ('--dynamic-batch-tokenizer-batch-timeout', 'dynamic_batch_tokenizer_batch_timeout', 'float', None, None, 0.002),
    ('--enable-tokenizer-batch-encode', 'enable_tokenizer_batch_encode', 'true', None, None, False),
    ('--disable-tokenizer-batch-decode', 'disable_tokenizer_batch_decode', 'true', None, None, False),
    ('--debug-tensor-dump-output-folder', 'debug_tensor_dump_output_folder', 'str', None, None, None),
    ('--debug-tensor-dump-layers', 'debug_tensor_dump_layers', 'int', '+', None, None),
    ('--debug-tensor-dump-input-file', 'debug_tensor_dump_input_file', 'str', None, None, None),
    ('--enable-memory-saver', 'enable_memory_saver', 'true', None, None, False),
    ('--enable-weights-cpu-backup', 'enable_weights_cpu_backup', 'true', None, None, False),
    ('--enable-draft-weights-cpu-backup', 'enable_draft_weights_cpu_backup', 'true', None, None, False),
    ('--enable-custom-logit-processor', 'enable_custom_logit_processor', 'true', None, None, False),
    ('--enable-return-hidden-states', 'enable_return_hidden_states', 'true', None, None, False),
    ('--return-hidden-states-mode', 'return_hidden_states_mode', 'str', None, 'last|full', None),
    ('--enable-return-routed-experts', 'enable_return_routed_experts', 'true', None, None, False),
    ('--enable-return-indexer-topk', 'enable_return_indexer_topk', 'true', None, None, False),
    ('--sampling-mask-max-tokens', 'sampling_mask_max_tokens', 'int', None, None, 4096),
    ('--disable-outlines-disk-cache', 'disable_outlines_disk_cache', 'true', None, None, False),
    ('--enable-mis', 'enable_mis', 'true', None, None, False),
    ('--weight-cache-mode', 'weight_cache_mode', 'str', None, 'off|daemon|client', 'off'),
    ('--weight-cache-socket', 'weight_cache_socket', 'str', None, None, None),
    ('--weight-cache-timeout', 'weight_cache_timeout', 'int', None, None, 1800),
    ('--forward-hooks', 'forward_hooks', 'jsonlist', None, None, None),
    ('--msprobe-dump-config', 'msprobe_dump_config', 'str', None, None, None),
    ('--ple-offload-embedding', 'ple_offload_embedding', 'boolopt', None, None, None),
    ('--ple-offload-backend', 'ple_offload_backend', 'str', None, 'pinned|file', 'pinned'),
    ('--ple-offload-dir', 'ple_offload_dir', 'str', None, None, None),
    ('--disaggregation-enable-kv-checksum', 'disaggregation_enable_kv_checksum', 'true', None, None, False),
    ('--enable-pd-role-switch', 'enable_pd_role_switch', 'true', None, None, False),
    ('--speculative-domino-candidate-pool-size', 'speculative_domino_candidate_pool_size', 'int', None, None, 2048),
    ('--flashinfer-a2a-dispatch-type', 'flashinfer_a2a_dispatch_type', 'str', None, 'auto|bf16|nvfp4|mxfp8', None),
    ('--cuda-graph-max-seq-len-prefill', 'cuda_graph_max_seq_len_prefill', 'int', None, None, None),
    ('--prefill-kv-cache-dequant-dtype', 'prefill_kv_cache_dequant_dtype', 'str', None, 'auto|nvfp4|fp8_e4m3', 'auto'),
    ('--dsv4-attn-backend', 'dsv4_attn_backend', 'str', None, 'auto|flashmla|flashmla_mega|trtllm', 'auto'),
    ('--otlp-service-name', 'otlp_service_name', 'str', None, None, None),
    ('--hicache-host-memory-fraction', 'hicache_host_memory_fraction', 'float', None, None, 0.8),
    ('--enable-linker-mla-dedup', 'enable_linker_mla_dedup', 'true', None, None, False),
    ('--swa-prefix-tails', 'swa_prefix_tails', 'int', None, None, None),
    ('--enable-encoder-swa-bounded-replay', 'enable_encoder_swa_bounded_replay', 'true', None, None, False),
    ('--enable-decoder-swa-bounded-replay', 'enable_decoder_swa_bounded_replay', 'boolopt', None, None, None),
    ('--enable-response-store', 'enable_response_store', 'true', None, None, False),
    ('--disaggregation-decode-host-receive-threshold',
     'disaggregation_decode_host_receive_threshold', 'float', None, None, 1.0),
    ('--qsa-indexer-dtype', 'qsa_indexer_dtype', 'str', None, 'auto|bfloat16|fp8_e4m3', 'auto'),
    ('--disaggregation-decode-allocation-policy', 'disaggregation_decode_allocation_policy', 'str', None,
     'early|prefill_complete',
     'early'),
    ('--speculative-use-block-verification', 'speculative_use_block_verification', 'true', None, None, False),
    ('--speculative-draft-sink-size', 'speculative_draft_sink_size', 'int', None, None, None),
    ('--disable-aiter-allreduce-fusion-in-prefill',
     'disable_aiter_allreduce_fusion_in_prefill', 'true', None, None, False),
    ('--disable-aiter-allreduce-fusion-in-decode',
     'disable_aiter_allreduce_fusion_in_decode', 'true', None, None, False),
    ('--enable-amd-monokernel', 'enable_amd_monokernel', 'true', None, None, False),
    ('--dsa-triton-union', 'dsa_triton_union', 'int', None, '0|2|4', 0),
    ('--enable-dsa-fused-indexer', 'enable_dsa_fused_indexer', 'boolopt', None, None, None),
    ('--enable-watermark', 'enable_watermark', 'true', None, None, False),
    ('--watermark-config', 'watermark_config', 'str', None, None, None),
    ('--grpc-response-timeout-secs', 'grpc_response_timeout_secs', 'int', None, None, 300),
    ('--enable-paged-experts', 'enable_paged_experts', 'true', None, None, False),
    ('--paged-experts-num-resident', 'paged_experts_num_resident', 'int', None, None, None),
    ('--enable-nvidia-megakernel', 'enable_nvidia_megakernel', 'true', None, None, False),
    ('--enable-megamoe-for-layernorm-sp', 'enable_megamoe_for_layernorm_sp', 'true', None, None, False),
    ('--enable-http-worker-reuseport', 'enable_http_worker_reuseport', 'true', None, None, False),
    ('--prefill-decode-interval-min-bs', 'prefill_decode_interval_min_bs', 'int', None, None, 0),
    ('--unified-cache-external-linker-config', 'unified_cache_external_linker_config', 'json', None, None, None),
    ('--enable-return-aux-hidden-states', 'enable_return_aux_hidden_states', 'true', None, None, False),
    ('--return-aux-hidden-state-layer-ids', 'return_aux_hidden_state_layer_ids', 'int', '+', None, None),
    ('--sampling-backend', 'sampling_backend', 'str', None, 'flashinfer|pytorch|intel_xpu|ascend', None),
    ('--reasoning-parser', 'reasoning_parser', 'str', None,
     'auto|apertus2509|beam|deepseek-r1|deepseek-v3|deepseek-v4|deepseek-v41|dots|glm45|ling3|hunyuan|'
     'gpt-oss|k2_horizon|kimi|kimi_k2|kimi_k3|mimo|muse|poolside_v1|qwen3|qwen3-thinking|minimax|'
     'minimax-append-think|minimax-m3|nanbeige|step3|step3p5|mistral|nemotron_3|granite_thinking_parser|'
     'interns1|gemma4|inkling|iquest_q1|cohere_command4|gigachat35|response_template',
     None),
    ('--tool-call-parser', 'tool_call_parser', 'str', None,
     'auto|apertus2509|beam|cohere_command4|deepseekv3|deepseekv31|deepseekv32|deepseekv4|deepseekv41|'
     'dots|glm|glm45|glm47|gpt-oss|k2_horizon|kimi_k2|kimi_k3|lfm2|ling3|llama3|mimo|minicpm5|mistral|'
     'muse|poolside_v1|pythonic|qwen|qwen25|qwen3_coder|spark25|step3|step3p5|minimax-m2|minimax-m3|'
     'nanbeige|trinity|interns1|hermes|hunyuan|gigachat3|gigachat35|gemma4|inkling|iquest_q1|'
     'response_template',
     None),
    ('--kv-canary-real-data', 'kv_canary_real_data', 'str', None, 'none|partial|all', 'none'),
    ('--config', 'config', 'str', None, None, None),
    ('--disable-cuda-graph', 'disable_cuda_graph', 'true', None, None, False),
    ('--enable-dp-attention', 'enable_dp_attention', 'true', None, None, False),
    ('--monokernel-backend', 'enable_amd_monokernel', 'const', None, 'amd', False),
    ('--enable-flashinfer-allreduce-fusion', 'enable_flashinfer_allreduce_fusion', 'true', None, None, False),
)

_SPECS: tuple[FlagSpec, ...] = tuple(_spec(row) for row in _TABLE)
_BY_DEST: dict[str, FlagSpec] = {spec.dest: spec for spec in _SPECS}
_BY_OPTION: dict[str, FlagSpec] = {name: spec for spec in _SPECS for name in spec.names}
