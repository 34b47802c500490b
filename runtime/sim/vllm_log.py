"""vLLM 0.33.0's log lines, printed by the simulated server with vLLM's V1 formats.

``VllmServerLog`` writes ``(<Proc> pid=<pid>) LEVEL MM-DD HH:MM:SS [file.py:line] message`` (``vllm/logger.py``'s
``_FORMAT``; uvicorn's own lines carry only the process prefix). ``VllmBoot`` walks vLLM's V1 boot (version
and ``non-default args``, the resolved configuration's notes, the engine core's weights, memory profile and
``Available KV cache memory``, ``GPU KV cache size`` with ``Maximum concurrency``, graph capture, the API server's
routes) and stops at the phase where a crash is due, printing what the engine core prints when it fails there.
The format strings are those of ``vllm/v1/worker/gpu_worker.py``, ``v1/core/kv_cache_utils.py``,
``v1/core/kv_cache_planning.py``, ``v1/engine/core.py`` and ``entrypoints/common/startup.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.sim.faults import Crash
from elsa_tune.runtime.sim.memory import MemoryPlan
from elsa_tune.runtime.sim.startup import ServerLog
from elsa_tune.runtime.sim.vocabulary import VllmConfig

API = "APIServer"
ENGINE = "EngineCore"
_ROUTES = ("/health", "/metrics", "/version", "/v1/models", "/v1/completions", "/v1/chat/completions",
           "/tokenize", "/detokenize")


class VllmServerLog(ServerLog):
    """Thread-safe line writer with vLLM's prefix; ``pid`` is the API server's, the engine core's is ``pid + 1``."""

    def __init__(self, stream: TextIO | None = None, *, pid: int | None = None) -> None:
        super().__init__(stream, millis=False)
        self.pid = os.getpid() if pid is None else pid

    def line(self, message: str, *, proc: str = API, level: str = "INFO", where: str = "api_server.py:1") -> None:
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime())
        pid = self.pid if proc == API else self.pid + 1
        prefix = f"({proc} pid={pid}) "
        lines = message.split("\n")
        self.raw("\n".join([f"{prefix}{level} {stamp} [{where}] {lines[0]}", *(prefix + rest for rest in lines[1:])]))

    def info(self, message: str) -> None:
        self.line(message)

    def uvicorn(self, text: str) -> None:
        """A line the API server writes without the logger's format (uvicorn's, a traceback's)."""
        self.raw(f"({API} pid={self.pid}) {text}")

    def batch(self, kind: str, values: Sequence[tuple[str, Any]]) -> None:
        """vLLM's periodic engine stats line (``v1/metrics/loggers.py``), written on decode steps."""
        if kind != "Decode":
            return
        pairs = dict(values)
        usage = float(pairs.get("token usage", pairs.get("full token usage", 0.0)) or 0.0)
        self.line(f"Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
                  f"{pairs.get('gen throughput (token/s)', '0.00')} tokens/s, Running: {pairs.get('#running-req', 0)} "
                  f"reqs, Waiting: {pairs.get('#queue-req', 0)} reqs, GPU KV cache usage: {usage * 100:.1f}%, "
                  "Prefix cache hit rate: 0.0%", where="loggers.py:259")

    def crash(self, crash: Crash, *, serving: bool) -> None:
        """What vLLM prints when its engine core dies: the traceback, then the API server's error."""
        if crash.kind is FailureKind.HANG:
            for _ in range(2):
                self.line("No available shared memory broadcast block found in 60 seconds. This typically happens "
                          "when some processes are hanging or doing some time-consuming work (e.g. compilation, "
                          "weight/kv cache quantization).", proc=ENGINE, level="WARNING", where="shm_broadcast.py:681")
            return
        if not crash.traceback:
            self.line(f"Engine core proc EngineCore_DP0 died unexpectedly (exit code: {crash.exit_code})",
                      level="ERROR", where="core_client.py:625")
            return
        lines = exception_lines(crash)
        own = [frame for frame in crash.frames if "/vllm/" in frame or "/torch/" in frame]
        frames = own or _KIND_FRAMES.get(crash.kind, ())
        head = "EngineCore encountered a fatal error." if serving else "EngineCore failed to start."
        self.line("\n".join([head, "Traceback (most recent call last):", *frames, *lines]),
                  proc=ENGINE, level="ERROR", where="core.py:1586")
        if serving:
            self.line("AsyncLLM output_handler failed.", level="ERROR", where="async_llm.py:701")
            self.line("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
                      "(above) for the root cause.", level="ERROR", where="async_llm.py:701")
        else:
            self.uvicorn("RuntimeError: Engine core initialization failed. See root cause above. Failed core "
                         "proc(s): {'EngineCore_DP0': 1}")


def exception_lines(crash: Crash) -> tuple[str, ...]:
    """The exception of ``crash`` as vLLM raises it: the lines a crash of the engine's plan already carries in
    vLLM's words are kept; a kind whose lines were written for another runtime gets vLLM's text."""
    lines = tuple(line for line in crash.exception_lines if not line.startswith("Scheduler hit an exception"))
    if any(line.startswith(_VLLM_OWN) for line in lines):
        return lines
    text = _KIND_TEXT.get(crash.kind)
    return (text,) if text is not None else lines


#: Exception texts that read the same in vLLM (torch's own), or that the vLLM dialect wrote itself.
_VLLM_OWN = ("torch.OutOfMemoryError: CUDA out of memory", "ValueError: To serve at least one request",
             "RuntimeError: CUDA error: out of memory", "ValueError: No available memory for the cache blocks",
             "ValueError: Free memory on device")


_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "{total} of which 1.12 GiB is free.")
_KIND_TEXT: dict[FailureKind, str] = {
    FailureKind.WEIGHTS_OOM: _OOM.format(total="31.36 GiB"),
    FailureKind.NO_ROOM_FOR_KV: ("ValueError: No available memory for the cache blocks. Try increasing "
                                 "`gpu_memory_utilization` when initializing the engine (this flag also controls CPU "
                                 "memory reservation on the CPU backend, despite its name). See https://docs.vllm.ai/"
                                 "en/latest/configuration/conserving_memory/ for more details."),
    FailureKind.MAMBA_POOL_TOO_SMALL: ("ValueError: No available memory for the cache blocks. Try increasing "
                                       "`gpu_memory_utilization` when initializing the engine."),
    FailureKind.CUDA_GRAPH_FAILED: "RuntimeError: CUDA error: out of memory",
    FailureKind.OOM_UNDER_LOAD: _OOM.format(total="31.36 GiB"),
}


_SITE = "/usr/local/lib/python3.12/site-packages"
_KIND_FRAMES: dict[FailureKind, tuple[str, ...]] = {
    FailureKind.CUDA_GRAPH_FAILED: (
        f'  File "{_SITE}/vllm/v1/worker/gpu_model_runner.py", line 6592, in capture_model',
        f'  File "{_SITE}/vllm/compilation/cuda_graph.py", line 241, in __call__',
        "    with torch.cuda.graph(cudagraph, pool=self.graph_pool, stream=current_stream()):",
        f'  File "{_SITE}/torch/cuda/graphs.py", line 186, in __exit__',
        "    self.cuda_graph.capture_end()",
        f'  File "{_SITE}/torch/cuda/graphs.py", line 88, in capture_end',
        "    super().capture_end()"),
    FailureKind.WEIGHTS_OOM: (
        f'  File "{_SITE}/vllm/v1/worker/gpu_model_runner.py", line 5060, in load_model',
        f'  File "{_SITE}/vllm/model_executor/model_loader/base_loader.py", line 49, in load_model',
        "    model = initialize_model(vllm_config=vllm_config, model_config=model_config)"),
    FailureKind.NO_ROOM_FOR_KV: (
        f'  File "{_SITE}/vllm/v1/engine/core.py", line 262, in _initialize_kv_caches',
        f'  File "{_SITE}/vllm/v1/core/kv_cache_planning.py", line 58, in _check_enough_kv_cache_memory'),
}


class VllmBoot:
    """Print vLLM's V1 boot for one launch; ``run`` returns the ``Crash`` that stopped it, if any.

    ``sleep(seconds)`` waits simulated time; ``crash_at(phase)`` says whether a crash is due in a phase
    (``weights``, ``kv``, ``graph``); ``on_memory(used_gb)`` reports the card's usage as it grows.
    ``seconds`` holds each phase's simulated seconds once walked.
    """

    def __init__(self, log: VllmServerLog, config: VllmConfig, plan: MemoryPlan, model: str, served: str,
                 non_default: Mapping[str, Any], model_class: str, sleep: Callable[[float], None],
                 crash_at: Callable[[str], Crash | None], on_memory: Callable[[float], None],
                 phase_seconds: Mapping[str, float]) -> None:
        self.log = log
        self.config = config
        self.plan = plan
        self.model = model
        self.served = served
        self.non_default = non_default
        self.model_class = model_class
        self.sleep = sleep
        self.crash_at = crash_at
        self.on_memory = on_memory
        self.phase_seconds = phase_seconds
        self.seconds: dict[str, float] = {}

    def run(self) -> Crash | None:
        c, p, log = self.config, self.plan, self.log
        log.line(f"vLLM server version 0.33.0, serving model {self.model}", where="startup.py:28")
        log.line(f"non-default args: {dict(self.non_default)!r}", where="startup.py:96")
        log.line(f"Resolved architecture: {self.model_class}", where="model.py:612")
        log.line(f"Using max model len {c.model_max_len if c.auto_len else c.max_model_len}", where="model.py:2087")
        if c.kv_cache_dtype.startswith("fp8"):
            log.line("Using fp8 data type to store kv cache. It reduces the GPU memory footprint and boosts the "
                     "performance. Meanwhile, it may cause accuracy drop without a proper scaling factor",
                     where="cache.py:230")
        for note in c.notes:
            log.line(note.message, level=note.level, where=note.where)
        log.line(f"Initializing a V1 LLM engine (v0.33.0) with config: model={self.model!r}, "
                 f"speculative_config={self._spec()}, max_seq_len={c.max_model_len}, "
                 f"kv_cache_dtype={c.kv_cache_dtype}, enforce_eager={c.enforce_eager}, "
                 f"served_model_name={self.served}, enable_prefix_caching={c.prefix_caching}, "
                 f"enable_chunked_prefill={c.chunked_prefill}, compilation_config={{'cudagraph_mode': "
                 f"<CUDAGraphMode.{c.cudagraph_mode}>, 'cudagraph_capture_sizes': {list(c.capture_sizes)}, "
                 f"'max_cudagraph_capture_size': {max(c.capture_sizes) if c.capture_sizes else 0}}}",
                 proc=ENGINE, where="core.py:104")
        log.line(f"Starting to load model {self.model}...", proc=ENGINE, where="gpu_model_runner.py:5021")
        crash = self._phase("weights")
        if crash:
            return crash
        weights = p.weights_gb + p.draft_weights_gb
        self.on_memory(weights)
        log.line(f"Loading weights took {self.seconds['weights'] * 0.8:.2f} seconds", proc=ENGINE,
                 where="default_loader.py:507")
        log.line(f"Model loading took {weights:.2f} GiB memory and {self.seconds['weights']:.6f} seconds",
                 proc=ENGINE, where="gpu_model_runner.py:5089")
        crash = self._phase("kv")
        if crash:
            return crash
        available_kv = p.kv_gb + p.mamba_gb
        log.line(f"Available KV cache memory: {available_kv:.2f} GiB", proc=ENGINE, where="gpu_worker.py:773")
        tokens = p.kv_tokens
        max_len = p.context_len
        if c.auto_len:
            if max_len >= c.model_max_len:
                log.line(f"Auto-fit max_model_len: full model context length {c.model_max_len} fits in available "
                         f"KV cache memory ({available_kv:.2f} GiB)", proc=ENGINE, where="kv_cache_planning.py:1395")
            else:
                log.line(f"Auto-fit max_model_len: reduced from {c.model_max_len} to {max_len} to fit in available "
                         f"KV cache memory ({available_kv:.2f} GiB)", proc=ENGINE, where="kv_cache_planning.py:1404")
        concurrency = tokens / max(1, max_len)
        log.line(f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for {max_len:,} tokens per request: "
                 f"{concurrency:.2f}x", proc=ENGINE, where="kv_cache_utils.py:1148")
        self.on_memory(weights + available_kv)
        if c.capture_sizes:
            log.line(f"Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): {len(c.capture_sizes)} sizes",
                     proc=ENGINE, where="gpu_model_runner.py:6592")
        crash = self._phase("graph")
        if crash:
            return crash
        if c.capture_sizes:
            log.line(f"Graph capturing finished in {self.seconds['graph']:.0f} secs, took {p.cuda_graph_gb:.2f} GiB",
                     proc=ENGINE, where="gpu_model_runner.py:6517")
        self.on_memory(weights + available_kv + p.cuda_graph_gb)
        log.line(f"init engine (profile, create kv cache, warmup model) took {sum(self.seconds.values()):.2f} s",
                 proc=ENGINE, where="core.py:413")
        return None

    def serving(self, host: str, port: int) -> None:
        """The API server's lines once the engine is up: tasks, the address, the routes, uvicorn's start-up."""
        log = self.log
        log.line("Supported tasks: ['generate']", where="entry.py:135")
        log.line(f"Starting vLLM server on http://{host}:{port}", where="entry.py:139")
        log.line("Available routes are:", where="launcher.py:190")
        for route in _ROUTES:
            method = "GET" if route in ("/health", "/metrics", "/version", "/v1/models") else "POST"
            log.line(f"Route: {route}, Methods: {method}", where="launcher.py:197")
        log.uvicorn(f"INFO:     Started server process [{log.pid}]")
        log.uvicorn("INFO:     Waiting for application startup.")
        log.uvicorn("INFO:     Application startup complete.")

    def _spec(self) -> str:
        c = self.config
        if c.spec_method is None:
            return "None"
        return f"SpeculativeConfig(method={c.spec_method.lower()!r}, num_spec_tokens={c.spec_tokens})"

    def _phase(self, name: str) -> Crash | None:
        seconds = float(self.phase_seconds.get(name, 1.0))
        crash = self.crash_at(name)
        self.sleep(seconds * (0.5 if crash else 1.0))
        self.seconds[name] = seconds
        return crash


def bind_failed(log: VllmServerLog, host: str, port: int) -> None:
    log.line(f"[Errno 98] error while attempting to bind on address ('{host}', {port}): address already in use",
             level="ERROR", where="api_server.py:1")
