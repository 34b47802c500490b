"""Classify how SGLang failed, from its log, exit status and timing .

``FailureLog`` is what every runtime family's classification rules read (vLLM's, llama.cpp's): the lines of the
log, the hints, the ready line's pattern; it finds lines, quotes evidence and builds the ``Failure``.

``classify(log_text, hints) -> Failure``. Rules are tried in a fixed order, most specific first:
a CUDA-graph capture failure is also a CUDA OOM, a scheduler traceback ends with SGLang killing
itself (-9), so the order matters. Every ``Failure`` carries the few lines that prove it and a
one-line remedy that names the flag to change.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from elsa_tune.errors import ConfigError, EnvironmentError_, RuntimeUnavailable, StudyError
from elsa_tune.runtime.failure import Failure, FailureHints, FailureKind
from elsa_tune.runtime.log_lines import TextLine
from elsa_tune.runtime.startup_log import READY_LINE, LogLine, boot_lines


@dataclass(frozen=True)
class FailureLog:
    """A failed boot's log lines and hints: what a runtime family's classification rules read.

    ``ready`` matches the line the server prints once it serves: a failure after it is a serve-phase failure.
    """

    lines: Sequence[TextLine]
    hints: FailureHints
    ready: re.Pattern[str]

    def find(self, pattern: re.Pattern[str]) -> list[int]:
        """The indexes of the lines whose text ``pattern`` matches."""
        return [i for i, line in enumerate(self.lines) if pattern.search(line.text)]

    def evidence(self, indexes: Sequence[int], limit: int = 4) -> tuple[str, ...]:
        """The raw lines at ``indexes``, blank and repeated lines left out, at most ``limit``."""
        return tuple(dict.fromkeys(self.lines[i].raw.strip() for i in indexes if self.lines[i].raw.strip()))[:limit]

    def ready_before(self, index: int) -> bool:
        """Whether the server had become ready before line ``index`` (or the hints say it did)."""
        return self.hints.became_ready or any(self.ready.search(line.text) for line in self.lines[:index])

    def tail(self, n: int = 3) -> tuple[str, ...]:
        """The last ``n`` non-blank raw lines."""
        return tuple(line.raw.strip() for line in self.lines if line.raw.strip())[-n:]

    def port_in_use(self, pattern: re.Pattern[str]) -> Failure | None:
        """``PORT_IN_USE`` when a line matches ``pattern`` (the runtime's bind error) or the hints saw the port
        taken; ``None`` otherwise."""
        hits = self.find(pattern)
        if not hits and not self.hints.port_in_use:
            return None
        return self.failure(FailureKind.PORT_IN_USE, "the server port was already taken by another process",
                            "stop the stale server holding the port (`ss -ltnp`); elsa-tune picks a fresh free "
                            "--port on the next boot", self.evidence(hits[:1]))

    def failure(self, kind: FailureKind, summary: str, remedy: str, evidence: Sequence[str],
                phase: str | None = None) -> Failure:
        """The ``Failure`` a rule found; its phase is ``serve`` once the server was ready (unless given), its
        evidence the log's last lines when the rule quotes none."""
        if phase is None:
            phase = "serve" if self.ready_before(len(self.lines)) else "boot"
        return Failure(kind=kind, summary=summary, remedy=remedy, evidence=tuple(evidence) or self.tail(),
                       phase=phase, exit_code=self.hints.exit_code, elapsed_s=self.hints.elapsed_s)


_OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|CUDA error: out of memory|out of memory", re.IGNORECASE)
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?(?P<name>[A-Z]\w*(?:Error|Exception|Exit|Interrupt))(?::\s?(?P<text>.*))?$")
_CODE_BUGS = ("AttributeError", "NotImplementedError", "TypeError", "KeyError", "IndexError", "AssertionError",
              "NameError", "ImportError", "ModuleNotFoundError", "UnboundLocalError", "ZeroDivisionError")
_MEM_FRACTION = re.compile(r"mem_fraction_static=([\d.]+)|--mem-fraction-static=([\d.]+)")
_RAISE_ABOVE = re.compile(r"Raise --mem-fraction-static above ([\d.]+)")


@dataclass(frozen=True)
class _Context:
    lines: Sequence[LogLine]
    hints: FailureHints

    def find(self, pattern: re.Pattern[str]) -> list[int]:
        return [i for i, line in enumerate(self.lines) if pattern.search(line.message)]

    def evidence(self, indexes: Sequence[int], after: int = 1, limit: int = 4) -> tuple[str, ...]:
        picked: list[int] = []
        for i in indexes:
            for j in range(i, min(i + after + 1, len(self.lines))):
                if j not in picked and self.lines[j].message.strip():
                    picked.append(j)
            if len(picked) >= limit:
                break
        return tuple(self.lines[j].raw.strip() for j in picked[:limit])

    def has(self, *needles: str) -> bool:
        return any(n in line.message for line in self.lines for n in needles)

    def tail(self, n: int = 5) -> tuple[str, ...]:
        return tuple(line.raw.strip() for line in self.lines if line.raw.strip())[-n:]


_Rule = Callable[[_Context], Failure | None]


def _failure(ctx: _Context, kind: FailureKind, summary: str, remedy: str, evidence: Sequence[str]) -> Failure:
    hints = ctx.hints
    phase = "serve" if hints.became_ready or ctx.has(READY_LINE) else "boot"
    return Failure(kind=kind, summary=summary, remedy=remedy, evidence=tuple(evidence) or ctx.tail(3), phase=phase,
                   exit_code=hints.exit_code, elapsed_s=hints.elapsed_s)


def _bad_flag(ctx: _Context) -> Failure | None:
    pattern = re.compile(r"error: (unrecognized arguments: (?P<args>.*)|ambiguous option: (?P<amb>\S+)"
                         r"|argument (?P<arg>--[\w-]+)(?:/[-\w]+)?: (?P<why>.*))")
    hits = ctx.find(pattern)
    if hits:
        match = pattern.search(ctx.lines[hits[0]].message)
        assert match is not None
        flag = (match["args"] or match["amb"] or match["arg"] or "").split()[0] if match else ""
        flag = flag.split("=")[0]
        return _failure(ctx, FailureKind.BAD_FLAG, f"the runtime rejected the flag {flag}",
                        f"remove or rename {flag}: this SGLang version does not accept it "
                        "(validate the space against `--help` before the study)",
                        ctx.evidence(hits, after=0))
    if ctx.hints.exit_code == 2 and not ctx.has(READY_LINE) and ctx.has("usage:"):
        return _failure(ctx, FailureKind.BAD_FLAG, "the launcher exited 2 with a usage message (argparse)",
                        "fix the launch flags: argparse refused them", ctx.tail(3))
    return None


def _port_in_use(ctx: _Context) -> Failure | None:
    hits = ctx.find(re.compile(r"Address already in use|\[Errno 98\]|address is already in use"
                               r"|port \d+ is (?:already )?in use", re.IGNORECASE))
    if hits or ctx.hints.port_in_use:
        return _failure(ctx, FailureKind.PORT_IN_USE, "the server port was already taken by another process",
                        "stop the stale server holding the port (`ss -ltnp`); elsa-tune picks a fresh free "
                        "--port on the next boot", ctx.evidence(hits, after=0))
    return None


def _mem_fraction(ctx: _Context) -> str:
    for line in ctx.lines:
        above = _RAISE_ABOVE.search(line.message)
        if above:
            return f" above {above.group(1)}"
    for line in ctx.lines:
        match = _MEM_FRACTION.search(line.message)
        if match:
            return f" (now {match.group(1) or match.group(2)})"
    return ""


def _no_room_for_kv(ctx: _Context) -> Failure | None:
    hits = ctx.find(re.compile(r"Loaded weights leave no GPU memory for the KV cache|Not enough memory\. Please try "
                               r"to increase --mem-fraction-static|is larger than the profiled value -\d+"))
    if not hits:
        return None
    return _failure(ctx, FailureKind.NO_ROOM_FOR_KV, "the weights leave no GPU memory for the KV cache pool",
                    f"raise --mem-fraction-static{_mem_fraction(ctx)} or free the GPU; lower --context-length or "
                    "--max-running-requests if the pool must shrink", ctx.evidence(hits))


def _mamba_too_small(ctx: _Context) -> Failure | None:
    hits = ctx.find(re.compile(r"Not enough GPU memory for hybrid \(mamba/linear-attention\) state cache"
                               r"|state cache is too small to serve any requests"))
    if not hits:
        return None
    return _failure(ctx, FailureKind.MAMBA_POOL_TOO_SMALL,
                    "the Mamba (linear-attention) state pool cannot hold a request",
                    "raise --mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state with "
                    "--mamba-ssm-dtype bfloat16", ctx.evidence(hits))


def _cuda_graph(ctx: _Context) -> Failure | None:
    hits = ctx.find(re.compile(r"Capture (?:[\w -]+ )?(?:cuda|CUDA) graph failed|CUDA graph capture failed",
                               re.IGNORECASE))
    if not hits:
        return None
    if "prefill" in ctx.lines[hits[0]].message.lower():
        return _failure(ctx, FailureKind.CUDA_GRAPH_FAILED, "prefill CUDA-graph capture failed at boot",
                        "lower --cuda-graph-max-bs-prefill (or --chunked-prefill-size) or --mem-fraction-static "
                        "by 0.03; or --disable-prefill-cuda-graph", ctx.evidence(hits))
    return _failure(ctx, FailureKind.CUDA_GRAPH_FAILED, "CUDA-graph capture failed at boot",
                    "lower --cuda-graph-max-bs-decode (e.g. 16; ≤0.5.9: --cuda-graph-max-bs) or "
                    "--mem-fraction-static by 0.03; or --disable-decode-cuda-graph", ctx.evidence(hits))


def _oom(ctx: _Context) -> Failure | None:
    serve_oom = re.compile(r"(?:Prefill|Decode) out of memory|^Out of memory\. Try to lower"
                           r"|Triton Error \[CUDA\]: out of memory")
    hits = ctx.find(serve_oom) or ctx.find(_OOM)
    if not hits:
        return None
    first = hits[0]
    loaded = any(("Load weight end" in ln.message) for ln in ctx.lines[:first])
    ready = ctx.hints.became_ready or any(READY_LINE in ln.message for ln in ctx.lines[:first])
    if not loaded and not ready:
        return _failure(ctx, FailureKind.WEIGHTS_OOM, "CUDA out of memory while loading the weights",
                        "the weights do not fit the free GPU memory: free the GPU, raise --tp-size or use a "
                        "smaller/quantized checkpoint (--mem-fraction-static does not help here)",
                        ctx.evidence(hits, after=0))
    when = "while serving" if ready else "after the weights were loaded (pool allocation or warm-up)"
    return _failure(ctx, FailureKind.OOM_UNDER_LOAD, f"out of GPU memory {when}",
                    "lower --mem-fraction-static (e.g. by 0.03) to leave activation workspace, or lower "
                    "--chunked-prefill-size / --max-running-requests", ctx.evidence(hits, after=2))


def _hang(ctx: _Context) -> Failure | None:
    hits = ctx.find(re.compile(r"watchdog timeout|Scheduler watchdog|Health check failed\. Server couldn't get a "
                               r"response", re.IGNORECASE))
    if not hits and not (ctx.hints.timed_out and ctx.hints.became_ready):
        return None
    return _failure(ctx, FailureKind.HANG, "a forward pass hung (watchdog or no response)",
                    "drop the flag this candidate added last (e.g. --max-mamba-cache-size too large hangs hybrid "
                    "models); raise --watchdog-timeout only for legitimately long prefills",
                    ctx.evidence(hits, after=0) if hits else ctx.tail(3))


def _host_oom_explicit(ctx: _Context) -> Failure | None:
    hits = ctx.find(re.compile(r"crashed with exit code -9|exit code: -9|Killed process \d+|oom-kill"))
    if not hits:
        return None
    return _host_oom(ctx, hits)


def _host_oom(ctx: _Context, hits: Sequence[int]) -> Failure:
    return _failure(ctx, FailureKind.HOST_OOM_KILLED, "a runtime process was SIGKILLed, likely by the host OOM killer",
                    "free host RAM or lower host-memory flags (--tokenizer-worker-num, --hicache-size or "
                    "--hicache-ratio); check `dmesg` for the OOM killer",
                    ctx.evidence(hits, after=0) if hits else ctx.tail(3))


def _technique_crash(ctx: _Context) -> Failure | None:
    if not ctx.find(_TRACEBACK):
        return None
    exceptions = [i for i, ln in enumerate(ctx.lines) if (m := _EXCEPTION.match(ln.message.strip()))
                  and m["name"] in _CODE_BUGS]
    if not exceptions:
        return None
    i = exceptions[0]
    name_line = ctx.lines[i].message.strip()
    where = next((ctx.lines[j].raw.strip() for j in range(i - 1, max(-1, i - 6), -1)
                  if ctx.lines[j].message.strip().startswith("File ")), None)
    evidence = tuple(x for x in (where, ctx.lines[i].raw.strip()) if x)
    return _failure(ctx, FailureKind.TECHNIQUE_CRASH, f"a code path crashed: {name_line[:160]}",
                    "drop the technique flag(s) this candidate enabled (the traceback names the code path), "
                    "or patch the runtime; record it in the ledger", evidence)


def _host_oom_silent(ctx: _Context) -> Failure | None:
    if ctx.hints.exit_code in (-9, 137) and not ctx.find(_TRACEBACK) and not ctx.has("Scheduler hit an exception"):
        return _host_oom(ctx, [])
    return None


def _boot_timeout(ctx: _Context) -> Failure | None:
    if not ctx.hints.timed_out or ctx.hints.became_ready:
        return None
    waited = f" after {ctx.hints.elapsed_s:.0f} s" if ctx.hints.elapsed_s is not None else ""
    return _failure(ctx, FailureKind.BOOT_TIMEOUT, f"the server did not become ready{waited}",
                    "raise the boot timeout if the last log line shows progress (weight download, JIT compile); "
                    "otherwise treat the last phase in the log as the culprit", ctx.tail(3))


def _unknown(ctx: _Context) -> Failure:
    errors = [i for i, ln in enumerate(ctx.lines) if _EXCEPTION.match(ln.message.strip()) or "Error" in ln.message]
    evidence = ctx.evidence(errors[-2:], after=0) if errors else ctx.tail(5)
    code = f" (exit code {ctx.hints.exit_code})" if ctx.hints.exit_code is not None else ""
    return _failure(ctx, FailureKind.UNKNOWN_CRASH, f"the runtime died for an unrecognised reason{code}",
                    "read the full server log in the boot folder; if it is a new failure mode, report it so "
                    "elsa-tune learns to classify it", evidence)


_RULES: tuple[_Rule, ...] = (
    _bad_flag, _port_in_use, _cuda_graph, _no_room_for_kv, _mamba_too_small, _oom, _hang,
    _host_oom_explicit, _technique_crash, _boot_timeout, _host_oom_silent,
)


def classify(log_text: str, hints: FailureHints | None = None) -> Failure:
    """Classify a failed boot or a dead server. Never raises; unknown causes give ``UNKNOWN_CRASH``."""
    ctx = _Context(boot_lines(log_text), hints or FailureHints())
    for rule in _RULES:
        failure = rule(ctx)
        if failure is not None:
            return failure
    return _unknown(ctx)


def looks_failed(log_text: str) -> bool:
    """True when the log shows a failure signature (used by ``log explain`` to choose report vs failure)."""
    ctx = _Context(boot_lines(log_text), FailureHints())
    if any(rule(ctx) for rule in _RULES[:-1]):
        return True
    return bool(ctx.find(_TRACEBACK)) or ctx.has("Scheduler hit an exception", "Received sigquit")


_STUDY_STOPPERS: tuple[tuple[re.Pattern[str], type[StudyError], str, str], ...] = (
    (re.compile(r"No module named '?sglang"), RuntimeUnavailable, "the launch command's Python cannot import SGLang",
     "install sglang into that environment, or point the launch command at the environment that has it"),
    (re.compile(r"Repo id must use alphanumeric|is not a local folder and is not a valid model identifier"
                r"|does not appear to have a file named config\.json|Can't load the configuration of"),
     ConfigError, "the model path cannot be loaded",
     "fix --model-path: a local folder with config.json (mounted into the container for Docker) or a Hub id "
     "reachable from this machine"),
    (re.compile(r"Found no NVIDIA driver on your system|No CUDA GPUs are available|CUDA driver initialization failed"
                r"|no CUDA-capable device is detected"),
     EnvironmentError_, "the runtime sees no usable CUDA GPU",
     "check the driver and that the GPU (CUDA_VISIBLE_DEVICES / the container's device request) is visible"),
)


def study_stopper(log_text: str) -> StudyError | None:
    """A failure no other candidate would escape (no SGLang, bad model path, no GPU): stop the study.

    Returns the error to raise instead of recording ``BootFailed`` for one candidate, or ``None``.
    """
    for line in boot_lines(log_text):
        for pattern, error, what, remedy in _STUDY_STOPPERS:
            if pattern.search(line.message):
                return error(f"{what}: {line.message.strip()[:300]}", remedy=remedy)
    return None
