"""``BootReport``: what the runtime actually did, read from its startup log and ``/server_info``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1


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
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["phases"] = [vars(p).copy() for p in self.phases]
        data["server_args"] = dict(self.server_args)
        data["adjustments"] = [a.to_dict() for a in self.adjustments]
        data["warnings"] = list(self.warnings)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BootReport:
        kwargs = dict(data)
        kwargs["phases"] = tuple(BootPhase(**p) for p in data.get("phases", ()))
        kwargs["adjustments"] = tuple(Adjustment(**a) for a in data.get("adjustments", ()))
        kwargs["warnings"] = tuple(data.get("warnings", ()))
        kwargs["server_args"] = dict(data.get("server_args", {}))
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in kwargs.items() if k in known})
