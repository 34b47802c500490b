"""The seed spaces' baselines are the seeds' configurations: the simulated runtime (calibrated on the seeds'
tables) boots them and gives the KV pools and running slots the seeds printed."""

from __future__ import annotations

import pytest

from elsa_tune.runtime.sim.memory import plan_memory
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.search_spaces import load_space


@pytest.mark.parametrize(("space_name", "profile", "values", "kv_tokens", "requests"), [
    # seed 004: "max_total_num_tokens 134016" with one request and 8 Mamba slots
    ("qwen3.8-27b-nvfp4-rtx5090", "rtx5090-qwen3.8-27b-nvfp4", {}, 134_016, 1),
    # seed 001: 8 / 12 / 16 running requests -> 411K / 355K / 299K KV tokens
    ("qwen3.6-35b-a3b-nvfp4-rtx5090", "rtx5090-qwen3.6-35b-a3b-nvfp4", {"max-running-requests": 8}, 411_000, 8),
    ("qwen3.6-35b-a3b-nvfp4-rtx5090", "rtx5090-qwen3.6-35b-a3b-nvfp4", {}, 355_000, 12),
    ("qwen3.6-35b-a3b-nvfp4-rtx5090", "rtx5090-qwen3.6-35b-a3b-nvfp4", {"max-running-requests": 16}, 299_000, 16),
])
def test_seed_baselines_reproduce_the_seed_pools(space_name: str, profile: str, values: dict[str, int],
                                                  kv_tokens: int, requests: int) -> None:
    space = load_space(space_name)
    candidate = space.candidate(values)
    plan = plan_memory(load_profile(profile), candidate.flags, candidate.env)
    assert plan.boots and plan.serve_crash is None and not plan.first_generation_oom
    assert plan.max_running_requests == requests, "the Mamba slots must not clamp the requested slots"
    assert plan.adjustments == ()
    assert abs(plan.kv_tokens - kv_tokens) / kv_tokens < 0.03
    assert space.guardrails.min_context_tokens is not None
    assert plan.kv_tokens >= space.guardrails.min_context_tokens
