"""The prior over what a technique truly does, and the sim-profile effects that make it so.

A technique of a generated space is a real SGLang flag (a switch or a backend choice the simulated server parses
and otherwise leaves alone) or an ``SGLANG_*`` environment toggle of a patched build. Its true effect is drawn from
``OUTCOMES`` and written as profile techniques (``runtime/sim/technique.py``):

- failures: crash at boot, at the first generation or under load; OOM outside the pool (a CUDA context or
  workspace bigger than the headroom the baseline leaves); a hang under load;
- silent: a flag accepted and ignored, or silently clamped to another value;
- quality: wrong answers always, wrong answers on prefix-cache hits (both tempting: they are also faster), or a
  draft whose acceptance collapses while the answers stay right;
- speed: a gain or loss by context (−70% … +40%), by concurrency (batch compute), by content regime, a TTFT-only
  effect (prefill), a no-op, a change within the noise;
- memory: a KV pool gain (static memory freed beside the weights; sometimes a little slower), a pool loss;
- stacking: a fast technique whose static memory drops the pool below the context target unless a memory
  technique frees room first (a pair: the memory one is drawn with it).

The outcome names are the generator's own bookkeeping; the benchmark scores every decision against the truth of
the configuration, never against these names.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

OUTCOMES: tuple[tuple[str, float], ...] = (
    ("crash-boot", 1.0), ("crash-first-generation", 0.6), ("crash-under-load", 0.6), ("oom-outside-pool", 0.8),
    ("hang", 0.5), ("ignored", 0.7), ("clamped", 0.4), ("wrong-answers", 0.6), ("wrong-on-cache-hit", 0.4),
    ("acceptance-collapse", 0.5), ("speed-gain", 2.0), ("speed-loss", 1.2), ("speed-by-context", 1.2),
    ("speed-by-concurrency", 0.8), ("speed-by-regime", 0.8), ("ttft-only", 0.6), ("no-op", 1.0),
    ("within-noise", 0.8), ("memory-gain", 1.2), ("memory-loss", 0.6), ("unlock-pair", 0.9),
)

#: switches the simulated server parses and otherwise ignores: a technique's effect is all in the profile
_SWITCHES = ("enable-fused-qk-norm-rope", "enable-torch-compile", "enable-two-batch-overlap",
             "enable-single-batch-overlap", "enable-dynamic-chunking", "enable-tf32-matmul", "enable-fp32-lm-head",
             "enable-hierarchical-cache", "enable-page-major-kv-layout", "enable-prefill-delayer",
             "enable-deterministic-inference", "enable-lean-attention", "enable-symm-mem", "enable-cudagraph-gc",
             "enable-nccl-nvls", "enable-layernorm-sp")
#: backend choices (flag, value the technique sets, another valid value a clamp falls back to)
_CHOICES = (("attention-backend", "triton", "flashinfer"), ("decode-attention-backend", "fa3", "flashinfer"),
            ("fp8-gemm-backend", "cutlass", "auto"), ("fp4-gemm-backend", "flashinfer_cudnn", "auto"),
            ("sampling-backend", "pytorch", "flashinfer"), ("grammar-backend", "llguidance", "xgrammar"),
            ("cuda-graph-backend-decode", "breakable", "full"), ("bf16-gemm-backend", "cutedsl", "auto"),
            ("mamba-backend", "flashinfer", "triton"), ("linear-attn-backend", "cutedsl", "triton"))
_ENV_WORDS = ("FAST", "FUSED", "SPLIT", "PINNED", "LAZY", "TILED", "PAGED", "ASYNC", "SKINNY", "HOT", "PACKED", "WIDE")
_ENV_NOUNS = ("ROPE", "GEMM", "ALLREDUCE", "SAMPLER", "KV", "DECODE", "PREFILL", "GRAPH", "HEAD", "NORM", "MOE", "SCAN")


@dataclass(frozen=True)
class Baseline:
    """What the outcomes need to know about the scenario's baseline boot (its memory plan) and space."""

    headroom_gb: float
    kv_tokens: int
    kv_gb: float
    kv_share: float            # the share of memory freed (or taken) beside the weights that the KV pool gets
    weights_gb: float
    context_target: int
    spec_on: bool
    hybrid: bool
    default_kv_dtype: str


@dataclass
class Carriers:
    """Flags and env names not yet used by a technique of this scenario."""

    rng: random.Random
    used: set[str] = field(default_factory=set)

    def switch(self) -> dict[str, Any]:
        free = [s for s in _SWITCHES if s not in self.used]
        name = self.rng.choice(free)
        self.used.add(name)
        return {"flags": {name: True}}

    def choice(self) -> tuple[str, str, str]:
        free = [c for c in _CHOICES if c[0] not in self.used]
        flag, value, fallback = self.rng.choice(free)
        self.used.add(flag)
        return flag, value, fallback

    def env(self) -> dict[str, Any]:
        while True:
            name = f"SGLANG_{self.rng.choice(_ENV_WORDS)}_{self.rng.choice(_ENV_NOUNS)}"
            if name not in self.used:
                self.used.add(name)
                return {"env": {name: "1"}}

    def any(self) -> dict[str, Any]:
        pick = self.rng.random()
        if pick < 0.4:
            return self.switch()
        if pick < 0.6:
            flag, value, _ = self.choice()
            return {"flags": {flag: value}}
        return self.env()


@dataclass(frozen=True)
class Drawn:
    """One drawn technique: the space's entries (name → YAML mapping) and the profile's true effects."""

    outcome: str
    space: dict[str, dict[str, Any]]
    profile: list[dict[str, Any]]


def draw_outcome(rng: random.Random, baseline: Baseline, exclude: Sequence[str] = ()) -> str:
    allowed = [(o, w) for o, w in OUTCOMES if o not in exclude
               and not (o == "acceptance-collapse" and not baseline.spec_on)]
    return rng.choices([o for o, _ in allowed], weights=[w for _, w in allowed])[0]


def draw_technique(rng: random.Random, outcome: str, name: str, baseline: Baseline, carriers: Carriers) -> Drawn:
    """The technique ``name`` with the true effect ``outcome``."""
    u = rng.uniform

    def one(kind: str, carrier: dict[str, Any], rationale: str, **effect: Any) -> Drawn:
        match = dict(carrier)
        if outcome == "acceptance-collapse":
            match["spec"] = True
        entry = {"kind": kind, "rationale": rationale, **carrier}
        return Drawn(outcome, {name: entry}, [{"name": name, "match": match, **effect, "note": outcome}])

    def crash(phase: str, kind: str, line: str) -> dict[str, Any]:
        return {"crash": {"phase": phase, "kind": kind, "lines": [
            "Scheduler hit an exception: Traceback (most recent call last):", line] if line else []}}

    if outcome == "crash-boot":
        return one("speed", carriers.any(), "an alternative kernel path",
                   **crash("boot", "technique_crash", "RuntimeError: this kernel requires SM100 (found sm_120)"))
    if outcome == "crash-first-generation":
        return one("speed", carriers.any(), "a fused decode path",
                   **crash("first_generation", "technique_crash",
                           "RuntimeError: CUDA error: an illegal memory access was encountered"))
    if outcome == "crash-under-load":
        return one("speed", carriers.any(), "an overlapped scheduler path",
                   **crash("under_load", "technique_crash", "AssertionError: batch size mismatch in overlap worker"))
    if outcome == "hang":
        return one("speed", carriers.any(), "an asynchronous transfer path", **crash("under_load", "hang", ""))
    if outcome == "oom-outside-pool":
        return one("speed", carriers.any(), "extra worker processes on the GPU",
                   outside_gb=round(max(0.3, baseline.headroom_gb) + u(0.3, 2.0), 2), decode=[[1000, 1.05]])
    if outcome in ("ignored", "clamped"):
        flag, value, fallback = carriers.choice()
        return one("speed", {"flags": {flag: value}}, f"--{flag} {value}", ignored=flag,
                   ignored_value=False if outcome == "ignored" else fallback)
    if outcome == "wrong-answers":
        return one("speed", carriers.any(), "a faster fused kernel", decode=[[1000, round(u(1.05, 1.3), 3)]],
                   quality_damage="wrong_answers: the fused kernel reads a stale scale")
    if outcome == "wrong-on-cache-hit":
        return one("speed", carriers.any(), "a faster prefix-cache restore", decode=[[1000, round(u(1.03, 1.15), 3)]],
                   quality_damage="on_cache_hit: a cached prefix is restored before its copy finishes")
    if outcome == "acceptance-collapse":
        return one("speed", carriers.any(), "a smaller draft head", draft_step_factor=round(u(0.3, 0.6), 2),
                   acceptance_factor=round(u(0.15, 0.4), 2),
                   quality_damage="draft_garbage: the sliced draft head guesses garbage")
    if outcome == "speed-gain":
        return one("speed", carriers.any(), "a faster kernel", decode=[[1000, round(u(1.03, 1.4), 3)]])
    if outcome == "speed-loss":
        return one("speed", carriers.any(), "a kernel tuned for another card", decode=[[1000, round(u(0.3, 0.95), 3)]])
    if outcome == "speed-by-context":
        short, long = round(u(0.95, 1.3), 3), round(u(0.3, 1.1), 3)
        return one("speed", carriers.any(), "a kernel that trades long-context speed for short",
                   decode=[[1000, short], [8000, round((short + long) / 2, 3)], [64000, long]],
                   prefill=[[1000, 1.0], [32000, round(u(0.5, 1.1), 3)]])
    if outcome == "speed-by-concurrency":
        return one("speed", carriers.any(), "a batched GEMM path", batch_compute_factor=round(u(0.4, 1.6), 2),
                   decode=[[1000, round(u(0.97, 1.03), 3)]])
    if outcome == "speed-by-regime":
        favoured = rng.sample(("chat", "code", "tool", "prose", "reasoning", "document"), 2)
        return one("speed", carriers.any(), "a sampling fast path for some content",
                   regime={favoured[0]: round(u(1.1, 1.4), 3), favoured[1]: round(u(0.7, 0.95), 3)})
    if outcome == "ttft-only":
        return one("speed", carriers.any(), "a prefill kernel", prefill=[[1000, round(u(0.4, 1.4), 3)]])
    if outcome == "no-op":
        return one("speed", carriers.any(), "a kernel option that changes nothing here", decode=[[1000, 1.0]])
    if outcome == "within-noise":
        return one("speed", carriers.any(), "a small scheduling tweak", decode=[[1000, round(u(0.985, 1.015), 4)]])
    if outcome == "memory-gain":
        freed = min(0.8 * baseline.weights_gb, baseline.kv_gb * u(0.1, 1.0))
        return one("memory", carriers.env(), "a smaller copy of a buffer held beside the weights",
                   static_gb=-round(freed, 2), decode=[[1000, round(u(0.96, 1.01), 3)]])
    if outcome == "memory-loss":
        return one("memory", carriers.any(), "checkpointed state in the radix cache",
                   kv_pool_factor=round(u(0.6, 0.95), 2))
    if outcome == "unlock-pair":
        return _unlock_pair(rng, name, baseline, carriers)
    raise ValueError(f"unknown outcome {outcome!r}")


def _unlock_pair(rng: random.Random, name: str, baseline: Baseline, carriers: Carriers) -> Drawn:
    """A fast technique that costs static memory (the pool drops below the target) and a memory one that frees it."""
    need = max(0.0, 1.0 - baseline.context_target / max(1, baseline.kv_tokens))     # share of the pool to spare
    drop = min(0.95, need + rng.uniform(0.1, 0.3))                                  # below the target alone
    static = round(baseline.kv_gb * drop / baseline.kv_share, 2)
    freed = min(0.8 * baseline.weights_gb,
                baseline.kv_gb * (drop - need + rng.uniform(0.1, 0.4)) / baseline.kv_share)   # room for both
    speed_carrier, memory_carrier = carriers.any(), carriers.env()
    fast, room = name, f"{name}-room"
    space = {fast: {"kind": "speed", "rationale": "a bigger fused graph that needs memory", **speed_carrier},
             room: {"kind": "memory", "rationale": "a compact KV layout that frees memory", **memory_carrier}}
    profile = [{"name": fast, "match": dict(speed_carrier), "static_gb": static,
                "decode": [[1000, round(rng.uniform(1.1, 1.35), 3)]], "note": "unlock-pair (speed)"},
               {"name": room, "match": dict(memory_carrier), "static_gb": -round(freed, 2),
                "decode": [[1000, round(rng.uniform(0.98, 1.01), 3)]], "note": "unlock-pair (memory)"}]
    return Drawn("unlock-pair", space, profile)
