"""One-sentence reasons: how a verdict, a failure or a silent clamp reads in the ledger and the report.

The sentences follow the field notes: "−20% at short prompts, −30% at 63K", "crashes: 'HybridLinearKVPool'
object has no attribute 'layer_num'", "accepted and silently ignored: server_args shows False",
"no demonstrated benefit: +1.2% [−4%, +7%] over 12 boots". A missing number is said, never shown as 0.

``reason_category`` files a decision under one of the tables' few words (crash, oom, hang, ignored, context drop,
memory loss, wrong answers, slower, no gain, kept, kept for memory) from typed facts: a failure's kind, a silent
ignore, or the category the decider set on its verdict. "Slower" is said only where the evidence shows it (an
interval below no change, a guardrail confidently worse, a screening boot far below the incumbent); otherwise "no
gain".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from elsa_tune.history.verdict import Decision, PolicyKind, Verdict
from elsa_tune.runtime.boot_report import Adjustment
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.search_spaces.space import ReasonCategory

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
    if verdict.by_workload:
        return ", ".join(f"{pct(r)} at {name}" for name, r in verdict.by_workload.items() if _is_number(r))
    if verdict.effect is None:
        return f"no estimate over {boots} boots"
    return f"{pct(verdict.effect)} {interval(verdict.ci_low, verdict.ci_high)} over {boots} boots" + \
        _outlier_note(verdict)


def _outlier_note(verdict: Verdict) -> str:
    """" (1 boot down-weighted as an outlier: candidate in block 3 −24% off its arm's median, weight 0.00)"."""
    rows = verdict.outlier_boots
    if not rows:
        return ""
    what = "; ".join(f"{o.arm} in block {o.block} {pct(1.0 + o.off_median)} off its arm's median, weight "
                     f"{o.weight:.2f}" for o in rows)
    many = len(rows) > 1
    return f" ({len(rows)} boots down-weighted as outliers: {what})" if many else \
        f" (1 boot down-weighted as an outlier: {what})"


def pool_text(verdict: Verdict) -> str:
    """"pool 300,144 → 600,288 tokens (×2.0)" for a memory technique's test; "" when it recorded no pools."""
    a, b = verdict.kv_pool_incumbent, verdict.kv_pool_candidate
    if not a or not b:
        return ""
    return f"pool {a:,} → {b:,} tokens (×{b / a:.1f})"


def _margin_text(verdict: Verdict) -> str:
    return pct(1.0 - verdict.speed_margin) if verdict.speed_margin is not None else "its margin"


def reason_from_verdict(verdict: Verdict) -> str:
    """The ledger/report sentence for an A/B verdict, read from its decision, category and typed facts."""
    failed = [g for g in verdict.guardrails if g.passed is False]
    category = verdict.category or _legacy_category(verdict)
    if verdict.decision is Decision.REJECT and verdict.failure is not None and verdict.effect is None:
        # an A/B boot of the candidate failed before any estimate: that failure is the reason
        return f"an A/B boot failed: {reason_from_failure(verdict.failure)}"
    if verdict.decision is Decision.INCONCLUSIVE:
        if verdict.not_tested:         # the night's control left no level to run a test at: said as such
            return verdict.reason
        control = verdict.night_control
        if control is not None and control.held and verdict.adjusted_p_value is not None:
            # the gate kept it; the night's false-keep control did not: a gain shown, not strongly enough for the night
            return (f"not kept under the night's false-keep control: {effect_text(verdict)}, adjusted p "
                    f"{verdict.adjusted_p_value:.2g} > {control.level:.2f}")
        guard = next((g for g in verdict.guardrails if g.name == verdict.pending_guardrail), None)
        if guard is not None:
            return (f"{effect_text(verdict)}, but {guard.name} not shown within {pct(guard.margin)}: "
                    f"{pct(guard.ratio)} {interval(guard.ci_low, guard.ci_high)}")
        pool = pool_text(verdict) if verdict.kind is PolicyKind.MEMORY else ""
        text = (f"{pool}, speed {effect_text(verdict)}, not shown within the margin {_margin_text(verdict)}"
                if pool else f"no demonstrated benefit: {effect_text(verdict)}")
        if verdict.mde is not None:
            text += f"; smallest detectable effect {pct(mde_ratio(verdict.mde))}"
        return text
    if verdict.decision is Decision.KEEP and verdict.kind is PolicyKind.MEMORY and pool_text(verdict):
        return f"{pool_text(verdict)}, speed {effect_text(verdict)}, within the margin {_margin_text(verdict)}"
    if verdict.decision is Decision.REJECT and failed and (verdict.effect is None or verdict.effect >= 1.0) \
            and not verdict.futile:        # a futility stop's guardrails were only not yet shown
        g = failed[0]
        return (f"{g.name} {pct(g.ratio)} {interval(g.ci_low, g.ci_high)}, allowed {pct(g.margin)}"
                + (f" ({g.detail})" if g.detail else ""))
    if verdict.decision is Decision.REJECT and verdict.effect is not None and verdict.effect >= 1.0:
        return f"no demonstrated benefit: {effect_text(verdict)}"
    if verdict.decision is Decision.REJECT and category is ReasonCategory.NO_GAIN:
        # stopped for futility with an interval that still reaches a gain: not shown slower, only not better
        return f"no demonstrated benefit (stopped early, futile): {effect_text(verdict)}"
    if verdict.decision is Decision.REJECT and category is ReasonCategory.SLOWER and verdict.effect is not None \
            and not verdict.failed_guardrail and not verdict.by_workload:
        return f"slower: {effect_text(verdict)}"
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


_FAILURE_CATEGORY: Mapping[FailureKind, ReasonCategory] = {
    FailureKind.BAD_FLAG: ReasonCategory.CRASH,
    FailureKind.WEIGHTS_OOM: ReasonCategory.OOM,
    FailureKind.NO_ROOM_FOR_KV: ReasonCategory.OOM,
    FailureKind.MAMBA_POOL_TOO_SMALL: ReasonCategory.OOM,
    FailureKind.CUDA_GRAPH_FAILED: ReasonCategory.CRASH,     # an OOM when the evidence says so (below)
    FailureKind.OOM_UNDER_LOAD: ReasonCategory.OOM,
    FailureKind.HOST_OOM_KILLED: ReasonCategory.OOM,
    FailureKind.HANG: ReasonCategory.HANG,
    FailureKind.BOOT_TIMEOUT: ReasonCategory.HANG,
    FailureKind.PORT_IN_USE: ReasonCategory.CRASH,
    FailureKind.TECHNIQUE_CRASH: ReasonCategory.CRASH,
    FailureKind.UNKNOWN_CRASH: ReasonCategory.CRASH,
}
def failure_category(failure: Failure) -> ReasonCategory:
    """The category of a failed boot: a CUDA-graph capture that ran out of memory is an OOM, else a crash."""
    if failure.kind is FailureKind.CUDA_GRAPH_FAILED and any(
            "out of memory" in line.lower() for line in (failure.summary, *failure.evidence)):
        return ReasonCategory.OOM
    return _FAILURE_CATEGORY.get(failure.kind, ReasonCategory.CRASH)


def reason_category(verdict: Verdict | None, failure: Failure | None = None,
                    ignored: Sequence[Adjustment] = ()) -> ReasonCategory | None:
    """Why a technique was (not) kept, in one ``ReasonCategory``; ``None`` when nothing was decided.

    A failure files under its kind, a silent ignore under "ignored", a verdict under the category its decider set
    (the gate, a screening shortcut, the night's false-keep control). Verdicts recorded before they carried one are
    filed from their typed facts (``_legacy_category``), never from their sentence.
    """
    if failure is not None:
        return failure_category(failure)
    if ignored:
        return ReasonCategory.IGNORED
    if verdict is None:
        return None
    return verdict.category or _legacy_category(verdict)


def _legacy_category(verdict: Verdict) -> ReasonCategory:
    """The category of a verdict written without one (schema 1), from its decision and its typed facts."""
    if verdict.decision is Decision.KEEP:
        return ReasonCategory.KEPT_FOR_MEMORY if verdict.kind is PolicyKind.MEMORY else ReasonCategory.KEPT
    if verdict.failure is not None and verdict.decision is Decision.REJECT:
        return failure_category(verdict.failure)
    pool = verdict.pool
    if pool is not None and pool.context_target is not None:
        return ReasonCategory.CONTEXT_DROP
    if verdict.quality_failed:
        return ReasonCategory.WRONG_ANSWERS
    guardrail = verdict.failed_guardrail
    memory = next((g for g in verdict.guardrails if g.name == "memory_gain"), None)
    if (pool is not None and pool.incumbent_kv_pool is not None) or (verdict.decision is Decision.REJECT and (
            guardrail == "kv_pool_tokens" or (memory is not None and memory.passed is False))):
        return ReasonCategory.MEMORY_LOSS
    if verdict.decision is not Decision.REJECT:
        return ReasonCategory.NO_GAIN
    if verdict.slow_boot_z is not None or guardrail in ("ttft_p50", "ttft_p99"):
        return ReasonCategory.SLOWER
    if verdict.ci_high is not None and verdict.ci_high < 1.0:
        return ReasonCategory.SLOWER
    return ReasonCategory.NO_GAIN


def mde_ratio(mde: float) -> float:
    """``Verdict.mde`` as a ratio: the gate may state it as a ratio (1.06) or as a fraction (0.06)."""
    return mde if mde >= 1.0 else 1.0 + mde


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))
