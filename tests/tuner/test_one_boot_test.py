"""The one-boot test a night uses when no A/B can finish: its level holds when the new boot is the incumbent's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from elsa_tune.tuner.flow.screening import one_boot_test


@pytest.mark.parametrize("boots", [4, 6])
def test_a_no_op_boot_is_kept_at_the_level_the_test_is_run_at(boots: int) -> None:
    """σ_boot and the incumbent's mean come from the same ``boots`` boots; a new boot of the same configuration
    passes p ≤ level as often as the level says (20,000 nights, within 4 binomial σ), at 0.05 and at 0.005."""
    rng = np.random.default_rng(7)
    nights = 20_000
    base = rng.normal(0.0, 0.08, size=(nights, boots))
    new = rng.normal(0.0, 0.08, size=nights)
    p = np.array([one_boot_test(math.exp(x - b.mean()), float(b.std(ddof=1)), boots)[0]
                  for b, x in zip(base, new, strict=True)])
    for level in (0.05, 0.005):
        keeps = float(np.mean(p <= level))
        assert abs(keeps - level) <= 4 * math.sqrt(level * (1 - level) / nights)


def test_a_boot_far_above_the_incumbent_is_a_small_p_and_its_interval_holds_it() -> None:
    p, (low, high) = one_boot_test(1.35, 0.041, 4)
    assert p < 0.005
    assert 1.0 < low < 1.35 < high
    p_flat, (low_flat, _) = one_boot_test(1.0, 0.041, 4)
    assert p_flat == pytest.approx(0.5) and low_flat < 1.0
