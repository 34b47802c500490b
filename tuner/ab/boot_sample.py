"""The per-boot measurement protocol: what one boot yields and how it is summarised for the gate.

A boot runs the identical workload (same requests, order and seeds in both arms) as ``warmup``
passes that are discarded, then ``k`` measured passes. The first pass after a boot is slow (graph
capture, JIT, allocator, cold prefix cache), so it never enters a comparison. The boot is the unit of
replication: its measured passes are sub-samples and collapse to one number per metric on the log
scale. A boot that crashed, ran out of memory or failed more than ``max_error_fraction`` of its
requests is a *failed* boot: it carries a ``Failure`` and no value is ever imputed for it.

``BootSampler`` is the seam to the real world: the study implements it by booting the runtime and
replaying traffic; tests implement it with seeded synthetic noise. The gate knows nothing else.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from elsa_tune.history.records import Arm, Covariates
from elsa_tune.runtime.failure import Failure, FailureKind

#: 2: ``arm`` is the ``Arm`` value (``"incumbent"``; schema 1 wrote the letter ``"A"``), the covariates are
#: ``history.records.Covariates`` (schema 1's ``power_w`` is read as ``power_limit_w``); ``BootSample.from_dict`` reads
#: both.
SCHEMA_VERSION = 2
DEFAULT_MAX_ERROR_FRACTION = 0.005


#: Fewer measured requests per boot than this cannot estimate a p99 (it would be their maximum): the TTFT tail
#: guardrail then uses the boot's p90.
TAIL_MIN_REQUESTS = 100


@dataclass(frozen=True)
class PassMeasurement:
    """One pass of the workload inside a boot. ``warmup`` passes are recorded but never compared."""

    output_throughput_tok_s: float
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    warmup: bool = False
    error_fraction: float = 0.0
    duration_s: float | None = None
    ttft_p90_s: float | None = None
    requests_ok: int | None = None       # the requests behind the TTFT quantiles (``None``: not recorded)


@dataclass(frozen=True)
class BootSample:
    """Everything one boot of one arm produced, as the gate sees it.

    ``passes`` lists every pass in order, warm-up passes included and flagged. ``kv_pool_tokens`` is
    the boot's ``BootReport.kv_capacity``: the runtime's real pool in tokens (not the declared context length), or
    tokens per GiB of KV where the context fixes the pool. ``quality_passed``
    is the quality gate's outcome (``None``: not run). ``failed`` is set when the boot crashed, hung or
    ran out of memory; the remaining fields then describe what was seen before the failure.
    """

    arm: Arm
    block: int
    position: int
    passes: tuple[PassMeasurement, ...] = ()
    kv_pool_tokens: float | None = None
    quality_passed: bool | None = None
    covariates: Covariates = field(default_factory=Covariates)
    failed: Failure | None = None
    candidate_key: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def measured(self) -> tuple[PassMeasurement, ...]:
        return tuple(p for p in self.passes if not p.warmup)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "arm": self.arm.value, "block": self.block,
                "position": self.position, "candidate_key": self.candidate_key,
                "passes": [vars(p).copy() for p in self.passes], "kv_pool_tokens": self.kv_pool_tokens,
                "quality_passed": self.quality_passed,
                "covariates": self.covariates.to_dict(),
                "failed": self.failed.to_dict() if self.failed else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BootSample:
        return cls(arm=Arm.read(str(data["arm"])), block=int(data["block"]), position=int(data["position"]),
                   passes=tuple(PassMeasurement(**p) for p in data.get("passes", ())),
                   kv_pool_tokens=data.get("kv_pool_tokens"), quality_passed=data.get("quality_passed"),
                   covariates=Covariates.from_dict(data.get("covariates") or {}),
                   failed=Failure.from_dict(data["failed"]) if data.get("failed") else None,
                   candidate_key=str(data.get("candidate_key", "")))


class BootSampler(Protocol):
    """Boots ``arm`` fresh, runs the warm-up and measured passes, stops it, and returns the sample.

    ``block`` and ``position`` come from the recorded schedule. A crashed boot is returned as a
    sample with ``failed`` set (raising ``BootFailed``/``ServerDied`` is accepted too).
    """

    def boot(self, arm: Arm, block: int, position: int) -> BootSample: ...


@dataclass(frozen=True)
class BootSummary:
    """One boot collapsed to the gate's unit: log of the mean measured throughput, log TTFTs, KV, quality.

    ``unusable`` explains why the boot cannot enter a comparison (then the log values are NaN).
    ``unsteady`` flags a boot whose measured passes spread more than 3 σ_run (hyperfine's
    ``SlowInitialRun`` spirit): it stays in the comparison but is reported.
    """

    arm: Arm
    block: int
    log_throughput: float
    log_ttft_p50: float | None
    log_ttft_p99: float | None
    kv_pool_tokens: float | None
    quality_passed: bool | None
    measured_passes: int
    unusable: str = ""
    unsteady: bool = False
    tail_quantile: float = 0.99          # the quantile ``log_ttft_p99`` holds (0.9 when the boot had too few requests)
    tail_requests: int | None = None     # the measured requests behind it


def failure_of(sample: BootSample, *, max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION) -> Failure | None:
    """The boot's failure: its own, or one made up for too many failed requests in a measured pass."""
    if sample.failed is not None:
        return sample.failed
    for i, p in enumerate(sample.passes):
        if p.error_fraction > max_error_fraction:
            return Failure(kind=FailureKind.UNKNOWN_CRASH, phase="serve",
                           summary=f"pass {i} failed {p.error_fraction:.1%} of its requests "
                                   f"(limit {max_error_fraction:.1%})",
                           remedy="read the boot's server log for the failing requests; a config that drops "
                                  "requests is not kept")
    return None


def summarize(sample: BootSample, *, measured_passes: int, warmup_passes: int = 1, sigma_run: float | None = None,
              max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION) -> BootSummary:
    """Collapse a boot to its summary on the log scale, using ``measured_passes`` passes after the warm-up.

    The first ``warmup_passes`` passes are discarded whether or not the sampler flagged them, and so is
    any other pass flagged ``warmup``. Missing, non-positive or non-finite throughput makes the boot
    unusable (never a zero), as does a failure.
    """
    if measured_passes < 1 or warmup_passes < 0:
        raise ValueError("measured_passes must be ≥ 1 and warmup_passes ≥ 0")

    def unusable(why: str) -> BootSummary:
        return BootSummary(arm=sample.arm, block=sample.block, log_throughput=math.nan, log_ttft_p50=None,
                           log_ttft_p99=None, kv_pool_tokens=sample.kv_pool_tokens,
                           quality_passed=sample.quality_passed, measured_passes=0, unusable=why)

    failure = failure_of(sample, max_error_fraction=max_error_fraction)
    if failure is not None:
        return unusable(f"failed boot: {failure.kind.value}: {failure.summary}")
    passes = tuple(p for p in sample.passes[warmup_passes:] if not p.warmup)[:measured_passes]
    if len(passes) < measured_passes:
        return unusable(f"{len(passes)} measured passes, the protocol needs {measured_passes}")
    tput = [p.output_throughput_tok_s for p in passes]
    if not all(math.isfinite(x) and x > 0 for x in tput):
        return unusable(f"non-positive or non-finite throughput {tput}")
    log_tput = math.log(statistics.fmean(tput))
    logs = [math.log(x) for x in tput]
    unsteady = bool(sigma_run and len(logs) > 1 and max(logs) - min(logs) > 3 * sigma_run)
    counts = [p.requests_ok for p in passes]
    requests = sum(c for c in counts if c is not None) if all(c is not None for c in counts) else None
    tail_q, tail = 0.99, [p.ttft_p99_s for p in passes]
    if requests is not None and requests < TAIL_MIN_REQUESTS and all(p.ttft_p90_s is not None for p in passes):
        # The p99 of a few dozen requests is their maximum: one slow request decides it, and a guardrail on it
        # reads noise as a regression. The boot's tail is judged at the 90th percentile instead, and says so.
        tail_q, tail = 0.9, [p.ttft_p90_s for p in passes]
    return BootSummary(arm=sample.arm, block=sample.block, log_throughput=log_tput,
                       log_ttft_p50=_log_median([p.ttft_p50_s for p in passes]),
                       log_ttft_p99=_log_median(tail),
                       kv_pool_tokens=sample.kv_pool_tokens, quality_passed=sample.quality_passed,
                       measured_passes=len(passes), unsteady=unsteady, tail_quantile=tail_q,
                       tail_requests=requests)


def _log_median(values: list[float | None]) -> float | None:
    usable = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if len(usable) != len(values) or not usable:
        return None
    return math.log(statistics.median(usable))
