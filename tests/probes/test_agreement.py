from __future__ import annotations

import pytest

from elsa_tune.probes.agreement import acceptance_collapsed, agreement, compare_accuracy


def test_identical_outputs_agree_fully() -> None:
    a = agreement(["the cat sat", "two plus two is four"], ["the cat sat", "two plus two is four"])
    assert a.identical == 2 and a.mean_similarity == 1.0 and a.acceptable()


def test_late_divergence_is_tolerated_but_garbage_is_not() -> None:
    ref = [" ".join(f"w{i}" for i in range(40))] * 4
    late = [" ".join(f"w{i}" for i in range(36)) + " x y z q"] * 4
    garbage = [" ".join(f"g{i}" for i in range(40))] * 4
    assert agreement(ref, late).acceptable()
    bad = agreement(ref, garbage)
    assert not bad.acceptable() and bad.mean_similarity < 0.1


def test_agreement_refuses_empty_or_mismatched_sets() -> None:
    with pytest.raises(ValueError):
        agreement([], [])
    with pytest.raises(ValueError):
        agreement(["a"], ["a", "b"])


def test_accuracy_regression_needs_evidence() -> None:
    base = [True] * 40 + [False] * 8
    same = list(base)
    assert not compare_accuracy(base, same).regressed()
    worse = [True] * 25 + [False] * 23
    cmp = compare_accuracy(base, worse)
    assert cmp.lost == 15 and cmp.regressed()
    one_off = [True] * 39 + [False] * 9
    assert not compare_accuracy(base, one_off).regressed()


def test_acceptance_collapse() -> None:
    assert acceptance_collapsed(3.5, 1.3) is True
    assert acceptance_collapsed(3.5, 3.3) is False
    assert acceptance_collapsed(None, 2.0) is None
