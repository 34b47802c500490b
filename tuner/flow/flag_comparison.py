"""``compare_flags``: one A/B of two flag sets through the study's gate, as pyperf's ``compare_to`` is for benchmarks.

The comparison is a small night (``tuner/flow/night.py``) with A as its incumbent, booted by the study's own booter
into a run folder of its own, so every boot is recorded as a study's is:

1. **A's boots** (``baseline_boots``, the first with the stress probes and the quality reference) measure the noise
   of this stack (``measure_baseline``, ``tuner/flow/baseline.py``: the step a study and a worker take too);
   ``gate_policy`` (``tuner/ab/policy.py``) turns it and the search space's guardrails into the policy.
2. **B's probed boot**: its stress probes and quality gate against A's answers. A crash, an OOM, a hang, wrong
   answers or a KV pool below the context target (``Screening.immediate_reject``) ends it: B failed.
3. **The A/B** (``Night.ab`` → ``gate.run_ab``): seeded ABBA·BAAB blocks of fresh boots, sequential looks, the
   guardrails, the CI futility rule (it stops only when the interval shows the gain cannot reach the minimum
   effect).

The gate's verdict becomes one ``Outcome``: *better* (the gate kept B: its interval lies above 1), *worse* (the
interval lies below 1, or a guardrail is confidently worse), *equivalent* (the interval lies within ± the minimum
effect), *no difference shown* (none of these), or *B failed*. Each has its exit status
(``elsa_tune/exit_codes.py``). The interval is the gate's 1 − 2α interval of B/A throughput, not adjusted for the
sequential design.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from elsa_tune import exit_codes
from elsa_tune.history.decision import DecisionRecord
from elsa_tune.history.records import Arm, Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.history.verdict import Decision, Futility, Verdict
from elsa_tune.runtime.failure import Failure
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.tuner.ab.gate import GatePolicy
from elsa_tune.tuner.ab.policy import COMPARISON_LOOKS
from elsa_tune.tuner.console import StudyView
from elsa_tune.tuner.flow.baseline import Baseline, BaselineRequest, measure_baseline
from elsa_tune.tuner.flow.booter import BootPlan
from elsa_tune.tuner.flow.budget import SIMULATED_CLOCK, WALL_CLOCK, Budget
from elsa_tune.tuner.flow.load import ServerLoad
from elsa_tune.tuner.flow.night import Incumbent, Night, PhaseResult, StopStudy, StudyClock, arm_mean
from elsa_tune.tuner.flow.preflight import Preflight
from elsa_tune.tuner.flow.screening import Screening
from elsa_tune.tuner.flow.signals import Interrupts

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
# schema history: 1 — first version.
#: The futility rule of a comparison: stop early only when the interval shows the gain cannot reach the minimum.
FUTILITY = Futility.CI
RECORD_FILE = "compare.json"


class Outcome(enum.Enum):
    """What the comparison showed about B against A; ``exit_code`` is the command's exit status."""

    BETTER = "better"
    WORSE = "worse"
    EQUIVALENT = "equivalent"
    NO_DIFFERENCE = "no difference shown"
    B_FAILED = "B failed"

    @property
    def sentence(self) -> str:
        return {Outcome.BETTER: "B is better than A", Outcome.WORSE: "B is worse than A",
                Outcome.EQUIVALENT: "B is equivalent to A",
                Outcome.NO_DIFFERENCE: "no difference shown between B and A",
                Outcome.B_FAILED: "B failed"}[self]

    @property
    def exit_code(self) -> int:
        return {Outcome.BETTER: exit_codes.OK, Outcome.WORSE: exit_codes.WORSE,
                Outcome.EQUIVALENT: exit_codes.EQUIVALENT, Outcome.NO_DIFFERENCE: exit_codes.NO_DIFFERENCE,
                Outcome.B_FAILED: exit_codes.CANDIDATE}[self]


@dataclass(frozen=True)
class Side:
    """One arm: the file it came from, its candidate, its boots and their geometric-mean throughput."""

    file: str
    candidate: Candidate
    boots: int
    throughput_tok_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "label": self.candidate.label, "key": self.candidate.key(),
                "flags": dict(self.candidate.flags), "argv": self.candidate.argv(), "boots": self.boots,
                "throughput_tok_s": self.throughput_tok_s}


@dataclass(frozen=True)
class FlagComparison:
    """The result of one comparison, as written to ``compare.json`` and printed by ``elsa-tune compare``."""

    outcome: Outcome
    reason: str
    a: Side
    b: Side
    verdict: Verdict | None           # ``None`` when B failed before the A/B
    failure: Failure | None           # B's failure, when it crashed, hung or ran out of memory
    boots: int
    run_dir: str
    simulated: bool
    min_effect: float
    context: Mapping[str, str] = field(default_factory=dict)
    ab_result: Mapping[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code

    @property
    def interval(self) -> tuple[float | None, float | None]:
        v = self.verdict
        return (v.ci_low, v.ci_high) if v is not None else (None, None)

    def to_dict(self) -> dict[str, Any]:
        v = self.verdict
        low, high = self.interval
        return {"schema_version": self.schema_version, "outcome": self.outcome.value, "exit_code": self.exit_code,
                "reason": self.reason, "effect": v.effect if v else None, "ci_low": low, "ci_high": high,
                "ci_level": v.statistics.ci_level if v and v.statistics else None, "p_value": v.p_value if v else None,
                "gate_decision": v.decision.value if v else None, "min_effect": self.min_effect,
                "a": self.a.to_dict(), "b": self.b.to_dict(), "boots": self.boots, "run_dir": self.run_dir,
                "simulated": self.simulated, "context": dict(self.context),
                "verdict": v.to_dict() if v else None, "failure": self.failure.to_dict() if self.failure else None,
                "ab_result": dict(self.ab_result) if self.ab_result is not None else None}

    def lines(self) -> list[str]:
        """The console summary: both arms, the effect with its interval, the outcome and why."""
        out = [f"A: {self.a.file} ({_tok_s(self.a)}, {_boots(self.a.boots)})",
               f"B: {self.b.file} ({_tok_s(self.b)}, {_boots(self.b.boots)})"]
        v = self.verdict
        if v is not None and v.effect is not None:
            level = v.statistics.ci_level if v.statistics is not None else 0.9
            interval = (f", {level:.0%} interval {v.ci_low:.3f}–{v.ci_high:.3f}"
                        if v.ci_low is not None and v.ci_high is not None else "")
            out.append(f"B/A throughput: {v.effect:.3f}×{interval}"
                       + (f", p = {v.p_value:.4f}" if v.p_value is not None else ""))
        out.append(f"verdict: {self.outcome.sentence}: {self.reason}")
        out.append(f"{_boots(self.boots)} recorded in {self.run_dir}")
        if self.simulated:
            out.append("SIMULATED: every number comes from elsa-tune's simulated runtime (simulated time), "
                       "not from a GPU")
        return out


def outcome_of(verdict: Verdict, *, min_effect: float) -> tuple[Outcome, str]:
    """The outcome the gate's verdict shows, and why (the interval is B/A throughput at the gate's level)."""
    low, high = verdict.ci_low, verdict.ci_high
    if verdict.decision is Decision.KEEP:
        return Outcome.BETTER, verdict.reason
    if verdict.decision is Decision.REJECT and verdict.failure is not None:
        return Outcome.B_FAILED, verdict.reason
    if verdict.decision is Decision.REJECT and verdict.quality_failed:
        return Outcome.B_FAILED, "B failed the quality gate: its answers differ from A's"
    if verdict.decision is Decision.REJECT and verdict.failed_guardrail:
        return Outcome.WORSE, verdict.reason
    if high is not None and high < 1.0:
        return Outcome.WORSE, f"the interval of B/A throughput lies below 1 ({_range(low, high)}); {verdict.reason}"
    margin = math.log1p(min_effect)
    if (low is not None and high is not None and min_effect > 0
            and math.log(low) > -margin and math.log(high) < margin):
        return Outcome.EQUIVALENT, (f"the interval of B/A throughput ({_range(low, high)}) lies within "
                                    f"±{min_effect:.0%}; {verdict.reason}")
    return Outcome.NO_DIFFERENCE, verdict.reason


def compare_flags(pre: Preflight, a: Candidate, b: Candidate, *, files: tuple[str, str], run_dir: Path,
                  clock: StudyClock | None = None, load: ServerLoad | None = None,
                  interrupts: Interrupts | None = None, looks: tuple[int, ...] = (),
                  min_effect: float | None = None, seed: int = 0) -> FlagComparison:
    """Boot A and B on ``pre``'s runtime into ``run_dir`` and compare them through the gate.

    Raises ``StudyError`` when A itself cannot be measured (it fails, or its boots cannot be dimensioned),
    ``StopStudy`` when ``interrupts`` asked to stop between boots. A budget (``settings.budget_s``) spent before
    the gate decided is *no difference shown*.
    """
    settings = pre.settings
    counts = WALL_CLOCK if clock is None else SIMULATED_CLOCK
    clock = clock or StudyClock()
    store = StudyStore(run_dir, name=settings.study_name, heartbeat_interval=None)
    night = Night(pre, store=store, budget=Budget(settings.budget_s, clock=clock.now, counts=counts), clock=clock,
                  view=StudyView(live=False), interrupts=interrupts or Interrupts(), on_decision=lambda: None,
                  load=load)
    night.apply(PhaseResult(incumbent=Incumbent({}, [], a, None)))
    night.view.update(study=settings.study_name, phase="compare", time_left_s=night.budget.left_s)
    run = _Comparison(night, a, b, files, looks=looks, min_effect=min_effect, seed=seed)
    try:
        return run.run()
    except StopStudy as stop:
        if stop.interrupted:
            raise
        result = FlagComparison(outcome=Outcome.NO_DIFFERENCE,
                                reason=f"the budget of {settings.budget_s / 60:.0f} minutes was spent after "
                                       f"{night.booter.boots} boots, before the gate decided (pass a longer --budget)",
                                a=Side(files[0], a, run.boots_a, night.incumbent.throughput),
                                b=Side(files[1], b, night.booter.boots - run.boots_a, None), verdict=None,
                                failure=None, boots=night.booter.boots, run_dir=str(store.run_dir),
                                simulated=settings.simulated, min_effect=run.min_effect, context=_context(pre))
        _record(night, result, a, b, probe_boot=run.probe_boot)
        return result


class _Comparison:
    """The three steps of one comparison on ``night`` (module docstring); ``run`` returns the result."""

    def __init__(self, night: Night, a: Candidate, b: Candidate, files: tuple[str, str], *,
                 looks: tuple[int, ...], min_effect: float | None, seed: int) -> None:
        self.night, self.a, self.b, self.files = night, a, b, files
        self.looks, self.seed = looks, seed
        self.requested_effect = min_effect
        self.min_effect = min_effect if min_effect is not None else GatePolicy.min_effect
        self.boots_a = 0
        self.probe_boot = ""

    def run(self) -> FlagComparison:
        night, a, b, files = self.night, self.a, self.b, self.files
        pre, store = night.pre, night.store
        settings = pre.settings
        baseline = self._measure_a()
        samples = baseline.samples
        probe = night.boot(BootPlan(tag="compare:B:probe", candidate=b, phase=Phase.COMPARE, arm=Arm.CANDIDATE,
                                    probes=True, technique="B"))
        self.probe_boot = probe.record.boot_id
        failure = probe.sample.failed
        immediate = Screening(night).immediate_reject(probe) if failure is None else None
        if immediate is not None and immediate.slow_boot_z is not None:
            immediate = None          # one slow boot is no verdict: the A/B measures it
        if failure is not None or immediate is not None:
            reason = (f"{failure.kind.value}: {failure.summary}" + (f" ({failure.remedy})" if failure.remedy else "")
                      if failure is not None else immediate.reason if immediate is not None else "")
            result = FlagComparison(outcome=Outcome.B_FAILED, reason=reason,
                                    a=Side(files[0], a, len(samples), night.incumbent.throughput),
                                    b=Side(files[1], b, 1, probe.record.throughput_tok_s), verdict=immediate,
                                    failure=failure, boots=night.booter.boots, run_dir=str(store.run_dir),
                                    simulated=settings.simulated, min_effect=self.min_effect, context=_context(pre))
            _record(night, result, a, b, probe_boot=probe.record.boot_id)
            return result
        ab, ids = night.ab(b, tag="compare", phase=Phase.COMPARE, technique="B", incumbent=a, seed=self.seed,
                           futility=FUTILITY)
        outcome, reason = outcome_of(ab.verdict, min_effect=self.min_effect)
        result = FlagComparison(outcome=outcome, reason=reason,
                                a=Side(files[0], a, len(samples) + len(ids[Arm.INCUMBENT]),
                                       arm_mean(ab, Arm.INCUMBENT)),
                                b=Side(files[1], b, 1 + len(ids[Arm.CANDIDATE]), arm_mean(ab, Arm.CANDIDATE)),
                                verdict=ab.verdict, failure=ab.verdict.failure, boots=night.booter.boots,
                                run_dir=str(store.run_dir), simulated=settings.simulated, min_effect=self.min_effect,
                                context=_context(pre), ab_result=ab.to_dict())
        _record(night, result, a, b, probe_boot=probe.record.boot_id, ids=ids)
        return result

    def _measure_a(self) -> Baseline:
        """A's boots (the first probed: the quality reference), the noise they show, and the gate's policy."""
        night, pre = self.night, self.night.pre
        settings = pre.settings
        before = night.booter.boots
        try:
            baseline = measure_baseline(night.boot, BaselineRequest(
                candidate=self.a, boots=settings.baseline_boots, tag="compare:A", phase=Phase.COMPARE,
                what=f"A ({self.files[0]})", where="on this setup", runner="the comparison",
                remedy="fix the flags of A", technique="A",
                noise_context={"runtime": pre.fingerprint.describe()}), run_dir=night.store.run_dir)
        finally:
            self.boots_a = night.booter.boots - before
        policy = baseline.policy(pre.space, settings, looks=self.looks or settings.looks or COMPARISON_LOOKS,
                                 context_target=pre.context_target)
        if self.requested_effect is not None:
            policy = replace(policy, min_effect=self.requested_effect)
        night.apply(PhaseResult(noise=baseline.noise, policy=policy,
                                incumbent=replace(night.incumbent, throughput=baseline.throughput_all_boots)))
        self.min_effect = policy.min_effect
        return baseline


def _record(night: Night, result: FlagComparison, a: Candidate, b: Candidate, *, probe_boot: str,
            ids: Mapping[Arm, list[str]] | None = None) -> None:
    """The comparison as a decision record (``decisions/``; never the ledger: a comparison is no technique)."""
    decision = DecisionRecord(study=night.name, number=1, phase=Phase.COMPARE, technique="B vs A",
                              flags_delta={k: v for k, v in b.flags.items() if a.flags.get(k) != v}
                              | {k: None for k in a.flags if k not in b.flags},
                              incumbent_key=a.key(), candidate_key=b.key(), verdict=result.verdict,
                              failure=result.failure if result.verdict is None else None,
                              boots_incumbent=tuple(ids[Arm.INCUMBENT]) if ids else (),
                              boots_candidate=tuple(i for i in (probe_boot, *(ids[Arm.CANDIDATE] if ids else ())) if i),
                              result=f"{result.outcome.sentence}: {result.reason}",
                              ab_result=result.ab_result)
    night.store.record_decision(decision)


def _context(pre: Preflight) -> dict[str, str]:
    return {"runtime": pre.runtime_name, "fingerprint": pre.fingerprint.key(), "setup": pre.fingerprint.describe()}


def _tok_s(side: Side) -> str:
    return f"{side.throughput_tok_s:,.1f} tok/s" if side.throughput_tok_s else "not measured"


def _range(low: float | None, high: float | None) -> str:
    return f"{low:.3f}–{high:.3f}" if low is not None and high is not None else "unknown"



def _boots(n: int) -> str:
    return f"{n} boot" + ("" if n == 1 else "s")
