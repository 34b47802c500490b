"""What the search's one-move sweep judges its moves against (``search_phase.sweep_reference``)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from elsa_tune.search_spaces.loader import load_space
from elsa_tune.tuner.flow.night import Incumbent
from elsa_tune.tuner.search.phase import sweep_reference

SPACE = load_space("qwen3.8-27b-nvfp4-rtx5090")


def _boot(candidate: Any, throughput: float) -> Any:
    return SimpleNamespace(candidate=candidate, throughput_tok_s=throughput)


def test_the_baseline_is_judged_by_its_own_boots_mean_and_the_boot_noise() -> None:
    baseline = SPACE.baseline()
    incumbent = Incumbent(SPACE.baseline_values(), [], baseline, 100.0)
    boots = {"search:0": _boot(baseline, 90.0)}
    assert sweep_reference(incumbent, baseline, 0.05, boots) == (100.0, 0.05)


def test_a_kept_incumbent_is_judged_by_the_sweeps_own_boot_of_it() -> None:
    """A keep's throughput is its A/B's winning arm, biased up by the keep; the sweep's boot of the incumbent's
    values is not. One boot against one boot: the margin is the noise of their difference, √2 · σ."""
    baseline = SPACE.baseline()
    name = next(t.name for t in SPACE.techniques if t.screen)
    kept = SPACE.candidate(SPACE.baseline_values(), [name])
    incumbent = Incumbent(SPACE.baseline_values(), [name], kept, 120.0)
    reference, margin = sweep_reference(incumbent, baseline, 0.05, {"search:0": _boot(kept, 110.0)})
    assert reference == 110.0 and margin == pytest.approx(math.sqrt(2) * 0.05)
    # without that boot (or with a boot of another candidate under the tag) the A/B's arm is all there is
    assert sweep_reference(incumbent, baseline, 0.05, {}) == (120.0, 0.05)
    assert sweep_reference(incumbent, baseline, 0.05, {"search:0": _boot(baseline, 90.0)}) == (120.0, 0.05)
