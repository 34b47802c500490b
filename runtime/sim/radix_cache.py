"""The radix prefix cache of the simulated SGLang, keyed on prompt block hashes (the Mooncake convention).

For a hybrid (Mamba/GDN) model a cached prefix is only reusable where a recurrent-state checkpoint exists, and
every checkpoint needs a Mamba state slot the running requests are not using. ``MambaStates`` models that: each
cached prompt keeps one state set (its end and a checkpoint every ``mamba-track-interval`` tokens) in one spare
slot, least recently used first out. With no spare slots the KV of a prefix may still sit in the pool while the
prefix cannot be reused: the log shows ``#cached-token: 0`` with much of the pool free.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence


class RadixCache:
    """Prompt blocks keyed by their prefix chain, each with a lock count; LRU-evicted (leaves first) when unlocked.

    A block's key hashes its whole prefix chain, so two prompts share a node exactly as long as their leading block
    hashes agree. ``block_tokens`` is the tokens per block (the trace's block size).
    """

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.nodes: OrderedDict[int, int] = OrderedDict()   # node key -> lock count (LRU order)
        self.locked = 0                                      # nodes with a lock count above zero
        self.on_evict: Callable[[Iterable[int]], None] | None = None

    @staticmethod
    def keys(hashes: Sequence[int]) -> list[int]:
        chain, out = 0, []
        for h in hashes:
            chain = hash((chain, h))
            out.append(chain)
        return out

    @property
    def tokens(self) -> int:
        return len(self.nodes) * self.block_tokens

    def evictable(self) -> int:
        return (len(self.nodes) - self.locked) * self.block_tokens

    def match(self, keys: Sequence[int]) -> list[int]:
        matched: list[int] = []
        for key in keys:
            if key not in self.nodes:
                break
            matched.append(key)
        self._touch(matched)
        return matched

    def _touch(self, path: Sequence[int]) -> None:
        # leaves become the least recent of their path, so eviction takes leaves before the prefixes they extend
        for key in reversed(path):
            self.nodes.move_to_end(key)

    def lock(self, path: Sequence[int], delta: int) -> None:
        for key in path:
            if key in self.nodes:
                before = self.nodes[key]
                after = max(0, before + delta)
                self.nodes[key] = after
                self.locked += (after > 0) - (before > 0)

    def insert(self, keys: Sequence[int]) -> int:
        """Add the blocks not yet cached; returns how many tokens were added."""
        added = 0
        for key in keys:
            if key not in self.nodes:
                self.nodes[key] = 0
                added += 1
        self._touch(keys)
        return added * self.block_tokens

    def evict(self, tokens: int) -> int:
        """Drop least recently used unlocked blocks until ``tokens`` are freed (or none are left)."""
        freed = 0
        victims: list[int] = []
        for key, locks in self.nodes.items():
            if freed >= tokens:
                break
            if locks == 0:
                victims.append(key)
                freed += self.block_tokens
        for key in victims:
            del self.nodes[key]
        if self.on_evict is not None:
            self.on_evict(victims)
        return freed

    def clear(self) -> bool:
        if self.locked:
            return False
        self.nodes.clear()
        if self.on_evict is not None:
            self.on_evict(())
        return True


class MambaStates:
    """Recurrent-state checkpoints of cached prompts, one spare Mamba slot per cached prompt (LRU).

    ``add(keys)`` records a prompt's state set: its last block and every ``every``-th block. ``usable(matched)``
    is how many leading blocks of a match end at a checkpoint. ``trim(spare)`` keeps the ``spare`` most recent sets.
    """

    def __init__(self, every_blocks: int) -> None:
        self.every = max(1, every_blocks)
        self.sets: OrderedDict[int, tuple[int, ...]] = OrderedDict()   # owner (last key) -> checkpoint keys
        self.covered: dict[int, int] = {}                                # checkpoint key -> sets holding it

    def add(self, keys: Sequence[int]) -> None:
        if not keys:
            return
        owner = keys[-1]
        if owner in self.sets:
            self.sets.move_to_end(owner)
            return
        points = tuple(dict.fromkeys((*(keys[i] for i in range(self.every - 1, len(keys), self.every)), owner)))
        self.sets[owner] = points
        for key in points:
            self.covered[key] = self.covered.get(key, 0) + 1

    def usable(self, matched: Sequence[int]) -> int:
        for depth in range(len(matched), 0, -1):
            if matched[depth - 1] in self.covered:
                owner = next((o for o, pts in self.sets.items() if matched[depth - 1] in pts), None)
                if owner is not None:
                    self.sets.move_to_end(owner)
                return depth
        return 0

    def trim(self, spare: int) -> None:
        while len(self.sets) > max(0, spare):
            _, points = self.sets.popitem(last=False)
            self._drop(points)

    def forget(self, keys: Iterable[int]) -> None:
        """Blocks left the KV pool: their checkpoints go (the rest of each set stays); nothing given: all go."""
        gone = set(keys)
        if not gone:
            self.sets.clear()
            self.covered.clear()
            return
        for owner, points in list(self.sets.items()):
            lost = [key for key in points if key in gone]
            if not lost:
                continue
            self._drop(lost)
            kept = tuple(key for key in points if key not in gone)
            if kept:
                self.sets[owner] = kept
            else:
                del self.sets[owner]

    def _drop(self, points: Sequence[int]) -> None:
        for key in points:
            left = self.covered.get(key, 0) - 1
            if left <= 0:
                self.covered.pop(key, None)
            else:
                self.covered[key] = left
