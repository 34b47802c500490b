from __future__ import annotations

import pytest

from elsa_tune.probes.haystack import build


def test_needles_sit_at_their_depths_and_are_deterministic() -> None:
    hay = build(2000, depths=(0.1, 0.5, 0.9), seed=7)
    assert hay == build(2000, depths=(0.1, 0.5, 0.9), seed=7)
    assert abs(hay.words - 2000) < 30
    for needle in hay.needles:
        at = hay.text.index(needle.sentence) / len(hay.text)
        assert abs(at - needle.depth) < 0.05
        assert needle.found_in(f"The code is {needle.code}.")
        assert not needle.found_in(f"The code is {needle.code + 1}.")


def test_too_small_haystack_is_refused() -> None:
    with pytest.raises(ValueError):
        build(10)
