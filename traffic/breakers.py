"""Prefix-cache breakers: volatile content early in prompts that are otherwise shared.

A prefix cache matches on the exact prefix. A session id, a clock, a turn counter or the name of the
current file near the top of a system prompt changes on every call and invalidates everything after
it; moved to the end, the same tokens give the same answer for a fraction of the time to first token.

How we find them, without guessing at templates: every prompt is read twice, raw and with volatile
spans (``VOLATILE``) collapsed to a placeholder. For each prompt in arrival order we measure how far
its leading chunks were already seen in earlier prompts, raw and masked. When the masked prompt
reaches further than the raw one, the volatile span at the raw divergence point is what stopped the
cache, and the difference is the prompt tokens it cost. Masking a span that never changes costs
nothing, so a pattern that over-matches (a constant number) is never reported. Findings are grouped
by pattern and by the text just before the span (its label, e.g. ``session_id:``).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from elsa_tune.traffic.requestlog import PIECE

SCHEMA_VERSION = 1
DEFAULT_CHUNK = 16
"""Pieces per compared chunk: the resolution of the analysis (SGLang's page size is 1 to 64 tokens)."""

_EXTENSIONS = "py|js|ts|tsx|jsx|go|rs|java|c|cc|cpp|h|hpp|rb|php|md|txt|json|yaml|yml|toml|sql|sh|html|css|ipynb"
# Every alternative starts at a word boundary and gates its costly part behind a cheap lookahead:
# Python's re tries each alternative at every boundary of a prompt that may be 100 KB long.
VOLATILE = re.compile(
    r"(?P<uuid>\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b)"
    r"|(?P<timestamp>\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b"
    r"|\b\d{1,2}:\d{2}:\d{2}\b|\b1[5-9]\d{8}(?:\d{3})?\b)"
    rf"|(?P<file>\b[\w-]+(?:[./][\w-]+)*\.(?:{_EXTENSIONS})\b)"
    r"|(?P<id>\b(?=[\w-]{8})(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9][\w-]{7,}\b)"
    r"|(?P<counter>\b\d+(?:\.\d+)?\b)"
)
PLACEHOLDER = "\x00{}\x00"


@dataclass(frozen=True)
class Breaker:
    """One kind of volatile content that stops prefix-cache reuse, and what it costs."""

    pattern: str  # uuid | timestamp | file | id | counter
    label: str  # the text just before the span, e.g. "session_id:"
    example: str  # one value seen
    requests: int  # requests whose reuse it cut short
    share_of_requests: float  # of all requests analysed
    tokens_lost_mean: float  # prompt tokens recomputed per affected request because of it
    tokens_lost_total: int
    position_tokens_median: float  # where it sits: token offset in the prompt
    position_fraction_median: float  # offset / prompt length (0 = at the top)
    prompt_tokens_median: float

    @property
    def remedy(self) -> str:
        return (f"move the {self.pattern} after {self.label!r} to the end of the prompt (after the stable "
                f"context): it sits at ~{self.position_tokens_median:.0f} tokens and costs "
                f"{self.tokens_lost_mean:.0f} recomputed tokens per request")


def find_breakers(prompts: Sequence[str], *, chunk: int = DEFAULT_CHUNK, min_requests: int = 2,
                  min_tokens: float = 64.0, rounds: int = 4) -> list[Breaker]:
    """Breakers in ``prompts`` (in arrival order), most costly first: those seen ``min_requests`` times
    that cost at least ``min_tokens`` recomputed prompt tokens per affected request.

    Templates often stack several volatile fields at the top (session id, turn counter, clock,
    current file). A round only sees the first one in each prompt, so the next round removes
    what was found (as if it had been moved to the end) and looks again, up to ``rounds`` times; a
    later breaker's cost is what it would still cost once the earlier ones are fixed.
    """
    found: list[Breaker] = []
    texts = list(prompts)
    for _ in range(max(rounds, 1)):
        new = [b for b in _round(texts, chunk, min_requests) if b.tokens_lost_mean >= min_tokens]
        if not new:
            break
        found += new
        groups = {(b.pattern, b.label) for b in new}
        texts = [_without(text, groups) for text in texts]
    return sorted(found, key=lambda b: -b.tokens_lost_total)


def _round(prompts: Sequence[str], chunk: int, min_requests: int) -> list[Breaker]:
    seen_raw: set[bytes] = set()
    seen_masked: set[bytes] = set()
    losses: dict[tuple[str, str], list[tuple[int, int, int, str]]] = defaultdict(list)
    for prompt in prompts:
        raw = PIECE.findall(prompt)
        masked, raw_index, spans = _masked(prompt, raw)
        raw_keys = _chunk_keys(raw, chunk)
        masked_keys = _chunk_keys(masked, chunk)
        raw_reuse = _reused(raw_keys, seen_raw)
        masked_reuse = _reused(masked_keys, seen_masked)
        seen_raw.update(raw_keys)
        seen_masked.update(masked_keys)
        diverged = raw_reuse * chunk
        reached = raw_index[min(masked_reuse * chunk, len(masked))]
        if reached <= diverged:
            continue
        culprit = next((s for s in spans if s[2] > diverged), None)
        if culprit is None or culprit[1] >= diverged + chunk:
            continue
        pattern, start, _end, value = culprit
        label = _label(raw[max(0, start - 4):start])
        losses[(pattern, label)].append((reached - diverged, start, len(raw), value))
    found = [
        Breaker(pattern=pattern, label=label, example=items[0][3], requests=len(items),
                share_of_requests=len(items) / max(len(prompts), 1),
                tokens_lost_mean=statistics.fmean(i[0] for i in items), tokens_lost_total=sum(i[0] for i in items),
                position_tokens_median=statistics.median(i[1] for i in items),
                position_fraction_median=statistics.median(i[1] / i[2] for i in items),
                prompt_tokens_median=statistics.median(i[2] for i in items))
        for (pattern, label), items in losses.items() if len(items) >= min_requests
    ]
    return found


def _without(prompt: str, groups: set[tuple[str, str]]) -> str:
    """``prompt`` with the volatile spans of ``groups`` (pattern, label) cut out."""
    kept: list[str] = []
    last = 0
    for match in VOLATILE.finditer(prompt):
        label = _label(PIECE.findall(prompt[max(0, match.start() - 80):match.start()])[-4:])
        if (match.lastgroup or "counter", label) in groups:
            kept.append(prompt[last:match.start()])
            last = match.end()
    kept.append(prompt[last:])
    return "".join(kept)


def breakers_to_json(found: Sequence[Breaker]) -> str:
    """The versioned JSON stored in a trace's metadata under ``extra["breakers"]``."""
    return json.dumps({"schema_version": SCHEMA_VERSION, "breakers": [asdict(b) for b in found]}, sort_keys=True)


def breakers_from_json(text: str | None) -> list[Breaker]:
    """Read what ``breakers_to_json`` wrote; an absent or foreign value reads as no findings."""
    if not text:
        return []
    try:
        payload = json.loads(text)
    except json.JSONDecodeError:
        return []
    if not isinstance(payload, dict) or payload.get("schema_version") != SCHEMA_VERSION:
        return []
    return [Breaker(**item) for item in payload.get("breakers", [])]


def _masked(prompt: str, raw: list[str]) -> tuple[list[str], list[int], list[tuple[str, int, int, str]]]:
    """Masked pieces, the raw piece index where each masked piece starts, and the volatile spans.

    Spans are (pattern, first raw piece, end raw piece, value). Each span collapses to one
    placeholder piece, so values of different lengths still line up what follows them.
    """
    starts: list[int] = []
    offset = 0
    for piece in raw:
        starts.append(offset)
        offset += len(piece)
    spans: list[tuple[str, int, int, str]] = []
    masked: list[str] = []
    raw_index: list[int] = []
    index = 0
    for match in VOLATILE.finditer(prompt):
        pattern = match.lastgroup or "counter"
        first = _piece_at(starts, match.start())
        end = _piece_at(starts, match.end() - 1) + 1
        if first < index:
            continue
        masked.extend(raw[index:first])
        raw_index.extend(range(index, first))
        spans.append((pattern, first, end, match.group()))
        masked.append(PLACEHOLDER.format(pattern))
        raw_index.append(first)
        index = end
    masked.extend(raw[index:])
    raw_index.extend(range(index, len(raw)))
    raw_index.append(len(raw))
    return masked, raw_index, spans


def _piece_at(starts: list[int], char: int) -> int:
    return bisect.bisect_right(starts, char) - 1


def _label(before: list[str]) -> str:
    text = "".join(before).strip()
    text = text.splitlines()[-1].strip() if text else ""
    return text[-40:]


def _chunk_keys(units: Sequence[str], chunk: int) -> list[bytes]:
    """Chained keys of whole chunks: key i identifies the prompt's first (i + 1) * chunk pieces."""
    keys: list[bytes] = []
    previous = b""
    for lo in range(0, len(units) - chunk + 1, chunk):
        payload = "\x1f".join(units[lo:lo + chunk]).encode("utf-8", "surrogatepass")
        previous = hashlib.blake2b(previous + payload, digest_size=12).digest()
        keys.append(previous)
    return keys


def _reused(keys: list[bytes], seen: set[bytes]) -> int:
    count = 0
    for key in keys:
        if key not in seen:
            break
        count += 1
    return count
