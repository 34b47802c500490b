from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from elsa_tune.errors import ConfigError, TrafficError
from elsa_tune.traffic.prompts import CorpusTokens, PromptSynth, RandomTokens, TokenizerFile, TokenSpace

BS = 32


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_requests_share_exactly_their_common_leading_blocks() -> None:
    synth = PromptSynth(BS, seed=7)
    a = synth.prompt([1, 2, 3, 4], 3 * BS + 5, unique_key=1)
    b = synth.prompt([1, 2, 9, 4], 3 * BS + 9, unique_key=2)
    c = synth.prompt([1, 2, 3, 8], 3 * BS + 5, unique_key=3)
    assert _common_prefix(a, b) == 2 * BS
    # same three full blocks, different partial last block: shared up to the partial block, not beyond
    assert _common_prefix(a, c) == 3 * BS
    assert len(a) == len(c) == 3 * BS + 5 and len(b) == 3 * BS + 9


def test_nothing_but_the_common_prefix_is_shared() -> None:
    synth = PromptSynth(BS, seed=1)
    prompts = [synth.prompt([10, 100 + i, 200 + i], 3 * BS, unique_key=i) for i in range(50)]
    blocks = [tuple(p[k * BS:(k + 1) * BS]) for p in prompts for k in (1, 2)]
    assert len(set(blocks)) == len(blocks)            # no later block repeats anywhere
    assert all(p[:BS] == prompts[0][:BS] for p in prompts)


def test_lengths_are_exact_and_ids_stay_in_range() -> None:
    synth = PromptSynth(BS, RandomTokens(TokenSpace(500, 600)))
    for n in (1, BS - 1, BS, BS + 1, 5 * BS, 5 * BS + 17):
        hashes = list(range(-(-n // BS)))
        ids = synth.prompt(hashes, n, unique_key=n)
        assert len(ids) == n
        assert min(ids) >= 500 and max(ids) < 600
    # a trace that carries fewer hashes than full blocks still gets an exact, unshared prompt
    assert len(synth.prompt([1], 4 * BS, unique_key=0)) == 4 * BS
    with pytest.raises(TrafficError):
        synth.prompt([], 0, unique_key=0)
    with pytest.raises(ConfigError):
        TokenSpace(10, 10)


def test_deterministic_across_instances_and_distinct_across_salts_and_seeds() -> None:
    a, b = PromptSynth(BS, seed=3), PromptSynth(BS, seed=3)
    args = ([5, 6, 7], 3 * BS - 4)
    assert a.prompt(*args, unique_key=9) == b.prompt(*args, unique_key=9)
    assert a.id == b.id
    assert a.prompt(*args, unique_key=9, salt=1) != a.prompt(*args, unique_key=9)
    assert PromptSynth(BS, seed=4).prompt(*args, unique_key=9) != a.prompt(*args, unique_key=9)
    assert PromptSynth(BS, seed=4).id != a.id
    # a salted pass keeps the structure: shared blocks are shared again, with other tokens
    x1, y1 = a.prompt([1, 2], 2 * BS, unique_key=0, salt=1), a.prompt([1, 3], 2 * BS, unique_key=1, salt=1)
    assert _common_prefix(x1, y1) == BS


def test_filler_is_exact_and_unique() -> None:
    synth = PromptSynth(BS)
    f1, f2 = synth.filler(1000, key=1), synth.filler(1000, key=2)
    assert len(f1) == 1000 and f1 != f2 and f1 == synth.filler(1000, key=1)
    assert synth.filler(0, key=1) == []


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    words = ["def", "return", "class", "import", "hello", "there", "how", "are", "you", "(", ")", ":", "x", "y"]
    tok.train_from_iterator([" ".join(words)] * 3, trainers.WordLevelTrainer(special_tokens=["<unk>"]))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    json.loads(path.read_text())
    return path


def test_corpus_blocks_are_real_text_of_their_regime(tmp_path: Path, tokenizer_file: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "chat").mkdir()
    (tmp_path / "code" / "a.py").write_text("def x ( ) : return y\nclass x : import y\n" * 20)
    (tmp_path / "chat" / "a.txt").write_text("hello there how are you\n" * 20)
    encoder = TokenizerFile(tokenizer_file.parent)
    corpus = CorpusTokens.from_directory(tmp_path, encoder)
    assert corpus.kinds == ("chat", "code")
    code_ids = set(encoder.encode("def x ( ) : return y class x : import y"))
    chat_ids = set(encoder.encode("hello there how are you"))
    synth = PromptSynth(BS, corpus, seed=2)
    code = synth.prompt([1, 2], 2 * BS + 7, unique_key=0, kind="code")
    chat = synth.prompt([1, 2], 2 * BS + 7, unique_key=0, kind="chat")
    assert len(code) == len(chat) == 2 * BS + 7
    assert set(code) <= code_ids and set(chat) <= chat_ids
    other = synth.prompt([1, 3], 2 * BS, unique_key=1, kind="code")
    assert code[:BS] == other[:BS]
    assert synth.id != PromptSynth(BS, seed=2).id


def test_corpus_missing_regime_and_fallback(tokenizer_file: Path) -> None:
    encoder = TokenizerFile(tokenizer_file)
    corpus = CorpusTokens.from_texts({"chat": ["hello there"]}, encoder)
    assert corpus.missing(["chat", "tool"]) == ("tool",)
    with pytest.raises(TrafficError, match="tool"):
        PromptSynth(BS, corpus).prompt([1], BS, unique_key=0, kind="tool")
    fallback = CorpusTokens.from_token_ids({"chat": [5, 6, 7]}, fallback="chat")
    ids = PromptSynth(BS, fallback).prompt([1], BS + 3, unique_key=0, kind="tool")
    assert len(ids) == BS + 3 and set(ids) <= {5, 6, 7}
    with pytest.raises(TrafficError):
        CorpusTokens({"chat": []})
    with pytest.raises(ConfigError):
        CorpusTokens({"chat": [1]}, fallback="code")
    with pytest.raises(ConfigError):
        CorpusTokens.from_directory("/nonexistent-corpus", encoder)
    with pytest.raises(ConfigError):
        TokenizerFile("/nonexistent/tokenizer.json")


def test_block_cache_is_bounded() -> None:
    synth = PromptSynth(4, cache_blocks=8)
    first = synth.prompt([1], 4, unique_key=0)
    for h in range(100):
        synth.prompt([h + 2], 4, unique_key=0)
    assert len(synth._cache) == 8
    assert synth.prompt([1], 4, unique_key=0) == first
    assert np.asarray(first).dtype.kind == "i"
