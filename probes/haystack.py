"""Long prompts with needles: deterministic filler text, facts hidden at chosen depths, the question.

Token counts differ between tokenizers, so the probe first measures the server's tokens per filler
word (``usage.prompt_tokens`` of a short calibration prompt) and sizes the haystack from that.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

_SUBJECTS = ("The harbour master", "A quiet engineer", "The night train", "An old lighthouse", "The river pilot",
             "A cartographer", "The station clock", "A beekeeper", "The ferry", "A mill on the hill")
_VERBS = ("watched", "counted", "measured", "recorded", "painted", "repaired", "followed", "described", "sorted",
          "carried")
_OBJECTS = ("the grey tide", "seven copper bells", "the northern road", "a ledger of storms", "the salt flats",
            "two hundred lanterns", "the morning fog", "a crate of maps", "the long canal", "a field of barley")
_TAILS = ("before the rain came.", "while the town slept.", "for the third time that week.", "without a word.",
          "as the wind turned.", "and wrote it down.", "until the lamps went out.", "near the old pier.")
_VAULTS = ("amber", "basalt", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "indigo", "juniper")

NEEDLE_TEMPLATE = "The access code for vault {name} is {code}."
QUESTION_TEMPLATE = ("What is the access code for vault {name}? Reply with the number only.")
_CODE = re.compile(r"\d{4,9}")


@dataclass(frozen=True)
class Needle:
    name: str
    code: int
    depth: float     # 0 = start of the prompt, 1 = end

    @property
    def sentence(self) -> str:
        return NEEDLE_TEMPLATE.format(name=self.name, code=self.code)

    @property
    def question(self) -> str:
        return QUESTION_TEMPLATE.format(name=self.name)

    def found_in(self, answer: str) -> bool:
        return str(self.code) in _CODE.findall(answer)


@dataclass(frozen=True)
class Haystack:
    text: str
    needles: tuple[Needle, ...]
    words: int


def filler_sentences(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}"
            for _ in range(512)]


def build(words: int, depths: Sequence[float] = (0.1, 0.5, 0.9), seed: int = 0) -> Haystack:
    """About ``words`` words of filler with one needle per depth. Deterministic for a seed."""
    if words < 50:
        raise ValueError("a haystack needs at least 50 words")
    rng = random.Random(seed)
    sentences = filler_sentences(seed)
    names = rng.sample(_VAULTS, k=len(depths))
    needles = tuple(Needle(name=n, code=rng.randint(10_000, 99_999_999), depth=d)
                    for n, d in zip(names, sorted(depths), strict=True))
    out: list[str] = []
    count = 0
    positions = [int(n.depth * words) for n in needles]
    pending = list(zip(positions, needles, strict=True))
    i = 0
    while count < words:
        while pending and count >= pending[0][0]:
            out.append(pending.pop(0)[1].sentence)
            count += len(out[-1].split())
        sentence = sentences[i % len(sentences)]
        i += 1
        out.append(sentence)
        count += len(sentence.split())
    out.extend(n.sentence for _, n in pending)
    return Haystack(text=" ".join(out), needles=needles, words=count)
