"""One-sentence reasons: how a verdict, a failure or a silent clamp reads in the ledger and the report.

The sentences follow the field notes: "−20% at short prompts, −30% at 63K", "crashes: 'HybridLinearKVPool'
object has no attribute 'layer_num'", "accepted and silently ignored: server_args shows False",
"no demonstrated benefit: +1.2% [−4%, +7%] over 12 boots". A missing number is said, never shown as 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from elsa_tune.history.verdict import Decision, Verdict
from elsa_tune.runtime.boot_report import Adjustment
from elsa_tune.runtime.failure import Failure, FailureKind

MINUS = "−"

_FAILURE_PREFIX: Mapping[FailureKind, str] = {
    FailureKind.BAD_FLAG: "refused by the runtime",
    FailureKind.WEIGHTS_OOM: "OOM while loading weights",
    FailureKind.NO_ROOM_FOR_KV: "no room left for the KV pool",
    FailureKind.MAMBA_POOL_TOO_SMALL: "Mamba state pool too small",
    FailureKind.CUDA_GRAPH_FAILED: "CUDA graph capture fails",
    FailureKind.OOM_UNDER_LOAD: "boots, then OOM under load",
    FailureKind.HOST_OOM_KILLED: "killed by the host OOM killer",
    FailureKind.HANG: "server hangs with no error",
    FailureKind.PORT_IN_USE: "port in use",
    FailureKind.BOOT_TIMEOUT: "boot timed out",
    FailureKind.TECHNIQUE_CRASH: "crashes",
    FailureKind.UNKNOWN_CRASH: "crashes",
}


def pct(ratio: float | None, *, digits: int | None = None) -> str:
    """A ratio as a signed percentage change with a real minus sign: 0.8 → "−20%", 1.012 → "+1.2%"."""
    if ratio is None or not math.isfinite(ratio):
        return "n/a"
    change = (ratio - 1.0) * 100.0
    if digits is None:
        digits = 1 if abs(change) < 10 else 0
    text = f"{abs(change):.{digits}f}"
    if float(text) == 0:
        return f"{0:.{digits}f}%"
    return f"{MINUS if change < 0 else '+'}{text}%"


def interval(low: float | None, high: float | None) -> str:
    """A CI of ratios as "[−4%, +7%]"; "[no interval]" when either end is unknown."""
    if low is None or high is None:
        return "[no interval]"
    low_text = pct(low, digits=0 if abs(low - 1) >= 0.01 else 1)
    high_text = pct(high, digits=0 if abs(high - 1) >= 0.01 else 1)
    return f"[{low_text}, {high_text}]"


def effect_text(verdict: Verdict) -> str:
    """"+1.2% [−4%, +7%] over 12 boots" (or the per-workload effects when the gate reported them)."""
    boots = verdict.boots_incumbent + verdict.boots_candidate
    by_workload = verdict.extra.get("by_workload") if isinstance(verdict.extra, Mapping) else None
    if isinstance(by_workload, Mapping) and by_workload:
        return ", ".join(f"{pct(float(r))} at {name}" for name, r in by_workload.items() if _is_number(r))
    if verdict.effect is None:
        return f"no estimate over {boots} boots"
    return f"{pct(verdict.effect)} {interval(verdict.ci_low, verdict.ci_high)} over {boots} boots"


def reason_from_verdict(verdict: Verdict) -> str:
    """The ledger/report sentence for an A/B verdict."""
    failed = [g for g in verdict.guardrails if g.passed is False]
    if verdict.decision is Decision.INCONCLUSIVE:
        text = f"no demonstrated benefit: {effect_text(verdict)}"
        if verdict.mde is not None:
            text += f"; smallest detectable effect {pct(mde_ratio(verdict.mde))}"
        return text
    if verdict.decision is Decision.REJECT and failed and (verdict.effect is None or verdict.effect >= 1.0):
        g = failed[0]
        return (f"{g.name} {pct(g.ratio)} {interval(g.ci_low, g.ci_high)}, allowed {pct(g.margin)}"
                + (f" ({g.detail})" if g.detail else ""))
    if verdict.decision is Decision.REJECT and verdict.effect is not None and verdict.effect >= 1.0:
        return f"no demonstrated benefit: {effect_text(verdict)}"
    return effect_text(verdict)


def reason_from_failure(failure: Failure) -> str:
    """"crashes: 'HybridLinearKVPool' object has no attribute 'layer_num'" and the like."""
    prefix = _FAILURE_PREFIX.get(failure.kind, "fails")
    summary = failure.summary.strip()
    return f"{prefix}: {summary}" if summary else prefix


def reason_from_adjustment(adjustment: Adjustment) -> str:
    """"accepted and silently ignored: server_args shows False" or "silently clamped: 4 → 2"."""
    where = adjustment.evidence.strip() or adjustment.reason.strip()
    if adjustment.effective is None or adjustment.effective is False:
        shown = "server_args shows False" if adjustment.effective is False else (where or "no effect in the log")
        return f"accepted and silently ignored: {shown}"
    return f"silently clamped: --{adjustment.flag} {adjustment.requested} → {adjustment.effective}"


def mde_ratio(mde: float) -> float:
    """``Verdict.mde`` as a ratio: the gate may state it as a ratio (1.06) or as a fraction (0.06)."""
    return mde if mde >= 1.0 else 1.0 + mde


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))
