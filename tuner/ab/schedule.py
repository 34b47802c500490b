"""The boot order of an A/B comparison: ABBA·BAAB blocks, seeded and recorded.

One block is one incumbent boot (arm A) and one candidate boot (arm B); the incumbent is re-booted in
every block, never reused from hours earlier. Blocks come in cycles of four, ``AB BA BA AB`` (the
slot order ``ABBA·BAAB``), whose A slots 1, 4, 6, 7 and B slots 2, 3, 5, 8 have equal sums and equal
sums of squares, so a linear or a quadratic drift over one cycle cancels in B − A. The seed picks, per
cycle, that order or its mirror ``BA AB AB BA`` (which cancels the same drifts), so the order is random
in expectation yet recorded. Looks of the sequential gate fall on whole cycles.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from elsa_tune.history.records import Arm

SCHEMA_VERSION = 1
BLOCKS_PER_CYCLE = 4

_CYCLE: tuple[str, ...] = ("AB", "BA", "BA", "AB")
_MIRROR: tuple[str, ...] = ("BA", "AB", "AB", "BA")


@dataclass(frozen=True)
class Slot:
    """One boot in the run order: its block (0-based), its position in the block (0 or 1), its arm."""

    index: int
    block: int
    position: int
    arm: Arm


@dataclass(frozen=True)
class Schedule:
    """The seeded boot order of one comparison. ``mirrored[c]`` says whether cycle ``c`` was flipped."""

    blocks: int
    seed: int
    mirrored: tuple[bool, ...]
    slots: tuple[Slot, ...]
    schema_version: int = SCHEMA_VERSION

    def __iter__(self) -> Iterator[Slot]:
        return iter(self.slots)

    def __len__(self) -> int:
        return len(self.slots)

    def letters(self, upto_slots: int | None = None) -> str:
        """The order as letters, e.g. ``"ABBABAAB"``; the first ``upto_slots`` boots when given."""
        chosen = self.slots if upto_slots is None else self.slots[:upto_slots]
        return "".join(slot.arm.letter for slot in chosen)

    def truncated(self, slots_run: int) -> Schedule:
        """The part of the schedule that was actually run (whole blocks are kept as planned)."""
        if not 0 <= slots_run <= len(self.slots):
            raise ValueError(f"slots_run {slots_run} outside 0..{len(self.slots)}")
        blocks_run = (slots_run + 1) // 2
        cycles_run = (blocks_run + BLOCKS_PER_CYCLE - 1) // BLOCKS_PER_CYCLE
        return Schedule(blocks=blocks_run, seed=self.seed, mirrored=self.mirrored[:cycles_run],
                        slots=self.slots[:slots_run])

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "blocks": self.blocks, "seed": self.seed,
                "mirrored": list(self.mirrored), "order": self.letters()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schedule:
        order = str(data["order"])
        slots = tuple(Slot(index=i, block=i // 2, position=i % 2, arm=Arm.from_letter(letter))
                      for i, letter in enumerate(order))
        return cls(blocks=int(data["blocks"]), seed=int(data["seed"]),
                   mirrored=tuple(bool(m) for m in data["mirrored"]), slots=slots,
                   schema_version=int(data.get("schema_version", SCHEMA_VERSION)))


def abba_baab(blocks: int, seed: int, *, randomize: bool = True) -> Schedule:
    """The boot order for ``blocks`` blocks (two boots each) in ABBA·BAAB cycles.

    With ``randomize`` each cycle is, by a coin seeded with ``seed``, ``AB BA BA AB`` or its mirror;
    without it every cycle is ``AB BA BA AB``. A trailing partial cycle keeps the cycle's prefix.
    """
    if blocks < 1:
        raise ValueError(f"a schedule needs at least one block, got {blocks}")
    coin = random.Random(seed)
    cycles = (blocks + BLOCKS_PER_CYCLE - 1) // BLOCKS_PER_CYCLE
    mirrored = tuple(randomize and coin.random() < 0.5 for _ in range(cycles))
    slots: list[Slot] = []
    for block in range(blocks):
        cycle, within = divmod(block, BLOCKS_PER_CYCLE)
        pair = (_MIRROR if mirrored[cycle] else _CYCLE)[within]
        for position, letter in enumerate(pair):
            slots.append(Slot(index=len(slots), block=block, position=position, arm=Arm.from_letter(letter)))
    return Schedule(blocks=blocks, seed=seed, mirrored=mirrored, slots=tuple(slots))


def drift_bias(schedule: Schedule, drift: Mapping[int, float] | None = None, *, power: int = 1) -> float:
    """B − A bias that a drift ``slot_index ** power`` (or the given per-slot drift) puts on the schedule.

    Zero for a whole number of ABBA·BAAB cycles and ``power`` 1 or 2; used by tests and the report.
    """
    def at(slot: Slot) -> float:
        return drift[slot.index] if drift is not None else float((slot.index + 1) ** power)

    a = [at(s) for s in schedule.slots if s.arm is Arm.INCUMBENT]
    b = [at(s) for s in schedule.slots if s.arm is Arm.CANDIDATE]
    if not a or not b:
        raise ValueError("drift bias needs boots in both arms")
    return sum(b) / len(b) - sum(a) / len(a)
