"""SGLang 0.5.23's log lines, printed by the simulated server with SGLang's exact formats.

``ServerLog`` writes timestamped lines (``[%Y-%m-%d %H:%M:%S] message``, the format of
``srt/utils/common.py::configure_logger``; uvicorn's lines carry no timestamp). ``Boot`` walks SGLang's
boot phases (server args, weights, Mamba and KV pools, CUDA-graph capture, scheduler summary, HTTP bind,
warm-up, ready line), each taking its simulated time, and stops at the phase where a crash is due, printing
what SGLang prints when its scheduler dies there.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from elsa_tune.runtime.sim.faults import Crash

READY_LINE = "The server is fired up and ready to roll!"


class ServerLog:
    """Thread-safe line writer with SGLang's timestamp prefix; flushes every line (it is read live)."""

    def __init__(self, stream: TextIO | None = None, *, millis: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        # SGLang adds milliseconds to its timestamps when SGLANG_LOG_MS is set
        self.millis = bool(os.environ.get("SGLANG_LOG_MS")) if millis is None else millis
        self._lock = threading.Lock()

    def info(self, message: str) -> None:
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
        if self.millis:
            stamp += f".{int(now * 1000) % 1000:03d}"
        self.raw("\n".join(f"[{stamp}] {line}" if i == 0 else line for i, line in enumerate(message.split("\n"))))

    def batch(self, kind: str, values: Sequence[tuple[str, Any]]) -> None:
        """A scheduler batch line (``Prefill batch, …`` / ``Decode batch, …``)."""
        self.info(runtime_line(kind, values))

    def raw(self, text: str) -> None:
        with self._lock:
            try:
                self.stream.write(text + "\n")
                self.stream.flush()
            except (BrokenPipeError, ValueError):
                pass   # the reader went away; a server keeps serving without its log

    def crash(self, crash: Crash, *, serving: bool) -> None:
        """What SGLang prints when a scheduler dies: the traceback, then the parent's SIGQUIT handler."""
        if crash.plain:
            for line in crash.exception_lines:
                self.info(line)
        elif crash.traceback:
            head = "Scheduler hit an exception: Traceback (most recent call last):"
            lines = list(crash.exception_lines)
            if lines and lines[0].startswith("Scheduler hit an exception"):
                head = lines.pop(0)
            body = [head, *crash.frames, *lines, ""]
            self.info("\n".join(body))
        else:
            self.info(f"Subprocess scheduler_0 (pid={os.getpid() + 1}) crashed with exit code {crash.exit_code}. "
                      "Triggering SIGQUIT for cleanup...")
        if serving:
            self.info("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
        else:
            self.info("Received sigquit from a child process. It usually means the child failed.")
            if not crash.traceback:
                self.info(f"RuntimeError: Rank 0 scheduler died during initialization (exit code: {crash.exit_code}). "
                          "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T` to "
                          "check for OOM killer messages.")


@dataclass(frozen=True)
class MambaPool:
    slots: int
    conv_gb: float
    ssm_gb: float
    intermediate_ssm_gb: float | None = None     # only with speculative decoding
    intermediate_conv_gb: float | None = None


@dataclass(frozen=True)
class StartupFacts:
    """Everything the startup log states, taken from the memory plan (see ``serving.facts_from_plan``)."""

    server_args: Mapping[str, Any]
    total_gb: float
    weights_gb: float
    model_class: str
    quant: str | None
    kv_tokens: int
    kv_dtype: str                 # torch dtype name as SGLang prints it, e.g. torch.bfloat16
    kv_gb: float                  # K + V
    avail_after_pools_gb: float
    graph_gb: float
    available_gpu_mem_gb: float   # the scheduler summary's value
    chunked_prefill_size: int
    max_prefill_tokens: int
    max_running_requests: int
    context_len: int
    draft_weights_gb: float = 0.0
    draft_buffers_gb: float = 0.0
    mamba: MambaPool | None = None
    decode_graph_bs: tuple[int, ...] = ()
    prefill_graph_tokens: tuple[int, ...] = ()
    speculative: bool = False
    warnings: tuple[str, ...] = ()
    #: simulated seconds of each phase (scaled by the server's speedup when slept)
    phase_seconds: Mapping[str, float] = field(default_factory=dict)

    def early_warnings(self) -> tuple[str, ...]:
        """Warnings logged while the server args are resolved (speculative hook), before the weights load."""
        return tuple(w for w in self.warnings if w.startswith(_EARLY))

    def late_warnings(self) -> tuple[str, ...]:
        return tuple(w for w in self.warnings if not w.startswith(_EARLY))


_EARLY = ("Max running requests is reset to", "speculative_num_draft_tokens is adjusted",
          "Mixed chunked prefill is disabled", "The mixed chunked prefill are disabled")


class Boot:
    """Print SGLang's boot sequence for ``facts``; ``run`` returns the ``Crash`` that stopped it, if any.

    ``sleep(seconds)`` waits simulated time (the server scales it); ``crash_at(phase)`` says whether a crash is
    due in a phase (``weights``, ``kv``, ``graph``); ``on_memory(used_gb)`` reports the card's usage as it grows.
    """

    def __init__(self, log: ServerLog, facts: StartupFacts, sleep: Callable[[float], None],
                 crash_at: Callable[[str], Crash | None], on_memory: Callable[[float], None]) -> None:
        self.log = log
        self.facts = facts
        self.sleep = sleep
        self.crash_at = crash_at
        self.on_memory = on_memory
        self.seconds: dict[str, float] = {}

    def run(self) -> Crash | None:
        f, log = self.facts, self.log
        log.info(f"server_args={dict(f.server_args)!r}")
        for line in f.early_warnings():
            log.info(line)
        free = f.total_gb - 0.55
        log.info(f"Load weight begin. avail mem={free:.2f} GB")
        crash = self._phase("weights")
        if crash:
            return crash
        used = f.weights_gb + f.draft_weights_gb
        self.on_memory(used)
        quant = f"quant={f.quant}, " if f.quant else ""
        log.info(f"Load weight end. elapsed={self.seconds['weights']:.2f} s, type={f.model_class}, {quant}"
                 f"avail mem={free - f.weights_gb:.2f} GB, mem usage={f.weights_gb:.2f} GB.")
        if f.speculative and f.draft_weights_gb > 0:
            log.info(f"Load weight end. elapsed=0.41 s, type={f.model_class}MTP, "
                     f"avail mem={free - used:.2f} GB, mem usage={f.draft_weights_gb:.2f} GB.")
        crash = self._phase("kv")
        if crash:
            return crash
        if f.mamba is not None:
            m = f.mamba
            if f.speculative and m.intermediate_ssm_gb is not None:
                log.info(f"Mamba Cache is allocated. max_mamba_cache_size: {m.slots}, conv_state size: "
                         f"{m.conv_gb:.2f}GB, ssm_state size: {m.ssm_gb:.2f}GB intermediate_ssm_state_cache size: "
                         f"{m.intermediate_ssm_gb:.2f}GB intermediate_conv_window_cache size: "
                         f"{(m.intermediate_conv_gb or 0.0):.2f}GB ")
            else:
                log.info(f"Mamba Cache is allocated. max_mamba_cache_size: {m.slots}, conv_state size: "
                         f"{m.conv_gb:.2f}GB, ssm_state size: {m.ssm_gb:.2f}GB ")
        log.info(f"KV Cache is allocated. dtype: {f.kv_dtype}, #tokens: {f.kv_tokens}, "
                 f"K size: {f.kv_gb / 2:.2f} GB, V size: {f.kv_gb / 2:.2f} GB")
        self.on_memory(f.total_gb - 0.55 - f.avail_after_pools_gb)
        log.info(f"Memory pool end. avail mem={f.avail_after_pools_gb:.2f} GB")
        avail = f.avail_after_pools_gb
        decode_share = f.graph_gb * 0.8
        name = "target verify" if f.speculative else "target decode"
        tokens_per_req = int(f.server_args.get("speculative_num_draft_tokens") or 1) if f.speculative else 1
        if f.decode_graph_bs:
            log.info(f"Capture {name} CUDA graph begin. backend=full, num_tokens_per_req={tokens_per_req}, "
                     f"avail mem={avail:.2f} GB")
        crash = self._phase("graph")
        if crash:
            return crash
        if f.decode_graph_bs:
            log.info(f"Capture {name} CUDA graph end. bs={list(f.decode_graph_bs)}, "
                     f"elapsed={self.seconds['graph'] * 0.7:.2f} s, mem usage={decode_share:.2f} GB, "
                     f"avail mem={avail - decode_share:.2f} GB.")
            if f.speculative:
                log.info(f"Capture draft decode CUDA graph end. bs={list(f.decode_graph_bs)}, elapsed="
                         f"{self.seconds['graph'] * 0.1:.2f} s, mem usage=0.00 GB, "
                         f"avail mem={avail - decode_share:.2f} GB.")
        if f.prefill_graph_tokens:
            log.info(f"Capture target prefill CUDA graph begin. backend=breakable, "
                     f"num_tokens={list(f.prefill_graph_tokens)}, avail mem={avail - decode_share:.2f} GB")
            log.info(f"Capture target prefill CUDA graph end. elapsed={self.seconds['graph'] * 0.2:.2f} s, "
                     f"mem usage={f.graph_gb - decode_share:.2f} GB, avail mem={avail - f.graph_gb:.2f} GB.")
        self.on_memory(f.total_gb - 0.55 - f.available_gpu_mem_gb)
        for line in f.late_warnings():
            log.info(line)
        log.info(f"max_total_num_tokens={f.kv_tokens}, chunked_prefill_size={f.chunked_prefill_size}, "
                 f"max_prefill_tokens={f.max_prefill_tokens}, max_running_requests={f.max_running_requests}, "
                 f"context_len={f.context_len}, available_gpu_mem={f.available_gpu_mem_gb:.2f} GB")
        return None

    def _phase(self, name: str) -> Crash | None:
        seconds = float(self.facts.phase_seconds.get(name, _DEFAULT_PHASE_S[name]))
        crash = self.crash_at(name)
        # A crash comes part-way into the phase, the way an allocation fails before the phase would end.
        self.sleep(seconds * (0.5 if crash else 1.0))
        self.seconds[name] = seconds
        return crash


_DEFAULT_PHASE_S = {"weights": 12.0, "kv": 1.5, "graph": 9.0, "warmup": 1.0}


def uvicorn_started(log: ServerLog, host: str, port: int) -> None:
    log.raw(f"INFO:     Started server process [{os.getpid()}]")
    log.raw("INFO:     Waiting for application startup.")
    log.raw("INFO:     Application startup complete.")
    log.raw(f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")


def uvicorn_bind_failed(log: ServerLog, host: str, port: int) -> None:
    log.raw(f"ERROR:    [Errno 98] error while attempting to bind on address ('{host}', {port}): "
            "address already in use")


def runtime_line(kind: str, values: Sequence[tuple[str, Any]]) -> str:
    """``Prefill batch, #new-seq: 1, …`` / ``Decode batch, #running-req: 4, …`` from ordered pairs."""
    return f"{kind} batch, " + ", ".join(f"{k}: {v}" for k, v in values)
