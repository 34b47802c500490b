"""The t test on log boot means, MDE, non-inferiority and variance components, against hand numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from elsa_tune.tuner.ab.comparison import (
    InsufficientData,
    boots_per_arm_for,
    compare,
    mde_for,
    non_inferiority,
    variance_components,
)

# statistics.md §4 worked example: boot means in tok/s
A = [1000, 1080, 930, 1010, 960, 1040, 990, 1020]
B = [1130, 1060, 1150, 1010, 1090, 1170, 1080, 1120]


def test_worked_example_look_one_matches_the_spec() -> None:
    c = compare([math.log(x) for x in A[:4]], [math.log(x) for x in B[:4]])
    assert c.test == "student"
    assert c.delta == pytest.approx(0.0790, abs=5e-4)
    assert c.se == pytest.approx(0.0428, abs=5e-4)
    assert c.t == pytest.approx(1.847, abs=0.01)
    assert c.df == 6
    assert c.p_one_sided == pytest.approx(0.057, abs=0.002)
    assert c.ratio_bounds(0.05)[1] == pytest.approx(1.176, abs=0.003)


def test_worked_example_look_two_matches_the_spec() -> None:
    c = compare([math.log(x) for x in A], [math.log(x) for x in B])
    assert c.delta == pytest.approx(0.0926, abs=5e-4)
    assert c.t == pytest.approx(3.948, abs=0.02)
    assert c.p_one_sided == pytest.approx(0.00073, abs=0.00005)


def test_student_matches_scipy_and_welch_switches_on_unequal_variance() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 0.1, 6), rng.normal(0.05, 0.1, 6)
    c = compare(a.tolist(), b.tolist(), welch_ratio=1e9)
    ref = stats.ttest_ind(b, a, alternative="greater")
    assert c.t == pytest.approx(ref.statistic) and c.p_one_sided == pytest.approx(ref.pvalue)
    wide = compare(a.tolist(), (b * 5).tolist())
    assert wide.test == "welch"
    ref = stats.ttest_ind(b * 5, a, alternative="greater", equal_var=False)
    assert wide.p_one_sided == pytest.approx(ref.pvalue)


def test_paired_matches_scipy() -> None:
    rng = np.random.default_rng(1)
    a = rng.normal(0, 0.1, 8)
    b = a + rng.normal(0.03, 0.02, 8)
    c = compare(a.tolist(), b.tolist(), analysis="paired")
    ref = stats.ttest_rel(b, a, alternative="greater")
    assert c.test == "paired" and c.df == 7 and c.p_one_sided == pytest.approx(ref.pvalue)


@pytest.mark.parametrize("a, b", [
    ([0.1], [0.2, 0.3]),                       # one boot
    ([0.1, float("nan")], [0.2, 0.3]),         # NaN
    ([0.5, 0.5, 0.5], [0.7, 0.7, 0.7]),        # zero variance: never a confident keep
])
def test_degenerate_data_never_passes_as_a_test(a: list[float], b: list[float]) -> None:
    with pytest.raises(InsufficientData):
        compare(a, b)


def test_mde_table_of_the_spec() -> None:
    # statistics.md §3.6: σ_w 3%, k 3, one-sided .05, power 80%
    assert mde_for(10, sigma_boot=0.10, sigma_run=0.03, measured_passes=3) == pytest.approx(0.125, abs=0.002)
    assert mde_for(4, sigma_boot=0.05, sigma_run=0.03, measured_passes=3) == pytest.approx(0.112, abs=0.002)
    assert mde_for(20, sigma_boot=0.03, sigma_run=0.03, measured_passes=3) == pytest.approx(0.028, abs=0.001)
    assert boots_per_arm_for(0.10, sigma_boot=0.10, sigma_run=0.03, measured_passes=3) == 15
    assert boots_per_arm_for(0.05, sigma_boot=0.10, sigma_run=0.03, measured_passes=3) == 55
    assert boots_per_arm_for(0.03, sigma_boot=0.05, sigma_run=0.03, measured_passes=3) == 41


def test_non_inferiority_passes_flat_and_fails_clearly_worse() -> None:
    rng = np.random.default_rng(2)
    a = np.log(0.5) + rng.normal(0, 0.02, 8)
    same = non_inferiority(a.tolist(), (a + rng.normal(0, 0.01, 8)).tolist(), margin=1.10)
    assert same.passed and not same.confidently_worse
    worse = non_inferiority(a.tolist(), (a + math.log(1.3)).tolist(), margin=1.10)
    assert not worse.passed and worse.confidently_worse


def test_variance_components_recover_known_sigmas() -> None:
    rng = np.random.default_rng(3)
    n, m = 400, 5
    values = rng.normal(0, 0.10, (n, 1)) + rng.normal(0, 0.03, (n, m))
    t_boot, t_run = variance_components(values)
    assert math.sqrt(t_boot) == pytest.approx(0.10, rel=0.1)
    assert math.sqrt(t_run) == pytest.approx(0.03, rel=0.05)


def test_an_mde_beyond_any_finite_effect_is_infinite_not_an_overflow() -> None:
    """A robust look whose outliers leave a fraction of a boot of weight has a heavy-tailed t: no finite effect is
    detectable, and the gate records no MDE instead of crashing the study."""
    from elsa_tune.tuner.ab.comparison import mde_from_se

    assert mde_from_se(0.5, 0.05, alpha=0.01) == float("inf")
    assert 0 < mde_from_se(0.03, 10.0, alpha=0.05) < 0.2


def test_a_non_inferiority_p_value_agrees_with_its_bound() -> None:
    """``passed`` (the upper bound within the margin) is the same statement as ``p_value ≤ alpha``."""
    from elsa_tune.tuner.ab.comparison import non_inferiority

    rng = np.random.default_rng(5)
    for _ in range(200):
        a, b = rng.normal(0.0, 0.1, 8).tolist(), rng.normal(rng.uniform(-0.1, 0.2), 0.1, 8).tolist()
        ni = non_inferiority(a, b, margin=1.10, alpha=0.05)
        assert ni.passed == (ni.p_value <= 0.05) or abs(ni.p_value - 0.05) < 1e-9
