"""``Failure``: a classified outcome of a boot or a run, with the evidence and a remedy."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 1


class FailureKind(enum.Enum):
    """How a runtime failed: each kind is recognised from the server's log by its family's classifier
    (``runtime/classify.py`` for SGLang, ``runtime/llamacpp/classify.py`` for llama.cpp,
    ``runtime/vllm/classify.py`` for vLLM)."""

    BAD_FLAG = "bad_flag"                  # argparse exit 2 before any log
    WEIGHTS_OOM = "weights_oom"            # CUDA OOM while loading weights
    NO_ROOM_FOR_KV = "no_room_for_kv"      # KV pool <= 0 / weights leave no memory for KV
    MAMBA_POOL_TOO_SMALL = "mamba_pool_too_small"
    CUDA_GRAPH_FAILED = "cuda_graph_failed"
    OOM_UNDER_LOAD = "oom_under_load"      # booted, died on a generation (prefill/decode OOM, Triton OOM)
    HOST_OOM_KILLED = "host_oom_killed"    # SIGKILL with no Python traceback
    HANG = "hang"                          # watchdog timeout or no token for N seconds
    PORT_IN_USE = "port_in_use"
    BOOT_TIMEOUT = "boot_timeout"
    TECHNIQUE_CRASH = "technique_crash"    # an exception from a code path a flag enabled (AttributeError, …)
    UNKNOWN_CRASH = "unknown_crash"
    COMPUTE_BUFFER_OOM = "compute_buffer_oom"  # llama.cpp: the per-batch compute buffer could not be allocated
    CONTEXT_EXCEEDED = "context_exceeded"      # llama.cpp: a request longer than one slot's context (HTTP 400)
    MODEL_LOAD_FAILED = "model_load_failed"    # llama.cpp: the GGUF file cannot be opened or loaded
    PROFILE_OOM = "profile_oom"                # vLLM: CUDA OOM in the profiling run (one dummy batch at boot)
    GPU_BUSY = "gpu_busy"                      # vLLM: less free GPU memory at start than the utilization asks


@dataclass(frozen=True)
class Failure:
    """A classified failure: ``kind``, a one-line ``summary``, the log lines that prove it, a remedy.

    ``phase`` is ``"boot"`` or ``"serve"``; ``exit_code`` is the launcher's return code when it exited.
    """

    kind: FailureKind
    summary: str
    remedy: str
    evidence: tuple[str, ...] = ()
    phase: str = "boot"
    exit_code: int | None = None
    elapsed_s: float | None = None
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "kind": self.kind.value, "summary": self.summary,
                "remedy": self.remedy, "evidence": list(self.evidence), "phase": self.phase,
                "exit_code": self.exit_code, "elapsed_s": self.elapsed_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Failure:
        return cls(kind=FailureKind(data["kind"]), summary=data["summary"], remedy=data.get("remedy", ""),
                   evidence=tuple(data.get("evidence", ())), phase=data.get("phase", "boot"),
                   exit_code=data.get("exit_code"), elapsed_s=data.get("elapsed_s"),
                   schema_version=data.get("schema_version", SCHEMA_VERSION))


@dataclass(frozen=True)
class FailureHints:
    """Extra facts a classifier can use besides the log text (all optional)."""

    exit_code: int | None = None
    elapsed_s: float | None = None
    became_ready: bool = False
    timed_out: bool = False
    #: the launcher found the port taken (a log without the runtime's own bind error still files as PORT_IN_USE)
    port_in_use: bool = False
