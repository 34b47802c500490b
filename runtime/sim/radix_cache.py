"""The radix prefix cache of the simulated SGLang, keyed on prompt block hashes (the Mooncake convention)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class RadixCache:
    """Prompt blocks keyed by their prefix chain, each with a lock count; LRU-evicted (leaves first) when unlocked.

    A block's key hashes its whole prefix chain, so two prompts share a node exactly as long as their leading block
    hashes agree. ``block_tokens`` is the tokens per block (the trace's block size).
    """

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.nodes: OrderedDict[int, int] = OrderedDict()   # node key -> lock count (LRU order)
        self.locked = 0                                      # nodes with a lock count above zero

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
        return freed

    def clear(self) -> bool:
        if self.locked:
            return False
        self.nodes.clear()
        return True
