"""Deterministic pseudo-tokens: how the simulated server counts prompts and writes completions.

There is no model, so a prompt's text is split into word and punctuation pieces (one piece, one token),
token-id prompts are taken as they are, and a completion is a function of the prompt: it starts with
``The answer is N.`` and goes on with filler words. N is the value of a simple ``a op b`` expression in
the prompt when there is one, else a number derived from the prompt's hash, so probes can compare a
candidate's answers with the baseline's. Greedy (temperature 0) output depends only on the prompt and on
the configuration's quality damage, never on the boot, so it is identical across boots of one config. A
technique with quality damage (profile) makes a fraction of the prompts answer wrongly and diverge.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elsa_tune.runtime.sim.answers import Answerer

_PIECES = re.compile(r"\w+|[^\w\s]")
# Word problems the simulated model can do (the shapes of GSM8K-style one- and two-step problems).
_WORD_PROBLEMS: tuple[tuple[re.Pattern[str], Any], ...] = (
    (re.compile(r"has (\d+) .*?adds (\d+) more .*?gives away (\d+)", re.S), lambda a, b, c: a + b - c),
    (re.compile(r"holds (\d+) .*?fills (\d+) more such .*?removes (\d+)", re.S), lambda a, b, c: a * (b + 1) - c),
    (re.compile(r"packs (\d+) .*?into groups of (\d+)", re.S), lambda a, b: a // b if b else 0),
    (re.compile(r"buys (\d+) boxes .*?with (\d+) .*?each box and already owned (\d+)", re.S),
     lambda a, b, c: a * b + c),
    (re.compile(r"sorts (\d+) .*?After (\d+) days .*?sorted (\d+) fewer", re.S), lambda a, b, c: a * b - c),
)
_QUESTION = re.compile(r"[Ww]hat is the ([^?]{3,120})\?")
_EXPR = re.compile(r"(-?\d+(?:\.\d+)?)\s*([-+*/x×÷])\s*(-?\d+(?:\.\d+)?)")
_WORDS = ("the", "model", "of", "and", "a", "value", "is", "to", "in", "this", "result", "we", "that", "it", "for",
          "step", "so", "with", "as", "each", "number", "then", "on", "are", "by", "total", "from", "at", "be",
          "which", "first", "next", "all", "can", "one", "two", "more", "answer", "check", "sum", "count", "left",
          "right", "there", "here", "when", "after", "before", "now", "again", "case", "part", "work", "time",
          "list", "item", "group", "set", "order", "line", "point", "end", "start", "way")
VOCAB_SIZE = 151_936
CHAT_TEMPLATE_TOKENS_PER_MESSAGE = 4   # <|im_start|>role\n … <|im_end|>\n
CHAT_TEMPLATE_TOKENS_TAIL = 3          # <|im_start|>assistant\n


def text_token_ids(text: str) -> list[int]:
    """The pseudo-tokenization of ``text``: one id per word or punctuation piece."""
    return [_piece_id(piece) for piece in _PIECES.findall(text)]


def chat_token_ids(messages: Sequence[tuple[str, str]]) -> list[int]:
    """Token ids of a chat prompt after a ChatML-like template: (role, content) pairs."""
    ids: list[int] = []
    for role, content in messages:
        ids.extend((1, _piece_id(role), 2))
        ids.extend(text_token_ids(content))
        ids.append(3)
    ids.extend((1, _piece_id("assistant"), 2))
    return ids


def prompt_key(token_ids: Sequence[int]) -> int:
    """A stable 64-bit key of a whole prompt."""
    return _hash64(struct.pack(f"<{len(token_ids)}q", *token_ids))


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full ``block_size`` blocks of a prompt (the Mooncake trace convention).

    Two prompts share a prefix of k blocks exactly when their first k hashes agree.
    """
    hashes: list[int] = []
    previous = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[start:start + block_size]
        previous = _hash64(struct.pack(f"<Q{len(block)}q", previous, *block))
        hashes.append(previous)
    return hashes


def solve(text: str) -> float | None:
    """The answer to a simple arithmetic question: a word problem of a known shape, else the first ``a op b``."""
    for pattern, formula in _WORD_PROBLEMS:
        found = pattern.search(text)
        if found:
            return float(formula(*(int(g) for g in found.groups())))
    match = _EXPR.search(text)
    if not match:
        return None
    a, op, b = float(match.group(1)), match.group(2), float(match.group(3))
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op in "*x×":
        return a * b
    return a / b if b else None


def lookup(text: str) -> str | None:
    """Retrieval from the prompt: for a question ``What is the X?`` the value V of a sentence ``The X is V.``.

    That is how a long-context probe hides its needles (``The access code for vault amber is 123456.``).
    """
    asked = _QUESTION.findall(text)
    if not asked:
        return None
    subject = asked[-1].strip()
    found = re.search(r"[Tt]he " + re.escape(subject) + r" is ([^\s.,;]+(?:\.\d+)?)", text)
    return found.group(1) if found else None


@dataclass(frozen=True)
class ToolCall:
    """A call of the first offered tool, its arguments built from the JSON schema and the user's words."""

    name: str
    arguments: str

    @classmethod
    def for_tools(cls, tools: Sequence[Mapping[str, Any]], text: str, key: int) -> ToolCall | None:
        functions = [t.get("function") for t in tools if isinstance(t, Mapping)]
        fn = next((f for f in functions if isinstance(f, Mapping) and f.get("name")), None)
        if fn is None:
            return None
        params = fn.get("parameters") or {}
        props = params.get("properties") or {}
        numbers = iter([*map(int, re.findall(r"-?\d+", text)), *range(1 + key % 5, 100)])
        # proper nouns: capitalised words that do not start a sentence
        words = re.findall(r"(?<![.?!]\s)(?<!^)\b([A-Z][a-z]+(?:[ -][A-Z][a-z]+)*)", text) or ["Paris"]
        args: dict[str, Any] = {}
        for name, schema in props.items():
            kind = schema.get("type") if isinstance(schema, Mapping) else None
            if kind == "integer":
                args[name] = next(numbers)
            elif kind == "number":
                args[name] = float(next(numbers))
            elif kind == "boolean":
                args[name] = True
            elif kind == "array":
                args[name] = []
            elif kind == "object":
                args[name] = {}
            else:
                args[name] = words[len(args) % len(words)]
        return cls(name=str(fn["name"]), arguments=json.dumps(args))


@dataclass(frozen=True)
class Completion:
    """The tokens a request will generate. ``damage`` in [0, 1] is the share of prompts a broken config fumbles.

    ``stream_salt`` is 0 for greedy requests (deterministic across boots) and a per-boot, per-request value
    for sampled ones. With ``tool_call`` the tokens are the pieces of its JSON arguments.
    """

    key: int
    answer: str
    damage: float = 0.0
    damage_salt: str = ""
    stream_salt: int = 0
    tool_call: ToolCall | None = None

    @classmethod
    def for_prompt(cls, token_ids: Sequence[int], text: str | None, damage: float = 0.0, damage_salt: str = "",
                   stream_salt: int = 0, tools: Sequence[Mapping[str, Any]] = (),
                   answerer: Answerer | None = None) -> Completion:
        """``answerer`` (``answers.py``) decides the answer when given: skill level and known questions."""
        key = prompt_key(token_ids)
        if answerer is not None:
            said = answerer.answer(text, key) if text else None
            answer = said if said is not None else str(1 + key % 997)
        else:
            found = lookup(text) if text else None
            value = solve(text) if text and found is None else None
            number = _format_number(value) if value is not None else str(1 + key % 997)
            answer = found if found is not None else number
        call = ToolCall.for_tools(tools, text or "", key) if tools else None
        return cls(key=key, answer=answer, damage=damage, damage_salt=damage_salt, stream_salt=stream_salt,
                   tool_call=call)

    def with_damage(self, damage: float, salt: str) -> Completion:
        return replace(self, damage=damage, damage_salt=salt)

    @property
    def damaged(self) -> bool:
        if self.damage <= 0.0:
            return False
        draw = _hash64(f"damage:{self.damage_salt}:{self.key}".encode()) / 2**64
        return draw < self.damage

    def natural_length(self, max_tokens: int) -> int:
        """Where this completion would emit EOS (16 to 400 tokens; a tool call's length), capped by ``max_tokens``."""
        if self.tool_call is not None:
            return max(1, min(max_tokens, len(self._call_pieces())))
        return max(1, min(max_tokens, 16 + self.key % 385))

    def pieces(self, start: int, count: int) -> list[str]:
        """The text of tokens ``start`` … ``start + count - 1``."""
        head = self._call_pieces() if self.tool_call is not None else self._head()
        out: list[str] = []
        for i in range(start, start + count):
            if i < len(head):
                out.append(head[i])
            elif self.tool_call is not None:
                break
            else:
                out.append(" " + _WORDS[self._filler(i) % len(_WORDS)])
        return out

    def text(self, count: int) -> str:
        return "".join(self.pieces(0, count))

    def _head(self) -> tuple[str, ...]:
        answer = self.answer
        if self.damaged:
            answer = str(int(float(answer)) + 1 + self.key % 7) if _is_number(answer) else answer + "0"
        return ("The", " answer", " is", f" {answer}", ".")

    def _call_pieces(self) -> tuple[str, ...]:
        assert self.tool_call is not None
        arguments = self.tool_call.arguments
        if self.damaged:
            # a broken kernel writes plausible-looking but invalid arguments
            arguments = arguments.replace('": ', '": "', 1).rstrip("}") + '"'
        return tuple(arguments[i:i + 4] for i in range(0, len(arguments), 4))

    def _filler(self, i: int) -> int:
        # Damage changes the continuation too: a broken draft or kernel does not only miss the number.
        salt = f"{self.damage_salt}:bad" if self.damaged else ""
        return _hash64(f"{self.key}:{i}:{self.stream_salt}:{salt}".encode()) >> 8


def _piece_id(piece: str) -> int:
    return 16 + _hash64(piece.encode()) % (VOCAB_SIZE - 16)


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
