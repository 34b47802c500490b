"""The written GGUF models: metadata, determinism, a numpy forward pass of the designed weights, and (marked
``llamacpp``) the real ``llama-server``: answers as designed, unchanged by numerics-only flags, changed by RoPE
scaling, a draft with a real acceptance rate, a foreign draft refused while the server keeps serving."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import gguf
import numpy as np
import pytest
from llamacpp_server import LlamaServer, running_llama_server

from elsa_tune.probes.agreement import agreement
from elsa_tune.runtime.llamacpp.model import (
    HEAD_DIM,
    ROPE_BASE,
    Design,
    ModelKind,
    main,
    parameter_count,
    vocabulary_for,
    write_model,
)
from elsa_tune.runtime.llamacpp.vocab import BOS, EOS, IM_END, IM_START

# -- the file --------------------------------------------------------------------------------------------------


def _field(reader: gguf.GGUFReader, key: str) -> object:
    return reader.fields[key].contents()


def test_tiny_is_a_small_llama_with_a_chat_vocabulary(tmp_path: Path) -> None:
    card = write_model(ModelKind.TINY, tmp_path / "tiny.gguf")
    reader = gguf.GGUFReader(card.path)
    assert _field(reader, "general.architecture") == "llama" == card.architecture
    assert _field(reader, "llama.context_length") == card.context_length >= 8192
    assert _field(reader, "llama.block_count") == card.layers
    assert _field(reader, "llama.embedding_length") == card.hidden
    assert _field(reader, "llama.attention.head_count") == card.heads
    assert _field(reader, "llama.attention.head_count_kv") == card.kv_heads
    assert _field(reader, "tokenizer.ggml.model") == "llama"
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert isinstance(tokens, list) and len(tokens) == card.vocab
    assert [f"<0x{b:02X}>" for b in range(256)] == [t for t in tokens if re.fullmatch(r"<0x[0-9A-F]{2}>", t)]
    assert {"\u2581the", "\u2581answer", "\u2581water"} <= set(tokens)
    assert tokens[IM_START] == "<|im_start|>" and tokens[IM_END] == "<|im_end|>"
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        assert len(reader.fields[key].data) == card.vocab
    assert (_field(reader, "tokenizer.ggml.bos_token_id"), _field(reader, "tokenizer.ggml.eos_token_id")) == (BOS, EOS)
    assert "<|im_start|>assistant" in str(_field(reader, "tokenizer.chat_template"))
    assert card.parameters == sum(int(np.prod(t.shape)) for t in reader.tensors)
    assert 2_000_000 < card.bytes == card.path.stat().st_size < 16_000_000
    assert card.path.stat().st_mode & 0o777 == 0o644
    assert not [p for p in tmp_path.iterdir() if p.name != "tiny.gguf"], "the temporary file was left behind"


def test_a_seed_gives_the_same_bytes_and_another_seed_others(tmp_path: Path) -> None:
    a = write_model(ModelKind.DRAFT, tmp_path / "a.gguf", seed=3).path.read_bytes()
    b = write_model(ModelKind.DRAFT, tmp_path / "b.gguf", seed=3).path.read_bytes()
    c = write_model(ModelKind.DRAFT, tmp_path / "c.gguf", seed=4).path.read_bytes()
    assert a == b != c


def test_draft_is_smaller_on_the_same_vocabulary_and_the_foreign_draft_is_not(tmp_path: Path) -> None:
    tiny = write_model(ModelKind.TINY, tmp_path / "tiny.gguf")
    draft = write_model(ModelKind.DRAFT, tmp_path / "draft.gguf")
    foreign = write_model(ModelKind.FOREIGN_DRAFT, tmp_path / "foreign.gguf")
    tokens = {c.kind: _field(gguf.GGUFReader(c.path), "tokenizer.ggml.tokens") for c in (tiny, draft, foreign)}
    assert draft.parameters < tiny.parameters / 2 and draft.bytes < tiny.bytes / 2
    assert tokens[ModelKind.DRAFT] == tokens[ModelKind.TINY]
    assert isinstance(tokens[ModelKind.FOREIGN_DRAFT], list) and isinstance(tokens[ModelKind.TINY], list)
    differing = [i for i, (a, b) in enumerate(zip(tokens[ModelKind.TINY], tokens[ModelKind.FOREIGN_DRAFT],
                                                  strict=True)) if a != b]
    assert differing and differing[0] >= 5       # llama.cpp compares the text of every id from 5 on


def test_the_gpu_kind_has_over_a_billion_parameters_and_tiny_is_small() -> None:
    assert parameter_count(ModelKind.GPU) > 1_000_000_000
    assert parameter_count(ModelKind.TINY) < 8_000_000
    assert parameter_count(ModelKind.DRAFT) < parameter_count(ModelKind.TINY) / 2


def test_cli_writes_a_model_and_refuses_bad_input_in_one_line(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--kind", "draft", "-o", str(tmp_path / "d.gguf"), "--seed", "2"]) == 0
    assert "draft" in capsys.readouterr().out and (tmp_path / "d.gguf").is_file()
    for argv in (["--kind", "huge", "-o", str(tmp_path / "x.gguf")], ["--kind", "tiny"],
                 ["--kind", "tiny", "-o", str(tmp_path / "x.gguf"), "--seed", "-1"],
                 ["--kind", "tiny", "-o", str(tmp_path)],
                 ["--kind", "tiny", "-o", str(tmp_path / "d.gguf" / "x.gguf")]):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err


# -- the design, through a numpy forward pass of the written weights --------------------------------------------


def _rope(x: np.ndarray, positions: np.ndarray, freq_scale: float) -> np.ndarray:
    """llama.cpp's normal RoPE: adjacent pairs (2i, 2i+1) turn by pos·freq_scale·base^(−2i/64)."""
    theta = ROPE_BASE ** (-2.0 * np.arange(HEAD_DIM // 2) / HEAD_DIM)
    angle = positions[:, None, None] * freq_scale * theta
    cos, sin = np.cos(angle), np.sin(angle)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


@functools.cache
def _weights(path: Path) -> tuple[dict[str, np.ndarray], int, int, int]:
    reader = gguf.GGUFReader(path)
    sizes = [reader.fields[f"llama.{key}"].contents() for key in ("attention.head_count",
                                                                  "attention.head_count_kv", "block_count")]
    assert all(isinstance(size, int) for size in sizes)
    heads, kv_heads, layers = (int(size) for size in sizes)  # type: ignore[call-overload]
    return {t.name: np.asarray(t.data, dtype=np.float64) for t in reader.tensors}, heads, kv_heads, layers


def _logits(path: Path, tokens: Sequence[int], freq_scale: float = 1.0) -> np.ndarray:
    """The last position's logits of a llama forward pass in float64 over the model's weights."""
    w, heads, kv_heads, layers = _weights(path)

    def norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return np.asarray(x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * weight)

    n = len(tokens)
    positions = np.arange(n, dtype=np.float64)
    x = w["token_embd.weight"][list(tokens)]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for layer in range(layers):
        p = f"blk.{layer}."
        h = norm(x, w[p + "attn_norm.weight"])
        q = _rope((h @ w[p + "attn_q.weight"].T).reshape(n, heads, HEAD_DIM), positions, freq_scale)
        k = _rope((h @ w[p + "attn_k.weight"].T).reshape(n, kv_heads, HEAD_DIM), positions, freq_scale)
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, kv_heads, HEAD_DIM)
        out = np.empty((n, heads, HEAD_DIM))
        for head in range(heads):
            g = head * kv_heads // heads
            scores = q[:, head] @ k[:, g].T / np.sqrt(HEAD_DIM) + mask
            weights = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[:, head] = (weights / weights.sum(axis=1, keepdims=True)) @ v[:, g]
        x = x + out.reshape(n, -1) @ w[p + "attn_output.weight"].T
        h = norm(x, w[p + "ffn_norm.weight"])
        gate = h @ w[p + "ffn_gate.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    return np.asarray(norm(x[-1], w["output_norm.weight"]) @ w["output.weight"].T)


def _sentence(kind: ModelKind, text: str) -> list[int]:
    vocab = vocabulary_for(kind)
    return [BOS, IM_START, vocab.id_of("\u2581user"), vocab.id_of("<0x0A>"),
            *(vocab.id_of("\u2581" + word) for word in text.split()), IM_END]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[ModelKind, Path]:
    folder = tmp_path_factory.mktemp("models")
    return {kind: write_model(kind, folder / f"{kind.value}.gguf").path
            for kind in (ModelKind.TINY, ModelKind.DRAFT, ModelKind.FOREIGN_DRAFT)}


def test_the_weights_compute_the_designed_next_token_with_a_wide_margin(models: dict[ModelKind, Path]) -> None:
    design = Design(vocabulary_for(ModelKind.TINY), seed=0)
    context = _sentence(ModelKind.TINY, "the sky look blue at noon and red at sunset")
    for _ in range(6):
        logits = _logits(models[ModelKind.TINY], context)
        expected = design.next_token(context)
        runner_up = np.sort(logits)[-2]
        assert int(np.argmax(logits)) == expected
        assert logits[expected] - runner_up > 8.0, "the designed margin is 9 logits"
        context.append(expected)


def test_rope_scaling_moves_the_previous_token_head_and_changes_the_answers(models: dict[ModelKind, Path]) -> None:
    design = Design(vocabulary_for(ModelKind.TINY), seed=0)
    context = _sentence(ModelKind.TINY, "give two reasons a small bakery might keep a written log of oven water")
    changed = 0
    for cut in range(8, len(context) + 1):
        prefix = context[:cut]
        changed += int(np.argmax(_logits(models[ModelKind.TINY], prefix, freq_scale=0.25))) != design.next_token(
            prefix)
    assert changed >= 2


def test_the_draft_agrees_with_tiny_on_about_half_the_steps() -> None:
    design = Design(vocabulary_for(ModelKind.TINY), seed=0)
    rng = np.random.default_rng(0)
    words = list(design.vocab.words)
    agree = sum(design.next_token(list(ctx)) == design.next_token(list(ctx), previous_head=False)
                for ctx in (rng.choice(words, size=12) for _ in range(400)))
    assert 0.35 < agree / 400 < 0.65


# -- the real llama-server --------------------------------------------------------------------------------------


def _prompts() -> list[str]:
    text = resources.files("elsa_tune.probes").joinpath("data", "prompts.jsonl").read_text(encoding="utf-8")
    return [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]


def _chat_answers(server: LlamaServer, max_tokens: int = 48) -> list[str]:
    return [server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                                 "max_tokens": max_tokens, "temperature": 0})
            ["choices"][0]["message"]["content"] for prompt in _prompts()]


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^llamacpp:{name}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", text, re.MULTILINE)
    assert found, f"no llamacpp:{name} in /metrics"
    return float(found.group(1))


@pytest.fixture(scope="module")
def baseline(models: dict[ModelKind, Path], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    with running_llama_server(models[ModelKind.TINY], log_dir=tmp_path_factory.mktemp("logs")) as server:
        return _chat_answers(server)


@pytest.mark.llamacpp
def test_server_answers_as_designed(models: dict[ModelKind, Path], tmp_path: Path) -> None:
    design = Design(vocabulary_for(ModelKind.TINY), seed=0)
    with running_llama_server(models[ModelKind.TINY], log_dir=tmp_path) as server:
        for prompt in _prompts():
            text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
            tokens = server.post("/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]
            reply = server.post("/completion", {"prompt": text, "n_predict": 32, "temperature": 0,
                                                "return_tokens": True})
            assert reply["tokens"] == design.greedy(tokens, 32), prompt


@pytest.mark.llamacpp
def test_answers_differ_between_prompts(baseline: list[str]) -> None:
    assert len(set(baseline)) >= 4
    assert all(len(answer.split()) >= 40 for answer in baseline)


@pytest.mark.llamacpp
@pytest.mark.parametrize("flags", [("-fa", "on"), ("-fa", "off"), ("-ub", "32", "-b", "32"), ("-ub", "512"),
                                   ("-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"), ("-t", "1"), ("-np", "1")],
                         ids=" ".join)
def test_numerics_only_changes_keep_every_answer(models: dict[ModelKind, Path], baseline: list[str],
                                                 flags: tuple[str, ...], tmp_path: Path) -> None:
    slots, extra = (int(flags[1]), ()) if flags[0] == "-np" else (2, flags)
    with running_llama_server(models[ModelKind.TINY], *extra, log_dir=tmp_path, slots=slots) as server:
        assert _chat_answers(server) == baseline


@pytest.mark.llamacpp
@pytest.mark.parametrize("flags", [("--rope-freq-scale", "0.25"), ("--rope-scaling", "linear", "--rope-scale", "4")],
                         ids=" ".join)
def test_rope_scaling_changes_the_answers_beyond_the_gates_tolerance(
        models: dict[ModelKind, Path], baseline: list[str], flags: tuple[str, ...], tmp_path: Path) -> None:
    with running_llama_server(models[ModelKind.TINY], *flags, log_dir=tmp_path) as server:
        damaged = _chat_answers(server)
    found = agreement(baseline, damaged)
    assert found.identical <= 2 and not found.acceptable()


@pytest.mark.llamacpp
def test_the_draft_is_accepted_part_of_the_time(models: dict[ModelKind, Path], baseline: list[str],
                                                tmp_path: Path) -> None:
    with running_llama_server(models[ModelKind.TINY], "--model-draft", str(models[ModelKind.DRAFT]),
                              "--spec-type", "draft-simple", "--spec-draft-n-max", "4", "--metrics",
                              log_dir=tmp_path) as server:
        answers = _chat_answers(server)
        metrics = server.get("/metrics")
    drafted = _metric(metrics, "spec_decode_num_draft_tokens_total")
    accepted = _metric(metrics, "spec_decode_num_accepted_tokens_total")
    assert answers == baseline, "speculative decoding must not change greedy answers"
    assert drafted > 100 and 0.0 < accepted / drafted < 1.0


@pytest.mark.llamacpp
def test_a_foreign_draft_is_refused_and_the_server_keeps_serving(models: dict[ModelKind, Path], baseline: list[str],
                                                                tmp_path: Path) -> None:
    with running_llama_server(models[ModelKind.TINY], "--model-draft", str(models[ModelKind.FOREIGN_DRAFT]),
                              "--spec-type", "draft-simple", "--metrics", log_dir=tmp_path) as server:
        answers = _chat_answers(server)
        log = server.log()
    assert "the target and draft vocabs are not compatible" in log
    assert answers == baseline


@pytest.mark.llamacpp
def test_tiny_is_fast_on_a_small_cpu(models: dict[ModelKind, Path], tmp_path: Path) -> None:
    with running_llama_server(models[ModelKind.TINY], "-t", "2", log_dir=tmp_path) as server:
        rates = [server.post("/v1/completions", {"prompt": f"the water of river {i}", "max_tokens": 128,
                                                 "temperature": 0, "ignore_eos": True})["timings"]
                 ["predicted_per_second"] for i in range(3)]
    assert max(rates) >= 100.0

