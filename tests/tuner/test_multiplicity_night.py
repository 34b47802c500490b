"""False-keep control across a night: BH and Holm on textbook examples, online LOND and spending."""

from __future__ import annotations

import numpy as np
import pytest

from elsa_tune.history.verdict import Decision, Verdict
from elsa_tune.tuner.ab.multiplicity import OnlineFalseKeepControl, adjust_night, benjamini_hochberg, holm

# statistics.md §4: ten candidates
SPEC = [0.0004, 0.006, 0.024, 0.043, 0.052, 0.18, 0.29, 0.44, 0.61, 0.83]
# Benjamini & Hochberg (1995), §4: fifteen p-values, 4 rejections at q = 0.05
BH1995 = [0.0001, 0.0004, 0.0019, 0.0095, 0.0201, 0.0278, 0.0298, 0.0344, 0.0459, 0.3240, 0.4262, 0.5719,
          0.6528, 0.7590, 1.000]


def test_spec_example_bh_keeps_three_holm_keeps_one() -> None:
    assert sum(benjamini_hochberg(SPEC, 0.10)[0]) == 3
    assert sum(holm(SPEC, 0.05)[0]) == 1
    assert sum(p <= 0.05 for p in SPEC) == 4


def test_bh_1995_example() -> None:
    rejected, adjusted = benjamini_hochberg(BH1995, 0.05)
    assert rejected == [True] * 4 + [False] * 11
    assert adjusted[3] == pytest.approx(0.0095 * 15 / 4)
    assert sum(holm(BH1995, 0.05)[0]) == 3


def test_adjusted_p_values_match_the_textbook_formulas_in_any_order() -> None:
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 0.2, 12).tolist()
    perm = rng.permutation(12).tolist()
    bh = benjamini_hochberg(p)[1]
    bh_perm = benjamini_hochberg([p[i] for i in perm])[1]
    assert bh_perm == pytest.approx([bh[i] for i in perm])
    order = np.argsort(p)
    m = len(p)
    expected_holm = np.minimum(1, np.maximum.accumulate((m - np.arange(m)) * np.asarray(p)[order]))
    got = np.asarray(holm(p)[1])[order]
    assert got == pytest.approx(expected_holm)
    expected_bh = np.minimum.accumulate((np.asarray(p)[order] * m / np.arange(1, m + 1))[::-1])[::-1]
    assert np.asarray(bh)[order] == pytest.approx(np.minimum(expected_bh, 1))
    with pytest.raises(ValueError):
        holm([0.1, float("nan")])


def verdict(p: float | None, decision: Decision = Decision.KEEP) -> Verdict:
    return Verdict(decision=decision, reason="gate", effect=1.05, ci_low=1.0, ci_high=1.1, p_value=p,
                   boots_incumbent=8, boots_candidate=8)


def test_adjust_night_demotes_keeps_that_fail_and_leaves_others() -> None:
    night = [verdict(p) if p <= 0.05 else verdict(p, Decision.REJECT) for p in SPEC]
    night.append(verdict(None, Decision.REJECT))        # a crash counts with p = 1
    out = adjust_night(night, method="holm")
    assert [v.decision for v in out].count(Decision.KEEP) == 1
    demoted = [v for v in out if v.decision is Decision.INCONCLUSIVE]
    assert len(demoted) == 3 and all("incumbent stays" in v.reason for v in demoted)
    assert all(v.adjusted_p_value is not None for v in out)
    assert [v.decision for v in adjust_night(night, method="bh")].count(Decision.KEEP) == 3
    assert adjust_night([], method="bh") == []


def test_online_lond_earns_budget_back_with_each_keep() -> None:
    control = OnlineFalseKeepControl(method="lond", level=0.10, expected_tests=10)
    first = control.next_level()
    assert first == pytest.approx(0.10 * 0.9 / 10)
    out = control.review(verdict(0.001))
    assert out.decision is Decision.KEEP
    assert control.next_level() == pytest.approx(2 * first)
    weak = control.review(verdict(0.03))
    assert weak.decision is Decision.INCONCLUSIVE and weak.adjusted_p_value is not None and weak.adjusted_p_value > 0.1


def test_online_spending_never_exceeds_its_budget() -> None:
    control = OnlineFalseKeepControl(method="spending", level=0.05, expected_tests=5)
    for _ in range(200):
        control.review(verdict(0.5, Decision.REJECT))
    assert sum(control.history) <= 0.05 + 1e-12
    assert sum(control.gamma(j) for j in range(1, 100_000)) <= 1.0


def test_online_control_keeps_no_op_nights_clean() -> None:
    rng = np.random.default_rng(1)
    false_keeps = 0
    for _ in range(500):
        control = OnlineFalseKeepControl(method="lond", level=0.10, expected_tests=20)
        for p in rng.uniform(0, 1, 20):
            false_keeps += control.review(verdict(float(p))).decision is Decision.KEEP
    assert false_keeps / 500 <= 0.12       # FDR = P(any keep) on an all-null night; bound 0.10


def test_the_inverse_normal_combination_and_its_second_stage_level_agree() -> None:
    from elsa_tune.tuner.ab.multiplicity import SECOND_STAGE_MAX_LEVEL, combined_p, second_stage_level

    assert combined_p(0.5, 0.5) == pytest.approx(0.5)
    assert combined_p(0.025, 0.025) == pytest.approx(0.0028, abs=2e-4)
    for p_first in (0.01, 0.03, 0.08, 0.2, 0.6):
        level = second_stage_level(p_first, 0.02)
        if level < SECOND_STAGE_MAX_LEVEL:
            assert combined_p(p_first, level) == pytest.approx(0.02, rel=1e-6)
        assert combined_p(p_first, level * 0.999) <= 0.02
    # a strong first test lowers what the fresh boots must show, never below showing something on their own
    assert second_stage_level(1e-9, 0.02) == SECOND_STAGE_MAX_LEVEL
    assert second_stage_level(0.01, 0.02) > 0.02 > second_stage_level(0.5, 0.02)


def test_a_retest_run_only_after_a_promising_first_test_keeps_a_no_op_at_most_its_level() -> None:
    """Under no effect the first stage's p is uniform and the retest runs only when it was small; the fresh boots'
    p is uniform whatever happened. Keeping when the second p is below ``second_stage_level`` is still at most α."""
    from elsa_tune.tuner.ab.multiplicity import second_stage_level

    rng = np.random.default_rng(3)
    p1, p2 = rng.uniform(size=200_000), rng.uniform(size=200_000)
    level = 0.02
    first_keeps = p1 <= level
    retested = (~first_keeps) & (p1 <= 0.10)            # promising: inconclusive, its interval above no change
    second = np.array([p <= second_stage_level(q, level) for p, q in zip(p2[retested], p1[retested], strict=True)])
    assert (first_keeps.sum() + second.sum()) / p1.size <= 2 * level + 0.002   # two tests, each at most α
    assert second.sum() / p1.size <= level


def test_a_continued_test_is_judged_at_its_own_level_and_spends_none() -> None:
    """A test reviewed once (a futility stop, since taken back) and continued: judged at the level it was run at,
    not a new one; no test is added to the night's count, and a keep earns the next tests their share back."""
    control = OnlineFalseKeepControl(method="lond", level=0.10, expected_tests=10)
    first = control.next_level()
    control.review(verdict(0.7, Decision.REJECT))
    tests, keeps = control.tests, control.keeps
    weak = control.resume(verdict(2 * first), first)
    assert weak.decision is Decision.INCONCLUSIVE and weak.night_control is not None and weak.night_control.held
    assert control.tests == tests and control.keeps == keeps
    kept = control.resume(verdict(first / 2), first)
    assert kept.decision is Decision.KEEP and kept.adjusted_p_value == pytest.approx(0.05)
    assert control.tests == tests and control.keeps == keeps + 1
    assert kept.night_control is not None and "a continued test at level" in kept.night_control.method
