"""``Screening``: the techniques of the space, one at a time, against the incumbent.

Every technique the ledger has not rejected for this fingerprint is booted once with the probes and the
quality gate (an OOM or hang gets a second and third attempt). A crash, OOM, hang, quality regression, a pool
below the context target or an adjustment showing a technique flag was silently ignored or clamped rejects it
at once, with that reason; so does a memory technique whose KV pool is no larger than the incumbent's, and a
screening boot more than 3 σ slower than the incumbent, twice. Otherwise the sequential A/B gate decides
against the incumbent, under online false-keep control across the night; kept techniques stack into the incumbent.

A technique the gate left INCONCLUSIVE although its interval shows it faster (the night's false-keep control or
an unresolved TTFT guardrail held it back) is *promising*: ``retest`` tests it once more, with fresh boots, as a
new test under the night's false-keep control (``statistics.md`` §3.5: "a retest later is a new test with fresh
boots"). The study runs the retests at the start of the search phase, before the numeric search tunes around an
incumbent that a kept technique would change more than any flag value.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import replace
from typing import Any

from elsa_tune.history.decision import DecisionRecord, Kept
from elsa_tune.history.reasons import pct, reason_from_verdict
from elsa_tune.history.records import Phase
from elsa_tune.history.verdict import Decision, Verdict
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.search_spaces.rules import DerivationError, RuleViolation
from elsa_tune.search_spaces.space import ReasonCategory, Technique, TechniqueKind
from elsa_tune.tuner.night import Incumbent, Night, arm_mean
from elsa_tune.tuner.sampler import BootPlan, BootResult
from elsa_tune.tuner.schedule import Arm

log = logging.getLogger(__name__)

#: Failures worth a second and third attempt before they are the answer (seed 004: NGRAM "3 attempts, 3 OOM").
_RETRIED = (FailureKind.OOM_UNDER_LOAD, FailureKind.HANG)
#: Promising techniques retested at most, the largest estimate first.
RETESTS = 2


class Screening:
    """The screening phase of one night: ``run()`` decides every technique it has time for."""

    def __init__(self, night: Night) -> None:
        self.night = night

    def run(self) -> None:
        night = self.night
        here = str(night.store.run_dir)     # this study's own entries (a resumed study) are replayed, not skipped
        rejected = {name: e for name, e in night.store.ledger.rejected_for(night.pre.fingerprint).items()
                    if e.evidence.run_dir != here}
        for name, (entry, changes) in night.store.ledger.reopened_for(night.pre.fingerprint).items():
            if any(t.name == name for t in night.space.techniques):
                log.info("technique %s was rejected on another setup (%s); the setup changed (%s): screening it again",
                         name, entry.reason, "; ".join(changes) or "fingerprint")
        todo: list[tuple[int, Technique]] = []
        for index, technique in enumerate(night.space.techniques):     # what costs no boot is decided first
            if not technique.screen:
                log.info("technique %s is not screened automatically: %s", technique.name,
                         technique.rationale.strip())
                night.notes.append(f"{technique.name}: not screened automatically ({technique.rationale.strip()})")
            elif technique.name in rejected:
                note = night.store.ledger.skip_note(rejected[technique.name])
                log.info("technique %s skipped: %s", technique.name, note)
                night.decide(DecisionRecord(study=night.name, number=0, phase=Phase.SCREENING, technique=technique.name,
                                            flags_delta=dict(technique.flags), env_delta=dict(technique.env),
                                            skipped=note, decided_at=time.time()))
            else:
                todo.append((index, technique))
        for index, technique in todo:
            night.check()
            if night.budget.allowance("screening") < 2 * night.boot_s():
                log.warning("screening out of time: %s and later techniques were not tried", technique.name)
                night.notes.append(f"screening ran out of time before {technique.name}")
                break
            self.screen(index, technique)

    def retest(self, phase: str) -> None:
        """Test each promising technique once more (fresh boots, a new test), if ``phase``'s allowance has room.

        A retest needs a probed boot and at most the gate's extended cap in both arms; it runs only when that fits
        twice in what ``phase`` has left, so the phase keeps most of its time for its own work.
        """
        night = self.night
        assert night.policy is not None
        promising = sorted(night.promising, key=lambda item: -(item[2].effect or 0.0))
        night.promising = []
        for index, technique, first in promising[:RETESTS]:
            night.check()
            if technique.name in night.incumbent.techniques:
                continue
            cost = (1 + 2 * night.policy.max_blocks) * night.boot_s()
            if night.budget.allowance(phase) < 2 * cost:
                note = f"no time to retest {technique.name} ({reason_from_verdict(first)})"
                log.warning("%s", note)
                night.notes.append(note)
                break
            log.info("retesting %s with fresh boots: the first test was inconclusive at %s", technique.name,
                     reason_from_verdict(first))
            self.screen(index, technique, first=first)
        for _, technique, first in promising[RETESTS:]:
            night.notes.append(f"{technique.name} not retested (at most {RETESTS} retests a night): "
                               f"{reason_from_verdict(first)}")

    def screen(self, index: int, technique: Technique, *, first: Verdict | None = None) -> None:
        """Decide one technique: rules, the probed screening boot, immediate rejects, then the A/B gate.

        ``first``: this is a retest, and that was the first test's verdict (the decision's sentence says so).
        """
        night = self.night
        base: dict[str, Any] = dict(flags_delta=dict(technique.flags), env_delta=dict(technique.env),
                                    incumbent_key=night.incumbent.candidate.key())
        try:
            candidate = night.space.candidate(night.incumbent.values, [*night.incumbent.techniques, technique.name],
                                              label=technique.name)
        except (RuleViolation, DerivationError) as exc:
            failure = Failure(FailureKind.BAD_FLAG, f"refused by the space's rules: {exc.message}",
                              "change the technique or the rule in the search space", phase="plan")
            night.decide(DecisionRecord(study=night.name, number=0, phase=Phase.SCREENING, technique=technique.name,
                                        failure=failure, decided_at=time.time(), **base))
            return
        base["candidate_key"] = candidate.key()
        attempts, result = 0, None
        tag = f"screening:{technique.name}" + (":retest" if first is not None else "")
        while attempts < 3:
            attempts += 1
            result = night.boot(BootPlan(tag=f"{tag}:probe{attempts}", candidate=candidate, phase=Phase.SCREENING,
                                         arm=Arm.CANDIDATE, technique=technique.name, probes=True))
            failed = result.sample.failed
            if failed is None or failed.kind not in _RETRIED:
                break
        assert result is not None
        boots: tuple[str, ...] = (result.record.boot_id,)
        if result.sample.failed is not None:
            night.decide(DecisionRecord(study=night.name, number=0, phase=Phase.SCREENING, technique=technique.name,
                                        failure=_named(result.sample.failed), attempts=attempts, boots_candidate=boots,
                                        decided_at=time.time(), **base))
            return
        report = result.record.report
        ignored = tuple(a for a in (report.adjustments if report else ())
                        if a.flag in technique.flags or a.flag in _derived_of(technique))
        if ignored:
            night.decide(DecisionRecord(study=night.name, number=0, phase=Phase.SCREENING, technique=technique.name,
                                        ignored=ignored, boots_candidate=boots, decided_at=time.time(), **base))
            return
        immediate = self.immediate_reject(result)
        if immediate is None or immediate.extra.get("z") is not None:
            # A pool is a fact of the configuration, one boot shows it; a slow boot may be the host (rechecked).
            immediate = self.no_memory_gain(technique, result) or immediate
        if immediate is not None and immediate.extra.get("z") is not None:
            # A single slow boot may be the host, not the technique: a second boot must be as slow.
            again = night.boot(BootPlan(tag=f"{tag}:recheck", candidate=candidate, phase=Phase.SCREENING,
                                        arm=Arm.CANDIDATE, technique=technique.name))
            boots += (again.record.boot_id,)
            second = self.immediate_reject(again) if again.sample.failed is None else None
            immediate = second if second is not None and second.extra.get("z") is not None else None
            if immediate is not None:
                immediate = replace(immediate, boots_candidate=2, reason=immediate.reason.replace(
                    "on its screening boot", "on two screening boots (the second shown)"))
        if immediate is not None:
            night.decide(DecisionRecord(study=night.name, number=0, phase=Phase.SCREENING, technique=technique.name,
                                        verdict=immediate, result=immediate.reason, boots_candidate=boots,
                                        decided_at=time.time(), **base))
            return
        kind = technique.kind.value if technique.kind.value in ("speed", "memory") else "speed"
        ab, ids = night.ab(candidate, tag=tag, phase=Phase.SCREENING, technique=technique.name, kind=kind,
                           seed=index if first is None else 7919 + index)
        verdict = night.fdr.review(ab.verdict)
        sentence = (f"retest with fresh boots (the first: {reason_from_verdict(first)}): "
                    f"{reason_from_verdict(verdict)}" if first is not None else "")
        decision = DecisionRecord(study=night.name, number=0, phase=Phase.SCREENING, technique=technique.name,
                                  verdict=verdict, ab_result=ab.to_dict(), decided_at=time.time(),
                                  boots_incumbent=tuple(ids[Arm.INCUMBENT]), result=sentence,
                                  boots_candidate=boots + tuple(ids[Arm.CANDIDATE]), **base)
        night.decide(decision)
        # faster at the interval's low end (a memory technique: no slower than its non-inferiority margin)
        margin = night.policy.non_inferiority_margin if kind == "memory" and night.policy else 0.0
        if (first is None and decision.kept is Kept.INCONCLUSIVE and verdict.ci_low is not None
                and verdict.ci_low > 1.0 - margin):
            night.promising.append((index, technique, verdict))
        if decision.kept is Kept.YES:
            night.incumbent = Incumbent(dict(night.incumbent.values), [*night.incumbent.techniques, technique.name],
                                        candidate, arm_mean(ab, Arm.CANDIDATE) or night.incumbent.throughput)

    def no_memory_gain(self, technique: Technique, result: BootResult) -> Verdict | None:
        """A memory technique whose KV pool is no larger than the incumbent's: rejected without an A/B.

        A memory technique is there to buy KV pool (seed 004: int8 Mamba checkpoints, "−20% KV pool, no gain");
        the pool is a property of the configuration, so one boot shows it. Without a recorded pool on either
        side there is nothing to compare and the A/B decides.
        """
        if technique.kind is not TechniqueKind.MEMORY:
            return None
        report = result.record.report
        pool = report.max_total_num_tokens if report else None
        before = self.incumbent_pool()
        if not pool or not before or pool > before:
            return None
        reason = f"{pct(pool / before)} KV pool ({pool:,} vs {before:,} tokens), no memory gain"
        return Verdict(decision=Decision.REJECT, reason=reason, effect=None, ci_low=None, ci_high=None, p_value=None,
                       boots_incumbent=0, boots_candidate=1, extra={"kv_pool": pool, "incumbent_kv_pool": before},
                       category=ReasonCategory.MEMORY_LOSS)

    def incumbent_pool(self) -> int | None:
        """The incumbent's KV pool (``max_total_num_tokens``), the median over its recorded boots."""
        key = self.night.incumbent.candidate.key()
        pools = [b.report.max_total_num_tokens for b in self.night.store.load().boots
                 if b.candidate.key() == key and b.report is not None and b.report.max_total_num_tokens]
        return int(statistics.median_low(pools)) if pools else None

    def immediate_reject(self, result: BootResult) -> Verdict | None:
        """A quality regression or a pool below the context target: rejected without an A/B."""
        night = self.night
        reason = ""
        facts: dict[str, object] = {}
        category = ReasonCategory.SLOWER
        if result.sample.quality_passed is False:
            detail = next((p.detail for p in result.record.probes if not p.passed), "")
            reason = f"answers regressed against the baseline: {detail}" if detail else "failed the quality gate"
            facts, category = {"quality_failed": True}, ReasonCategory.WRONG_ANSWERS
        kv = result.sample.kv_pool_tokens
        if not reason and night.context_target and kv is not None and kv < night.context_target:
            reason = f"context drops to {kv:,} tokens, below the {night.context_target:,}-token target"
            facts, category = {"kv_pool": kv, "context_target": night.context_target}, ReasonCategory.CONTEXT_DROP
        tput, incumbent = result.record.throughput_tok_s, night.incumbent.throughput
        z: float | None = None
        if not reason and tput and incumbent and night.noise is not None:
            # One boot against the incumbent's mean: a drop beyond 3 σ_boot (one-sided p ≈ 0.001) needs no A/B.
            sigma = night.noise.sigma_boot * math.sqrt(1.0 + 1.0 / max(1, night.noise.boots))
            z = math.log(tput / incumbent) / sigma if sigma > 0 else 0.0
            if z < -3.0:
                reason = (f"{tput / incumbent - 1:+.0%} on its screening boot ({tput:,.1f} vs {incumbent:,.1f} tok/s), "
                          f"{-z:.1f} σ below the incumbent's boot-to-boot noise")
            else:
                z = None
        if not reason:
            return None
        if z is not None:
            facts = {"z": z}
        return Verdict(decision=Decision.REJECT, reason=reason, effect=None, ci_low=None, ci_high=None, p_value=None,
                       boots_incumbent=0, boots_candidate=1, extra=facts, category=category)


def _named(failure: Failure) -> Failure:
    """An unclassified crash is named by its own last evidence line (``RuntimeError: … requires SM100``)."""
    if failure.kind is FailureKind.UNKNOWN_CRASH and failure.evidence:
        return replace(failure, summary=failure.evidence[-1].strip()[:200])
    return failure


def _derived_of(technique: Technique) -> set[str]:
    """Flags a technique changes indirectly (steps → draft tokens): their adjustments count against it too."""
    return {"speculative-num-draft-tokens"} if "speculative-num-steps" in technique.flags else set()
