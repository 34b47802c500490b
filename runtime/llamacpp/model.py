"""LLaMA-architecture GGUF models with designed weights: confident, checkable greedy answers, no download.

Random weights give near-flat logits, so greedy output flips under any change of numerics and a quality gate
comparing answers with the baseline's would fail flash attention on/off. These models compute a fixed
next-token function instead, with a logit margin of 9 between the chosen token and the runner-up and about 80
over every token outside its group's candidates, so numerics-only changes (``--flash-attn``, ``-b``/``-ub``,
a q8_0 KV cache, ``--threads``, ``-np``) cannot change an answer, while a change that breaks attention's
positions does.

The function (``Design.next_token``): every token ``t`` has a group ``g(t)`` of 128, a previous-bit
``p(t) = ±1`` and a level ``l(t)`` (0 for pieces, bytes and control tokens; 1–31 for whole words, level
``k`` with probability ``0.25·0.75^(k−1)``). Each group has 32 candidate words, one of each class
``c = 2·code + bit``.
The next token after context ``… t[n-1] t[n]`` is the candidate of ``g(t[n])`` whose class has
``code = max level in the context mod 16`` and ``bit = (p(t[n-1]) > 0)``, so the answer depends on the current
token, the previous token and the most salient word of the prompt.

How the weights compute it, all in the first layer; RMS norms are 1, every other weight is Gaussian noise of
standard deviation ``0.064/√hidden`` (the same compute, no effect on the answer):

- the embedding holds a constant (dim 0), the one-hot group (dims 1–128), ``Λ·l(t)`` (dim 129), the four bits
  of ``l(t) mod 16`` and ``p(t)`` as ±β (dims 130–134) and a padding that makes every row's norm
  ``√(hidden − |attention output|²)``, so the final RMS norm is the identity on the designed path;
- a *previous-token head* (head 0): q and k are constant (read from dim 0), built per RoPE pair ``i`` so that
  ``score(Δ) = A·Σ w_i cos((Δ−1)·θ_i)`` peaks at relative offset Δ = 1 with a gap of ≥ 24 over every other
  offset up to 32,768 (``rope.freq_base`` 1e6, ``θ_i = base^(−2i/64)``); it copies ``p(t[n-1])`` to dim 139;
- a *salience head* (the first head of the second KV group): q constant, k = ``κ·Λ·l(t)`` in the slowest RoPE
  pair (``θ_31 ≈ 1.5e-6``, so positions hardly matter), 24 score units per level: it attends to the highest
  level in the context and copies that level's four bits to dims 135–138;
- the output matrix gives each group's candidates +60 and adds ±4.5 per class bit that agrees with dims 135–139.

Scaling RoPE (``--rope-freq-scale 0.25``, i.e. ``--rope-scaling linear --rope-scale 4``) moves the previous-token
head's peak to offset 4, so about half the steps read another token's bit and the answers change.

Kinds: ``tiny`` (CI's CPU model, ~8 MB); ``draft`` (same vocabulary and tables, smaller, no previous-token head:
it always assumes bit 1, so it agrees with ``tiny`` of the same seed on about half the tokens); ``foreign-draft``
(the draft on a vocabulary in another order, which llama.cpp refuses as a draft for ``tiny``); ``gpu`` (1.1B
parameters, the same design, so the GPU bounds throughput). A seed changes the tables and the noise; the same
kind and seed always give the same bytes.

    python -m elsa_tune.runtime.llamacpp.model --kind tiny -o tiny.gguf [--seed 0]
"""

from __future__ import annotations

import argparse
import enum
import math
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

try:
    import gguf
except ImportError as exc:  # the optional extra
    raise ImportError("writing GGUF models needs the gguf package: pip install 'elsa-tune[llamacpp]'") from exc

from elsa_tune.runtime.llamacpp.vocab import BOS, CHAT_TEMPLATE, EOS, UNK, Vocabulary, build_vocabulary

ARCHITECTURE = "llama"
HEAD_DIM = 64
ROPE_BASE = 1e6
GROUPS = 128
CODE_BITS = 4
CLASSES = 2 ** (CODE_BITS + 1)
MAX_LEVEL = 31

# Residual-stream layout of the designed path.
_BIAS, _GROUP, _LEVEL, _CODE, _PBIT, _CODE_OUT, _PBIT_OUT, _PAD = 0, 1, 129, 130, 134, 135, 139, 140
# Designed values: constant, group one-hot, level step, bit size in the embedding, attention output size.
_B0, _H, _LAMBDA, _BETA, _GAMMA = 4.0, 6.0, 0.2, 2.0, 3.0
_PREV_AMPLITUDE = 130.0       # A: score(Δ=1) of the previous-token head
_SALIENCE_QK = 31.0           # ρ = κ: 31·31·Λ/8 = 24 score units per level
_CANDIDATE = 10.0             # output weight on a group dim: 6·10 = +60
_BIT = 1.5                    # output weight on a bit dim: 3·1.5 = ±4.5


class ModelKind(enum.Enum):
    TINY = "tiny"
    DRAFT = "draft"
    FOREIGN_DRAFT = "foreign-draft"
    GPU = "gpu"
    GPU_DRAFT = "gpu-draft"
    GPU_WEAK_DRAFT = "gpu-weak-draft"


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    feed_forward: int
    heads: int
    kv_heads: int
    context_length: int
    vocab_size: int | None = None      # None: exactly the pieces the vocabulary needs
    previous_head: bool = True
    foreign: bool = False


SHAPES: dict[ModelKind, Shape] = {
    ModelKind.TINY: Shape(layers=4, hidden=256, feed_forward=512, heads=4, kv_heads=2, context_length=8192),
    ModelKind.DRAFT: Shape(layers=2, hidden=192, feed_forward=256, heads=3, kv_heads=1, context_length=8192,
                           previous_head=False),
    ModelKind.FOREIGN_DRAFT: Shape(layers=2, hidden=192, feed_forward=256, heads=3, kv_heads=1, context_length=8192,
                                   previous_head=False, foreign=True),
    ModelKind.GPU: Shape(layers=22, hidden=2048, feed_forward=5632, heads=32, kv_heads=4, context_length=32768,
                         vocab_size=32000),
    ModelKind.GPU_DRAFT: Shape(layers=4, hidden=256, feed_forward=512, heads=4, kv_heads=2, context_length=32768,
                               vocab_size=32000),
    ModelKind.GPU_WEAK_DRAFT: Shape(layers=2, hidden=192, feed_forward=256, heads=3, kv_heads=1,
                                    context_length=32768, vocab_size=32000, previous_head=False),
}

_BEHAVIOUR = {
    ModelKind.TINY: "greedy answers follow Design.next_token (group of the current token, bit of the previous "
                    "token, most salient word); margin >= 9 logits",
    ModelKind.DRAFT: "tiny's design without the previous-token head: agrees with tiny (same seed) on ~half the tokens",
    ModelKind.FOREIGN_DRAFT: "the draft on a reordered vocabulary: llama.cpp refuses it as a draft for tiny",
    ModelKind.GPU: "tiny's design at 1.1B parameters (22 x 2048, 32/4 heads, vocab 32000)",
    ModelKind.GPU_DRAFT: "tiny's shape on gpu's vocabulary: the same next-token function, a draft gpu accepts",
    ModelKind.GPU_WEAK_DRAFT: "the draft's shape on gpu's vocabulary: agrees with gpu on ~half the tokens",
}


@dataclass(frozen=True)
class ModelCard:
    """What ``write_model`` wrote."""

    kind: ModelKind
    path: Path
    seed: int
    architecture: str
    parameters: int
    layers: int
    hidden: int
    feed_forward: int
    heads: int
    kv_heads: int
    vocab: int
    context_length: int
    bytes: int
    behaviour: str


class Design:
    """The next-token function a model of this vocabulary and seed computes, and its tables."""

    def __init__(self, vocab: Vocabulary, seed: int) -> None:
        rng = np.random.default_rng([seed, 1])
        n = len(vocab)
        self.vocab = vocab
        self.group = rng.integers(0, GROUPS, size=n)
        self.pbit = rng.choice(np.array([-1, 1]), size=n)
        self.level = np.zeros(n, dtype=np.int64)
        words = np.array(vocab.words)
        self.level[words] = np.minimum(rng.geometric(0.25, size=len(words)), MAX_LEVEL)
        word_class = rng.permutation(np.arange(len(words)) % CLASSES)
        self.candidates = np.empty((GROUPS, CLASSES), dtype=np.int64)
        for c in range(CLASSES):
            members = words[word_class == c]
            self.candidates[:, c] = rng.choice(members, size=GROUPS)

    def next_token(self, context: Sequence[int], previous_head: bool = True) -> int:
        current = context[-1]
        previous = context[-2] if len(context) > 1 else current
        code = int(max(self.level[t] for t in context)) % 2**CODE_BITS
        bit = int(self.pbit[previous] > 0) if previous_head else 1
        return int(self.candidates[self.group[current], 2 * code + bit])

    def greedy(self, context: Sequence[int], n: int, previous_head: bool = True) -> list[int]:
        """The ``n`` tokens a model of this design answers after ``context`` (the prompt's token ids)."""
        tokens = list(context)
        for _ in range(n):
            tokens.append(self.next_token(tokens, previous_head))
        return tokens[len(context):]


def vocabulary_for(kind: ModelKind) -> Vocabulary:
    shape = SHAPES[kind]
    return build_vocabulary(foreign=shape.foreign, size=shape.vocab_size)


def previous_head_weights() -> npt.NDArray[np.float64]:
    """``w_i`` per RoPE pair: a geometric profile with extra weight on the fastest pair (gap ≥ 0.19·A)."""
    w = 0.85 ** np.arange(HEAD_DIM // 2)
    w[0] += 0.3 * w.sum()
    return np.asarray(w / w.sum(), dtype=np.float64)


def rope_thetas(base: float = ROPE_BASE) -> npt.NDArray[np.float64]:
    return np.asarray(base ** (-2.0 * np.arange(HEAD_DIM // 2) / HEAD_DIM), dtype=np.float64)


class _Noise:
    """Slices of one seeded pool of Gaussian noise (F16), so a 2 GB model is written at disk speed."""

    def __init__(self, seed: int, sigma: float, size: int = 4_000_037) -> None:
        self._rng = np.random.default_rng([seed, 2])
        self._pool = (self._rng.standard_normal(size, dtype=np.float32) * sigma).astype(np.float16)

    def matrix(self, rows: int, cols: int) -> npt.NDArray[np.float16]:
        count = rows * cols
        out = np.empty(count, dtype=np.float16)
        at, done = int(self._rng.integers(0, self._pool.size)), 0
        while done < count:
            take = min(count - done, self._pool.size - at)
            out[done:done + take] = self._pool[at:at + take]
            at, done = 0, done + take
        return out.reshape(rows, cols)

    def designed(self, rows: int, cols: int) -> npt.NDArray[np.float32]:
        """A noise matrix in F32, to write designed weights into."""
        return self.matrix(rows, cols).astype(np.float32)


def _embedding(design: Design, shape: Shape, noise: _Noise) -> npt.NDArray[np.float32]:
    n, d = len(design.vocab), shape.hidden
    e = noise.designed(n, d)
    rows = np.arange(n)
    e[:, _BIAS] = _B0
    e[rows, _GROUP + design.group] = _H
    e[:, _LEVEL] = _LAMBDA * design.level
    codes = design.level % 2**CODE_BITS
    for k in range(CODE_BITS):
        e[:, _CODE + k] = np.where((codes >> k) & 1, _BETA, -_BETA)
    e[:, _PBIT] = _BETA * design.pbit
    attention_out = CODE_BITS + 1 if shape.previous_head else CODE_BITS
    if not shape.previous_head:
        e[:, _PBIT_OUT] = _GAMMA            # the draft always assumes bit 1
    used = np.square(e[:, :_PAD]).sum(axis=1)
    room = d - attention_out * _GAMMA**2 - used
    e[:, _PAD:] = np.sqrt(room / (d - _PAD))[:, None]
    return e


def _output(design: Design, shape: Shape, noise: _Noise) -> npt.NDArray[np.float32]:
    out = noise.designed(len(design.vocab), shape.hidden)
    for g in range(GROUPS):
        out[design.candidates[g], _GROUP + g] = _CANDIDATE
    for c in range(CLASSES):
        members = np.unique(design.candidates[:, c])
        for k in range(CODE_BITS):
            out[members, _CODE_OUT + k] = _BIT if (c >> (k + 1)) & 1 else -_BIT
        out[members, _PBIT_OUT] = _BIT if c & 1 else -_BIT
    return out


def _attention(shape: Shape, noise: _Noise) -> tuple[npt.NDArray[np.float32 | np.float16], ...]:
    d, kv = shape.hidden, shape.kv_heads * HEAD_DIM
    wq, wk, wv, wo = noise.designed(d, d), noise.designed(kv, d), noise.designed(kv, d), noise.designed(d, d)
    if shape.previous_head:                       # head 0, KV head 0
        w, theta = previous_head_weights(), rope_thetas()
        size = np.sqrt(8.0 * _PREV_AMPLITUDE * w)    # |q_i| = |k_i|, q_i·k_i/√64 = A·w_i
        wq[0:HEAD_DIM:2, _BIAS] = size * np.cos(theta) / _B0
        wq[1:HEAD_DIM:2, _BIAS] = -size * np.sin(theta) / _B0
        wk[0:HEAD_DIM:2, _BIAS] = size / _B0
        wk[1:HEAD_DIM:2, _BIAS] = 0.0
        wv[0, _PBIT] = 1.0
        wo[_PBIT_OUT, 0] = _GAMMA / _BETA
    kv_group = 1 if shape.previous_head else 0    # the salience head: first head of its KV group
    head = kv_group * shape.heads // shape.kv_heads
    slow = HEAD_DIM - 2                           # the slowest RoPE pair
    wq[head * HEAD_DIM + slow, _BIAS] = _SALIENCE_QK / _B0
    wk[kv_group * HEAD_DIM + slow, _LEVEL] = _SALIENCE_QK
    for k in range(CODE_BITS):
        wv[kv_group * HEAD_DIM + k, _CODE + k] = 1.0
        wo[_CODE_OUT + k, head * HEAD_DIM + k] = _GAMMA / _BETA
    return wq, wk, wv, wo


def _tensors(design: Design, shape: Shape, seed: int) -> Iterator[npt.NDArray[np.float32 | np.float16]]:
    """The model's tensors in ``_tensor_shapes`` order (numpy layout: rows = outputs)."""
    noise = _Noise(seed, 0.064 / math.sqrt(shape.hidden))
    d, kv, f = shape.hidden, shape.kv_heads * HEAD_DIM, shape.feed_forward
    ones = np.ones(d, dtype=np.float32)
    yield _embedding(design, shape, noise).astype(np.float16)
    for layer in range(shape.layers):
        attention = _attention(shape, noise) if layer == 0 else (
            noise.matrix(d, d), noise.matrix(kv, d), noise.matrix(kv, d), noise.matrix(d, d))
        yield ones
        yield from (w.astype(np.float16, copy=False) for w in attention)
        yield ones
        yield from (noise.matrix(f, d), noise.matrix(f, d), noise.matrix(d, f))
    yield ones
    yield _output(design, shape, noise).astype(np.float16)


def _tensor_shapes(shape: Shape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """Names and numpy shapes in file order: 1-D tensors (the norms, all ones) are F32, 2-D ones F16."""
    d, kv, f = shape.hidden, shape.kv_heads * HEAD_DIM, shape.feed_forward
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, d))]
    for layer in range(shape.layers):
        shapes += [(f"blk.{layer}.attn_norm.weight", (d,)), (f"blk.{layer}.attn_q.weight", (d, d)),
                   (f"blk.{layer}.attn_k.weight", (kv, d)), (f"blk.{layer}.attn_v.weight", (kv, d)),
                   (f"blk.{layer}.attn_output.weight", (d, d)), (f"blk.{layer}.ffn_norm.weight", (d,)),
                   (f"blk.{layer}.ffn_gate.weight", (f, d)), (f"blk.{layer}.ffn_up.weight", (f, d)),
                   (f"blk.{layer}.ffn_down.weight", (d, f))]
    return [*shapes, ("output_norm.weight", (d,)), ("output.weight", (vocab, d))]


def parameter_count(kind: ModelKind) -> int:
    """How many weights a ``kind`` model has (without writing it)."""
    return sum(math.prod(dims) for _, dims in _tensor_shapes(SHAPES[kind], len(vocabulary_for(kind))))


def _metadata(writer: gguf.GGUFWriter, kind: ModelKind, shape: Shape, vocab: Vocabulary) -> None:
    writer.add_name(f"elsa-tune {kind.value}")
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.feed_forward)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(vocab))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_scores(list(vocab.scores))
    writer.add_token_types(list(vocab.types))
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_unk_token_id(UNK)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(True)
    writer.add_chat_template(CHAT_TEMPLATE)


def write_model(kind: ModelKind, path: Path, seed: int = 0) -> ModelCard:
    """Write the ``kind`` model to ``path`` atomically (a temporary file beside it, then ``os.replace``)."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    shape = SHAPES[kind]
    vocab = vocabulary_for(kind)
    design = Design(vocab, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(tmp, ARCHITECTURE)
        _metadata(writer, kind, shape, vocab)
        parameters = 0
        for name, dims in _tensor_shapes(shape, len(vocab)):
            dtype = np.dtype(np.float32 if len(dims) == 1 else np.float16)
            writer.add_tensor_info(name, dims, dtype, math.prod(dims) * dtype.itemsize)
            parameters += math.prod(dims)
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for (name, dims), tensor in zip(_tensor_shapes(shape, len(vocab)), _tensors(design, shape, seed), strict=True):
            if tensor.shape != dims:
                raise AssertionError(f"{name}: wrote {tensor.shape}, declared {dims}")
            writer.write_tensor_data(tensor)
        writer.close()
        tmp.chmod(0o644)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return ModelCard(kind=kind, path=path, seed=seed, architecture=ARCHITECTURE, parameters=parameters,
                     layers=shape.layers, hidden=shape.hidden, feed_forward=shape.feed_forward, heads=shape.heads,
                     kv_heads=shape.kv_heads, vocab=len(vocab), context_length=shape.context_length,
                     bytes=path.stat().st_size, behaviour=_BEHAVIOUR[kind])


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m elsa_tune.runtime.llamacpp.model",
                     description="Write a LLaMA GGUF model with designed, confident greedy answers.")
    parser.add_argument("--kind", required=True, choices=[k.value for k in ModelKind])
    parser.add_argument("-o", "--output", required=True, type=Path, help="where to write the .gguf file")
    parser.add_argument("--seed", type=int, default=0, help="tables and noise (default 0); same seed, same bytes")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.output.is_dir():
        parser.error(f"-o {args.output} is a folder; give a file path")
    try:
        card = write_model(ModelKind(args.kind), args.output, seed=args.seed)
    except OSError as exc:
        parser.error(f"cannot write {args.output}: {exc.strerror or exc}")
    print(f"{card.path}: {card.kind.value}, {card.parameters:,} parameters, {card.layers} layers x {card.hidden}, "
          f"vocab {card.vocab}, context {card.context_length}, {card.bytes:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
