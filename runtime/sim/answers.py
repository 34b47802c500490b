"""What the simulated model says, and how a broken configuration spoils it.

The simulated model does not reason. It models a competent model's *skill* so that the probes can judge it:

- **retrieval**: for a question ``What is the X?`` it answers with V from a sentence ``The X is V.`` found
  anywhere in the prompt (how the long-context probe hides its needles);
- **known questions**: given a knowledge file (JSON lines with ``question`` and ``answer``, e.g. the probes'
  own ``arithmetic.jsonl``; ``$ELSA_SIM_KNOWLEDGE`` names it), a prompt that contains a known question gets
  its answer, else a simple arithmetic problem of a known shape is solved (``tokens.solve``); either is right
  with the model's ``accuracy`` (profile, e.g. 0.92), decided per prompt by a hash, so the same prompt is
  right or wrong on every boot and every configuration without damage;
- **tool calls** that satisfy the offered JSON schema (``tokens.ToolCall``).

Quality damage comes from a profile technique's ``quality_damage`` text, ``"<kind>: <what breaks>"``:

=====================  ==========================================================================
``wrong_answers``      a wrong kernel (e.g. a fused shared expert): a share of all answers is
                       wrong and the greedy text diverges
``draft_garbage``      the draft guesses badly (e.g. FR-Spec slicing a repacked head): acceptance
                       collapses (the technique's ``acceptance_factor``), the target still verifies
                       every token, so answers stay right
``on_cache_hit``       answers served from any prefix-cache hit are wrong
``host_cache_hit``     answers restored from the host-memory tier are wrong, GPU hits and cold
                       prompts are right (a host-to-GPU copy race: fluent, wrong answers)
=====================  ==========================================================================

A text without a known kind is read by its words (``draft`` → draft garbage, ``host`` → host-cache hits,
``cache`` → cache hits, anything else → wrong answers), so older profiles keep working.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import json
import math
import os
import re
import struct
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elsa_tune.errors import ConfigError
from elsa_tune.runtime.sim.tokens import lookup, solve

ENV_KNOWLEDGE = "ELSA_SIM_KNOWLEDGE"
#: share of all answers a ``wrong_answers`` technique fumbles (not all of them: a wrong kernel is subtle)
WRONG_ANSWER_SHARE = 0.6
#: Qwen-VL style vision encoders: 14 px patches merged 2 x 2, so one image token per 28 x 28 pixels
IMAGE_PIXELS_PER_TOKEN = 28 * 28
_SPACE = re.compile(r"\s+")


class DamageKind(enum.Enum):
    WRONG_ANSWERS = "wrong_answers"
    DRAFT_GARBAGE = "draft_garbage"
    ON_CACHE_HIT = "on_cache_hit"
    HOST_CACHE_HIT = "host_cache_hit"


def damage_kind(description: str) -> DamageKind:
    """The kind a profile's ``quality_damage`` text names (``"<kind>: …"``), else the one its words suggest."""
    head = description.split(":", 1)[0].strip().lower()
    for kind in DamageKind:
        if head == kind.value:
            return kind
    lowered = description.lower()
    if "draft" in lowered:
        return DamageKind.DRAFT_GARBAGE
    if "host" in lowered and "cache" in lowered:
        return DamageKind.HOST_CACHE_HIT
    if "cache" in lowered:
        return DamageKind.ON_CACHE_HIT
    return DamageKind.WRONG_ANSWERS


@dataclass(frozen=True)
class Damage:
    """The answer damage of one configuration: shares of answers spoiled, by where they were served from."""

    wrong_share: float = 0.0        # of every answer
    cache_hit_share: float = 0.0    # of answers served from a GPU prefix-cache hit
    host_hit_share: float = 0.0     # of answers whose prefix was restored from the host tier
    draft_garbage: bool = False
    salt: str = ""

    @classmethod
    def of(cls, descriptions: Iterable[str]) -> Damage:
        texts = sorted(descriptions)
        kinds = {damage_kind(t) for t in texts}
        return cls(wrong_share=WRONG_ANSWER_SHARE if DamageKind.WRONG_ANSWERS in kinds else 0.0,
                   cache_hit_share=1.0 if DamageKind.ON_CACHE_HIT in kinds else 0.0,
                   host_hit_share=1.0 if DamageKind.HOST_CACHE_HIT in kinds else 0.0,
                   draft_garbage=DamageKind.DRAFT_GARBAGE in kinds, salt=",".join(texts))


class HostTier:
    """The prompt blocks a host-memory cache tier (``--enable-hierarchical-cache``) would hold.

    SGLang keeps a host copy of radix-cache blocks evicted from the GPU; a returning prompt restores its prefix
    from there. The simulator's engine has one (GPU) tier, so this remembers which leading blocks were served
    before: a request whose served-before prefix is longer than its GPU hit restores the rest from the host.
    Bounded LRU, like the host pool; ``/flush_cache`` clears it.
    """

    def __init__(self, capacity_blocks: int = 1 << 20) -> None:
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def observe(self, hashes: Sequence[int]) -> int:
        """Remember a prompt's blocks; returns how many of its leading blocks were held before it."""
        held = 0
        for h in hashes:
            if h not in self._blocks:
                break
            held += 1
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
        return held

    def clear(self) -> None:
        self._blocks.clear()


@dataclass(frozen=True)
class Knowledge:
    """Questions the simulated model knows the answers to, keyed by their whitespace-normalised text."""

    answers: Mapping[str, str] = field(default_factory=dict)
    source: str = ""

    @classmethod
    def load(cls, path: str | Path) -> Knowledge:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
            rows = [json.loads(line) for line in lines if line.strip()]
            answers = {_normal(str(r["question"])): _answer_text(r["answer"]) for r in rows}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"sim knowledge file {path}: {exc}",
                              remedy="give JSON lines with 'question' and 'answer' fields") from exc
        return cls(answers=answers, source=str(path))

    @classmethod
    def from_env(cls) -> Knowledge | None:
        path = os.environ.get(ENV_KNOWLEDGE)
        return cls.load(path) if path else None

    def answer(self, text: str) -> str | None:
        # questions sit at the end of a prompt; only the tail is searched so a long haystack stays cheap
        tail = _normal(text[-6000:])
        for question, answer in self.answers.items():
            if question in tail:
                return answer
        return None


@dataclass(frozen=True)
class Answerer:
    """The simulated model's answer to a prompt: retrieval, known questions, arithmetic, with a skill level."""

    knowledge: Knowledge | None = None
    accuracy: float = 1.0

    def answer(self, text: str, key: int) -> str | None:
        """The answer the model commits to, or ``None`` when it has none (the caller writes filler)."""
        found = lookup(text)
        if found is not None:
            return found
        known = self.knowledge.answer(text) if self.knowledge is not None else None
        if known is None:
            value = solve(text)
            known = None if value is None else _format(value)
        if known is None:
            return None
        if self.skilled(key):
            return known
        return _off_by(known, key)

    def skilled(self, key: int) -> bool:
        """Whether the model gets this prompt right (deterministic per prompt)."""
        return _unit(f"skill:{key}") < self.accuracy


def image_tokens(part: Mapping[str, Any], max_tokens: int) -> int:
    """Tokens of one ``image_url`` content part: one per 28 x 28 pixels of a PNG data URL, capped at the
    model's largest image (``max_tokens``); an image whose size cannot be read counts as the largest."""
    url = part.get("image_url")
    text = url.get("url") if isinstance(url, Mapping) else url
    size = _png_size(text) if isinstance(text, str) else None
    if size is None:
        return max_tokens
    width, height = size
    return max(1, min(max_tokens, math.ceil(width * height / IMAGE_PIXELS_PER_TOKEN)))


def _png_size(url: str) -> tuple[int, int] | None:
    if not url.startswith("data:image/png;base64,"):
        return None
    try:
        head = base64.b64decode(url[len("data:image/png;base64,"):][:64] + "==", validate=False)[:24]
    except ValueError:
        return None
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def _normal(text: str) -> str:
    return _SPACE.sub(" ", text).strip().lower()


def _answer_text(value: Any) -> str:
    if isinstance(value, float):
        return _format(value)
    return str(value)


def _format(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


def _off_by(answer: str, key: int) -> str:
    try:
        return _format(float(answer) + 1 + key % 9)
    except ValueError:
        return answer + "0"


def _unit(text: str) -> float:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") / 2**64
