"""Plausible cards and models for generated scenarios, drawn from priors, as the sim's card/model YAML mappings.

Cards: 16–192 GB (log-uniform), bandwidth and tensor throughput that grow with the card, a default power of
150–1,000 W and sometimes a lower cap. Models: dense, MoE or hybrid (linear attention + a few full-attention
layers, some MoE), quantised NVFP4/FP8/BF16, weights taking 25–60% of the card; KV bytes per token from the
full-attention geometry, a recurrent state per slot for hybrids, step costs from the active parameters and the
card's throughput (the same roofline shape as the shipped profiles); half of them carry an MTP draft head whose
acceptance differs by content regime. Every number is made up; none describes a real product.
"""

from __future__ import annotations

import math
import random
from typing import Any

GIB = float(1 << 30)
_BYTES_PER_PARAM = {"nvfp4": 0.56, "fp8": 1.05, "bf16": 2.0}
REGIMES = ("chat", "code", "tool", "prose", "reasoning", "document")


def draw_card(rng: random.Random, name: str) -> dict[str, Any]:
    memory = round(math.exp(rng.uniform(math.log(16), math.log(192))), 2)
    default_w = float(round(rng.uniform(150, 1000), -1))
    limit = default_w if rng.random() < 0.6 else max(150.0, float(round(default_w * rng.uniform(0.5, 0.9), -1)))
    bf16 = round(default_w * rng.uniform(0.2, 0.5), 1)
    return {"schema_version": 1, "name": name, "memory_gb": memory,
            "bandwidth_gbs": float(round(min(8000.0, (250 + 38 * memory) * rng.uniform(0.6, 1.2)))),
            "bf16_tflops": bf16, "fp8_tflops": round(2 * bf16, 1), "fp4_tflops": round(4 * bf16, 1),
            "power_limit_w": limit, "default_power_w": default_w,
            "context_overhead_gb": round(rng.uniform(0.3, 0.8), 2), "power_exponent": round(rng.uniform(0.4, 0.7), 2),
            "decode_power_exponent": round(rng.uniform(0.1, 0.3), 2), "sm": "sm120",
            "uuid": f"GPU-5ce0a210-0000-4000-8000-{rng.randrange(16 ** 12):012x}"}


def draw_model(rng: random.Random, name: str, card: dict[str, Any]) -> dict[str, Any]:
    """A model that fits ``card``: kind, quantisation, geometry, step costs and (half the time) a draft head."""
    kind = rng.choice(("dense", "moe", "hybrid"))
    hybrid = kind == "hybrid"
    moe = kind == "moe" or (hybrid and rng.random() < 0.4)
    quant = rng.choice(("nvfp4", "fp8", "bf16"))
    weights_gb = round(card["memory_gb"] * rng.uniform(0.25, 0.6), 2)
    params_b = weights_gb * GIB / 1e9 / _BYTES_PER_PARAM[quant]
    layers = rng.choice((24, 32, 40, 48, 64, 80))
    full = layers if not hybrid else layers // 4
    kv_heads = rng.choice((2, 4, 8))
    head_dim = rng.choice((128, 256))
    hidden = rng.choice((2048, 4096, 5120, 7168))
    kv_bf16 = full * kv_heads * head_dim * 2 * 2
    moe_fraction = round(rng.uniform(0.7, 0.85), 3) if moe else 0.0
    experts, active = (rng.choice((64, 128, 256)), rng.choice((4, 8))) if moe else (0, 0)
    active_b = params_b * ((1 - moe_fraction) + moe_fraction * active / experts) if moe else params_b
    tflops = {"nvfp4": card["fp4_tflops"], "fp8": card["fp8_tflops"], "bf16": card["bf16_tflops"]}[quant]
    per_token = 2 * active_b * 1e9 / (tflops * 1e12)
    model: dict[str, Any] = {
        "schema_version": 1, "name": name, "served_name": name, "vocab_size": rng.choice((32000, 151936, 248320)),
        "hidden_size": hidden, "num_layers": layers, "full_attention_layers": full,
        "linear_attention_layers": layers - full if hybrid else 0,
        "context_length": rng.choice((65536, 131072, 262144)), "is_hybrid": hybrid, "is_vision": False,
        "accuracy": round(rng.uniform(0.9, 0.97), 2), "active_params_b": round(active_b, 2),
        "weights_gb": {"body": round(weights_gb * 0.93, 3), "embed_lm_head": round(weights_gb * 0.07, 3)},
        "kv_bytes_per_token": {"bf16": kv_bf16, "fp8_e4m3": kv_bf16 // 2, "nvfp4": int(kv_bf16 * 0.27)},
        "default_kv_dtype": rng.choice(("bf16", "bf16", "fp8_e4m3")),
        "ssm_bytes_per_slot": {}, "conv_bytes_per_slot": 0, "default_ssm_dtype": "bfloat16",
        "decode_bytes_per_step": float(f"{weights_gb * GIB * (1 - moe_fraction):.4g}"),
        "decode_fixed_s": round(rng.uniform(0.0008, 0.003), 5),
        "attention_read_efficiency": round(rng.uniform(0.3, 0.7), 2),
        "batch_compute_s_per_token": float(f"{per_token / rng.uniform(0.3, 0.5):.3g}"),
        "verify_s_per_token": float(f"{per_token * rng.uniform(0.1, 0.6):.3g}"),
        "verify_attention_factor": round(rng.uniform(0.05, 0.8), 2),
        "prefill_s_per_token": float(f"{per_token / rng.uniform(0.4, 0.6):.3g}"),
        "prefill_s_per_token_ctx": float(f"{4 * full * hidden / (tflops * 1e12 * rng.uniform(0.2, 0.4)):.3g}"),
        "prefill_chunk_overhead_s": round(rng.uniform(0.002, 0.01), 4),
        "generation_workspace_gb": round(min(3.0, 0.3 + 0.01 * card["memory_gb"] * rng.uniform(0.5, 1.5)), 2),
        "cuda_graph_gb": round(rng.uniform(0.1, 0.4), 2),
    }
    if moe:
        model.update(moe_experts=experts, moe_active=active, moe_bytes_fraction=moe_fraction)
    if hybrid:
        heads = rng.choice((16, 32, 48))
        ssm = (layers - full) * heads * 128 * 128 * 4
        model.update(ssm_bytes_per_slot={"float32": ssm, "bfloat16": ssm // 2},
                     conv_bytes_per_slot=(layers - full) * hidden * 3 * 2 * 2,
                     default_ssm_dtype=rng.choice(("bfloat16", "float32")))
    if rng.random() < 0.5:
        base = rng.uniform(0.35, 0.8)
        acceptance = {r: round(min(0.92, max(0.1, base + rng.uniform(-0.3, 0.2))), 2) for r in REGIMES}
        acceptance["default"] = round(base, 2)
        draft_bytes = weights_gb * rng.uniform(0.02, 0.05)
        model["draft"] = {"weights_gb": round(draft_bytes, 3), "buffers_gb": round(rng.uniform(0.2, 1.2), 2),
                          "private_vocab_gb": 0.0, "kv_bytes_per_token": 0, "state_slots_per_request": 0,
                          "step_s": float(f"{draft_bytes * GIB / (card['bandwidth_gbs'] * 1e9) + 2e-4:.3g}"),
                          "step_s_per_token": float(f"{per_token * 0.05:.3g}"), "default_steps": [3, 1, 4],
                          "acceptance": acceptance, "prefill_workspace_gb_per_100k": 0.0}
    return model
