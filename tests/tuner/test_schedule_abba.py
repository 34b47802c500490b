"""The boot order: ABBA·BAAB cycles, seeded, recorded, drift-cancelling."""

from __future__ import annotations

import pytest

from elsa_tune.history.records import Arm
from elsa_tune.tuner.ab.schedule import Schedule, abba_baab, drift_bias


def test_unrandomized_order_is_exactly_abba_baab() -> None:
    s = abba_baab(8, seed=1, randomize=False)
    assert s.letters() == "ABBABAAB" * 2
    assert [slot.block for slot in s][:6] == [0, 0, 1, 1, 2, 2]
    assert [slot.position for slot in s][:4] == [0, 1, 0, 1]


def test_every_block_boots_the_incumbent_once_and_the_candidate_once() -> None:
    s = abba_baab(12, seed=7)
    for block in range(12):
        arms = sorted(slot.arm.letter for slot in s if slot.block == block)
        assert arms == ["A", "B"]


def test_seeded_cycles_are_the_order_or_its_mirror_and_reproducible() -> None:
    a, b = abba_baab(12, seed=42), abba_baab(12, seed=42)
    assert a == b
    for c, mirrored in enumerate(a.mirrored):
        cycle = a.letters()[8 * c: 8 * c + 8]
        assert cycle == ("BAABABBA" if mirrored else "ABBABAAB")
    orders = {abba_baab(12, seed=s).letters() for s in range(40)}
    assert len(orders) == 8          # 2^3 cycle orientations all occur


@pytest.mark.parametrize("power", [1, 2])
def test_linear_and_quadratic_drift_cancel_over_whole_cycles(power: int) -> None:
    for seed in range(10):
        assert drift_bias(abba_baab(8, seed), power=power) == pytest.approx(0.0)
    # the naive orders do not cancel a linear drift
    naive = Schedule.from_dict({"blocks": 2, "seed": 0, "mirrored": [False], "order": "AABB"})
    assert drift_bias(naive, power=1) == pytest.approx(2.0)


def test_round_trip_and_truncation_keep_the_order_run() -> None:
    s = abba_baab(12, seed=3)
    assert Schedule.from_dict(s.to_dict()).letters() == s.letters()
    run = s.truncated(9)
    assert run.letters() == s.letters()[:9]
    assert run.blocks == 5 and len(run.mirrored) == 2
    assert run.slots[-1].arm in (Arm.INCUMBENT, Arm.CANDIDATE)
    with pytest.raises(ValueError):
        abba_baab(0, seed=1)
