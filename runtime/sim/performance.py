"""Step times of the simulated SGLang: a roofline of the card for decode, verify, drafting and chunked prefill.

Decode is bandwidth-bound: one target forward reads the weights it touches (a MoE touches more experts as the
batch grows), the Mamba/GDN state of every running request, and the KV cache of every cached token (at an
attention efficiency well below the card's bandwidth), plus a per-token compute term and a fixed launch cost.
With speculative decoding a step is one verify forward over ``draft_tokens`` tokens per request (its attention
over the context costs more per extra token) plus ``steps`` draft forwards; it emits the accepted tokens, whose
mean depends on the content regime and the draft depth. Prefill is compute-bound and chunked by
``chunked_prefill_size``: a linear term, a quadratic attention term and a per-chunk cost. A power cap below the
card's default slows compute-bound work more than decode. Techniques multiply step times by context and regime.

Calibrated against published measurements on the profiled cards (``tests/runtime/test_sim_calibration.py``);
not a hardware measurement.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from elsa_tune.runtime.sim.memory import MemoryPlan
from elsa_tune.runtime.sim.profile import GIB, SimProfile
from elsa_tune.runtime.sim.technique import TechniqueEffect
from elsa_tune.search_spaces.candidate import FlagValue


class PerformanceModel:
    """Step times and speculative acceptance for one boot (a profile under a memory plan and its flags)."""

    def __init__(self, profile: SimProfile, plan: MemoryPlan, flags: Mapping[str, FlagValue] | None = None,
                 env: Mapping[str, str] | None = None, *, power_limit_w: float | None = None) -> None:
        self.profile = profile
        self.plan = plan
        self.model = profile.model
        self.card = profile.card
        self.flags = {**profile.base_flags, **(flags or {})}
        self.env = dict(env or {})
        self.spec = plan.spec
        self.techniques: tuple[TechniqueEffect, ...] = tuple(
            t for t in profile.techniques if t.name in set(plan.techniques))
        decode_power = self.card.power_factor(decode=True, power_limit_w=power_limit_w)
        self.compute_power = self.card.power_factor(decode=False, power_limit_w=power_limit_w)
        self.bandwidth = self.card.bandwidth_gbs * 1e9 * decode_power
        m = self.model
        self.kv_read_s = plan.kv_bytes_per_token / (self.bandwidth * m.attention_read_efficiency)
        self.state_s = (m.state_bytes_per_slot(_ssm_dtype(self.flags)) / self.bandwidth) if m.is_hybrid else 0.0
        self.expert_bytes = m.total_weights_gb * GIB * m.moe_bytes_fraction
        self.acceptance_factor: float = math.prod(t.acceptance_factor for t in self.techniques)
        self.draft_factor: float = math.prod(t.draft_step_factor for t in self.techniques)
        self.batch_factor: float = math.prod(t.batch_compute_factor for t in self.techniques)
        self.uses_draft = self.spec.on and m.draft is not None and self.spec.algorithm != "NGRAM"

    # ---- decode ------------------------------------------------------------------------------------------

    def forward_s(self, batch: int, tokens_per_request: int, contexts: Sequence[int]) -> float:
        """One target forward over ``batch`` requests of ``tokens_per_request`` query tokens each."""
        m = self.model
        tokens = batch * tokens_per_request
        weights = m.decode_bytes_per_step
        if m.moe_experts:
            touched = 1.0 - (1.0 - m.moe_active / m.moe_experts) ** tokens
            weights += self.expert_bytes * touched
        attention_factor = 1.0 + m.verify_attention_factor * (tokens_per_request - 1)
        kv = sum(contexts) * self.kv_read_s * attention_factor
        compute = (batch * m.batch_compute_s_per_token + batch * max(0, tokens_per_request - 1)
                   * m.verify_s_per_token) * self.batch_factor / self.compute_power
        return float(m.decode_fixed_s + weights / self.bandwidth + kv + batch * self.state_s + compute)

    def draft_step_s(self, batch: int, contexts: Sequence[int]) -> float:
        """One draft forward (the MTP/EAGLE head) for the batch."""
        draft = self.model.draft
        if draft is None:
            return 0.0
        kv = sum(contexts) * self.kv_read_s / max(1, self.model.full_attention_layers)
        per_request = batch * draft.step_s_per_token * self.batch_factor
        return float((draft.step_s + per_request) * self.draft_factor + kv)

    def decode_step_s(self, batch: int, context_tokens: Sequence[int] | int) -> float:
        """Seconds of one decode step of the running batch (spec: draft steps + one verify)."""
        if batch <= 0:
            return 0.0
        contexts = _contexts(batch, context_tokens)
        if self.uses_draft:
            step = self.forward_s(batch, self.spec.draft_tokens, contexts)
            step += self.spec.steps * self.draft_step_s(batch, contexts)
        else:
            step = self.forward_s(batch, 1, contexts)
        mean_ctx = sum(contexts) / len(contexts)
        return step / self._decode_multiplier(mean_ctx)

    def _decode_multiplier(self, context: float) -> float:
        return float(math.prod(t.decode_multiplier(context) for t in self.techniques))

    def regime_multiplier(self, regime: str) -> float:
        """Throughput multiplier a technique has on one content regime (e.g. a sampling fast path)."""
        return float(math.prod(float(t.regime.get(regime, t.regime.get("default", 1.0))) for t in self.techniques))

    # ---- speculative acceptance ------------------------------------------------------------------------

    def accept_length(self, regime: str) -> float:
        """Mean tokens emitted per step for a request of ``regime`` (1.0 without speculative decoding)."""
        draft = self.model.draft
        if not self.uses_draft or draft is None:
            return 1.0
        p = min(0.999, draft.acceptance_p(regime) * self.acceptance_factor)
        steps = self.spec.steps
        base = (1.0 - p ** (steps + 1)) / (1.0 - p)
        base *= 1.0 + draft.topk_bonus * math.log2(max(1, self.spec.topk))
        return float(min(float(self.spec.draft_tokens), base))

    def sample_accepted(self, regime: str, rng: random.Random) -> int:
        """Tokens one request emits in one step: a draft chain accepted token by token, plus the bonus token."""
        draft = self.model.draft
        if not self.uses_draft or draft is None:
            return 1
        p = min(0.999, draft.acceptance_p(regime) * self.acceptance_factor)
        accepted = 1
        for _ in range(self.spec.steps):
            if rng.random() >= p:
                break
            accepted += 1
        return accepted

    def decode_tokens_per_s(self, batch: int, context_tokens: Sequence[int] | int, regime: str) -> float:
        """Aggregate output tokens/s of a steady batch (mean acceptance), the truth's closed-form view."""
        step = self.decode_step_s(batch, context_tokens)
        return batch * self.accept_length(regime) * self.regime_multiplier(regime) / step

    # ---- prefill -----------------------------------------------------------------------------------------

    def chunk_s(self, chunk_tokens: int, context_before: int) -> float:
        """One prefill chunk of ``chunk_tokens`` new tokens after ``context_before`` tokens already in KV."""
        m = self.model
        if chunk_tokens <= 0:
            return 0.0
        attention = chunk_tokens * (context_before + chunk_tokens / 2.0) * m.prefill_s_per_token_ctx
        if self.uses_draft:
            attention *= 1.0 + 1.0 / max(1, m.full_attention_layers)   # the draft layer reads the prompt too
        linear = chunk_tokens * m.prefill_s_per_token
        seconds = m.prefill_chunk_overhead_s + (linear + attention) / self.compute_power
        return float(seconds / self._prefill_multiplier(context_before + chunk_tokens))

    def prefill_s(self, new_tokens: int, cached_tokens: int = 0, context_tokens: int | None = None) -> float:
        """Seconds to prefill ``new_tokens`` after ``cached_tokens`` (a prefix-cache hit), chunk by chunk."""
        del context_tokens  # the context is cached + new; kept for the API's symmetry with decode
        chunk = self.plan.chunked_prefill_size if self.plan.chunked_prefill_size > 0 else max(1, new_tokens)
        done, seconds = 0, 0.0
        while done < new_tokens:
            size = min(chunk, new_tokens - done)
            seconds += self.chunk_s(size, cached_tokens + done)
            done += size
        return seconds

    def _prefill_multiplier(self, context: float) -> float:
        return float(math.prod(t.prefill_multiplier(context) for t in self.techniques))


def _contexts(batch: int, context_tokens: Sequence[int] | int) -> Sequence[int]:
    if isinstance(context_tokens, int):
        return [context_tokens] * batch
    return context_tokens


def _ssm_dtype(flags: Mapping[str, FlagValue]) -> str | None:
    value = flags.get("mamba-ssm-dtype")
    return None if value is None or value is False else str(value)
