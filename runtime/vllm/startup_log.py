"""``build_report``: what one vLLM boot really produced, from its log (V0 and V1) and ``vllm:cache_config_info``.

The lines it reads (vLLM's own format strings; the brackets are the ``BootReport`` fields)::

    █     █     █▄   ▄█  version 0.33.0   (the logo; VLLM_DISABLE_LOG_LOGO=1: vLLM server version 0.33.0, …)
                                                                     [runtime_version]   (0.33)
    vLLM API server version 0.10.1                                   [runtime_version]   (older)
    non-default args: {'model_tag': '/models/m', 'max_num_seqs': 64}  [server_args, max_running_requests]
    args: Namespace(model='/models/m', block_size=16, …)              [server_args]  (V0: every argument)
    Initializing a V1 LLM engine (v0.33.0) with config: model=…, max_seq_len=65536, kv_cache_dtype=auto, …
                                                                     [runtime_version, context_len, kv_dtype]
    Chunked prefill is enabled with max_num_batched_tokens=8192.     [chunked_prefill_size]
    Model loading took 15.27 GiB memory and 6.312 seconds            [weights_mem_gb, phase]
    Available KV cache memory: 52.37 GiB                             [kv_pool_gb]  (can be negative)
    GPU KV cache size: 425,424 tokens, Maximum concurrency for 65,536 tokens per request: 6.49x
                                                                     [max_total_num_tokens, context_len,
                                                                      max_concurrency]  (one line from ~0.29)
    Graph capturing finished in 12 secs, took 0.52 GiB               [cuda_graph_mem_gb, phase]
    init engine (profile, create kv cache, warmup model) took 48.20 s [boot_seconds]

V0 (0.5 to 0.8) prints the pool in blocks, ``# GPU blocks: 27057, # CPU blocks: 2048`` (0.5–0.6) or
``# cuda blocks: 38652, # CPU blocks: 4096`` (0.7–0.8): the pool in tokens is the blocks times the block size
(``--block-size``, else the received ``block_size``, else vLLM's CUDA default of 16, said in a warning), and
``the rest of the memory reserved for KV Cache is 54.82GiB`` its memory. The maximum concurrency is read as
printed, never derived (a hybrid model's is not tokens ÷ context).

Adjustments (requested against effective, each with the line that proves it): the chunked-prefill token budget
vLLM chose, ``--enforce-eager`` turning off torch.compile and CUDA graphs, a CUDA-graph mode replaced, capture
sizes capped, ``--max-model-len auto`` (or a draft model) shrinking the context, and a dtype that fell back.
Warnings: a KV memory at or below zero, the shared-memory broadcast wait (printed by slow compiles as by hangs),
a cold torch.compile (``Compiling a graph for …`` with no ``Directly load the compiled graph(s)``: a warm restart
of the same flags can size a larger pool), and a pool in blocks read with the default block size.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from elsa_tune.runtime.boot_report import Adjustment, BootPhase, BootReport
from elsa_tune.runtime.log_lines import first, last
from elsa_tune.runtime.vllm.flags import canonical
from elsa_tune.runtime.vllm.log_lines import LogLine, split_lines
from elsa_tune.search_spaces.candidate import Candidate

#: vLLM's CUDA block size when none is set (V0 prints its pool in blocks of this many tokens).
DEFAULT_BLOCK_SIZE = 16

_VERSION = re.compile(r"vLLM (?:API )?server version (?P<v>[\w.+-]+)|█\s+version (?P<logo>\d+\.[\w.+-]+)|"
                      r"Initializing an? (?:V1 )?LLM engine \(v(?P<e>[\w.+-]+)\) with config")
_ENGINE_CONFIG = re.compile(r"LLM engine \(v[\w.+-]+\) with config: (?P<config>.*)$")
_NON_DEFAULT = re.compile(r"non-default args: (?P<dict>\{.*\})\s*$")
_NAMESPACE = re.compile(r"^args: (?P<ns>Namespace\(.*\))\s*$")
_KV_TOKENS = re.compile(r"(?:GPU|CPU|XPU|TPU|HPU|NPU|GPU \+ host) KV cache size: (?P<tokens>[\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>[\d.]+)x")
_BLOCKS = re.compile(r"# (?:GPU|gpu|cuda|CUDA) blocks: (?P<blocks>\d+)")
_AVAILABLE_KV = re.compile(r"Available KV cache memory: (?P<gib>-?[\d.]+) GiB")
_V0_KV_MEMORY = re.compile(r"the rest of the memory reserved for KV Cache is (?P<gib>-?[\d.]+) ?GiB")
_WEIGHTS_V1 = re.compile(r"Model loading took (?P<gib>[\d.]+) GiB(?: memory)? and (?P<s>[\d.]+) seconds")
_WEIGHTS_V0 = re.compile(r"Loading model weights took (?P<gib>[\d.]+) GB")
_GRAPHS = re.compile(r"Graph capturing finished in (?P<s>[\d.]+) secs?, took (?P<gib>-?[\d.]+) GiB")
_INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<s>[\d.]+) s")
_COMPILE = re.compile(r"torch\.compile takes (?P<s>[\d.]+) s in total")
_CHUNKED = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(?P<n>\d+)")
_EAGER = re.compile(r"Enforce eager set, disabling torch\.compile|Cudagraph is disabled under eager mode")
_GRAPH_MODE = re.compile(r"[Oo]verriding cudagraph_mode (?:from )?(?P<old>\w+)?\s*to (?P<new>[A-Z_]+)"
                         r"|Cudagraph mode (?P<old2>[\w.]+) is not compatible with compilation mode [\w.]+\. "
                         r"Overriding to (?:CUDAGraphMode\.)?(?P<new2>[A-Z_]+)")
_CAPTURE_MAX = re.compile(r"Truncating max_cudagraph_capture_size to (?P<n>\d+)")
_CAPTURE_SIZES = re.compile(r"cudagraph_capture_sizes specified in compilation_config (?P<old>\[.*?\]) is "
                            r"overridden by config (?P<new>\[.*?\])")
_GRAPH_FLAGS = ("cuda-graph-sizes", "max-cudagraph-capture-size", "cudagraph-capture-sizes")
_AUTO_LENGTHS = ("auto", "-1")
_AUTO_FIT = re.compile(r"Auto-fit max_model_len: reduced from (?P<old>\d+) to (?P<new>\d+)")
_DRAFT_LEN = re.compile(r"The draft model's max_model_len \((?P<draft>\d+)\) is smaller than the target.*"
                        r"reducing max_model_len to (?P<new>\d+)")
_DTYPE_FALLBACK = re.compile(r"doesn't support (?P<old>[\w.]+)\. Falling back to (?P<new>[\w.]+) for compatibility")
_DTYPE_CAST = re.compile(r"^Casting (?P<old>[\w.]+) to (?P<new>[\w.]+)\.")
_COLD_COMPILE = re.compile(r"Compiling a graph for (?:compile range|dynamic shape|general shape)")
_WARM_COMPILE = re.compile(r"Directly load the compiled graph\(s\) for")
_SHM_WAIT = re.compile(r"No available shared memory broadcast block found in (?P<s>\d+) seconds")
_CONFIG_FIELD = re.compile(r"(?:^|, )(?P<key>max_seq_len|kv_cache_dtype|dtype|tensor_parallel_size|enforce_eager"
                           r"|enable_prefix_caching|enable_chunked_prefill)=(?P<value>[^,]*)")


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _number(value: Any) -> int | float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    try:
        text = str(value).replace(",", "").strip()
        return float(text) if "." in text else int(text)
    except ValueError:
        return None


def _literal(text: str) -> dict[str, Any]:
    """A printed Python dict (``non-default args``); ``{}`` when it is not a literal."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return {}
    return dict(value) if isinstance(value, dict) else {}


def _namespace(text: str) -> dict[str, Any]:
    """The literal keyword values of a printed ``Namespace(k=v, …)`` (V0's ``args:`` line); others are skipped."""
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return {}
    if not isinstance(tree.body, ast.Call):
        return {}
    found: dict[str, Any] = {}
    for keyword in tree.body.keywords:
        if keyword.arg is None:
            continue
        try:
            found[keyword.arg] = ast.literal_eval(keyword.value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return found


def _engine_config(lines: Sequence[LogLine]) -> dict[str, str]:
    found = first(lines, _ENGINE_CONFIG)
    if found is None:
        return {}
    return {m["key"]: m["value"].strip().strip("'") for m in _CONFIG_FIELD.finditer(found[1]["config"])}


def _phases(lines: Sequence[LogLine]) -> tuple[BootPhase, ...]:
    phases = []
    weights = first(lines, _WEIGHTS_V1)
    if weights:
        phases.append(BootPhase("load weights", float(weights[1]["s"]), mem_usage_gb=float(weights[1]["gib"])))
    compiled = first(lines, _COMPILE)
    if compiled:
        phases.append(BootPhase("torch.compile", float(compiled[1]["s"])))
    graphs = first(lines, _GRAPHS)
    if graphs:
        phases.append(BootPhase("CUDA graph capture", float(graphs[1]["s"]), mem_usage_gb=float(graphs[1]["gib"])))
    init = first(lines, _INIT_ENGINE)
    if init:
        phases.append(BootPhase("init engine", float(init[1]["s"])))   # profile, KV cache, warm-up
    return tuple(phases)


def _block_size(received: Mapping[str, Any], requested: Mapping[str, Any]) -> tuple[int, bool]:
    for source in (requested.get("block-size"), received.get("block_size")):
        value = _number(source)
        if isinstance(value, int) and value > 0:
            return value, False
    return DEFAULT_BLOCK_SIZE, True


def parse_log(log_text: str, requested: Mapping[str, Any] | None = None) -> BootReport:
    """The boot report of a vLLM log alone (``requested``: the candidate's flags, for V0's block size)."""
    lines = split_lines(log_text)
    wanted = dict(requested or {})
    version = first(lines, _VERSION)
    received_found = first(lines, _NON_DEFAULT)
    received = _literal(received_found[1]["dict"]) if received_found else {}
    namespace = first(lines, _NAMESPACE) if received_found is None else None
    if namespace is not None:
        received = _namespace(namespace[1]["ns"])
    config = _engine_config(lines)
    warnings: list[str] = []

    tokens: int | None = None
    kv_tokens = last(lines, _KV_TOKENS)
    if kv_tokens:
        tokens = _int(kv_tokens[1]["tokens"])
    else:
        blocks = last(lines, _BLOCKS)
        if blocks:
            size, assumed = _block_size(received, wanted)
            tokens = int(blocks[1]["blocks"]) * size
            if assumed:
                warnings.append(f"the pool in tokens assumes vLLM's default block size of {size} (the log prints "
                                f"{int(blocks[1]['blocks']):,} blocks and no block size)")
    concurrency = last(lines, _CONCURRENCY)
    context = _int(concurrency[1]["len"]) if concurrency else None
    if context is None and config.get("max_seq_len", "").isdigit():
        context = int(config["max_seq_len"])
    available = last(lines, _AVAILABLE_KV) or last(lines, _V0_KV_MEMORY)
    kv_gb = float(available[1]["gib"]) if available else None
    if kv_gb is not None and kv_gb <= 0:
        warnings.append(f"vLLM had {kv_gb:.2f} GiB for the KV cache: weights, activations and CUDA graphs took "
                        "everything --gpu-memory-utilization allowed")
    weights = first(lines, _WEIGHTS_V1) or first(lines, _WEIGHTS_V0)
    graphs = first(lines, _GRAPHS)
    chunked = last(lines, _CHUNKED)
    init = first(lines, _INIT_ENGINE)
    slots = _number(wanted.get("max-num-seqs", received.get("max_num_seqs")))
    shm = [line for line in lines if _SHM_WAIT.search(line.text)]
    if shm:
        warnings.append(f"{len(shm)} 'No available shared memory broadcast block' warning(s): a slow compile or "
                        "quantization prints them too; a hang only if the server then stops answering")
    if any(_COLD_COMPILE.search(line.text) for line in lines) and not any(
            _WARM_COMPILE.search(line.text) for line in lines):
        warnings.append("torch.compile ran cold (no compile cache for these flags; each max_model_len is a new key): "
                        "a warm restart of the same flags can report a few percent more KV cache")
    eager = first(lines, _EAGER)
    if eager:
        warnings.append("--enforce-eager: torch.compile and CUDA graphs are off, so decode runs eagerly (slower; the "
                        f"graphs' memory goes to the KV cache): {eager[0].raw.strip()}")
    kv_dtype = config.get("kv_cache_dtype") or (str(received["kv_cache_dtype"]) if "kv_cache_dtype" in received
                                                 else None)
    runtime_version = (version[1]["v"] or version[1]["logo"] or version[1]["e"]) if version else None
    return BootReport(
        runtime_version=runtime_version, max_total_num_tokens=tokens, kv_pool_tokens=tokens,
        max_running_requests=int(slots) if isinstance(slots, int) and slots > 0 else None,
        context_len=context, chunked_prefill_size=int(chunked[1]["n"]) if chunked else None,
        weights_mem_gb=float(weights[1]["gib"]) if weights else None, kv_pool_gb=kv_gb, kv_dtype=kv_dtype,
        cuda_graph_mem_gb=float(graphs[1]["gib"]) if graphs else None,
        max_concurrency=float(concurrency[1]["x"]) if concurrency else None,
        boot_seconds=float(init[1]["s"]) if init else None, phases=_phases(lines),
        server_args=received, warnings=tuple(warnings),
        speculative=bool(received.get("speculative_config")) if received else None)


def merge_server_info(report: BootReport, info: Mapping[str, Any]) -> BootReport:
    """Fill what the log did not say from ``info``: the labels of ``vllm:cache_config_info`` (``num_gpu_blocks``,
    ``block_size``, ``kv_cache_size_tokens``, ``kv_cache_max_concurrency``, ``cache_dtype``) under
    ``"cache_config"``, and ``max_model_len`` from ``/v1/models``."""
    cache = info.get("cache_config")
    changes: dict[str, Any] = {}
    if isinstance(cache, Mapping):
        tokens = _number(cache.get("kv_cache_size_tokens"))
        if tokens is None:
            blocks, size = _number(cache.get("num_gpu_blocks")), _number(cache.get("block_size"))
            tokens = blocks * size if isinstance(blocks, int) and isinstance(size, int) else None
        if report.max_total_num_tokens is None and isinstance(tokens, int | float) and tokens > 0:
            changes["max_total_num_tokens"] = changes["kv_pool_tokens"] = int(tokens)
        concurrency = _number(cache.get("kv_cache_max_concurrency"))
        if report.max_concurrency is None and concurrency is not None:
            changes["max_concurrency"] = float(concurrency)
        if report.kv_dtype is None and cache.get("cache_dtype"):
            changes["kv_dtype"] = str(cache["cache_dtype"])
    length = _number(info.get("max_model_len"))
    if report.context_len is None and isinstance(length, int):
        changes["context_len"] = length
    return replace(report, **changes) if changes else report


def find_adjustments(log_text: str, requested: Mapping[str, Any]) -> tuple[Adjustment, ...]:
    """Each flag whose effective value the log proves differs from ``requested`` (or that vLLM set itself).

    Without ``requested`` (no candidate), the flags vLLM printed as received (``non-default args``) stand in.
    """
    lines = split_lines(log_text)
    if not requested:
        received = first(lines, _NON_DEFAULT)
        requested = {canonical(k): v for k, v in _literal(received[1]["dict"]).items()} if received else {}
    found: list[Adjustment] = []
    chunked = last(lines, _CHUNKED)
    if chunked:
        budget = int(chunked[1]["n"])
        asked = _number(requested.get("max-num-batched-tokens"))
        if asked != budget:
            found.append(Adjustment("max-num-batched-tokens", asked, budget, chunked[0].raw,
                                    "chunked prefill is on with the token budget vLLM chose (it depends on the "
                                    "version and the GPU's memory)" if asked is None else
                                    "vLLM changed the requested chunked-prefill budget"))
    eager = first(lines, _EAGER)
    if eager:
        # --enforce-eager itself is applied as asked (its cost is speed, which the gate measures); what it
        # silently cancels is any CUDA-graph setting the same command line asks for.
        for flag in _GRAPH_FLAGS:
            if flag in requested:
                found.append(Adjustment(flag, requested[flag], "no CUDA graphs (--enforce-eager)", eager[0].raw,
                                        "--enforce-eager turns CUDA graphs off, so this graph setting does nothing"))
    for line in lines:
        mode = _GRAPH_MODE.search(line.text)
        if mode:
            old = mode["old"] or mode["old2"] or requested.get("compilation-config")
            found.append(Adjustment("compilation-config", old, f"cudagraph_mode={mode['new'] or mode['new2']}",
                                    line.raw, "vLLM replaced the CUDA-graph mode"))
    capped = last(lines, _CAPTURE_MAX)
    if capped:
        found.append(Adjustment("compilation-config", requested.get("compilation-config"),
                                f"max_cudagraph_capture_size={capped[1]['n']}", capped[0].raw,
                                "CUDA-graph capture sizes capped (by max_num_seqs or max_num_batched_tokens)"))
    sizes = last(lines, _CAPTURE_SIZES)
    if sizes:
        found.append(Adjustment("compilation-config", sizes[1]["old"], sizes[1]["new"], sizes[0].raw,
                                "the requested capture sizes were cut to the ones vLLM can use"))
    fitted = last(lines, _AUTO_FIT)
    if fitted and str(requested.get("max-model-len", "")).strip().lower() not in _AUTO_LENGTHS:
        # "auto" (or -1) asks vLLM to fit the context to the KV cache: the number it resolves to is the boot
        # report's context, judged against the space's context target, not an adjustment of the request.
        found.append(Adjustment("max-model-len", requested.get("max-model-len", int(fitted[1]["old"])),
                                int(fitted[1]["new"]), fitted[0].raw,
                                "max_model_len auto shrank the context to what the KV cache holds"))
    draft = last(lines, _DRAFT_LEN)
    if draft:
        found.append(Adjustment("max-model-len", requested.get("max-model-len"), int(draft[1]["new"]), draft[0].raw,
                                "the draft model's context is shorter than the target's"))
    for pattern in (_DTYPE_FALLBACK, _DTYPE_CAST):
        hit = last(lines, pattern)
        if hit:
            found.append(Adjustment("dtype", requested.get("dtype", hit[1]["old"]), hit[1]["new"], hit[0].raw,
                                    "the model's dtype fell back to one the device supports"))
    return tuple(found)


def build_report(log_text: str, candidate: Candidate | None = None,
                 info: Mapping[str, Any] | None = None) -> BootReport:
    """The boot report: the log, then ``info`` (``VllmFamily.server_info``), then the adjustments."""
    requested = {canonical(k): v for k, v in candidate.flags.items()} if candidate is not None else {}
    report = parse_log(log_text, requested)
    if info:
        report = merge_server_info(report, info)
    adjustments = find_adjustments(log_text, requested)
    return replace(report, adjustments=adjustments) if adjustments else report
