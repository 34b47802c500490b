"""False-keep control across the many techniques one night tests.

Each technique's gate holds its own false-keep rate at α, so a night of 20 no-op techniques still
expects one false keep. Two ways to control that:

- **Batch** (``adjust_night``), once the night's verdicts are in: Benjamini–Hochberg (``"bh"``,
  default q = 0.10) bounds the expected share of false keeps among kept techniques (the FDR, which
  is our false-keep rate); Holm (``"holm"``, α = 0.05) bounds the chance of any false keep (FWER).
  BH is valid under independence and under positive regression dependence (PRDS), which holds for
  one-sided tests against a shared control (Benjamini–Yekutieli 2001); our tests re-boot the
  incumbent for every comparison, so their p-values are close to independent. Holm is valid under
  any dependence.
- **Online** (``OnlineFalseKeepControl``), as techniques arrive one by one and a keep must be acted
  on at once (kept techniques stack into the incumbent): **LOND** (Javanmard & Montanari 2018), test
  i at level α_i = q · γ_i · (keeps so far + 1), controls the FDR under independence and PRDS
  (Zrnic, Ramdas & Jordan 2021). Each earlier keep earns budget back, so a good night is not starved.
  ``"spending"`` (α_i = α · γ_i, a Bonferroni budget spread over the night) controls the FWER under
  any dependence and is the strict option. γ is horizon-aware: 90% of the budget is spread evenly
  over the ``expected_tests`` the study announced, the rest decays as 6/(π² j²) over any extras, so
  Σγ ≤ 1 whatever happens.

**A retest combines with its first test.** A technique whose first A/B was left inconclusive with its interval
above no change is tested once more on fresh boots; that second stage is not a fresh start. Its design-adjusted p
is combined with the first's by the inverse normal rule with equal, pre-specified weights
(p = 1 − Φ((Φ⁻¹(1 − p₁) + Φ⁻¹(1 − p₂))/√2), Lehmacher & Wassmer 1999): under no effect p₂ is super-uniform whatever
stage 1 showed (fresh boots), so the combined p is a valid p-value although running the retest depended on stage 1.
``second_stage_level`` turns the test's level into the level the second stage's boundaries are calibrated at.

A KEEP that fails the adjusted level becomes INCONCLUSIVE with the reason (the incumbent stays);
other verdicts keep their decision. A test without a p-value (a crash) counts with p = 1. The
p-values used are the gates' design-adjusted ones (``Verdict.p_value``), never a nominal look p.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from scipy import stats

from elsa_tune.history.verdict import Decision, NightControl, Stages, Verdict
from elsa_tune.search_spaces.space import ReasonCategory

BATCH_METHODS = ("bh", "holm", "none")
ONLINE_METHODS = ("lond", "spending")
DEFAULT_LEVEL = {"bh": 0.10, "holm": 0.05, "none": 0.05, "lond": 0.10, "spending": 0.05}


def holm(pvalues: Sequence[float], alpha: float = 0.05) -> tuple[list[bool], list[float]]:
    """Holm step-down: (rejected, adjusted p) in the input order. Reject while p_(i) ≤ α/(m−i+1)."""
    p = _checked(pvalues)
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return [a <= alpha for a in adjusted], adjusted


def benjamini_hochberg(pvalues: Sequence[float], q: float = 0.10) -> tuple[list[bool], list[float]]:
    """Benjamini–Hochberg step-up: (rejected, adjusted p) in the input order. k* = max{k: p_(k) ≤ kq/m}."""
    p = _checked(pvalues)
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adjusted = [0.0] * m
    running = 1.0
    for rank in range(m - 1, -1, -1):
        i = order[rank]
        running = min(running, p[i] * m / (rank + 1))
        adjusted[i] = running
    return [a <= q for a in adjusted], adjusted


def adjust_night(verdicts: Sequence[Verdict], *, method: str = "bh", level: float | None = None) -> list[Verdict]:
    """The night's verdicts with ``adjusted_p_value`` set; a KEEP that fails it becomes INCONCLUSIVE."""
    if method not in BATCH_METHODS:
        raise ValueError(f"method must be one of {BATCH_METHODS}, got {method!r}")
    level = DEFAULT_LEVEL[method] if level is None else level
    if not verdicts:
        return []
    p = [v.p_value if v.p_value is not None and math.isfinite(v.p_value) else 1.0 for v in verdicts]
    if method == "none":
        adjusted = p
    else:
        _, adjusted = (benjamini_hochberg(p, level) if method == "bh" else holm(p, level))
    return [_apply(v, adj, level, f"{method} across {len(verdicts)} techniques") for v, adj in
            zip(verdicts, adjusted, strict=True)]


@dataclass
class OnlineFalseKeepControl:
    """Online control for techniques tested one after another; call ``review`` on each verdict in order.

    Not a record: it holds the running count of tests and keeps. ``history`` lists each test's level.
    """

    method: str = "lond"
    level: float | None = None
    expected_tests: int = 20
    tests: int = 0
    keeps: int = 0
    history: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.method not in ONLINE_METHODS:
            raise ValueError(f"method must be one of {ONLINE_METHODS}, got {self.method!r}")
        if self.expected_tests < 1:
            raise ValueError("expected_tests must be at least 1")
        if self.level is None:
            self.level = DEFAULT_LEVEL[self.method]

    def gamma(self, j: int) -> float:
        """The share of the budget for test j (1-based); Σ_j γ_j ≤ 1."""
        if j <= self.expected_tests:
            return 0.9 / self.expected_tests
        return 0.1 * 6.0 / (math.pi**2 * (j - self.expected_tests) ** 2)

    def next_level(self) -> float:
        level = float(self.level if self.level is not None else DEFAULT_LEVEL[self.method])
        base = level * self.gamma(self.tests + 1)
        return base * (self.keeps + 1) if self.method == "lond" else base

    def review(self, verdict: Verdict) -> Verdict:
        """Spend this test's level on ``verdict``; returns it with ``adjusted_p_value`` and maybe demoted."""
        alpha_j = self.next_level()
        self.tests += 1
        self.history.append(alpha_j)
        return self._judge(verdict, alpha_j, f"test {self.tests}")

    def resume(self, verdict: Verdict, alpha_j: float) -> Verdict:
        """The verdict of a test reviewed before at ``alpha_j`` and continued since (a non-binding futility stop
        taken back): judged at that same level, spending none; a keep counts as a discovery from now on."""
        return self._judge(verdict, alpha_j, "a continued test")

    def _judge(self, verdict: Verdict, alpha_j: float, which: str) -> Verdict:
        p = verdict.p_value if verdict.p_value is not None and math.isfinite(verdict.p_value) else 1.0
        # Report p rescaled to the night's level, so "adjusted p ≤ level" reads the same as in batch mode.
        level = float(self.level if self.level is not None else DEFAULT_LEVEL[self.method])
        adjusted = min(1.0, p * level / alpha_j)
        out = _apply(verdict, adjusted, level, f"{self.method} online, {which} at level {alpha_j:.4g}")
        if out.decision is Decision.KEEP:
            self.keeps += 1
        return out


#: the highest level a retest's own boots are tested at, however strong its first test: the second stage must still
#: show the gain on its own boots, never ride on the first alone
SECOND_STAGE_MAX_LEVEL = 0.25


def combined_p(p_first: float, p_second: float) -> float:
    """The inverse-normal combination of two stages' one-sided p-values, equal weights."""
    z = (_z(p_first) + _z(p_second)) / math.sqrt(2.0)
    return float(stats.norm.sf(z))


def second_stage_level(p_first: float, level: float) -> float:
    """The level at which the second stage's p must lie for the combined p to reach ``level``.

    ``combined_p(p_first, p) ≤ level`` exactly when ``p ≤ second_stage_level(p_first, level)``; the result is capped
    at ``SECOND_STAGE_MAX_LEVEL`` (a cap only makes the combined test stricter).
    """
    z = math.sqrt(2.0) * _z(level) - _z(p_first)
    return float(min(SECOND_STAGE_MAX_LEVEL, stats.norm.sf(z)))


def with_first_stage(verdict: Verdict, p_first: float) -> Verdict:
    """A retest's verdict whose ``p_value`` is the combination with its first test's (both in ``Verdict.stages``)."""
    if verdict.p_value is None or not math.isfinite(verdict.p_value):
        return verdict
    p = combined_p(p_first, verdict.p_value)
    return replace(verdict, p_value=p, stages=Stages(first_p=p_first, second_p=verdict.p_value, combined_p=p))


def _z(p: float) -> float:
    """Φ⁻¹(1 − p), with p held inside (1e-12, 1 − 1e-12) so that a certain stage stays finite."""
    return float(stats.norm.isf(min(max(p, 1e-12), 1.0 - 1e-12)))


def _apply(verdict: Verdict, adjusted: float, level: float, how: str) -> Verdict:
    if verdict.decision is Decision.KEEP and adjusted > level:
        return replace(verdict, decision=Decision.INCONCLUSIVE, adjusted_p_value=adjusted,
                       night_control=NightControl(method=how, level=level, held=True),
                       category=ReasonCategory.NO_GAIN,
                       reason=f"{verdict.reason}; but after false-keep control ({how}) its adjusted p "
                              f"{adjusted:.4f} exceeds {level:.2f}: the incumbent stays")
    return replace(verdict, adjusted_p_value=adjusted, night_control=NightControl(method=how, level=level))


def _checked(pvalues: Sequence[float]) -> list[float]:
    p = [float(x) for x in pvalues]
    if any(not (0.0 <= x <= 1.0) for x in p):   # NaN fails this too
        raise ValueError(f"p-values must lie in [0, 1], got {p}")
    return p
