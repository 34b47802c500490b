"""What vLLM 0.33.0's flags mean to the simulated engine: ``resolve`` turns the ``vllm serve`` arguments that were
given into vLLM's resolved engine configuration and the engine's knobs.

The engine (``memory.plan_memory``, ``performance``, ``engine``) is written in one vocabulary of knobs (the names
SGLang gives them); this module is the table from vLLM's flags to those knobs, with vLLM's own defaults and
silent adjustments, calibrated to the same card and model profiles:

=====================================  =======================================================================
vLLM                                   engine knob
=====================================  =======================================================================
``--gpu-memory-utilization U``         ``mem-fraction-static``: vLLM's budget is ``U`` × the card's total
                                       memory and holds the weights, the activation peak, the CUDA graphs and
                                       the KV cache; the static pool is that budget less the activation peak
                                       and the graphs, over the memory free before loading
``--kv-cache-memory-bytes B``          ``mem-fraction-static`` sized so the KV pool is ``B``
``--max-num-seqs N``                   ``max-running-requests``
``--max-num-batched-tokens T``         ``chunked-prefill-size`` and ``max-prefill-tokens`` (the whole
                                       ``max-model-len`` when chunked prefill is off)
``--kv-cache-dtype fp8``               ``kv-cache-dtype fp8_e4m3`` (``auto``: the model's dtype, bf16)
``--enable/--disable-prefix-caching``  ``disable-radix-cache``
``--speculative-config {…}``           ``speculative-algorithm`` / ``-num-steps`` / ``-num-draft-tokens``
``--cudagraph-capture-sizes``,         ``cuda-graph-max-bs-decode`` (the largest captured size in tokens over
``--max-cudagraph-capture-size``,      the tokens per decode step); ``disable-cuda-graph`` with mode ``NONE``
``--compilation-config``               or ``--enforce-eager``
``--enforce-eager``                    ``disable-cuda-graph`` and ``eager-mode`` (the profile's technique that
                                       prices running without torch.compile and CUDA graphs)
``--block-size``                       ``page-size``
``--max-model-len`` (``auto``: -1)     ``context-length`` (``auto``: the longest the KV cache holds)
(a hybrid model's state)               ``max-mamba-cache-size``: at most ``max-num-seqs`` requests' state slots
                                       (vLLM keeps the running sequences' states in its KV budget; a larger
                                       share is KV cache there; ``dialect.py``)
=====================================  =======================================================================

Defaults are vLLM's for the OpenAI server on the card's memory (``EngineArgs.get_batch_defaults``): 2048 batched
tokens and 256 sequences below 70 GiB, 8192 and 1024 from 70 GiB, 16384 and 1024 from 160 GiB; chunked prefill
and prefix caching on; the graph capture ceiling ``min(max_num_seqs × decode tokens × 2, 512)``.
``EngineConfigError`` is what vLLM's engine-config builder rejects before any engine starts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elsa_tune.runtime.sim.profile import SimProfile
from elsa_tune.search_spaces.candidate import FlagValue

SCHEMA_VERSION = 1
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
DEFAULT_BLOCK_SIZE = 16
_KV_DTYPES = {"auto": "bf16", "bfloat16": "bf16", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e4m3",
              "nvfp4": "nvfp4"}
#: ``speculative_config.method`` → the engine's speculative algorithm.
_SPEC_METHODS = {"mtp": "MTP", "qwen3_5_mtp": "MTP", "qwen3_next_mtp": "MTP", "deepseek_mtp": "MTP",
                 "eagle": "EAGLE", "eagle3": "EAGLE3", "ngram": "NGRAM", "ngram_gpu": "NGRAM",
                 "draft_model": "STANDALONE", "dflash": "DFLASH", "dspark": "DSPARK"}
_CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


class EngineConfigError(ValueError):
    """A flag combination vLLM's engine-config builder refuses before any engine: ``exception`` is the class vLLM
    raises (``ValueError``, or pydantic's ``ValidationError`` for a field its config class validates)."""

    def __init__(self, message: str, exception: str = "ValueError") -> None:
        super().__init__(message)
        self.exception = exception

    @property
    def text(self) -> str:
        """The last lines of vLLM's traceback: ``<exception>: <message>``."""
        return f"{self.exception}: {self}"


_PYDANTIC = "pydantic_core._pydantic_core.ValidationError"
_KNOWN_KV_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
                    "nvfp4_ds_mla", "nvfp4", "int8_per_token_head", "fp8_per_token_head")


@dataclass(frozen=True)
class LogNote:
    """A line vLLM logs while it resolves its configuration: level, ``file.py:line`` and message."""

    level: str
    where: str
    message: str


@dataclass(frozen=True)
class VllmConfig:
    """vLLM's resolved engine configuration for one launch and the engine knobs it sets.

    ``max_model_len`` is ``-1`` when ``auto`` was asked (the boot resolves it from the KV cache); ``notes`` are
    the lines vLLM logs about silent adjustments (chunked prefill, eager mode, capped capture sizes).
    """

    knobs: Mapping[str, FlagValue]
    max_model_len: int
    model_max_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    prefix_caching: bool
    block_size: int
    kv_cache_dtype: str
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    enforce_eager: bool
    cudagraph_mode: str
    capture_sizes: tuple[int, ...]
    spec_method: str | None
    spec_tokens: int
    notes: tuple[LogNote, ...] = ()
    schema_version: int = SCHEMA_VERSION

    @property
    def auto_len(self) -> bool:
        return self.max_model_len < 0


def batch_defaults(total_gb: float) -> tuple[int, int]:
    """vLLM's OpenAI-server defaults by device memory: (``max_num_batched_tokens``, ``max_num_seqs``)."""
    if total_gb >= 160:
        return 16384, 1024
    if total_gb >= 70:
        return 8192, 1024
    return 2048, 256


def resolve(profile: SimProfile, given: Mapping[str, Any]) -> VllmConfig:
    """vLLM's engine configuration for ``given`` (``EngineArgs`` fields that were given) on ``profile``'s card.

    Raises ``EngineConfigError`` for what vLLM's config builder refuses.
    """
    model, card = profile.model, profile.card
    notes: list[LogNote] = []
    default_tokens, default_seqs = batch_defaults(card.memory_gb)
    asked_len = _int(given.get("max_model_len"))
    if asked_len is not None and asked_len > model.context_length:
        raise EngineConfigError(
            f"User-specified max_model_len ({asked_len}) is greater than the derived max_model_len "
            f"(max_position_embeddings={model.context_length} or model_max_length=None in model's config.json). "
            "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_"
            "MAX_MODEL_LEN must be used with extreme caution.")
    max_model_len = -1 if asked_len == -1 else (asked_len or model.context_length)
    seqs = _int(given.get("max_num_seqs")) or default_seqs
    chunked = given.get("enable_chunked_prefill")
    chunked = True if chunked is None else bool(chunked)
    batched = _int(given.get("max_num_batched_tokens"))
    if batched is None:
        batched = default_tokens if chunked else max(default_tokens, model.context_length if max_model_len < 0
                                                     else max_model_len)
    if not chunked and max_model_len > 0 and batched < max_model_len:
        raise EngineConfigError(
            f"max_num_batched_tokens ({batched}) is smaller than max_model_len ({max_model_len}). This effectively "
            "limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. "
            "Please increase max_num_batched_tokens or decrease max_model_len.")
    if batched < seqs:
        raise EngineConfigError(
            f"max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs ({seqs}).")
    if chunked:
        notes.append(LogNote("INFO", "scheduler.py:311",
                             f"Chunked prefill is enabled with max_num_batched_tokens={batched}."))
    utilization = float(given.get("gpu_memory_utilization") or DEFAULT_GPU_MEMORY_UTILIZATION)
    if not 0 < utilization <= 1:
        bound = "less than or equal to 1" if utilization > 1 else "greater than 0"
        kind = "less_than_equal" if utilization > 1 else "greater_than"
        raise EngineConfigError(f"1 validation error for CacheConfig\ngpu_memory_utilization\n  Input should be "
                                f"{bound} [type={kind}, input_value={utilization}, input_type=float]", _PYDANTIC)
    kv_bytes = _int(given.get("kv_cache_memory_bytes"))
    asked_dtype = str(given.get("kv_cache_dtype") or "auto")
    if asked_dtype not in _KNOWN_KV_DTYPES:
        raise EngineConfigError(f"1 validation error for CacheConfig\ncache_dtype\n  Value error, Invalid "
                                f"kv_cache_dtype: {asked_dtype!r}. Valid values are: {list(_KNOWN_KV_DTYPES)} "
                                f"[type=value_error, input_value={asked_dtype!r}, input_type=str]", _PYDANTIC)
    if asked_dtype not in _KV_DTYPES or _KV_DTYPES[asked_dtype] not in model.kv_bytes_per_token:
        raise EngineConfigError(f"kv_cache_dtype {asked_dtype!r} is not supported for this model on this device "
                                f"(the simulated model has KV sizes for {sorted(model.kv_bytes_per_token)})")
    kv_dtype = _KV_DTYPES[asked_dtype]
    block = _int(given.get("block_size")) or DEFAULT_BLOCK_SIZE
    prefix = given.get("enable_prefix_caching")
    prefix = True if prefix is None else bool(prefix)

    method, spec_tokens = _speculative(given.get("speculative_config"))
    decode_tokens = 1 + spec_tokens
    eager = bool(given.get("enforce_eager"))
    compilation = _mapping(given.get("compilation_config"), "compilation_config")
    mode = str(compilation.get("cudagraph_mode") or "FULL_AND_PIECEWISE").upper()
    if mode not in _CUDAGRAPH_MODES:
        raise EngineConfigError(f"Invalid cudagraph_mode {mode!r}: use one of {', '.join(_CUDAGRAPH_MODES)}")
    if eager:
        notes.append(LogNote("WARNING", "vllm.py:1779",
                             "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is "
                             "equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and "
                             "--kernel_config.enable_jit_warmup=False"))
        mode = "NONE"
    sizes = _capture_sizes(given, compilation, seqs, decode_tokens, batched, mode, notes)
    graphs_on = mode != "NONE" and bool(sizes)
    graph_bs = max(1, min(seqs, max(sizes) // decode_tokens)) if graphs_on else 0

    knobs: dict[str, FlagValue] = {
        "max-running-requests": seqs, "chunked-prefill-size": batched, "max-prefill-tokens": batched,
        "kv-cache-dtype": kv_dtype, "page-size": block, "disable-radix-cache": not prefix,
        "disable-cuda-graph": not graphs_on, "eager-mode": eager,
    }
    if graphs_on:
        knobs["cuda-graph-max-bs-decode"] = graph_bs
    if max_model_len > 0:
        knobs["context-length"] = max_model_len
    if method is not None:
        knobs.update({"speculative-algorithm": method, "speculative-num-steps": max(1, spec_tokens),
                      "speculative-eagle-topk": 1, "speculative-num-draft-tokens": spec_tokens + 1})
    if "mamba_ssm_cache_dtype" in given and given["mamba_ssm_cache_dtype"] not in (None, "auto"):
        knobs["mamba-ssm-dtype"] = str(given["mamba_ssm_cache_dtype"])
    fraction = _static_fraction(profile, utilization, kv_bytes, graph_bs if graphs_on else 0, method is not None)
    knobs["mem-fraction-static"] = round(fraction, 6)
    return VllmConfig(
        knobs=knobs, max_model_len=max_model_len, model_max_len=model.context_length, max_num_seqs=seqs,
        max_num_batched_tokens=batched, chunked_prefill=chunked, prefix_caching=prefix, block_size=block,
        kv_cache_dtype=asked_dtype, gpu_memory_utilization=utilization, kv_cache_memory_bytes=kv_bytes,
        enforce_eager=eager, cudagraph_mode=mode, capture_sizes=sizes, spec_method=method, spec_tokens=spec_tokens,
        notes=tuple(notes))


def graph_gb(profile: SimProfile, max_bs: int, spec: bool, draft_tokens: int = 0) -> float:
    """The CUDA-graph memory the engine's plan charges for ``max_bs`` captured sizes (``memory.py``'s formula)."""
    if max_bs <= 0:
        return 0.0
    return profile.model.cuda_graph_gb * (1.0 + 0.004 * max_bs) * (1.0 + 0.15 * draft_tokens / 4 if spec else 1.0)


def _static_fraction(profile: SimProfile, utilization: float, kv_bytes: int | None, graph_bs: int,
                     spec: bool) -> float:
    """The engine's static-pool fraction of the memory free before loading that gives vLLM's KV budget."""
    card, model = profile.card, profile.model
    overhead = card.context_overhead_gb + profile.memory_rules.runtime_overhead_gb
    pre_load = card.memory_gb - overhead
    if kv_bytes is not None:
        draft = model.draft.weights_gb if spec and model.draft is not None else 0.0
        return (model.total_weights_gb + draft + kv_bytes / 1024**3) / pre_load
    draft_tokens = 4 if spec else 0
    budget = utilization * card.memory_gb - overhead - model.generation_workspace_gb \
        - graph_gb(profile, graph_bs, spec, draft_tokens)
    return max(1e-6, budget / pre_load)


def _capture_sizes(given: Mapping[str, Any], compilation: Mapping[str, Any], seqs: int, decode_tokens: int,
                   batched: int, mode: str, notes: list[LogNote]) -> tuple[int, ...]:
    if mode == "NONE":
        return ()
    explicit = given.get("cudagraph_capture_sizes") or compilation.get("cudagraph_capture_sizes")
    ceiling = _int(given.get("max_cudagraph_capture_size") or compilation.get("max_cudagraph_capture_size"))
    if explicit:
        sizes = sorted({int(s) for s in explicit})
    else:
        top = ceiling if ceiling is not None else min(seqs * decode_tokens * 2, 512)
        sizes = [s for s in (1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)) if s <= top]
    capped = [s for s in sizes if s <= batched]
    if len(capped) < len(sizes):
        notes.append(LogNote("WARNING", "vllm.py:2552",
                             f"cudagraph capture sizes above max_num_batched_tokens ({batched}) are removed: "
                             f"{[s for s in sizes if s > batched]}"))
    return tuple(capped)


def _speculative(value: Any) -> tuple[str | None, int]:
    config = _mapping(value, "speculative_config")
    if not config:
        return None, 0
    method = str(config.get("method") or ("draft_model" if config.get("model") else "")).lower()
    if method not in _SPEC_METHODS:
        raise EngineConfigError(f"Unsupported speculative method: {method!r}. Known: {', '.join(_SPEC_METHODS)}")
    tokens = _int(config.get("num_speculative_tokens"))
    if tokens is None or tokens < 1:
        raise EngineConfigError("num_speculative_tokens must be provided with speculative model or method and "
                                "must be greater than 0")
    return _SPEC_METHODS[method], tokens


def _mapping(value: Any, name: str) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise EngineConfigError(f"{name}: invalid JSON {value!r}: {exc}") from exc
    if not isinstance(value, dict):
        raise EngineConfigError(f"{name} must be a JSON object, got {value!r}")
    return dict(value)


def _int(value: Any) -> int | None:
    if value is None or value is False or value == "":
        return None
    return math.floor(float(value))


@dataclass(frozen=True)
class Resolved:
    """A launch read through the vLLM vocabulary: the given ``EngineArgs`` fields and vLLM's configuration."""

    given: Mapping[str, Any]
    config: VllmConfig
    extra: Mapping[str, Any] = field(default_factory=dict)
