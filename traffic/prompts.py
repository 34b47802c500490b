"""Token-id prompts synthesised from block hashes: prefix sharing reproduced exactly, nothing else shared.

A trace says which requests share a prefix through their block hashes (one id per ``block_size``
prompt tokens, Mooncake's convention). ``PromptSynth`` turns each full block's hash into
``block_size`` token ids, deterministically (a PRNG keyed by seed, salt and hash), and fills the last,
partial block from a seed unique to the request. Two requests therefore share exactly their common
leading full blocks and nothing after them, so the prefix cache can hit exactly where production's
did and nowhere else: a cold first request and a prefix-cache hit are both wrong numbers. Prompts are token ids, sent as
a list of ints to ``/v1/completions``, so their lengths are exact: no detokenise/retokenise drift.

Where the tokens come from is a ``TokenSource``:

* ``RandomTokens`` — uniform ids in a ``TokenSpace`` (a range that avoids the special tokens);
* ``CorpusTokens`` — real text per content regime (``chat``, ``code``, ``tool``, …), tokenised once
  with the model's tokenizer; each block is a deterministic slice of its regime's token stream.
  Speculative acceptance depends on content (tool calls accept ~3x the draft tokens prose does),
  so a speed measured on random ids is not a speed for real traffic. The corpus can be a directory of
  text files per regime (``from_directory``), texts (``from_texts``) or token ids, e.g. bootstrapped
  from the baseline server's own outputs (``from_token_ids``).

Only the first token of a block that follows a divergence can coincide by chance between two prompts
(probability ~1/vocabulary for random ids, higher for real text); the cache then matches one token
more, never a whole page.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from elsa_tune.errors import ConfigError, TrafficError
from elsa_tune.traffic.measurement import RequestRecord

_MASK64 = (1 << 64) - 1
_TAG_BLOCK = 0
_TAG_UNIQUE = 1
_TAG_FILLER = 2

TokenArray = np.ndarray[Any, np.dtype[np.int64]]


@dataclass(frozen=True)
class TokenSpace:
    """Token ids ``low <= id < high`` that are ordinary tokens for the served model.

    The default, 100..32000, is ordinary text in the Llama, Mistral, Qwen and Gemma vocabularies
    (their special tokens sit at the very bottom or above 32000). Narrow it for a smaller vocabulary.
    """

    low: int = 100
    high: int = 32_000

    def __post_init__(self) -> None:
        if not 0 <= self.low < self.high:
            raise ConfigError(f"token range [{self.low}, {self.high}) is empty or negative",
                              remedy="pass 0 <= low < high, within the model's vocabulary and above its special ids")


class TokenSource(Protocol):
    """Deterministic token ids for a key: the same key, length and kind always give the same ids."""

    @property
    def fingerprint(self) -> str:
        """A short stable id of the source's content, recorded with every measurement."""
        ...

    def tokens(self, rng: np.random.Generator, n: int, kind: str) -> TokenArray:
        """``n`` token ids drawn with ``rng`` for content regime ``kind``."""
        ...


@dataclass(frozen=True)
class RandomTokens:
    """Uniform random ids from a ``TokenSpace``; the content regime is ignored."""

    space: TokenSpace = TokenSpace()

    @property
    def fingerprint(self) -> str:
        return f"random:{self.space.low}-{self.space.high}"

    def tokens(self, rng: np.random.Generator, n: int, kind: str) -> TokenArray:
        return rng.integers(self.space.low, self.space.high, size=n, dtype=np.int64)


class Encoder(Protocol):
    """What ``CorpusTokens`` needs from a tokenizer."""

    def encode(self, text: str) -> Sequence[int]: ...


class TokenizerFile:
    """An ``Encoder`` over a Hugging Face ``tokenizer.json`` (the ``tokenizers`` package), no special tokens."""

    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ConfigError("real-text prompts need the `tokenizers` package",
                              remedy="pip install tokenizers") from exc
        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises plain Exception subclasses from Rust
            raise ConfigError(f"cannot load tokenizer {file}: {exc}",
                              remedy="point at the served model's tokenizer.json (or its directory)") from exc

    def encode(self, text: str) -> Sequence[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        return ids


class CorpusTokens:
    """Real token streams per content regime; a block is a slice at a key-determined offset.

    ``fallback`` names the regime used for kinds the corpus lacks; with ``fallback=None`` such a kind
    raises ``TrafficError`` (check a workload first with ``missing``).
    """

    def __init__(self, streams: Mapping[str, Sequence[int] | TokenArray], *, fallback: str | None = None) -> None:
        self._streams = {kind: np.asarray(ids, dtype=np.int64) for kind, ids in sorted(streams.items())}
        empty = [kind for kind, ids in self._streams.items() if ids.size == 0]
        if not self._streams or empty:
            raise TrafficError(f"the prompt corpus has no tokens for {empty or 'any regime'}",
                               remedy="give every regime at least one non-empty text")
        if fallback is not None and fallback not in self._streams:
            raise ConfigError(f"fallback regime {fallback!r} is not in the corpus ({', '.join(self._streams)})",
                              remedy="name one of the corpus regimes")
        self._fallback = fallback
        digest = hashlib.sha256()
        for kind, ids in self._streams.items():
            digest.update(kind.encode() + b"\0" + ids.tobytes())
        self._fingerprint = f"corpus:{digest.hexdigest()[:12]}"

    @classmethod
    def from_token_ids(cls, streams: Mapping[str, Sequence[int]], *, fallback: str | None = None) -> CorpusTokens:
        """Streams of ids, e.g. the baseline server's own outputs per regime (bootstrapping)."""
        return cls(streams, fallback=fallback)

    @classmethod
    def from_texts(cls, texts: Mapping[str, Sequence[str]], encoder: Encoder, *,
                   fallback: str | None = None) -> CorpusTokens:
        streams: dict[str, list[int]] = {}
        for kind, docs in texts.items():
            ids: list[int] = []
            for doc in docs:
                ids.extend(encoder.encode(doc))
            streams[kind] = ids
        return cls(streams, fallback=fallback)

    @classmethod
    def from_directory(cls, root: str | Path, encoder: Encoder, *, fallback: str | None = None) -> CorpusTokens:
        """``root/<regime>/*.txt|*.md|*.json|*.py|…``: one sub-directory per content regime, files in name order."""
        base = Path(root)
        if not base.is_dir():
            raise ConfigError(f"prompt corpus {base} is not a directory",
                              remedy="make a directory with one sub-directory of text files per regime (chat/, code/)")
        texts: dict[str, list[str]] = {}
        for sub in sorted(p for p in base.iterdir() if p.is_dir()):
            files = sorted(f for f in sub.rglob("*") if f.is_file())
            try:
                texts[sub.name] = [f.read_text(encoding="utf-8") for f in files]
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"prompt corpus {sub}: {exc}", remedy="keep only UTF-8 text files there") from exc
        if not texts:
            raise ConfigError(f"prompt corpus {base} has no regime sub-directories",
                              remedy="put text files under e.g. chat/ and code/")
        return cls.from_texts(texts, encoder, fallback=fallback)

    @classmethod
    def from_outputs(cls, records: Iterable[RequestRecord], encoder: Encoder, *,
                     fallback: str | None = None) -> CorpusTokens:
        """Bootstrap from a baseline server's own completions (a pass run with ``keep_text=True``), per kind."""
        texts: dict[str, list[str]] = {}
        for rec in records:
            if rec.ok and rec.text:
                texts.setdefault(rec.kind, []).append(rec.text)
        if not texts:
            raise TrafficError("no completion text to bootstrap a corpus from",
                               remedy="run the baseline pass with LoadgenSettings(keep_text=True)")
        return cls.from_texts(texts, encoder, fallback=fallback)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self._streams)

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def missing(self, kinds: Sequence[str]) -> tuple[str, ...]:
        """Kinds that would raise (no stream and no fallback)."""
        if self._fallback is not None:
            return ()
        return tuple(sorted({k for k in kinds if k not in self._streams}))

    def tokens(self, rng: np.random.Generator, n: int, kind: str) -> TokenArray:
        stream = self._streams.get(kind)
        if stream is None:
            if self._fallback is None:
                raise TrafficError(f"the prompt corpus has no {kind!r} text ({', '.join(self._streams)})",
                                   remedy=f"add a {kind}/ directory to the corpus or set a fallback regime")
            stream = self._streams[self._fallback]
        if stream.size < n:
            stream = np.resize(stream, n)  # repeats the stream; only for corpora shorter than a block
        start = int(rng.integers(0, stream.size - n + 1))
        return stream[start:start + n].copy()


class PromptSynth:
    """Exact-length token-id prompts from block hashes, deterministic in ``(seed, salt, hashes, unique_key)``.

    ``salt`` separates passes: the load generator salts each pass so that pass 2 of a boot does not hit
    the prefix cache pass 1 filled, while pass k of arm A and pass k of arm B get identical prompts.
    """

    def __init__(self, block_size: int, source: TokenSource | None = None, *, seed: int = 0,
                 cache_blocks: int = 4096) -> None:
        if block_size <= 0:
            raise ConfigError(f"block_size must be positive, got {block_size}", remedy="use the trace's block size")
        self.block_size = block_size
        self.source: TokenSource = source if source is not None else RandomTokens()
        self.seed = seed & _MASK64
        self._cache: OrderedDict[tuple[int, int, str], TokenArray] = OrderedDict()
        self._cache_blocks = cache_blocks

    @property
    def id(self) -> str:
        """Stable id of what this synthesiser produces (source, block size, seed)."""
        raw = f"{self.source.fingerprint}|{self.block_size}|{self.seed}"
        return hashlib.sha256(raw.encode()).hexdigest()[:12]

    def _rng(self, tag: int, salt: int, key: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, tag, salt & _MASK64, key & _MASK64])

    def _block(self, block_hash: int, salt: int, kind: str) -> TokenArray:
        key = (block_hash, salt, kind)
        block = self._cache.get(key)
        if block is None:
            block = self.source.tokens(self._rng(_TAG_BLOCK, salt, block_hash), self.block_size, kind)
            self._cache[key] = block
            if len(self._cache) > self._cache_blocks:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return block

    def prompt_array(self, block_hashes: Sequence[int], input_tokens: int, *, unique_key: int,
                     kind: str = "chat", salt: int = 0) -> TokenArray:
        """The prompt as an int64 array of exactly ``input_tokens`` ids.

        Full blocks covered by a hash come from the hash; everything after them (the last partial
        block, or blocks the trace has no hash for) comes from ``unique_key``, so it is shared with
        no other request.
        """
        if input_tokens <= 0:
            raise TrafficError(f"a prompt needs at least one token, got {input_tokens}",
                               remedy="drop zero-length requests from the trace")
        full = min(input_tokens // self.block_size, len(block_hashes))
        parts = [self._block(h, salt, kind) for h in block_hashes[:full]]
        rest = input_tokens - full * self.block_size
        if rest:
            parts.append(self.source.tokens(self._rng(_TAG_UNIQUE, salt, unique_key), rest, kind))
        return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()

    def prompt(self, block_hashes: Sequence[int], input_tokens: int, *, unique_key: int, kind: str = "chat",
               salt: int = 0) -> list[int]:
        """``prompt_array`` as a list of ints, ready to send as ``prompt`` to ``/v1/completions``."""
        ids: list[int] = self.prompt_array(block_hashes, input_tokens, unique_key=unique_key, kind=kind,
                                           salt=salt).tolist()
        return ids

    def filler(self, n_tokens: int, *, key: int, kind: str = "chat") -> list[int]:
        """``n_tokens`` ids shared with nothing else: for probes that build long prompts (needles etc.)."""
        if n_tokens <= 0:
            return []
        ids: list[int] = self.source.tokens(self._rng(_TAG_FILLER, 0, key), n_tokens, kind).tolist()
        return ids
