"""Faults injected into one boot of the simulated server, and the exact text SGLang prints for each.

``--sim-fault`` (or the environment variable ``ELSA_SIM_FAULT``, so a ``Runtime`` can inject one per boot)
takes a comma-separated list:

=============================  =====================================================================
``weights_oom``                CUDA OOM while loading the weights (torch traceback, exit -9)
``no_room_for_kv``             ``RuntimeError: Not enough memory...`` when the KV pool is sized (exit -9)
``mamba_pool_too_small``       the hybrid state cache cannot serve a request (exit -9)
``cuda_graph_failed``          ``Capture cuda graph failed`` during graph capture (exit -9)
``host_oom_killed``            the scheduler is SIGKILLed with no Python traceback (exit -9)
``technique_crash``            an ``AttributeError`` from a code path a flag enabled (exit -9)
``unknown``                    an unclassifiable scheduler exception (exit -9)
``crash_after_requests=N``     after N finished requests the scheduler dies with a decode OOM
``hang`` / ``hang_after_requests=N``  the scheduler stops producing tokens; ``/health`` still answers
``slow_boot[=F]``              every boot phase takes F times longer (default 10)
``port_taken``                 binding the HTTP port fails like uvicorn's ``[Errno 98]``
``gpu_not_released[=S]``       the card keeps this server's memory for S seconds after it exits (default 5)
=============================  =====================================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from elsa_tune.errors import ConfigError
from elsa_tune.runtime.failure import FailureKind

ENV_FAULT = "ELSA_SIM_FAULT"

#: Boot phase in which each boot crash happens (``startup.py`` walks these phases in order).
BOOT_CRASH_PHASE = {
    "weights_oom": "weights",
    "no_room_for_kv": "kv",
    "mamba_pool_too_small": "kv",
    "cuda_graph_failed": "graph",
    "host_oom_killed": "kv",
    "technique_crash": "graph",
    "unknown": "graph",
}
BOOT_CRASH_KIND = {
    "weights_oom": FailureKind.WEIGHTS_OOM,
    "no_room_for_kv": FailureKind.NO_ROOM_FOR_KV,
    "mamba_pool_too_small": FailureKind.MAMBA_POOL_TOO_SMALL,
    "cuda_graph_failed": FailureKind.CUDA_GRAPH_FAILED,
    "host_oom_killed": FailureKind.HOST_OOM_KILLED,
    "technique_crash": FailureKind.TECHNIQUE_CRASH,
    "unknown": FailureKind.UNKNOWN_CRASH,
}
_VALUED = {"crash_after_requests", "hang_after_requests", "slow_boot", "gpu_not_released"}
_FLAGS = {"hang", "port_taken", *BOOT_CRASH_KIND}


@dataclass(frozen=True)
class Crash:
    """A scheduler death: what is printed and how the launcher exits.

    ``exception_lines`` are the last lines of the traceback (the exception and its message); ``traceback``
    false means the process was killed with no Python handler running (host OOM killer).
    """

    kind: FailureKind
    phase: str
    exception_lines: tuple[str, ...]
    frames: tuple[str, ...] = ()
    traceback: bool = True
    exit_code: int = -9
    plain: bool = False        # the lines are ordinary log lines (a watchdog), not an exception


def watchdog_crash(timeout_s: float) -> Crash:
    """A forward that never returns: SGLang's watchdog dumps the stacks and kills the tree."""
    return Crash(FailureKind.HANG, "serve", (
        f"Scheduler watchdog timeout (self.watchdog_timeout={timeout_s:g}, self.soft=False)",), plain=True)


@dataclass(frozen=True)
class Faults:
    """The faults of one boot (all off by default)."""

    boot_crash: str | None = None
    crash_after_requests: int | None = None
    hang_after_requests: int | None = None
    slow_boot: float = 1.0
    port_taken: bool = False
    gpu_not_released_s: float = 0.0

    @classmethod
    def parse(cls, text: str | None) -> Faults:
        """Parse ``--sim-fault`` text; raises ``ConfigError`` naming the known faults."""
        values: dict[str, object] = {}
        for raw in (text or "").split(","):
            item = raw.strip()
            if not item:
                continue
            name, _, value = item.partition("=")
            name = name.strip().replace("-", "_")
            if name not in _VALUED and name not in _FLAGS:
                raise ConfigError(f"unknown simulated fault {name!r}",
                                  remedy="use one of: " + ", ".join(sorted(_VALUED | _FLAGS)))
            try:
                if name in BOOT_CRASH_KIND:
                    values["boot_crash"] = name
                elif name == "hang":
                    values["hang_after_requests"] = int(value) if value else 0
                elif name == "port_taken":
                    values["port_taken"] = True
                elif name == "slow_boot":
                    values["slow_boot"] = float(value) if value else 10.0
                elif name == "gpu_not_released":
                    values["gpu_not_released_s"] = float(value) if value else 5.0
                else:
                    values[name] = int(value)
            except ValueError as exc:
                raise ConfigError(f"simulated fault {item!r}: bad value",
                                  remedy=f"write it as {name}=<number>") from exc
        return cls(**values)  # type: ignore[arg-type]

    @classmethod
    def from_sources(cls, cli: str | None) -> Faults:
        """``--sim-fault`` when given, else ``$ELSA_SIM_FAULT``."""
        return cls.parse(cli if cli else os.environ.get(ENV_FAULT))

    def boot_crash_at(self, phase: str, mem_fraction: float, total_gb: float) -> Crash | None:
        if self.boot_crash is None or BOOT_CRASH_PHASE[self.boot_crash] != phase:
            return None
        return boot_crash(self.boot_crash, mem_fraction, total_gb)


def boot_crash(name: str, mem_fraction: float, total_gb: float) -> Crash:
    """The exact SGLang 0.5.23 text of a boot crash."""
    kind = BOOT_CRASH_KIND[name]
    phase = BOOT_CRASH_PHASE[name]
    if name == "weights_oom":
        return Crash(kind, phase, (
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 0 has a total capacity "
            f"of {total_gb:.2f} GiB of which 412.00 MiB is free. Including non-PyTorch memory, this process has "
            f"{total_gb - 0.4:.2f} GiB memory in use. Of the allocated memory {total_gb - 1.1:.2f} GiB is allocated "
            "by PyTorch, and 201.35 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory "
            "is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",),
            frames=_frames("model_executor/model_runner.py", "load_model", "self.model = get_model("))
    if name == "no_room_for_kv":
        return Crash(kind, phase, (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={mem_fraction}",),
            frames=_frames("model_executor/pool_configurator.py", "__post_init__", "raise RuntimeError("))
    if name == "mamba_pool_too_small":
        return Crash(kind, phase, (
            "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
            "max_mamba_cache_size=2, mamba_ratio=3, resulting max_num_reqs=0",),
            frames=_frames("mem_cache/kv_cache_configurator.py", "resolve_max_num_reqs", "raise RuntimeError("))
    if name == "cuda_graph_failed":
        return Crash(kind, phase, (
            "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 544.00 MiB. "
            f"GPU 0 has a total capacity of {total_gb:.2f} GiB of which 96.00 MiB is free.",
            "Possible solutions:",
            "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
            "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)",
            "3. disable decode CUDA graph by --disable-decode-cuda-graph. (Not recommended. Huge performance loss)",
            "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose "),
            frames=_frames("model_executor/runner/decode_cuda_graph_runner.py", "__init__", "raise Exception("))
    if name == "host_oom_killed":
        return Crash(kind, phase, (), traceback=False)
    if name == "technique_crash":
        return Crash(kind, phase, ("AttributeError: 'HybridLinearKVPool' object has no attribute 'layer_num'",),
                     frames=_frames("mem_cache/hiradix_cache.py", "__init__",
                                    "self.kv_cache.layer_num, self.page_size,"))
    return Crash(kind, phase, ("RuntimeError: CUDA error: unspecified launch failure",
                               "CUDA kernel errors might be asynchronously reported at some other API call, so the "
                               "stacktrace below might be incorrect."),
                 frames=_frames("model_executor/model_runner.py", "forward", "return self.forward_decode("))


def serve_oom_crash() -> Crash:
    """A fatal KV allocation failure while serving (``mem_cache/allocation.py``)."""
    return Crash(FailureKind.OOM_UNDER_LOAD, "serve", (
        "RuntimeError: Decode out of memory. Try to lower your batch size.",
        "Try to allocate 12 tokens.",
        "Available tokens: 0, evictable tokens: 0"),
        frames=_frames("mem_cache/allocation.py", "alloc_for_decode", "raise RuntimeError(msg)"))


def first_generation_oom_crash() -> Crash:
    """The pools left no workspace: the server boots and answers, then the first generation dies in a Triton kernel."""
    return Crash(FailureKind.OOM_UNDER_LOAD, "serve", ("RuntimeError: Triton Error [CUDA]: out of memory",),
                 frames=_frames("layers/attention/fla/chunk.py", "chunk_gated_delta_rule_fwd",
                                "g = chunk_local_cumsum(g, chunk_size=64, cu_seqlens=cu_seqlens)"))


def _frames(path: str, func: str, code: str) -> tuple[str, ...]:
    site = "/usr/local/lib/python3.12/dist-packages/sglang/srt"
    return (
        f'  File "{site}/managers/scheduler.py", line 3412, in run_scheduler_process',
        "    scheduler = Scheduler(" if "runner" in path or "pool" in path or "cache" in path or "model_runner" in path
        else "    scheduler.event_loop_overlap()",
        f'  File "{site}/{path}", line 517, in {func}',
        f"    {code}",
    )
