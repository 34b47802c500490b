"""``BootReport``: what the runtime actually did, read from its startup log and its info endpoints.

The fields are one vocabulary for every runtime family: ``max_total_num_tokens`` is the KV capacity in tokens
(SGLang's pool, llama.cpp's total KV cells), ``max_running_requests`` the effective concurrent slots,
``context_len`` the longest request one slot holds (llama.cpp's ``n_ctx_seq``). Schema 2 adds what a runtime
that splits memory across devices and slots reports: the buffers per device, the layers offloaded, whether
the KV cache is one unified pool, and whether speculative decoding is active. Schema 3 adds
``max_concurrency``: how many requests of ``context_len`` tokens the KV pool holds at once, as the runtime
printed it (vLLM's ``Maximum concurrency for … tokens per request: 6.49x``; not derived, since a hybrid model's
is not the pool divided by the context).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 3


@dataclass(frozen=True)
class Adjustment:
    """A flag whose effective value differs from the requested one, with the line that proves it.

    ``effective`` is ``None`` when the runtime accepted the flag and ignored it with no value to show.
    """

    flag: str
    requested: Any
    effective: Any
    evidence: str
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"flag": self.flag, "requested": self.requested, "effective": self.effective,
                "evidence": self.evidence, "reason": self.reason}


@dataclass(frozen=True)
class BootPhase:
    """One timed phase of a boot (weights, KV pool, CUDA graph capture, warm-up, …)."""

    name: str
    seconds: float | None
    mem_usage_gb: float | None = None
    avail_mem_gb: float | None = None


@dataclass(frozen=True)
class DeviceBuffer:
    """One buffer a boot allocated: on ``device`` (``CUDA0``, ``CPU``, ``CPU_Mapped``), of ``kind`` (``model``,
    ``kv``, ``compute``, ``output``), ``mib`` MiB."""

    device: str
    kind: str
    mib: float


@dataclass(frozen=True)
class BootReport:
    """What one boot really produced. Every field may be ``None`` when the log did not say.

    Memory is in GB as SGLang prints it. ``server_args`` is the resolved dict the runtime printed
    (``server_args={...}``) or served at ``/server_info``.
    """

    runtime_version: str | None = None
    max_total_num_tokens: int | None = None
    max_running_requests: int | None = None        # effective, per DP worker
    context_len: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    available_gpu_mem_gb: float | None = None     # after the pools and graphs (scheduler summary)
    weights_mem_gb: float | None = None
    kv_pool_tokens: int | None = None
    kv_pool_gb: float | None = None
    kv_dtype: str | None = None
    mamba_cache_size: int | None = None            # max_mamba_cache_size (slots)
    mamba_pool_gb: float | None = None
    cuda_graph_mem_gb: float | None = None
    boot_seconds: float | None = None
    phases: tuple[BootPhase, ...] = ()
    server_args: Mapping[str, Any] = field(default_factory=dict)
    adjustments: tuple[Adjustment, ...] = ()
    warnings: tuple[str, ...] = ()
    buffers: tuple[DeviceBuffer, ...] = ()
    layers_offloaded: int | None = None
    layers_total: int | None = None
    kv_unified: bool | None = None
    speculative: bool | None = None
    pool_fixed_by_context: bool = False
    max_concurrency: float | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def kv_capacity(self) -> float | None:
        """What a memory technique must raise, comparable between two boots of one study.

        Where the runtime sizes its KV pool to the memory it is given (SGLang), the pool in tokens. Where the
        requested context fixes the pool (llama.cpp's ``-c``: ``pool_fixed_by_context``), the tokens one GiB of KV
        buffer holds, so a smaller KV type shows as a gain at the same context.
        """
        if not self.pool_fixed_by_context:
            return float(self.max_total_num_tokens) if self.max_total_num_tokens else None
        if not self.kv_pool_tokens or not self.kv_pool_gb:
            return None
        return self.kv_pool_tokens / self.kv_pool_gb

    @property
    def kv_capacity_unit(self) -> str:
        return "tokens/GiB" if self.pool_fixed_by_context else "tokens"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["phases"] = [vars(p).copy() for p in self.phases]
        data["server_args"] = dict(self.server_args)
        data["adjustments"] = [a.to_dict() for a in self.adjustments]
        data["warnings"] = list(self.warnings)
        data["buffers"] = [vars(b).copy() for b in self.buffers]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BootReport:
        kwargs = dict(data)
        kwargs["phases"] = tuple(BootPhase(**p) for p in data.get("phases", ()))
        kwargs["adjustments"] = tuple(Adjustment(**a) for a in data.get("adjustments", ()))
        kwargs["warnings"] = tuple(data.get("warnings", ()))
        kwargs["server_args"] = dict(data.get("server_args", {}))
        kwargs["buffers"] = tuple(DeviceBuffer(**b) for b in data.get("buffers", ()))
        kwargs["schema_version"] = SCHEMA_VERSION   # older records read as schema 3 with the new fields empty
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in kwargs.items() if k in known})
