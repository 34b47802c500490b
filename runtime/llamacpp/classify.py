"""Classify how ``llama-server`` failed, from its log, exit status and timing.

``classify(log_text, hints) -> Failure``. The rules read the lines llama.cpp 0c1e570 writes and are tried
most specific first: every fatal boot error ends with ``exiting due to model loading error``, so the line
that names the cause (a refused argument, the KV or compute buffer that could not be allocated, a GGUF file
that could not be opened) decides. Each ``Failure`` carries the lines that prove it and a remedy naming the
llama.cpp flag to change (``-c``, ``-np``, ``-ngl``, ``-ub``, ``-ctk``/``-ctv``, ``-fa on``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from elsa_tune.errors import ConfigError, StudyError
from elsa_tune.runtime.classify import FailureLog
from elsa_tune.runtime.failure import Failure, FailureHints, FailureKind
from elsa_tune.runtime.llamacpp.log_lines import READY_LINE, split_lines

_BAD_ARGUMENT = re.compile(r"error: invalid argument: (?P<flag>\S+)")
_BAD_VALUE = re.compile(r"error while handling (?P<what>argument|environment variable) \"(?P<flag>[^\"]+)\": "
                        r"(?P<why>.*)")
_ALLOWED = re.compile(r"^allowed values: ")
_PORT = re.compile(r"couldn't bind HTTP server socket|Address already in use")
_QUANT_V = re.compile(r"quantized V cache (?:requires flash_attn to be enabled|was requested, but this requires Flash"
                      r" Attention)")
_NO_MODEL = re.compile(r"failed to open GGUF file|gguf_init_from_file\w*: invalid magic|unknown model architecture"
                       r"|error loading model architecture")
_MODEL_FAILED = re.compile(r"llama_model_load: error loading model: (?P<why>.*)|failed to load model")
_COMPUTE = re.compile(r"failed to allocate compute (?:pp |tg )?buffers")
_KV_BUFFER = re.compile(r"failed to allocate buffer for kv cache")
_CONTEXT_BAD_ALLOC = re.compile(r"failed to initialize the context: std::bad_alloc")
_DEVICE_OOM = re.compile(r"cudaMalloc failed: out of memory|out of memory|ErrorOutOfDeviceMemory")
_HOST_OOM = re.compile(r"ggml_aligned_malloc: insufficient memory|std::bad_alloc|failed to allocate CPU buffer")
_WEIGHTS = re.compile(r"unable to allocate \S+ buffer|failed to allocate buffer for the model|error loading model: "
                      r".*(?:alloc|memory)")
_CONTEXT_EXCEEDED = re.compile(r"exceeds the available context size|exceed_context_size_error")
_KILLED = re.compile(r"Killed process \d+|oom-kill|Out of memory: Killed")
_EXITING = re.compile(r"exiting due to (?P<why>.+)")
_CONSTRUCTING = re.compile(r"constructing llama_context")
_N_CTX = re.compile(r"^llama_context: n_ctx\s+= (?P<ctx>\d+)")
_READY = re.compile(re.escape(READY_LINE))


_Rule = Callable[[FailureLog], Failure | None]


def _n_ctx(ctx: FailureLog) -> str:
    """`` (-c gave n_ctx = N)`` from the context's own line, ``""`` without one."""
    hits = ctx.find(_N_CTX)
    if not hits:
        return ""
    match = _N_CTX.search(ctx.lines[hits[0]].text)
    return f" (-c gave n_ctx = {int(match['ctx']):,})" if match else ""


def _bad_flag(ctx: FailureLog) -> Failure | None:
    for i in ctx.find(_BAD_ARGUMENT):
        match = _BAD_ARGUMENT.search(ctx.lines[i].text)
        assert match is not None
        flag = match["flag"]
        return ctx.failure(FailureKind.BAD_FLAG, f"llama-server does not know the flag {flag}",
                           f"remove or rename {flag}: this llama-server version does not accept it (check the space "
                           "against `llama-server --help` before the study)", ctx.evidence([i]))
    for i in ctx.find(_BAD_VALUE):
        match = _BAD_VALUE.search(ctx.lines[i].text)
        assert match is not None
        source = "the environment variable" if match["what"] != "argument" else "the flag"
        allowed = next((ln.text for ln in ctx.lines[i:] if _ALLOWED.match(ln.text)), "")
        listed = f" ({allowed})" if allowed else ""
        return ctx.failure(FailureKind.BAD_FLAG, f"llama-server refused the value of {source} {match['flag']}: "
                           f"{match['why'].strip()}",
                           f"give {match['flag']} a value `llama-server --help` lists for it{listed}",
                           ctx.evidence([i]))
    return None


def _port_in_use(ctx: FailureLog) -> Failure | None:
    return ctx.port_in_use(_PORT)


def _model_missing(ctx: FailureLog) -> Failure | None:
    hits = ctx.find(_NO_MODEL)
    if not hits:
        return None
    return ctx.failure(FailureKind.MODEL_LOAD_FAILED, "llama-server cannot open the model as a GGUF file",
                       "fix -m/--model: the path of a readable .gguf file on the machine that runs the server",
                       ctx.evidence(hits[:1] + ctx.find(_EXITING)))


def _quantized_v(ctx: FailureLog) -> Failure | None:
    hits = ctx.find(_QUANT_V)
    if not hits:
        return None
    return ctx.failure(FailureKind.BAD_FLAG, "a quantized V cache (-ctv) needs flash attention, which is off",
                       "add -fa on to a quantized -ctv (q8_0, q4_0, …), or keep -ctv f16", ctx.evidence(hits[-1:]))


def _compute_buffer(ctx: FailureLog) -> Failure | None:
    hits = ctx.find(_COMPUTE)
    if not hits:
        return None
    alloc = [i for i in ctx.find(_DEVICE_OOM) + ctx.find(_HOST_OOM) if i < hits[0]]
    return ctx.failure(FailureKind.COMPUTE_BUFFER_OOM,
                       f"the compute buffer for one batch could not be allocated{_n_ctx(ctx)}",
                       "lower -ub (the physical batch; the buffer grows with -ub × context), turn on -fa on (without "
                       "flash attention the attention scores need context × ubatch), or lower -c",
                       ctx.evidence(alloc[-1:] + hits))


def _kv_cache(ctx: FailureLog) -> Failure | None:
    kv = ctx.find(_KV_BUFFER)
    bad_alloc = ctx.find(_CONTEXT_BAD_ALLOC)
    if not kv and not bad_alloc:
        return None
    last = (kv or bad_alloc)[-1]
    device = [i for i in ctx.find(_DEVICE_OOM) if i <= last and not _HOST_OOM.search(ctx.lines[i].text)]
    host = [i for i in ctx.find(_HOST_OOM) if i <= last]
    if kv and device and (not host or device[-1] > host[-1]):
        return ctx.failure(FailureKind.NO_ROOM_FOR_KV,
                           f"the KV cache does not fit in the GPU's free memory{_n_ctx(ctx)}",
                           "lower -c (or -np with a fixed per-slot context), quantize the KV cache (-ctk q8_0 "
                           "-ctv q8_0 -fa on), or offload fewer layers (-ngl) so the weights leave room",
                           ctx.evidence([*device[-1:], last]))
    start = max([i for i in ctx.find(_CONSTRUCTING) if i < last], default=0)
    host = [i for i in host if i >= start][:1]
    where = "the KV cache" if kv else "the context (its KV cells)"
    return ctx.failure(FailureKind.NO_ROOM_FOR_KV, f"host memory ran out allocating {where}{_n_ctx(ctx)}",
                       "lower -c (or -np with a fixed per-slot context) or quantize the KV cache (-ctk q8_0 -ctv q8_0 "
                       "-fa on); on a GPU, offload the KV cache with -ngl instead of -nkvo",
                       ctx.evidence([*host, last]))


def _weights(ctx: FailureLog) -> Failure | None:
    hits = ctx.find(_WEIGHTS)
    if not hits:
        return None
    return ctx.failure(FailureKind.WEIGHTS_OOM, "the model weights could not be allocated",
                       "lower -ngl (keep some layers in host memory), use a smaller quantization, or free the GPU",
                       ctx.evidence(hits[:2]))


def _context_exceeded(ctx: FailureLog) -> Failure | None:
    hits = ctx.find(_CONTEXT_EXCEEDED)
    if not hits:
        return None
    return ctx.failure(FailureKind.CONTEXT_EXCEEDED, "a request was longer than one slot's context",
                       "raise -c (each slot holds -c / -np tokens unless the KV cache is unified) or lower -np; or "
                       "send shorter prompts", ctx.evidence(hits[:1]),
                       phase="serve" if ctx.ready_before(hits[0]) else "boot")


def _model_failed(ctx: FailureLog) -> Failure | None:
    hits = ctx.find(_MODEL_FAILED)
    if not hits:
        return None
    return ctx.failure(FailureKind.MODEL_LOAD_FAILED, "llama-server failed to load the model",
                       "read the error line: a GGUF this llama.cpp build cannot load (architecture, quantization) "
                       "needs another file or a newer build", ctx.evidence(hits[:2]))


def _host_oom_killed(ctx: FailureLog) -> Failure | None:
    hits = ctx.find(_KILLED)
    silent = ctx.hints.exit_code in (-9, 137) and not ctx.find(_EXITING)
    if not hits and not silent:
        return None
    return ctx.failure(FailureKind.HOST_OOM_KILLED, "llama-server was SIGKILLed, likely by the host OOM killer",
                       "free host RAM, or lower what lives there: -c and -np (KV on the CPU), --cache-ram (the prompt "
                       "cache, 8 GiB by default), -ngl (weights left on the host); check `dmesg`",
                       ctx.evidence(hits[:1]) if hits else ctx.tail())


def _boot_timeout(ctx: FailureLog) -> Failure | None:
    if not ctx.hints.timed_out or ctx.hints.became_ready:
        return None
    waited = f" after {ctx.hints.elapsed_s:.0f} s" if ctx.hints.elapsed_s is not None else ""
    return ctx.failure(FailureKind.BOOT_TIMEOUT, f"llama-server did not become ready{waited}",
                       "raise the boot timeout if the last log line shows progress (a large model loading); otherwise "
                       "treat the last phase in the log as the culprit", ctx.tail())


def _hang(ctx: FailureLog) -> Failure | None:
    if not (ctx.hints.timed_out and ctx.hints.became_ready):
        return None
    return ctx.failure(FailureKind.HANG, "the server stopped answering after it became ready",
                       "drop the flag this candidate added last; check the last slot lines for the stuck task",
                       ctx.tail(), phase="serve")


_RULES: tuple[_Rule, ...] = (_bad_flag, _port_in_use, _model_missing, _quantized_v, _compute_buffer, _kv_cache,
                             _weights, _model_failed, _context_exceeded, _host_oom_killed, _boot_timeout, _hang)
#: Rules that need no hints: what ``looks_failed`` reads.
_LOG_RULES = _RULES[:-3]


def classify(log_text: str, hints: FailureHints | None = None) -> Failure:
    """Classify a failed boot or a dead server. Never raises; an unknown cause gives ``UNKNOWN_CRASH``."""
    ctx = FailureLog(split_lines(log_text), hints or FailureHints(), _READY)
    for rule in _RULES:
        failure = rule(ctx)
        if failure is not None:
            return failure
    errors = [i for i, line in enumerate(ctx.lines) if line.level == "E" or line.text.startswith("error")]
    code = f" (exit code {ctx.hints.exit_code})" if ctx.hints.exit_code is not None else ""
    return ctx.failure(FailureKind.UNKNOWN_CRASH, f"llama-server died for an unrecognised reason{code}",
                       "read the full server log in the boot folder; if it is a new failure mode, report it so "
                       "elsa-tune learns to classify it", ctx.evidence(errors[-3:]) if errors else ctx.tail(5))


def looks_failed(log_text: str) -> bool:
    """Whether the log shows a failure: a rule's signature, or llama-server's ``exiting due to …`` line."""
    ctx = FailureLog(split_lines(log_text), FailureHints(), _READY)
    return any(rule(ctx) for rule in _LOG_RULES) or bool(ctx.find(_EXITING))


def study_stopper(log_text: str) -> StudyError | None:
    """A failure no other candidate would escape (the model file cannot be opened): stop the study.

    Returns the ``ConfigError`` to raise instead of recording the boot as one candidate's failure, or ``None``.
    """
    for line in split_lines(log_text):
        if _NO_MODEL.search(line.text):
            return ConfigError(f"llama-server cannot open the model: {line.text[:300]}",
                               remedy="fix -m/--model: the path of a readable .gguf file on the machine that runs "
                                      "llama-server (mounted into the container for Docker)")
    return None
