"""The A/B gate: keep a candidate only when fresh, interleaved boots show it is worth it.

``run_ab`` boots incumbent (A) and candidate (B) in seeded ABBA·BAAB blocks through a ``BootSampler``
and, at each planned look (e.g. after 4, 8 and 12 blocks), calls the pure ``decide`` on the boots so
far. ``decide``:

- **REJECT** at once on a crashed candidate boot, a quality-gate failure, a guardrail that is
  confidently worse than its margin, a memory technique that saves no memory, or futility: the
  one-sided upper bound of the gain is below the minimum worthwhile effect, or (boot-saving rule)
  the estimate is ≤ 0 at the first look or below half the worthwhile effect at the second;
- **KEEP** when the nominal one-sided p crosses the look's simulation-calibrated boundary, the
  estimated gain clears the noise floor, and every guardrail is shown non-inferior; a *memory*
  technique instead needs speed shown non-inferior within a margin and a KV pool that grew;
- **INCONCLUSIVE** otherwise: run the next look. At the cap it stays INCONCLUSIVE and the incumbent
  stays; the verdict states the estimate, its CI and the smallest effect the boots could detect.

**Guardrails over the looks.** A guardrail is a one-sided non-inferiority test (an intersection–union test, no α
split between guardrails). Tested at α at every look, a guardrail truly at its margin would pass at *some* look more
often than α, so its levels are spent over the looks (``guard_spending``). ``"split"`` (the default) gives the looks up
to the cap ``GUARD_CAP_SHARE`` of α at one Pocock level calibrated like the primary's boundaries, and the extension's
look, where a pending guardrail is decided, the rest; the two stages add up to α (Bonferroni), so a guardrail at its
margin passes somewhere with probability at most α. ``"pocock"`` is one level over every look, ``"none"`` α at each.

**Guardrail extension.** A TTFT tail shares the boot's drift with its throughput (``benchmarks/gate/tail_noise.py``
measures how closely), so at the cap a real gain can stand with its TTFT guardrail unresolved: the bound straddles
the margin. No covariate can remove that drift (every per-boot
measure of it is also moved by the candidate), so more boots are the only honest remedy. With
``guard_extension`` > 0, a gain that crossed its boundary at the cap while only a TTFT guardrail is pending
runs that many more blocks. The primary decision stays the one made at the cap (the extension boots do not test
it again, so its α is untouched); the guardrails are tested once more on every boot, at their Pocock level,
which counts this look. A keep also needs the gain over all boots to still clear the noise floor.
"""

from __future__ import annotations

import enum
import logging
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from elsa_tune.errors import BootFailed, ServerDied
from elsa_tune.history.reasons import failure_category
from elsa_tune.history.records import Arm
from elsa_tune.history.verdict import (
    CapLook,
    Decision,
    Futility,
    GateStatistics,
    GuardrailResult,
    OutlierBoot,
    PolicyKind,
    Verdict,
)
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.search_spaces.space import ReasonCategory
from elsa_tune.tuner.ab.boot_sample import BootSample, BootSampler, BootSummary, failure_of, summarize
from elsa_tune.tuner.ab.boundaries import Boundaries, Design, Shape, calibrate
from elsa_tune.tuner.ab.comparison import (
    BIWEIGHT_C,
    Analysis,
    Comparison,
    InsufficientData,
    compare,
    mde_for,
    non_inferiority,
)
from elsa_tune.tuner.ab.dimensioning import NoiseReport
from elsa_tune.tuner.ab.multiplicity import combined_p
from elsa_tune.tuner.ab.schedule import Schedule, abba_baab

log = logging.getLogger(__name__)

#: 2: ``GatePolicy.robust`` (the biweight comparison, on by default) and ``winsor`` off by default;
#: 3: ``GatePolicy.level`` (the efficacy boundaries' level, which the night's false-keep control sets per test) and
#: ``GatePolicy.first_stage_guards`` (a retest's guardrails combined with its first test's)
SCHEMA_VERSION = 3
#: the share of the guardrails' α that the looks up to the cap spend under ``guard_spending="split"``
GUARD_CAP_SHARE = 0.4


class GuardSpending(enum.StrEnum):
    """How the guardrails' α is spent over the looks: ``SPLIT`` gives the looks up to the cap ``GUARD_CAP_SHARE`` of it
    at one Pocock level and the extension's look the rest, ``POCOCK`` one Pocock level at every look, ``NONE`` the
    whole α at every look."""

    SPLIT = "split"
    POCOCK = "pocock"
    NONE = "none"


@dataclass(frozen=True)
class GuardrailPolicy:
    """Non-inferiority margins for the secondary metrics; ``None`` switches a guardrail off."""

    ttft_p50_margin: float | None = 1.10     # candidate/incumbent TTFT median may grow at most 10%
    ttft_p99_margin: float | None = 1.10
    kv_pool_min_ratio: float | None = 0.98   # KV pool tokens are deterministic per config: compared directly
    require_quality: bool = True             # every candidate boot's quality gate must have passed
    alpha: float = 0.05                      # each guardrail at alpha (intersection–union test)


@dataclass(frozen=True)
class GatePolicy:
    """How the gate decides. ``looks`` are blocks (= boots per arm) at each look; the last is the cap.

    ``min_effect`` is the minimum worthwhile gain (futility), ``noise_floor`` the gain a KEEP must at
    least show. ``kind="memory"`` keeps when speed is non-inferior within ``non_inferiority_margin``
    and the KV pool grows by ``memory_min_gain``. σ's are on the log scale and only shape the Monte
    Carlo calibration and the planned MDE; the test itself uses the observed variance. ``robust`` is the biweight
    constant of the robust comparison (``comparison.biweight``, from 4 boots per arm; ``None``: the plain t): a boot
    its host slowed counts less or not at all, and the verdict names it (``Verdict.outlier_boots``). ``winsor``
    (off by default, the rule before) clips each arm to its median ± that many robust σ. The boundaries are
    calibrated on the same statistic. ``level`` (``None``: ``alpha``) is the overall one-sided false-keep level the
    efficacy boundaries are calibrated at: the night's false-keep control gives each screening test its share
    (``Night.ab``), so a keep at the boundary is a keep under that control too and no boot is spent on a crossing
    the control would take back; a retest's second stage may be tested above ``alpha``
    (``multiplicity.second_stage_level``). Intervals, futility and the guardrails stay at ``alpha``.
    ``first_stage_guards`` (a retest): the first test's one-sided p of each TTFT guardrail; that guardrail passes
    when the inverse-normal combination of both tests' p reaches its level at the look (the retest's boots need only
    add what the first test's lacked), while "confidently worse" is still judged on the retest's boots alone.
    """

    kind: PolicyKind = PolicyKind.SPEED
    min_effect: float = 0.03
    noise_floor: float = 0.01
    looks: tuple[int, ...] = (4, 8, 12)
    alpha: float = 0.05
    shape: Shape = Shape.OBF
    futility: Futility = Futility.BOOT_SAVING
    non_inferiority_margin: float = 0.02
    memory_min_gain: float = 0.02
    guardrails: GuardrailPolicy = field(default_factory=GuardrailPolicy)
    measured_passes: int = 2
    warmup_passes: int = 1
    guard_extension: int = 0
    guard_spending: GuardSpending = GuardSpending.SPLIT
    sigma_boot: float = 0.10
    sigma_run: float = 0.03
    analysis: Analysis = Analysis.UNPAIRED
    welch_ratio: float = 2.0
    replicates: int = 20_000
    calibration_seed: int = 20_241_129
    max_error_fraction: float = 0.005
    power: float = 0.8
    winsor: float | None = None
    robust: float | None = BIWEIGHT_C
    level: float | None = None
    first_stage_guards: tuple[tuple[str, float], ...] = ()
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.level is not None and not 0 < self.level < 0.5:
            raise ValueError(f"level must be in (0, 0.5), got {self.level}")
        closed: tuple[tuple[str, type[enum.StrEnum]], ...] = (
            ("kind", PolicyKind), ("futility", Futility), ("guard_spending", GuardSpending), ("shape", Shape),
            ("analysis", Analysis))
        for name, members in closed:   # a value read from settings or JSON becomes its member; any other is refused
            value = getattr(self, name)
            if value not in {m.value for m in members}:
                raise ValueError(f"{name} must be one of {[m.value for m in members]}, got {value!r}")
            object.__setattr__(self, name, members(value))
        if self.min_effect < 0 or self.noise_floor < 0 or not 0 <= self.non_inferiority_margin < 1:
            raise ValueError("effects and margins must be non-negative (margin below 1)")
        if self.measured_passes < 1 or self.warmup_passes < 0:
            raise ValueError("measured_passes must be ≥ 1 and warmup_passes ≥ 0")
        if self.guard_extension < 0:
            raise ValueError(f"guard_extension must be ≥ 0 blocks, got {self.guard_extension}")
        self.design()  # validates looks, alpha, shape, analysis

    def first_look_boots(self) -> int:
        """Boots the gate needs to reach its first look (both arms)."""
        return 2 * self.looks[0]

    def design(self) -> Design:
        return Design(looks=self.looks, alpha=self.efficacy_level, shape=self.shape, analysis=self.analysis,
                      sigma_boot=self.sigma_boot, sigma_run=self.sigma_run, measured_passes=self.measured_passes,
                      welch_ratio=self.welch_ratio, replicates=self.replicates, seed=self.calibration_seed,
                      winsor=self.winsor, robust=self.robust)

    @property
    def efficacy_level(self) -> float:
        """The overall one-sided level of the efficacy boundaries: ``level``, or ``alpha`` when none is set."""
        return self.level if self.level is not None else self.alpha

    def boundaries(self) -> Boundaries:
        return calibrate(self.design())

    @property
    def max_blocks(self) -> int:
        """Blocks per arm at most: the cap, plus the guardrail extension."""
        return self.looks[-1] + self.guard_extension

    @property
    def last_look(self) -> int:
        """The number of the last look: the cap's, or the extension's one after it."""
        return len(self.looks) + (1 if self.guard_extension else 0)

    def guard_levels(self) -> tuple[float, ...]:
        """The one-sided level of the guardrails' non-inferiority tests at each look (the extension's included).

        ``"split"``: with an extension, the cap's looks share ``GUARD_CAP_SHARE`` of ``guardrails.alpha`` at one
        Pocock level and the extension's look has the rest (without one, as ``"pocock"``); ``"pocock"``: the same
        level at every look, calibrated like the primary's boundaries so that a guardrail truly at its margin passes
        at some look with probability ``guardrails.alpha``; ``"none"``: ``alpha`` at every look (repeated looks then
        let a guardrail at its margin pass more often than ``alpha``).
        """
        blocks = tuple(self.blocks_at(j) for j in range(1, self.last_look + 1))
        alpha = self.guardrails.alpha
        if self.guard_spending is GuardSpending.NONE or len(blocks) == 1:
            return tuple(alpha for _ in blocks)
        if self.guard_spending is GuardSpending.SPLIT and self.guard_extension:
            # Bonferroni between the two stages: the cap's looks share GUARD_CAP_SHARE of α at one Pocock level,
            # the extension's look, where a pending guardrail is decided, has the rest.
            cap = self._pocock(blocks[:-1], alpha * GUARD_CAP_SHARE) if len(blocks) > 2 \
                else (alpha * GUARD_CAP_SHARE,)
            return (*cap, alpha * (1.0 - GUARD_CAP_SHARE))
        return self._pocock(blocks, alpha)

    def _pocock(self, blocks: tuple[int, ...], alpha: float) -> tuple[float, ...]:
        """One nominal level for the looks in ``blocks`` holding the chance of passing at any of them to ``alpha``.

        Calibrated on the plain t, the statistic of the guardrails' own test (``comparison.non_inferiority``).
        """
        design = Design(looks=blocks, alpha=alpha, shape=Shape.POCOCK, analysis=self.analysis,
                        sigma_boot=self.sigma_boot, sigma_run=self.sigma_run, measured_passes=self.measured_passes,
                        welch_ratio=self.welch_ratio, replicates=self.replicates, seed=self.calibration_seed,
                        winsor=None, robust=None)
        return calibrate(design).nominal_p

    def blocks_at(self, look: int) -> int:
        """Blocks per arm at look ``look`` (1-based; the look after the cap is the extension's)."""
        return self.looks[look - 1] if look <= len(self.looks) else self.max_blocks

    @property
    def null_delta(self) -> float:
        """The log ratio the primary test must beat: 0 (superiority) or log(1 − margin) (non-inferiority)."""
        return 0.0 if self.kind is PolicyKind.SPEED else math.log1p(-self.non_inferiority_margin)

    @classmethod
    def from_dimensioning(cls, report: NoiseReport, **overrides: Any) -> GatePolicy:
        """A policy set from the baseline's measured noise; ``overrides`` win over the derived values."""
        derived: dict[str, Any] = {
            "sigma_boot": report.sigma_boot, "sigma_run": report.sigma_run,
            "measured_passes": report.measured_passes, "warmup_passes": report.warmup_passes,
            "analysis": report.analysis, "alpha": report.alpha, "power": report.power,
        }
        if report.kv_pool_deterministic is False:
            # A noisy KV pool still needs a margin; loosen it so that drift alone cannot block a keep.
            derived["guardrails"] = replace(overrides.get("guardrails", GuardrailPolicy()), kv_pool_min_ratio=0.95)
        derived.update(overrides)
        # The cap again for a gain whose TTFT guardrail the cap's boots could not resolve (module docstring).
        derived.setdefault("guard_extension", tuple(derived.get("looks", cls.looks))[-1])
        return cls(**derived)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["looks"] = list(self.looks)
        data.update(kind=self.kind.value, shape=self.shape.value, futility=self.futility.value,
                    guard_spending=self.guard_spending.value, analysis=self.analysis.value)
        return data


@dataclass(frozen=True)
class ABResult:
    """One comparison: the verdict, every boot sample in run order, the schedule actually run."""

    verdict: Verdict
    samples: tuple[BootSample, ...]
    schedule: Schedule
    policy: GatePolicy
    boundaries: Mapping[str, Any]
    seed: int
    context: Mapping[str, str] = field(default_factory=dict)   # runtime, model, GPU the numbers are about
    schema_version: int = SCHEMA_VERSION

    @property
    def boots(self) -> int:
        return len(self.samples)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "verdict": self.verdict.to_dict(),
                "samples": [s.to_dict() for s in self.samples], "schedule": self.schedule.to_dict(),
                "policy": self.policy.to_dict(), "boundaries": dict(self.boundaries), "seed": self.seed,
                "context": dict(self.context)}


def run_ab(sampler: BootSampler, policy: GatePolicy, rng_seed: int, *,
           context: Mapping[str, str] | None = None) -> ABResult:
    """Boot both arms in seeded ABBA·BAAB blocks, deciding at each look, until a decision or the cap.

    ``context`` names the runtime, model and GPU the boots ran on; it is stored with the result.
    """
    schedule = abba_baab(policy.max_blocks, rng_seed)
    bounds = policy.boundaries()
    samples: list[BootSample] = []
    verdict: Verdict | None = None
    looks: list[dict[str, Any]] = []
    for slot in schedule:
        sample = _boot(sampler, slot.arm, slot.block, slot.position)
        samples.append(sample)
        failure = failure_of(sample, max_error_fraction=policy.max_error_fraction)
        block_done = slot.position == 1
        look = _look_at(policy, slot.block + 1) if block_done else None
        if failure is not None or look is not None:
            verdict = decide(_arm(samples, Arm.INCUMBENT), _arm(samples, Arm.CANDIDATE), policy,
                             look or _look_for(policy, slot.block), boundaries=bounds)
            log.info("A/B look after %d boots (%s): %s — %s", len(samples), schedule.letters(len(samples)),
                     verdict.decision.value, verdict.reason)
            looks.append({"look": verdict.stopped_at_look, "boots": len(samples), "decision": verdict.decision.value,
                          "reason": verdict.reason, "effect": verdict.effect, "p_value": verdict.p_value})
            if verdict.decision is not Decision.INCONCLUSIVE or verdict.final:
                break
    if verdict is None:  # unreachable: the last slot always completes the last look
        raise RuntimeError("the schedule ended without a look")
    run = schedule.truncated(len(samples))
    verdict = replace(verdict, order=run.letters(), schedule_seed=rng_seed,
                      extra={**verdict.extra, "context": dict(context or {}), "looks": looks})
    return ABResult(verdict=verdict, samples=tuple(samples), schedule=run, policy=policy,
                    boundaries=bounds.to_dict(), seed=rng_seed, context=dict(context or {}))


def decide(samples_a: Sequence[BootSample], samples_b: Sequence[BootSample], policy: GatePolicy, look: int,
           *, boundaries: Boundaries | None = None) -> Verdict:
    """The decision at look ``look`` (1-based, into ``policy.looks``) from the boots so far.

    Pure: the same samples and policy always give the same verdict. ``Verdict.final`` is true when no
    further look can change the outcome (a decision, or the cap).
    """
    if not 1 <= look <= policy.last_look:
        raise ValueError(f"look {look} outside 1..{policy.last_look}")
    bounds = boundaries or policy.boundaries()
    last = look == len(policy.looks)
    ctx = _Context(policy=policy, look=look, last=last, n_a=len(samples_a), n_b=len(samples_b))

    failed_b = [f for f in (failure_of(s, max_error_fraction=policy.max_error_fraction) for s in samples_b) if f]
    if failed_b:
        return ctx.verdict(Decision.REJECT, f"a candidate boot failed: {failed_b[0].kind.value}: "
                                            f"{failed_b[0].summary}", final=True,
                           failure=failed_b[0], category=failure_category(failed_b[0]))
    failed_a = [f for f in (failure_of(s, max_error_fraction=policy.max_error_fraction) for s in samples_a) if f]
    if failed_a:
        return ctx.verdict(Decision.INCONCLUSIVE, f"an incumbent boot failed ({failed_a[0].kind.value}: "
                                                  f"{failed_a[0].summary}); the machine is not stable enough to "
                                                  "compare, the incumbent stays", final=True,
                           failure=failed_a[0], category=ReasonCategory.NO_GAIN)
    if policy.guardrails.require_quality and any(s.quality_passed is False for s in samples_b):
        return ctx.verdict(Decision.REJECT, "the candidate failed the quality gate", final=True,
                           quality_failed=True, category=ReasonCategory.WRONG_ANSWERS)

    if look > len(policy.looks):
        return _extension(samples_a, samples_b, policy, bounds, ctx)
    sa, sb = _summaries(samples_a, policy), _summaries(samples_b, policy)
    ctx.samples = (sa, sb)
    ya, yb, excluded = _usable(sa, sb, paired=policy.analysis is Analysis.PAIRED)
    ctx.excluded_boots, ctx.unsteady_boots = excluded, sum(s.unsteady for s in sa + sb)

    memory = _memory_check(sa, sb, policy) if policy.kind is PolicyKind.MEMORY else None
    if memory is not None and memory.passed is False:
        return ctx.verdict(Decision.REJECT, f"a memory technique must grow the KV pool: {memory.detail}",
                           final=True, guardrails=(memory,), category=ReasonCategory.MEMORY_LOSS)
    try:
        comparison = compare(ya, yb, analysis=policy.analysis, welch_ratio=policy.welch_ratio,
                             null_delta=policy.null_delta, winsor=policy.winsor,
                             robust=policy.robust)
    except InsufficientData as exc:
        return ctx.verdict(Decision.INCONCLUSIVE, f"no valid test yet: {exc}"
                           + ("; the incumbent stays" if last else ""), final=last,
                           mde=_planned_mde(policy, min(len(ya), len(yb)), bounds, look),
                           category=ReasonCategory.NO_GAIN)
    ctx.comparison = comparison
    ctx.outlier_boots = _outlier_boots(comparison, sa, sb, policy)
    guards, worse = _guardrails(sa, sb, policy, policy.guard_levels()[look - 1])
    guards += (memory,) if memory is not None else ()
    ctx.guardrails = guards
    boundary_p = bounds.nominal_p[look - 1]
    mde = comparison.mde(boundary_p, policy.power)
    ctx.nominal_p, ctx.boundary_p = comparison.p_one_sided, boundary_p
    ctx.t_critical = bounds.t_critical(look, comparison.df)
    p_adj = bounds.adjusted_p(look, comparison.p_one_sided)

    if worse:
        return ctx.verdict(Decision.REJECT, f"guardrail {worse[0].name} failed: {worse[0].detail}", final=True,
                           p_value=p_adj, mde=mde, failed_guardrail=worse[0].name,
                           category=_guard_category(worse[0]))

    gain = comparison.ratio - 1.0
    crosses = bounds.crosses(look, comparison.p_one_sided)
    clears_floor = policy.kind is PolicyKind.MEMORY or gain >= policy.noise_floor
    if crosses and clears_floor:
        pending = [g for g in guards if g.passed is not True]
        if not pending:
            what = (f"speed {gain:+.1%} is non-inferior within −{policy.non_inferiority_margin:.0%} and memory grew"
                    if policy.kind is PolicyKind.MEMORY else f"{gain:+.1%} throughput")
            return ctx.verdict(Decision.KEEP, f"{what} (p = {comparison.p_one_sided:.4f} ≤ {boundary_p:.4f} "
                                              f"at look {look})", final=True, p_value=p_adj, mde=None,
                               category=_kept(policy))
        if last and policy.guard_extension and _extendable(pending):
            return ctx.verdict(Decision.INCONCLUSIVE, f"{gain:+.1%} crossed the boundary at the cap but guardrail "
                                                      f"{pending[0].name} is not yet shown non-inferior "
                                                      f"({pending[0].detail}); {policy.guard_extension} more blocks "
                                                      "for the guardrail", final=False, p_value=p_adj, mde=mde,
                               crossed_at_cap=True, pending_guardrail=pending[0].name,
                               category=ReasonCategory.NO_GAIN)
        if last:
            return ctx.verdict(Decision.INCONCLUSIVE, f"the gain passed but guardrail {pending[0].name} was not "
                                                      f"shown non-inferior at the cap ({pending[0].detail}); the "
                                                      "incumbent stays", final=True, p_value=p_adj, mde=mde,
                               pending_guardrail=pending[0].name, category=ReasonCategory.NO_GAIN)
        return ctx.verdict(Decision.INCONCLUSIVE, f"{gain:+.1%} crosses the boundary but guardrail "
                                                  f"{pending[0].name} is not yet shown non-inferior "
                                                  f"({pending[0].detail}); continue to look {look + 1}",
                           final=False, p_value=p_adj, mde=mde, pending_guardrail=pending[0].name,
                           category=ReasonCategory.NO_GAIN)

    futile, rule = _futility(comparison, policy, look)
    if rule is not None:
        plain = comparison if policy.robust is None else compare(
            ya, yb, analysis=policy.analysis, welch_ratio=policy.welch_ratio, null_delta=policy.null_delta,
            winsor=policy.winsor, robust=None)
        return ctx.verdict(Decision.REJECT, futile, final=True, p_value=p_adj, mde=mde,
                           futility=rule, category=_futile_category(comparison, plain, boundary_p))
    if last:
        low, high = comparison.ratio_bounds(policy.alpha)
        return ctx.verdict(Decision.INCONCLUSIVE,
                           f"inconclusive at the cap of {policy.looks[-1]} blocks: {gain:+.1%} "
                           f"(CI {low - 1:+.1%} to {high - 1:+.1%}); effects below "
                           f"{f'{mde:.1%}' if mde is not None else 'any size'} could not be detected; "
                           "the incumbent stays", final=True, p_value=p_adj, mde=mde,
                           category=ReasonCategory.NO_GAIN)
    return ctx.verdict(Decision.INCONCLUSIVE, f"{gain:+.1%} so far (p = {comparison.p_one_sided:.4f}, boundary "
                                              f"{boundary_p:.4f}); continue to look {look + 1}", final=False,
                       p_value=p_adj, mde=mde, category=ReasonCategory.NO_GAIN)


@dataclass
class _Context:
    """Builds verdicts for one look so every outcome carries the same evidence."""

    policy: GatePolicy
    look: int
    last: bool
    n_a: int
    n_b: int
    comparison: Comparison | None = None
    guardrails: tuple[GuardrailResult, ...] = ()
    excluded_boots: int | None = None
    unsteady_boots: int | None = None
    nominal_p: float | None = None
    boundary_p: float | None = None
    t_critical: float | None = None
    outlier_boots: tuple[OutlierBoot, ...] = ()
    at_cap: CapLook = field(default_factory=lambda: CapLook(p=None, boundary_p=None, effect=None))
    samples: tuple[Sequence[BootSummary], Sequence[BootSummary]] = ((), ())

    def verdict(self, decision: Decision, reason: str, *, final: bool, category: ReasonCategory,
                p_value: float | None = None, mde: float | None = None,
                guardrails: tuple[GuardrailResult, ...] | None = None, failure: Failure | None = None,
                quality_failed: bool = False, failed_guardrail: str | None = None,
                pending_guardrail: str | None = None, crossed_at_cap: bool = False,
                futility: Futility | None = None) -> Verdict:
        c = self.comparison
        low, high = c.ratio_bounds(self.policy.alpha) if c is not None else (None, None)
        stats = GateStatistics(
            look_blocks=self.policy.blocks_at(self.look), ci_level=1 - 2 * self.policy.alpha,
            excluded_boots=self.excluded_boots, unsteady_boots=self.unsteady_boots, nominal_p=self.nominal_p,
            boundary_p=self.boundary_p, t_critical=self.t_critical,
            delta_log=c.delta if c is not None else None, se=c.se if c is not None else None,
            df=c.df if c is not None else None, t=c.t if c is not None else None,
            test=c.test if c is not None else None, sd_incumbent=c.sd_a if c is not None else None,
            sd_candidate=c.sd_b if c is not None else None, null_delta=c.null_delta if c is not None else None)
        at_cap = self.at_cap if self.at_cap.p is not None or self.at_cap.effect is not None else None
        return Verdict(decision=decision, reason=reason, effect=c.ratio if c is not None else None,
                       ci_low=low, ci_high=high, p_value=p_value, boots_incumbent=self.n_a,
                       boots_candidate=self.n_b, mde=mde,
                       guardrails=self.guardrails if guardrails is None else guardrails,
                       kind=self.policy.kind, stopped_at_look=self.look, extra={"ci_note": CI_NOTE},
                       category=category, final=final, failure=failure, quality_failed=quality_failed,
                       failed_guardrail=failed_guardrail, pending_guardrail=pending_guardrail,
                       crossed_at_cap=crossed_at_cap, futility=futility, outlier_boots=self.outlier_boots,
                       statistics=stats, at_cap=at_cap, **_memory_facts(self.policy, self.samples))


#: what a gate verdict's interval is not (stored in its ``extra`` beside the interval)
CI_NOTE = "not adjusted for the sequential design; a kept effect is biased upward (winner's curse)"


def _boot(sampler: BootSampler, arm: Arm, block: int, position: int) -> BootSample:
    """One boot; a ``BootFailed``/``ServerDied`` raised by the sampler becomes a failed sample."""
    try:
        return sampler.boot(arm, block, position)
    except (BootFailed, ServerDied) as exc:
        failure = exc.failure or Failure(kind=FailureKind.UNKNOWN_CRASH, summary=exc.message, remedy=exc.remedy,
                                         phase="serve")
        return BootSample(arm=arm, block=block, position=position, failed=failure)


def _summaries(samples: Sequence[BootSample], policy: GatePolicy) -> list[BootSummary]:
    return [summarize(s, measured_passes=policy.measured_passes, warmup_passes=policy.warmup_passes,
                      sigma_run=policy.sigma_run, max_error_fraction=policy.max_error_fraction) for s in samples]


def _arm(samples: Sequence[BootSample], arm: Arm) -> list[BootSample]:
    return [s for s in samples if s.arm is arm]


def _look_for(policy: GatePolicy, block: int) -> int:
    """The look whose span contains ``block`` (0-based): used when a failure ends the run mid-look."""
    for i, blocks in enumerate(policy.looks, start=1):
        if block < blocks:
            return i
    return policy.last_look


def _look_at(policy: GatePolicy, blocks: int) -> int | None:
    """The look that falls after ``blocks`` complete blocks, if any (the extension's after ``max_blocks``)."""
    if blocks in policy.looks:
        return policy.looks.index(blocks) + 1
    if policy.guard_extension and blocks == policy.max_blocks:
        return policy.last_look
    return None


#: the guardrails more boots can resolve: estimated ratios whose bound straddles the margin (not missing data,
#: a missing quality result or a KV pool, which are properties of the configuration)
_STATISTICAL_GUARDS = frozenset({"ttft_p50", "ttft_p99"})


def _extendable(pending: Sequence[GuardrailResult]) -> bool:
    return all(g.name in _STATISTICAL_GUARDS and g.ratio is not None for g in pending)


def _extension(samples_a: Sequence[BootSample], samples_b: Sequence[BootSample], policy: GatePolicy,
               bounds: Boundaries, ctx: _Context) -> Verdict:
    """The look after the guardrail extension: the cap's decision on the cap's boots, the guardrails on all boots.

    Called with the failures and the quality gate already checked on every boot.
    """
    cap = policy.looks[-1]
    at_cap = decide([s for s in samples_a if s.block < cap], [s for s in samples_b if s.block < cap], policy,
                    len(policy.looks), boundaries=bounds)
    if not at_cap.crossed_at_cap:
        return at_cap          # nothing to extend: the cap's verdict stands (``run_ab`` never gets here)
    sa, sb = _summaries(samples_a, policy), _summaries(samples_b, policy)
    ctx.samples = (sa, sb)
    ya, yb, excluded = _usable(sa, sb, paired=policy.analysis is Analysis.PAIRED)
    ctx.excluded_boots, ctx.unsteady_boots = excluded, sum(s.unsteady for s in sa + sb)
    cap_stats = at_cap.statistics
    ctx.at_cap = CapLook(p=cap_stats.nominal_p if cap_stats else None,
                         boundary_p=cap_stats.boundary_p if cap_stats else None, effect=at_cap.effect)
    memory = _memory_check(sa, sb, policy) if policy.kind is PolicyKind.MEMORY else None
    try:
        comparison = compare(ya, yb, analysis=policy.analysis, welch_ratio=policy.welch_ratio,
                             null_delta=policy.null_delta, winsor=policy.winsor,
                             robust=policy.robust)
    except InsufficientData as exc:
        return ctx.verdict(Decision.INCONCLUSIVE, f"no valid test after the guardrail extension: {exc}; the "
                                                  "incumbent stays", final=True, p_value=at_cap.p_value,
                           category=ReasonCategory.NO_GAIN)
    ctx.comparison = comparison
    ctx.outlier_boots = _outlier_boots(comparison, sa, sb, policy)
    guards, worse = _guardrails(sa, sb, policy, policy.guard_levels()[-1])
    ctx.guardrails = guards + ((memory,) if memory is not None else ())
    gain = comparison.ratio - 1.0
    more = policy.guard_extension
    if worse:
        return ctx.verdict(Decision.REJECT, f"guardrail {worse[0].name} failed after {more} more blocks: "
                                            f"{worse[0].detail}", final=True, p_value=at_cap.p_value,
                           failed_guardrail=worse[0].name, category=_guard_category(worse[0]))
    holds = gain >= policy.noise_floor if policy.kind is PolicyKind.SPEED else gain >= -policy.non_inferiority_margin
    pending = [g for g in ctx.guardrails if g.passed is not True]
    cap_p = ctx.at_cap.p if ctx.at_cap.p is not None else float("nan")
    cap_boundary = ctx.at_cap.boundary_p if ctx.at_cap.boundary_p is not None else 0.0
    crossed = f"p = {cap_p:.4f} ≤ {cap_boundary:.4f} at the cap"
    if holds and not pending:
        what = (f"speed {gain:+.1%} is non-inferior within −{policy.non_inferiority_margin:.0%} and memory grew"
                if policy.kind is PolicyKind.MEMORY else f"{gain:+.1%} throughput")
        shown = "; ".join(f"{g.name} {g.detail}" for g in guards if g.name in _STATISTICAL_GUARDS)
        return ctx.verdict(Decision.KEEP, f"{what} ({crossed}; guardrails shown non-inferior after {more} more "
                                          f"blocks: {shown})", final=True, p_value=at_cap.p_value, mde=None,
                           category=_kept(policy))
    why = (f"guardrail {pending[0].name} was still not shown non-inferior ({pending[0].detail})" if pending
           else f"the gain over all boots fell to {gain:+.1%}")
    return ctx.verdict(Decision.INCONCLUSIVE, f"the gain crossed at the cap ({crossed}) but after {more} more blocks "
                                              f"{why}; the incumbent stays", final=True, p_value=at_cap.p_value,
                       mde=comparison.mde(policy.alpha, policy.power),
                       pending_guardrail=pending[0].name if pending else None,
                       category=ReasonCategory.NO_GAIN)


def _used(sa: Sequence[BootSummary], sb: Sequence[BootSummary], *, paired: bool
          ) -> tuple[list[BootSummary], list[BootSummary]]:
    """The boots that can enter the test, in order; for a paired analysis a block enters only whole."""
    if paired:
        by_block_a = {s.block: s for s in sa if not s.unusable}
        by_block_b = {s.block: s for s in sb if not s.unusable}
        blocks = sorted(set(by_block_a) & set(by_block_b))
        return [by_block_a[b] for b in blocks], [by_block_b[b] for b in blocks]
    return [s for s in sa if not s.unusable], [s for s in sb if not s.unusable]


def _usable(sa: Sequence[BootSummary], sb: Sequence[BootSummary], *, paired: bool) -> tuple[list[float],
                                                                                            list[float], int]:
    """Boot values that can enter the test, and how many boots could not."""
    used_a, used_b = _used(sa, sb, paired=paired)
    return ([s.log_throughput for s in used_a], [s.log_throughput for s in used_b],
            len(sa) + len(sb) - len(used_a) - len(used_b))


def _outlier_boots(c: Comparison, sa: Sequence[BootSummary], sb: Sequence[BootSummary], policy: GatePolicy
                   ) -> tuple[OutlierBoot, ...]:
    """The boots the comparison down-weighted, by arm and block, with their distance from their arm's median."""
    paired = policy.analysis is Analysis.PAIRED
    used_a, used_b = _used(sa, sb, paired=paired)
    if paired:
        diffs = [b.log_throughput - a.log_throughput for a, b in zip(used_a, used_b, strict=True)]
        mid = statistics.median(diffs)
        return tuple(OutlierBoot(arm="pair", block=used_b[i].block, weight=c.weights_b[i],
                                 off_median=math.expm1(diffs[i] - mid)) for i in c.outliers_b)
    out: list[OutlierBoot] = []
    for arm, used, weights, positions in (("incumbent", used_a, c.weights_a, c.outliers_a),
                                          ("candidate", used_b, c.weights_b, c.outliers_b)):
        mid = statistics.median(s.log_throughput for s in used)
        out += [OutlierBoot(arm=arm, block=used[i].block, weight=weights[i],
                            off_median=math.expm1(used[i].log_throughput - mid)) for i in positions]
    return tuple(sorted(out, key=lambda o: (o.block, o.arm)))


def _guardrails(sa: Sequence[BootSummary], sb: Sequence[BootSummary], policy: GatePolicy, level: float
                ) -> tuple[tuple[GuardrailResult, ...], list[GuardrailResult]]:
    """Every guardrail's result at one-sided ``level``, and those confidently worse than their margin (a REJECT)."""
    g = policy.guardrails
    out: list[GuardrailResult] = []
    worse: list[GuardrailResult] = []
    for name, margin, attr in (("ttft_p50", g.ttft_p50_margin, "log_ttft_p50"),
                               ("ttft_p99", g.ttft_p99_margin, "log_ttft_p99")):
        if margin is None:
            continue
        a = [getattr(s, attr) for s in sa if not s.unusable]
        b = [getattr(s, attr) for s in sb if not s.unusable]
        if any(v is None for v in a + b):
            out.append(GuardrailResult(name=name, passed=None, ratio=None, ci_low=None, ci_high=None, margin=margin,
                                       detail="TTFT missing from some boots"))
            continue
        try:
            ni = non_inferiority(a, b, margin=margin, alpha=level, welch_ratio=policy.welch_ratio)
        except InsufficientData as exc:
            out.append(GuardrailResult(name=name, passed=None, ratio=None, ci_low=None, ci_high=None, margin=margin,
                                       detail=str(exc)))
            continue
        detail = (f"ratio {ni.ratio:.3f}, upper bound {ni.ci_high:.3f} vs margin {margin:.2f}"
                  + ("; confidently worse than the margin" if ni.confidently_worse else ""))
        passed = ni.passed
        first = dict(policy.first_stage_guards).get(name)
        if first is not None and not ni.confidently_worse:
            together = combined_p(first, ni.p_value)
            passed = together <= level
            detail += (f"; with the first test (p {first:.3g}) combined p {together:.3g} "
                       f"{'≤' if passed else '>'} {level:.3g}")
        if attr == "log_ttft_p99":
            detail += _tail_note([s for s in (*sa, *sb) if not s.unusable])
        out.append(GuardrailResult(name=name, passed=passed, ratio=ni.ratio, ci_low=ni.ci_low,
                                   ci_high=ni.ci_high, margin=margin, detail=detail, p_value=ni.p_value))
        if ni.confidently_worse:
            worse.append(out[-1])
    if g.kv_pool_min_ratio is not None and policy.kind is PolicyKind.SPEED:
        out.append(_kv_ratio(sa, sb, g.kv_pool_min_ratio, name="kv_pool_tokens", need_gain=False))
        if out[-1].passed is False:   # KV pool size is deterministic per config: below the margin is final
            worse.append(out[-1])
    if g.require_quality:
        missing = sum(s.quality_passed is None for s in sb)
        out.append(GuardrailResult(name="quality", passed=True if missing == 0 else None, ratio=None, ci_low=None,
                                   ci_high=None, margin=1.0,
                                   detail="every candidate boot passed the quality gate" if missing == 0
                                   else f"{missing} candidate boot(s) have no quality result"))
    return tuple(out), worse


def _tail_note(summaries: Sequence[BootSummary]) -> str:
    """Say when the TTFT tail was judged below p99 because the boots had too few requests to estimate it."""
    low = [s for s in summaries if s.tail_quantile < 0.99]
    if not low:
        return ""
    counts = sorted(s.tail_requests for s in low if s.tail_requests is not None)
    few = f"{counts[0]}–{counts[-1]}" if counts and counts[0] != counts[-1] else (str(counts[0]) if counts else "few")
    return (f"; judged at p{round(100 * min(s.tail_quantile for s in low))}: {few} requests per boot cannot "
            "estimate a p99")


def _kept(policy: GatePolicy) -> ReasonCategory:
    """A keep is filed "kept", a memory technique's "kept for memory" (kept for the pool it buys)."""
    return ReasonCategory.KEPT_FOR_MEMORY if policy.kind is PolicyKind.MEMORY else ReasonCategory.KEPT


def _memory_facts(policy: GatePolicy, samples: tuple[Sequence[BootSummary], Sequence[BootSummary]]
                  ) -> dict[str, Any]:
    """What a memory technique's verdict records of what it buys: both arms' median KV capacity and the margin."""
    if policy.kind != "memory":
        return {}
    pools = [[s.kv_pool_tokens for s in arm if s.kv_pool_tokens] for arm in samples]
    a, b = (int(statistics.median(p)) if p else None for p in pools)
    return {"kv_pool_incumbent": a, "kv_pool_candidate": b, "speed_margin": policy.non_inferiority_margin}


def _memory_check(sa: Sequence[BootSummary], sb: Sequence[BootSummary], policy: GatePolicy) -> GuardrailResult:
    return _kv_ratio(sa, sb, 1.0 + policy.memory_min_gain, name="memory_gain", need_gain=True)


def _kv_ratio(sa: Sequence[BootSummary], sb: Sequence[BootSummary], threshold: float, *, name: str,
              need_gain: bool) -> GuardrailResult:
    """KV pool tokens compared directly (they are near-deterministic per config): median B / median A."""
    a = [s.kv_pool_tokens for s in sa if s.kv_pool_tokens]
    b = [s.kv_pool_tokens for s in sb if s.kv_pool_tokens]
    if not a or not b or len(a) < len(sa) or len(b) < len(sb):
        return GuardrailResult(name=name, passed=None, ratio=None, ci_low=None, ci_high=None, margin=threshold,
                               detail="KV pool tokens missing from some boots")
    ratio = statistics.median(b) / statistics.median(a)
    low, high = min(b) / max(a), max(b) / min(a)
    passed = ratio >= threshold
    what = "needs at least" if need_gain else "may not fall below"
    detail = f"KV pool ratio {ratio:.3f} ({what} {threshold:.2f})"
    return GuardrailResult(name=name, passed=passed, ratio=ratio, ci_low=low, ci_high=high, margin=threshold,
                           detail=detail)


def _guard_category(guard: GuardrailResult) -> ReasonCategory:
    """A guardrail confidently worse than its margin: a latency one is "slower", a KV pool one "memory loss"."""
    return ReasonCategory.MEMORY_LOSS if guard.name in ("kv_pool_tokens", "memory_gain") else ReasonCategory.SLOWER


def _futile_category(c: Comparison, plain: Comparison, level: float) -> ReasonCategory:
    """A futility stop is "slower" only under the same control as a keep, else "no gain".

    "Slower" needs the upper bound at ``level`` (the efficacy boundary's nominal one-sided level at this look, the
    level a keep must reach there) below no change (below the margin for a non-inferiority test), in the robust
    comparison and in the plain one (``plain``, every boot at full weight) alike: the outlier rule down-weights slow
    boots on either arm, and a slow incumbent boot left out makes a candidate look slower than its boots show.
    """
    ceiling = min(0.0, c.null_delta)
    slower = all(comparison.bounds(level)[1] < ceiling for comparison in (c, plain))
    return ReasonCategory.SLOWER if slower else ReasonCategory.NO_GAIN


def _futility(c: Comparison, policy: GatePolicy, look: int) -> tuple[str, Futility | None]:
    """The futility reason at this look and the rule that gave it (``Futility.CI`` or
    ``Futility.BOOT_SAVING``), or ``("", None)`` to go on.

    Futility stops are non-binding for alpha: the efficacy boundaries ignore them, so a test a ``"boot_saving"``
    stop ended early can be continued later to its cap (``Screening.resume``) at the level it was calibrated at.
    """
    if policy.futility is Futility.NONE:
        return "", None
    if policy.kind is PolicyKind.MEMORY:
        # A memory technique buys pool, shown at its screening boot; its speed is a non-inferiority question, never
        # stopped early for want of a gain: only an interval wholly below the margin ends it.
        _, high = c.bounds(policy.alpha)
        if high < c.null_delta:
            return (f"slower than the non-inferiority margin −{policy.non_inferiority_margin:.0%}: the upper bound "
                    f"{math.expm1(high):+.1%} (estimate {c.ratio - 1:+.1%})", Futility.CI)
        return "", None
    target = math.log1p(policy.min_effect)
    what = f"the minimum worthwhile {policy.min_effect:+.0%}" if policy.kind is PolicyKind.SPEED else "no slowdown"
    _, high = c.bounds(policy.alpha)
    if high < target:
        return (f"futile: the gain's upper bound {math.expm1(high):+.1%} is below {what} "
                f"(estimate {c.ratio - 1:+.1%})", Futility.CI)
    looks = len(policy.looks)
    if policy.futility is Futility.BOOT_SAVING and look < looks:
        threshold = c.null_delta + (target - c.null_delta) * (look - 1) / max(looks - 1, 1)
        if c.delta <= threshold:
            return (f"futile at look {look}: estimate {c.ratio - 1:+.1%} is not above {math.expm1(threshold):+.1%}, "
                    "too little to reach a keep with the remaining boots", Futility.BOOT_SAVING)
    return "", None


def _planned_mde(policy: GatePolicy, n: int, bounds: Boundaries, look: int) -> float | None:
    try:
        return float(mde_for(max(n, 2), sigma_boot=policy.sigma_boot, sigma_run=policy.sigma_run,
                             measured_passes=policy.measured_passes, alpha=bounds.nominal_p[look - 1],
                             power=policy.power))
    except InsufficientData:
        return None
