"""The memory model against the simulator's real memory plan: it learns the pool from boots and skips safely."""

from __future__ import annotations

import random

import pytest

from elsa_tune.runtime.sim.memory import plan_memory
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.search_spaces.loader import load_space
from elsa_tune.tuner.flow.memory_model import MemoryModel, Observation, Prediction


@pytest.fixture(scope="module")
def observed() -> list[Observation]:
    """KV pools the simulated SGLang plans for random candidates of seed 004's space (what boots report)."""
    space = load_space("qwen3.8-27b-nvfp4-rtx5090")
    profile = load_profile("rtx5090-qwen3.8-27b-nvfp4")
    out = []
    for candidate in space.sample(random.Random(4), 40):
        plan = plan_memory(profile, candidate.flags, candidate.env)
        if plan.boot_failure is None and plan.kv_tokens > 0:
            out.append(Observation(candidate.flags, plan.kv_tokens, plan.max_running_requests))
    assert len(out) >= 20
    return out


def test_predicts_unseen_pools_better_than_their_mean(observed: list[Observation]) -> None:
    model = MemoryModel()
    for o in observed[:16]:
        model.add(o)
    unseen = observed[16:]
    errors = sorted(abs((model.predict(o.flags).kv_tokens or 0) - o.kv_tokens) for o in unseen)
    mean = sum(o.kv_tokens for o in observed[:16]) / 16
    naive = sorted(abs(mean - o.kv_tokens) for o in unseen)
    assert errors[len(errors) // 2] < 0.5 * naive[len(naive) // 2]
    loo = model.error()
    assert loo is not None and 0 < loo < 1.0   # it states its own (leave-one-out) error


def test_no_prediction_before_enough_boots(observed: list[Observation]) -> None:
    model = MemoryModel(min_points=4)
    for o in observed[:3]:
        model.add(o)
    prediction = model.predict(observed[5].flags)
    assert prediction.kv_tokens is None and not prediction.misses(10**9)   # no data, no skip


def test_a_seen_configuration_is_its_own_answer(observed: list[Observation]) -> None:
    model = MemoryModel()
    for o in observed[:8]:
        model.add(o)
    assert model.predict(observed[2].flags).kv_tokens == observed[2].kv_tokens


def test_skip_only_when_confidently_below_the_target() -> None:
    assert Prediction(50_000, 1, 0.05, 10).misses(63_000)          # 50K + 2 × 5% < 63K
    assert not Prediction(50_000, 1, 0.05, 10, error_tokens=8000).misses(63_000)   # ± 16K tokens: boot it
    assert not Prediction(60_000, 1, 0.05, 10).misses(63_000)      # within twice the error: boot it
    assert not Prediction(50_000, 1, None, 10).misses(63_000)      # unknown error: never skip
    assert not Prediction(50_000, 1, 0.05, 10).misses(None)


def test_slots_follow_a_seen_clamp() -> None:
    model = MemoryModel()
    flags = {"max-running-requests": 4, "max-mamba-cache-size": 16, "mem-fraction-static": 0.9}
    model.add(Observation(flags, 100_000, slots=2))
    assert model.predict(flags).slots == 2
    assert model.predict({**flags, "max-running-requests": 3}).slots == 3
