"""What the simulated model says (``runtime/sim/answers.py``): retrieval, known questions at a skill level,
damage kinds read from the profiles, the host tier, image tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elsa_tune.errors import ConfigError
from elsa_tune.probes.quality import arithmetic_problems, final_integer, knowledge_file
from elsa_tune.probes.vision import image_part, png_data_url
from elsa_tune.runtime.sim.answers import (
    WRONG_ANSWER_SHARE,
    Answerer,
    Damage,
    DamageKind,
    HostTier,
    Knowledge,
    damage_kind,
    image_tokens,
)
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.runtime.sim.tokens import Completion, text_token_ids


def _key(text: str) -> int:
    return Completion.for_prompt(text_token_ids(text), text).key


def test_needles_are_retrieved_from_anywhere_in_the_prompt() -> None:
    filler = "The ferry counted seven copper bells. " * 400
    for at in (0, 200, 399):
        parts = filler.split(". ")
        parts.insert(at, "The access code for vault ember is 4471902")
        text = ". ".join(parts) + "\n\nWhat is the access code for vault ember? Reply with the number only."
        assert Answerer(accuracy=0.0).answer(text, _key(text)) == "4471902"   # retrieval is not the skill


def test_known_questions_are_answered_with_the_profile_accuracy() -> None:
    knowledge = Knowledge.load(knowledge_file())
    problems = arithmetic_problems()
    assert len(knowledge.answers) == len(problems)
    perfect, skilled = Answerer(knowledge, 1.0), Answerer(knowledge, 0.9)
    right = 0
    for p in problems:
        prompt = p["question"] + " End with 'The answer is N.'"
        key = _key(prompt)
        assert perfect.answer(prompt, key) == str(p["answer"])
        said = skilled.answer(prompt, key)
        assert said == skilled.answer(prompt, key)                     # deterministic per prompt
        right += final_integer(f"The answer is {said}.") == p["answer"]
    assert 0.75 * len(problems) <= right < len(problems)


def test_a_knowledge_file_that_is_not_question_answer_lines_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "k.jsonl"
    bad.write_text(json.dumps({"q": "what?"}) + "\n")
    with pytest.raises(ConfigError):
        Knowledge.load(bad)


@pytest.mark.parametrize(("text", "kind"), [
    ("draft_garbage: anything", DamageKind.DRAFT_GARBAGE),
    ("host_cache_hit: a race", DamageKind.HOST_CACHE_HIT),
    ("on_cache_hit: stale KV", DamageKind.ON_CACHE_HIT),
    ("wrong_answers: a kernel", DamageKind.WRONG_ANSWERS),
    ("draft guesses garbage", DamageKind.DRAFT_GARBAGE),            # older texts, by their words
    ("wrong answers from host cache hits", DamageKind.HOST_CACHE_HIT),
    ("wrong output", DamageKind.WRONG_ANSWERS),
])
def test_damage_kinds(text: str, kind: DamageKind) -> None:
    assert damage_kind(text) is kind


def test_damage_shares_by_kind() -> None:
    damage = Damage.of(["wrong_answers: x", "host_cache_hit: y", "draft_garbage: z"])
    assert damage.wrong_share == WRONG_ANSWER_SHARE and damage.host_hit_share == 1.0
    assert damage.cache_hit_share == 0.0 and damage.draft_garbage
    assert Damage.of([]) == Damage()


def test_the_seeds_damaged_techniques_carry_the_right_kind() -> None:
    profile = load_profile("rtx5090-qwen3.6-35b-a3b-nvfp4")
    kinds = {t.name: damage_kind(t.quality_damage) for t in profile.techniques if t.quality_damage}
    assert kinds == {"frspec-sliced-head": DamageKind.DRAFT_GARBAGE,          # seed 000
                     "shared-expert-fusion": DamageKind.WRONG_ANSWERS,        # seed 000
                     "hicache-host-hit-race": DamageKind.HOST_CACHE_HIT}      # seeds 001/002
    assert profile.model.is_vision and profile.model.image_max_tokens == 16384
    assert not [t for t in load_profile("rtx5090-qwen3.8-27b-nvfp4").techniques if t.quality_damage]


def test_the_host_tier_remembers_leading_blocks_until_flushed() -> None:
    tier = HostTier(capacity_blocks=4)
    assert tier.observe([1, 2, 3]) == 0
    assert tier.observe([1, 2, 9]) == 2
    assert tier.observe([5, 6]) == 0          # pushes the least recent blocks out
    assert tier.observe([1, 2]) == 0
    tier.clear()
    assert tier.observe([5, 6]) == 0


def test_image_tokens_follow_the_png_size_up_to_the_largest_image() -> None:
    assert image_tokens({"image_url": {"url": png_data_url(280, 56)}}, 16384) == 20
    assert image_tokens(image_part(), 16384) == 16384
    assert image_tokens(image_part(), 4096) == 4096
    assert image_tokens({"image_url": {"url": "https://example.invalid/cat.jpg"}}, 1024) == 1024
