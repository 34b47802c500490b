"""Classify how a vLLM server failed, from its log, exit status and timing (V0 and V1 wording).

``classify(log_text, hints) -> Failure``. The rules are tried most specific first; each ``Failure`` carries
the lines that prove it and a remedy naming the vLLM flag to change:

* a refused flag: argparse's ``vllm serve: error: unrecognized arguments: …`` (exit 2, after a usage block that
  can run to 300 lines), a bad type or choice, or a value the engine config refuses (pydantic's
  ``validation error for CacheConfig``) → ``BAD_FLAG``;
* the port taken → ``PORT_IN_USE``; less free GPU memory at start than ``--gpu-memory-utilization`` asks
  (``Free memory on device … on startup is less than desired GPU memory utilization``) → ``GPU_BUSY``;
* no memory left for the KV cache (``No available memory for the cache blocks``), or too little for one request
  at ``max_model_len`` (V0: ``The model's max seq len (29000) is larger than the maximum number of tokens that
  can be stored in KV cache (23648)``; V1: ``To serve at least one request with the model's max seq len …``,
  with vLLM's own estimate of the length that fits) → ``NO_ROOM_FOR_KV``;
* a CUDA out-of-memory error, placed by the boot phase it hit: while creating the weights → ``WEIGHTS_OOM``, in
  the profiling run → ``PROFILE_OOM``, in CUDA-graph capture (including ``CUDA error: out of memory`` at
  ``capture_end``) → ``CUDA_GRAPH_FAILED``, after the server was ready → ``OOM_UNDER_LOAD``;
* SIGKILL without a traceback, or an engine core that died of signal 9 (``Failed core proc(s): {…: -9}``) →
  ``HOST_OOM_KILLED``; an exception from a code path a flag enabled → ``TECHNIQUE_CRASH``; timeouts →
  ``BOOT_TIMEOUT`` or ``HANG``.

``No available shared memory broadcast block found in 60 seconds`` is printed by healthy slow compiles as by
real hangs: it is never a failure by itself, only evidence beside a timeout.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from elsa_tune.errors import ConfigError, EnvironmentError_, RuntimeUnavailable, StudyError
from elsa_tune.runtime.classify import FailureLog
from elsa_tune.runtime.failure import Failure, FailureHints, FailureKind
from elsa_tune.runtime.vllm.log_lines import split_lines

#: Lines a vLLM server prints once it serves (the HTTP server is up); readiness itself is ``/health``.
READY_MARKERS = re.compile(r"Starting vLLM (?:API )?server on http|Application startup complete"
                           r"|Uvicorn running on http")

_ARGPARSE = re.compile(r"^(?P<prog>[\w./ -]{1,60}): error: (?P<why>unrecognized arguments: (?P<args>.*)"
                       r"|ambiguous option: (?P<amb>\S+)|argument (?P<arg>-{1,2}[\w.-]+)(?:/[-\w]+)?: (?P<detail>.*)"
                       r"|.*)$")
_VALIDATION = re.compile(r"(?P<n>\d+) validation errors? for (?P<model>\w+Config|EngineArgs)")
_NO_CACHE_MEMORY = re.compile(r"No available memory for the cache blocks")
_V0_TOO_LONG = re.compile(r"The model's max seq len \((?P<len>\d+)\) is larger than the maximum number of tokens "
                          r"that can be stored in KV cache \((?P<kv>\d+)\)")
_V1_TOO_LONG = re.compile(r"To serve at least one request with the model's max seq len \((?P<len>\d+)\), "
                          r"\((?P<need>[\d.]+) GiB KV cache is needed, which is larger than the available KV cache "
                          r"memory \((?P<have>-?[\d.]+) GiB\)\.(?: Based on the available memory, the estimated "
                          r"maximum model length is (?P<fits>\d+)\.)?")
_GPU_BUSY = re.compile(r"Free memory on device .* on startup is less than desired GPU memory utilization"
                       r"(?: \((?P<util>[\d.]+), (?P<gib>[\d.]+) GiB\))?")
_PORT = re.compile(r"Address already in use|\[Errno 98\]|error while attempting to bind on address", re.IGNORECASE)
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation"
                  r"|out of memory on device", re.IGNORECASE)
_CAPTURE = re.compile(r"capture_end|capture_begin|_capture_cudagraphs|capture_model|Capturing CUDA graphs"
                      r"|cudagraph_capture|graph capture|CUDAGraphWrapper", re.IGNORECASE)
_WEIGHTS_PHASE = re.compile(r"Starting to load model|Loading weights|load_weights|create_weights|initialize_model"
                            r"|get_model\(|load_model\(|Loading safetensors checkpoint shards")
_WEIGHTS_DONE = re.compile(r"Model loading took|Loading model weights took|Loading weights took")
_PROFILE_PHASE = re.compile(r"profile_run|_dummy_run|_dummy_sampler_run|determine_available_memory"
                            r"|determine_num_available_blocks|Memory profiling takes")
_KV_DONE = re.compile(r"KV cache size: [\d,]+ tokens|# (?:GPU|gpu|cuda|CUDA) blocks: \d+"
                      r"|Available KV cache memory:")
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)")
_CRASH = re.compile(r"^(?:\w+\.)*(?P<type>AttributeError|NotImplementedError|AssertionError|KeyError|TypeError"
                    r"|IndexError|ImportError|ModuleNotFoundError|RuntimeError|ValueError)\b:?(?P<msg>.*)")
_ENGINE_DEAD = re.compile(r"Engine core initialization failed|EngineDeadError|EngineCore encountered a fatal error"
                          r"|EngineCore failed to start")
_KILLED = re.compile(r"Killed process \d+|oom-kill|Out of memory: Killed|Failed core proc\(s\): \{[^}]*: -9\}")
_SHM_WAIT = re.compile(r"No available shared memory broadcast block found in \d+ seconds")


_Rule = Callable[[FailureLog], Failure | None]


def _bad_flag(ctx: FailureLog) -> Failure | None:
    for i in ctx.find(_ARGPARSE):
        match = _ARGPARSE.search(ctx.lines[i].text)
        assert match is not None
        if ctx.lines[i].level:        # a logged line that happens to contain ": error: " is not argparse's
            continue
        flag = (match["args"] or match["amb"] or match["arg"] or "").split()
        named = flag[0].split("=")[0] if flag else ""
        what = f"the flag {named}" if named else "the launch flags"
        detail = f": {match['detail'].strip()}" if match["detail"] else ""
        return ctx.failure(FailureKind.BAD_FLAG, f"vllm serve refused {what}{detail}",
                           f"remove or rename {named or 'the flag'}: this vLLM version does not accept it as given "
                           "(check the space with `elsa-tune space check SPACE --runtime-python PY` before the "
                           "study)", ctx.evidence([i]))
    for i in ctx.find(_VALIDATION):
        after = [j for j in range(i + 1, min(i + 4, len(ctx.lines))) if ctx.lines[j].text]
        reason = next((ctx.lines[j].text for j in after if "error" in ctx.lines[j].text.lower()),
                      ctx.lines[i].text.strip())
        return ctx.failure(FailureKind.BAD_FLAG, f"vLLM's engine config refused a value: {reason[:240]}",
                           "give the flag the message names a value vLLM accepts (a "
                           "--kv-cache-dtype it knows, --gpu-memory-utilization at most 1, a --max-model-len within "
                           "the model's limit, a --tensor-parallel-size that divides the heads)",
                           ctx.evidence([i, *after[:2]]))
    return None


def _port_in_use(ctx: FailureLog) -> Failure | None:
    return ctx.port_in_use(_PORT)


def _gpu_busy(ctx: FailureLog) -> Failure | None:
    hits = ctx.find(_GPU_BUSY)
    if not hits:
        return None
    return ctx.failure(FailureKind.GPU_BUSY,
                       "the GPU had less free memory at start than --gpu-memory-utilization asks for",
                       "free the GPU (another process, or the previous server still releasing its memory) or lower "
                       "--gpu-memory-utilization below the free fraction the line shows", ctx.evidence(hits[:1]))


def _no_room_for_kv(ctx: FailureLog) -> Failure | None:
    for i in ctx.find(_V1_TOO_LONG):
        match = _V1_TOO_LONG.search(ctx.lines[i].text)
        assert match is not None
        fits = f"--max-model-len {int(match['fits']):,} (vLLM's own estimate of what fits) or lower" \
            if match["fits"] else "a lower --max-model-len"
        return ctx.failure(FailureKind.NO_ROOM_FOR_KV,
                           f"one request at max_model_len {int(match['len']):,} needs {match['need']} GiB of KV cache; "
                           f"{match['have']} GiB is available",
                           f"use {fits}, raise --gpu-memory-utilization, or a smaller --kv-cache-dtype (fp8)",
                           ctx.evidence([i]))
    for i in ctx.find(_V0_TOO_LONG):
        match = _V0_TOO_LONG.search(ctx.lines[i].text)
        assert match is not None
        return ctx.failure(FailureKind.NO_ROOM_FOR_KV,
                           f"max_model_len {int(match['len']):,} is longer than the KV cache holds "
                           f"({int(match['kv']):,} tokens)",
                           f"use --max-model-len {int(match['kv']):,} or lower, or raise --gpu-memory-utilization",
                           ctx.evidence([i]))
    hits = ctx.find(_NO_CACHE_MEMORY)
    if hits:
        return ctx.failure(FailureKind.NO_ROOM_FOR_KV, "the weights and activations leave no memory for the KV "
                           "cache blocks",
                           "raise --gpu-memory-utilization, lower --max-num-batched-tokens (the profiling batch), or "
                           "serve a smaller or quantized model", ctx.evidence(hits[:1]))
    return None


def _oom(ctx: FailureLog) -> Failure | None:
    hits = ctx.find(_OOM)
    if not hits:
        return None
    at = hits[0]
    before = ctx.lines[:at]
    window = ctx.lines[max(0, at - 40):at + 1]
    evidence = ctx.evidence(hits[:2])
    if ctx.ready_before(at):
        return ctx.failure(FailureKind.OOM_UNDER_LOAD, "CUDA ran out of memory while serving",
                           "lower --gpu-memory-utilization (more headroom for activations), --max-num-batched-tokens "
                           "or --max-num-seqs", evidence, phase="serve")
    if any(_CAPTURE.search(line.text) for line in window):
        return ctx.failure(FailureKind.CUDA_GRAPH_FAILED, "CUDA ran out of memory while capturing CUDA graphs",
                           "lower --gpu-memory-utilization by 0.03 to leave room for the graphs, cap the capture sizes "
                           "(--max-cudagraph-capture-size or -cc.cudagraph_capture_sizes), or --enforce-eager",
                           evidence + ctx.evidence([i for i in range(max(0, at - 40), at + 1)
                                               if _CAPTURE.search(ctx.lines[i].text)][:1]))
    weights_done = any(_WEIGHTS_DONE.search(line.text) for line in before)
    kv_done = any(_KV_DONE.search(line.text) for line in before)
    if not weights_done and (any(_WEIGHTS_PHASE.search(line.text) for line in window) or not before
                             or not any(_PROFILE_PHASE.search(line.text) for line in window)):
        return ctx.failure(FailureKind.WEIGHTS_OOM, "CUDA ran out of memory while creating the model's weights",
                           "the weights do not fit: raise --tensor-parallel-size, serve a quantized model "
                           "(--quantization), or free the GPU", evidence)
    if not kv_done:
        return ctx.failure(FailureKind.PROFILE_OOM,
                           "CUDA ran out of memory in the profiling run (one dummy batch of max_num_batched_tokens)",
                           "lower --max-num-batched-tokens (and --max-num-seqs), or --max-model-len when chunked "
                           "prefill is off", evidence)
    return ctx.failure(FailureKind.CUDA_GRAPH_FAILED, "CUDA ran out of memory after the KV cache was allocated "
                       "(CUDA-graph capture or warm-up)",
                       "lower --gpu-memory-utilization by 0.03, cap the CUDA-graph capture sizes, or --enforce-eager",
                       evidence)


def _technique_crash(ctx: FailureLog) -> Failure | None:
    if not ctx.find(_TRACEBACK) and not ctx.find(_ENGINE_DEAD):
        return None
    wrappers = set(ctx.find(_ENGINE_DEAD))
    crashes = [i for i in ctx.find(_CRASH) if i not in wrappers]   # the root cause, not "initialization failed"
    if not crashes:
        return None
    i = crashes[-1]
    match = _CRASH.search(ctx.lines[i].text)
    assert match is not None
    return ctx.failure(FailureKind.TECHNIQUE_CRASH,
                       f"vLLM raised {match['type']}:{match['msg'][:200]}",
                       "drop the flag this candidate added last: a code path it enabled fails in this vLLM version "
                       "on this model", ctx.evidence([i, *ctx.find(_ENGINE_DEAD)[:1]]))


def _host_oom_killed(ctx: FailureLog) -> Failure | None:
    hits = ctx.find(_KILLED)
    silent = ctx.hints.exit_code in (-9, 137) and not ctx.find(_TRACEBACK)
    if not hits and not silent:
        return None
    return ctx.failure(FailureKind.HOST_OOM_KILLED, "vLLM was SIGKILLed, likely by the host OOM killer",
                       "free host RAM, or lower what lives there: --swap-space, --cpu-offload-gb, "
                       "--kv-offloading-size; check `dmesg`", ctx.evidence(hits[:1]) if hits else ctx.tail())


def _boot_timeout(ctx: FailureLog) -> Failure | None:
    if not ctx.hints.timed_out or ctx.hints.became_ready:
        return None
    waited = f" after {ctx.hints.elapsed_s:.0f} s" if ctx.hints.elapsed_s is not None else ""
    shm = ctx.find(_SHM_WAIT)
    note = (" (the shared-memory broadcast warnings also appear in healthy slow compiles: a cold torch.compile "
            "cache can take minutes)") if shm else ""
    return ctx.failure(FailureKind.BOOT_TIMEOUT, f"vLLM did not become ready{waited}{note}",
                       "raise the boot timeout if the last log line shows progress (compilation, weights loading); "
                       "otherwise treat the last phase in the log as the culprit", ctx.evidence(shm[-1:]) + ctx.tail())


def _hang(ctx: FailureLog) -> Failure | None:
    if not (ctx.hints.timed_out and ctx.hints.became_ready):
        return None
    return ctx.failure(FailureKind.HANG, "the server stopped answering after it became ready",
                       "drop the flag this candidate added last; the last engine lines show where it stopped",
                       ctx.evidence(ctx.find(_SHM_WAIT)[-1:]) + ctx.tail(), phase="serve")


_RULES: tuple[_Rule, ...] = (_bad_flag, _port_in_use, _gpu_busy, _no_room_for_kv, _oom, _host_oom_killed,
                             _technique_crash, _boot_timeout, _hang)
#: An engine core killed by a signal (``Failed core proc(s): {'EngineCore_DP0': -9}``) leaves the API server's
#: traceback behind it: ``_host_oom_killed`` is tried before ``_technique_crash``.
#: Rules that need no hints: what ``looks_failed`` reads.
_LOG_RULES: tuple[_Rule, ...] = (_bad_flag, _port_in_use, _gpu_busy, _no_room_for_kv, _oom, _technique_crash)


def classify(log_text: str, hints: FailureHints | None = None) -> Failure:
    """Classify a failed boot or a dead server. Never raises; an unknown cause gives ``UNKNOWN_CRASH``."""
    ctx = FailureLog(split_lines(log_text), hints or FailureHints(), READY_MARKERS)
    for rule in _RULES:
        failure = rule(ctx)
        if failure is not None:
            return failure
    errors = [i for i, line in enumerate(ctx.lines) if line.level in ("ERROR", "CRITICAL")]
    code = f" (exit code {ctx.hints.exit_code})" if ctx.hints.exit_code is not None else ""
    return ctx.failure(FailureKind.UNKNOWN_CRASH, f"vLLM died for an unrecognised reason{code}",
                       "read the full server log in the boot folder; if it is a new failure mode, report it so "
                       "elsa-tune learns to classify it", ctx.evidence(errors[-3:]) if errors else ctx.tail(5))


def looks_failed(log_text: str) -> bool:
    """Whether the log shows a failure: a rule's signature, or an engine-core failure line. The shared-memory
    broadcast warning alone is not one."""
    ctx = FailureLog(split_lines(log_text), FailureHints(), READY_MARKERS)
    return any(rule(ctx) for rule in _LOG_RULES) or bool(ctx.find(_ENGINE_DEAD))


_STUDY_STOPPERS: tuple[tuple[re.Pattern[str], type[StudyError], str, str], ...] = (
    (re.compile(r"No module named '?vllm'?(?![._\w])|vllm: command not found"), RuntimeUnavailable,
     "the launch command's Python cannot import vLLM",
     "install vllm into that environment (pip install vllm==0.33.0), or point --launch at the environment that "
     "has it"),
    (re.compile(r"Repo id must use alphanumeric|is not a local folder and is not a valid model identifier"
                r"|does not appear to have a file named config\.json|Can't load the configuration of"
                r"|Invalid repository ID or local directory specified|Repository Not Found"),
     ConfigError, "the model cannot be loaded",
     "fix the model: a local folder with config.json (mounted into the container for Docker) or a Hub id "
     "reachable from this machine"),
    (re.compile(r"Failed to infer device type|Found no NVIDIA driver on your system|No CUDA GPUs are available"
                r"|CUDA driver initialization failed|no CUDA-capable device is detected"),
     EnvironmentError_, "vLLM sees no usable GPU",
     "check the driver and that the GPU (CUDA_VISIBLE_DEVICES / the container's device request) is visible; "
     "a CPU-only machine needs VLLM_TARGET_DEVICE=cpu and a CPU build of vLLM"),
)


def study_stopper(log_text: str) -> StudyError | None:
    """A failure no other candidate would escape (no vLLM, a model that cannot be loaded, no device): stop the
    study. Returns the error to raise instead of recording one candidate's failure, or ``None``."""
    for line in split_lines(log_text):
        for pattern, error, what, remedy in _STUDY_STOPPERS:
            if pattern.search(line.text):
                return error(f"{what}: {line.text.strip()[:300]}", remedy=remedy)
    return None
