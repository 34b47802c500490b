"""The simulated SGLang's memory plan: auto defaults, silent clamps, failure texts, resolved server args."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from elsa_tune.errors import ConfigError
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.sglang_flags import sglang_flags
from elsa_tune.runtime.sim.memory import auto_chunked_prefill, auto_mem_fraction, plan_memory
from elsa_tune.runtime.sim.profile import list_profiles, load_profile

QWEN36 = "rtx5090-qwen3.6-35b-a3b-nvfp4"
QWEN38 = "rtx5090-qwen3.8-27b-nvfp4"


def test_every_shipped_profile_loads_and_its_configs_boot() -> None:
    names = list_profiles()
    assert {QWEN36, QWEN38, "tiny-test"} <= set(names)
    for name in names:
        profile = load_profile(name)
        assert profile.runtime_version == "0.5.23"
        assert profile.configs, name
        for config in profile.configs.values():
            plan = plan_memory(profile, config.flags, config.env)
            if config.name == "no-mtp-0.97":
                assert plan.first_generation_oom
                continue
            assert plan.boot_failure is None and not plan.first_generation_oom, (name, config.name)
            assert plan.kv_tokens > 0 and plan.max_running_requests > 0


def test_unknown_profile_names_the_shipped_ones() -> None:
    with pytest.raises(ConfigError) as info:
        load_profile("no-such-card")
    assert "tiny-test" in info.value.remedy


def test_profile_loads_from_a_path_with_card_and_model_beside_it(tmp_path: Path) -> None:
    shipped = Path(load_profile("tiny-test").source)
    for name in ("tiny-test.yaml", "card-tiny.yaml", "model-tiny-hybrid.yaml"):
        (tmp_path / name).write_text((shipped.parent / name).read_text().replace("memory_gb: 8.0", "memory_gb: 16.0"))
    profile = load_profile(tmp_path / "tiny-test.yaml")
    assert profile.card.memory_gb == 16.0
    assert plan_memory(profile, {}, {}).kv_tokens > plan_memory(load_profile("tiny-test"), {}, {}).kv_tokens


def test_auto_defaults_follow_gpu_memory() -> None:
    assert auto_chunked_prefill(31.84) == (4096, 48)
    assert auto_chunked_prefill(8.0) == (2048, 8)
    assert auto_chunked_prefill(139.8) == (8192, 256)
    # reserved = 512 + 1.5·4096 + 128 + 2·48 + 8·16 MiB out of 32,604 MiB
    assert auto_mem_fraction(31.84, 4096, 48) == round((31.84 * 1024 - 7008) / (31.84 * 1024), 3)
    plan = plan_memory(load_profile(QWEN36), {"moe-runner-backend": "cutlass"}, {})
    assert plan.chunked_prefill_size == 4096 and plan.max_prefill_tokens == 16384 and plan.page_size == 1
    assert plan.mem_fraction_static == auto_mem_fraction(31.84, 4096, 48)
    assert plan.context_len == 262144


def test_speculative_defaults_and_adjustments() -> None:
    profile = load_profile(QWEN36)
    plan = plan_memory(profile, {"moe-runner-backend": "cutlass", "speculative-algorithm": "EAGLE"}, {})
    assert (plan.spec.steps, plan.spec.topk, plan.spec.draft_tokens) == (3, 1, 4)
    assert any("reset to 48 for speculative decoding" in w for w in plan.warnings)
    odd = plan_memory(profile, {"moe-runner-backend": "cutlass", "speculative-algorithm": "EAGLE",
                                "speculative-num-steps": 5, "speculative-eagle-topk": 1,
                                "speculative-num-draft-tokens": 3}, {})
    assert odd.spec.draft_tokens == 6
    assert any("adjusted to speculative_num_steps + 1" in w for w in odd.warnings)
    assert odd.resolved_server_args["speculative_num_draft_tokens"] == 6
    adjusted = [a for a in odd.adjustments if a.flag == "speculative-num-draft-tokens"]
    assert adjusted and (adjusted[0].requested, adjusted[0].effective) == (3, 6)


def test_mixed_chunk_is_silently_ignored_with_speculative_decoding() -> None:
    # seed 004: "--enable-mixed-chunk silently ignored with spec decoding (server_args shows False)"
    profile = load_profile(QWEN38)
    tuned = profile.config("tuned")
    plan = plan_memory(profile, {**tuned.flags, "enable-mixed-chunk": True}, {})
    assert plan.boot_failure is None
    assert plan.resolved_server_args["enable_mixed_chunk"] is False
    ignored = [a for a in plan.adjustments if a.flag == "enable-mixed-chunk"]
    assert ignored and ignored[0].requested is True and ignored[0].effective is False
    no_spec = plan_memory(profile, {"enable-mixed-chunk": True, "mem-fraction-static": 0.9}, {})
    assert no_spec.resolved_server_args["enable_mixed_chunk"] is True
    assert not [a for a in no_spec.adjustments if a.flag == "enable-mixed-chunk"]


def test_resolved_server_args_cover_every_sglang_field() -> None:
    profile = load_profile(QWEN36)
    config = profile.config("elsa-1.7")
    args = plan_memory(profile, config.flags, config.env).resolved_server_args
    assert {spec.dest for spec in sglang_flags()} <= set(args)
    assert args["max_running_requests"] == 12 and args["max_mamba_cache_size"] == 48
    assert args["mem_fraction_static"] == 0.88 and args["mamba_radix_cache_strategy"] == "extra_buffer_lazy"
    assert args["speculative_num_steps"] == 5


def test_mamba_auto_strategy_resolves_silently() -> None:
    profile = load_profile(QWEN36)
    overlap = plan_memory(profile, {"moe-runner-backend": "cutlass", "mem-fraction-static": 0.88}, {})
    assert overlap.mamba_strategy == "extra_buffer" and overlap.slots_per_request == 5
    plain = plan_memory(profile, {"moe-runner-backend": "cutlass", "mem-fraction-static": 0.88,
                                  "disable-overlap-schedule": True}, {})
    assert plain.mamba_strategy == "no_buffer" and plain.slots_per_request == 3
    assert plain.resolved_server_args["disable_overlap_schedule"] is True


def test_kv_and_state_dtypes_change_the_pool() -> None:
    profile = load_profile(QWEN36)
    base = {"moe-runner-backend": "cutlass", "mem-fraction-static": 0.88, "max-mamba-cache-size": 40}
    fp8 = plan_memory(profile, base, {})
    bf16 = plan_memory(profile, {**base, "kv-cache-dtype": "bf16"}, {})
    assert math.isclose(fp8.kv_tokens / bf16.kv_tokens, 2.0, rel_tol=0.01)
    small_state = plan_memory(profile, {**base, "mamba-ssm-dtype": "bfloat16"}, {})
    assert small_state.mamba_gb < fp8.mamba_gb and small_state.kv_tokens > fp8.kv_tokens


def test_weights_larger_than_the_card_fail_at_load() -> None:
    profile = load_profile("tiny-test")
    heavy = dataclasses.replace(profile, card=dataclasses.replace(profile.card, memory_gb=2.0))
    plan = plan_memory(heavy, {}, {})
    assert plan.boot_failure is not None and plan.boot_failure.kind is FailureKind.WEIGHTS_OOM
    assert "torch.OutOfMemoryError: CUDA out of memory" in plan.boot_failure.lines[-1]


def test_fraction_too_small_for_the_weights() -> None:
    plan = plan_memory(load_profile(QWEN38), {"mem-fraction-static": 0.5}, {})
    assert plan.boot_failure is not None and plan.boot_failure.kind is FailureKind.NO_ROOM_FOR_KV
    assert plan.boot_failure.lines[-1].startswith(
        "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.5.")


def test_fraction_leaving_no_kv_pool_prints_sglangs_text() -> None:
    profile = load_profile(QWEN38)
    plan = plan_memory(profile, {**profile.config("tuned").flags, "mem-fraction-static": 0.8}, {})
    assert plan.boot_failure is not None and plan.boot_failure.kind is FailureKind.NO_ROOM_FOR_KV
    assert plan.boot_failure.lines[-1] == ("RuntimeError: Not enough memory. Please try to increase "
                                           "--mem-fraction-static. Current value: mem_fraction_static=0.8")


def test_mamba_pool_too_small() -> None:
    profile = load_profile(QWEN36)
    base = {"moe-runner-backend": "cutlass", "mem-fraction-static": 0.88}
    tiny_ratio = plan_memory(profile, {**base, "mamba-full-memory-ratio": 0.001}, {})
    assert tiny_ratio.boot_failure is not None
    assert tiny_ratio.boot_failure.kind is FailureKind.MAMBA_POOL_TOO_SMALL
    assert "Not enough GPU memory for hybrid (mamba/linear-attention) state cache" in tiny_ratio.boot_failure.lines[-1]
    few_slots = plan_memory(profile, {**base, "max-mamba-cache-size": 3}, {})
    assert few_slots.boot_failure is not None
    assert "too small to serve any requests" in few_slots.boot_failure.lines[-1]


def test_max_total_tokens_caps_the_pool_and_warns_when_too_large() -> None:
    profile = load_profile("tiny-test")
    small = profile.config("small").flags
    capped = plan_memory(profile, {**small, "max-total-tokens": 4096}, {})
    assert capped.kv_tokens == 4096
    huge = plan_memory(profile, {**small, "max-total-tokens": 10**9}, {})
    assert any("is larger than the profiled value" in w for w in huge.warnings)
    assert [a.effective for a in huge.adjustments if a.flag == "max-total-tokens"] == [huge.kv_tokens]


def test_kv_capacity_reduces_requested_running_requests() -> None:
    profile = load_profile("tiny-test")
    plan = plan_memory(profile, {**profile.config("small").flags, "max-total-tokens": 6, "max-running-requests": 4,
                                 "max-mamba-cache-size": 40}, {})
    assert plan.max_running_requests == 3
    assert any("reduced from the requested 4 to 3" in a.evidence for a in plan.adjustments)


def test_technique_boot_crash_and_extra_memory() -> None:
    profile = load_profile(QWEN38)
    tuned = profile.config("tuned").flags
    hicache = plan_memory(profile, {**tuned, "enable-hierarchical-cache": True}, {})
    assert hicache.boot_failure is not None and hicache.boot_failure.technique == "hicache"
    assert "'HybridLinearKVPool' object has no attribute 'layer_num'" in hicache.boot_failure.lines[-1]
    # seed 004: "--tokenizer-worker-num 4: ~890 MB VRAM per worker -> OOM" (outside the pool: first generation)
    workers = plan_memory(profile, {**tuned, "tokenizer-worker-num": 4}, {})
    assert workers.boot_failure is None and workers.first_generation_oom
    int8 = plan_memory(profile, {**tuned, "enable-int8-mamba-checkpoint": True}, {})
    base = plan_memory(profile, tuned, {})
    assert math.isclose(int8.kv_tokens / base.kv_tokens, 0.8, abs_tol=0.01)


def test_elsa_tokenizer_context_goes_to_headroom_not_pool() -> None:
    # seed 000: "That memory went to headroom rather than pool"
    profile = load_profile(QWEN36)
    config = profile.config("elsa-part-one")
    env = dict(config.env)
    with_gpu_tokenizer = plan_memory(profile, config.flags, {k: v for k, v in env.items()
                                                             if k != "ELSA_CPU_TOKENIZER"})
    cpu_tokenizer = plan_memory(profile, config.flags, env)
    assert cpu_tokenizer.kv_tokens == with_gpu_tokenizer.kv_tokens
    assert math.isclose(cpu_tokenizer.headroom_gb - with_gpu_tokenizer.headroom_gb, 0.63, abs_tol=1e-6)
    assert cpu_tokenizer.gpu_used_bytes < with_gpu_tokenizer.gpu_used_bytes


def test_plan_numbers_add_up() -> None:
    profile = load_profile(QWEN36)
    config = profile.config("elsa-1.7")
    plan = plan_memory(profile, config.flags, config.env)
    pools = plan.weights_gb + plan.draft_weights_gb + plan.draft_buffers_gb + plan.mamba_gb + plan.kv_gb
    assert math.isclose(plan.avail_after_pools_gb, plan.pre_load_gb - pools, rel_tol=1e-9)
    assert math.isclose(plan.static_gb, plan.mem_fraction_static * plan.pre_load_gb)
    assert pools <= plan.static_gb + 1e-6
    assert 0 < plan.gpu_used_bytes <= plan.total_gb * (1 << 30)
    assert plan.kv_gb == pytest.approx(plan.kv_tokens * plan.kv_bytes_per_token / (1 << 30))
