"""The simulated SGLang's memory plan: SGLang 0.5.23's accounting for a described card and model.

The order follows ``mem_cache/kv_cache_configurator.py``: the scheduler measures free memory before loading
(``pre_load``), the static pool is ``mem_fraction_static × pre_load``; weights, the speculative draft (weights,
buffers, a private vocabulary copy unless shared), the Mamba/GDN state pool and the KV pool are carved out of
it in that order; CUDA graphs and the generation workspace live in what the fraction leaves outside. SGLang's
traps fall out of it: ``max_running_requests`` silently clamped by Mamba slots ÷ slots per request, a fraction
so high that the server boots and dies on its first generation (0.97 without MTP on a 32 GB card), pools too
small to start, flags accepted and silently ignored.

All sizes are GiB, the unit SGLang prints as "GB".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elsa_tune.runtime.boot_report import Adjustment
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.sglang_flags import flag_by_name, resolve_defaults
from elsa_tune.runtime.sim.profile import GIB, SimProfile
from elsa_tune.search_spaces.candidate import FlagValue

SCHEMA_VERSION = 1
SPEC_DEFAULT_MAX_RUNNING = 48
_SPEC_ALGORITHMS = {"EAGLE", "EAGLE3", "NEXTN", "MTP", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO"}


@dataclass(frozen=True)
class SimCrash:
    """A simulated death: the failure kind, when it happens and SGLang's exact log lines."""

    kind: FailureKind
    phase: str                         # "boot", "first_generation" or "under_load"
    lines: tuple[str, ...]
    technique: str | None = None


@dataclass(frozen=True)
class SpecSettings:
    """Resolved speculative decoding: algorithm, steps, topk, draft tokens (``None`` algorithm: off)."""

    algorithm: str | None = None
    steps: int = 0
    topk: int = 1
    draft_tokens: int = 0

    @property
    def on(self) -> bool:
        return self.algorithm is not None


@dataclass(frozen=True)
class MemoryPlan:
    """What a boot under these flags allocates, what SGLang prints about it, and whether it survives.

    ``kv_tokens`` is ``max_total_num_tokens``; ``max_running_requests`` is the effective per-DP value after the
    Mamba and KV clamps; ``available_gpu_mem_gb`` is the scheduler summary's value; ``headroom_gb`` is what is
    free while serving once the generation workspace and out-of-pool costs are taken.
    """

    total_gb: float
    pre_load_gb: float
    mem_fraction_static: float
    static_gb: float
    weights_gb: float
    draft_weights_gb: float
    draft_buffers_gb: float
    mamba_slots: int
    mamba_gb: float
    mamba_state_gb: float
    mamba_intermediate_gb: float
    slots_per_request: int
    kv_tokens: int
    kv_gb: float
    kv_dtype: str
    kv_bytes_per_token: int
    cuda_graph_gb: float
    cuda_graph_max_bs: int
    workspace_gb: float
    outside_gb: float
    avail_after_load_gb: float
    avail_after_pools_gb: float
    available_gpu_mem_gb: float
    headroom_gb: float
    requested_max_running_requests: int | None
    max_running_requests: int
    context_len: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    page_size: int
    spec: SpecSettings
    mamba_strategy: str
    techniques: tuple[str, ...]
    adjustments: tuple[Adjustment, ...] = ()
    warnings: tuple[str, ...] = ()
    boot_failure: SimCrash | None = None
    first_generation_oom: bool = False
    serve_crash: SimCrash | None = None
    quality_damage: tuple[str, ...] = ()
    resolved_server_args: Mapping[str, Any] = field(default_factory=dict)
    gpu_used_bytes: int = 0
    schema_version: int = SCHEMA_VERSION

    @property
    def boots(self) -> bool:
        return self.boot_failure is None


# ---- flag reading ----------------------------------------------------------------------------------------


def flag_text(flags: Mapping[str, FlagValue], name: str) -> str | None:
    value = flags.get(name)
    if value is None or value is False:
        return None
    return str(value)


def flag_int(flags: Mapping[str, FlagValue], name: str) -> int | None:
    text = flag_text(flags, name)
    return None if text is None else int(float(text))


def flag_float(flags: Mapping[str, FlagValue], name: str) -> float | None:
    text = flag_text(flags, name)
    return None if text is None else float(text)


def flag_on(flags: Mapping[str, FlagValue], name: str) -> bool:
    value = flags.get(name)
    return value is True or (isinstance(value, str) and value.lower() in ("1", "true"))


def resolve_spec(profile: SimProfile, flags: Mapping[str, FlagValue]) -> tuple[SpecSettings, list[str]]:
    """SGLang's speculative resolution: auto (steps, topk, tokens) and topk 1 forcing tokens = steps + 1."""
    algorithm = flag_text(flags, "speculative-algorithm")
    if algorithm is None:
        return SpecSettings(), []
    algorithm = algorithm.upper()
    warnings: list[str] = []
    steps, topk, tokens = (flag_int(flags, n) for n in ("speculative-num-steps", "speculative-eagle-topk",
                                                        "speculative-num-draft-tokens"))
    if steps is None and topk is None and tokens is None:
        draft = profile.model.draft
        steps, topk, tokens = draft.default_steps if draft else (3, 1, 4)
    steps = 3 if steps is None else steps
    topk = 1 if topk is None else topk
    if topk == 1 and tokens != steps + 1:
        if tokens is not None:
            warnings.append("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                            "speculative_eagle_topk == 1")
        tokens = steps + 1
    tokens = steps + 1 if tokens is None else tokens
    return SpecSettings(algorithm=algorithm, steps=steps, topk=topk, draft_tokens=tokens), warnings


def auto_chunked_prefill(total_gb: float) -> tuple[int, int]:
    """``handle_gpu_memory_settings``: (chunked_prefill_size, decode CUDA-graph max bs) by GPU memory, tp 1."""
    gib = total_gb
    if gib < 20:
        return 2048, 8
    if gib < 35:
        return 4096, 48
    if gib < 60:
        return 4096, 32
    if gib < 160:
        return 8192, 256
    return 16384, 512


def auto_mem_fraction(total_gb: float, chunked: int, max_bs: int) -> float:
    """SGLang's default ``mem_fraction_static``: ``(gpu_mem − reserved) / gpu_mem`` rounded to 3 digits."""
    mib = total_gb * 1024
    reserved = 512 + 1.5 * max(chunked, 2048) + 1024 / 8 + 2 * max_bs + 8 * 16
    return round((mib - reserved) / mib, 3)


# ---- the plan --------------------------------------------------------------------------------------------


def plan_memory(profile: SimProfile, flags: Mapping[str, FlagValue], env: Mapping[str, str]) -> MemoryPlan:
    """The memory plan of one boot of ``profile`` under ``flags`` (SGLang's names, no dashes) and ``env``."""
    return _Planner(profile, {**profile.base_flags, **flags}, env).plan()


class _Planner:
    def __init__(self, profile: SimProfile, flags: Mapping[str, FlagValue], env: Mapping[str, str]) -> None:
        self.profile = profile
        self.card = profile.card
        self.model = profile.model
        self.flags = flags
        self.env = env
        self.spec, self.warnings = resolve_spec(profile, flags)
        self.techniques = profile.active_techniques(flags, env, self.spec.on)
        self.adjustments: list[Adjustment] = []
        self.crash: SimCrash | None = None
        asked = flag_int(flags, "speculative-num-draft-tokens")
        if self.spec.on and asked is not None and asked != self.spec.draft_tokens:
            self.adjustments.append(Adjustment("speculative-num-draft-tokens", asked, self.spec.draft_tokens,
                                               self.warnings[-1], "topk 1 forces steps + 1"))

    # each step may set self.crash; later steps still run so a failed plan still reports what it could size
    def plan(self) -> MemoryPlan:
        f, m, card = self.flags, self.model, self.card
        total = card.memory_gb
        auto_chunk, auto_bs = auto_chunked_prefill(total)
        chunked = flag_int(f, "chunked-prefill-size") or auto_chunk
        page = flag_int(f, "page-size") or 1
        requested = flag_int(f, "max-running-requests")
        requested = None if requested is None else max(1, requested)   # SGLang: max(1, value // dp)
        max_bs = flag_int(f, "cuda-graph-max-bs-decode") or auto_bs
        if flag_int(f, "cuda-graph-max-bs-decode") is None and requested is not None:
            max_bs = min(max_bs, requested)
        fraction = flag_float(f, "mem-fraction-static") or auto_mem_fraction(total, chunked, max_bs)
        context_len = flag_int(f, "context-length") or m.context_length

        overhead = (card.context_overhead_gb + self.profile.memory_rules.runtime_overhead_gb
                    + sum(t.context_overhead_gb for t in self.techniques))
        pre_load = total - overhead
        weights = m.total_weights_gb + sum(t.static_gb for t in self.techniques)
        static = fraction * pre_load
        if weights > pre_load:
            self._fail(FailureKind.WEIGHTS_OOM, [
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity "
                f"of {total:.2f} GiB of which {max(0.0, pre_load - m.total_weights_gb * 0.95):.2f} GiB is free."])
        draft_weights, draft_buffers = self._draft()
        rest = static - weights
        if rest <= 0:
            minimum = (weights + draft_weights + draft_buffers) / pre_load
            self._fail(FailureKind.NO_ROOM_FOR_KV, [
                f"ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static="
                f"{fraction}. Raise --mem-fraction-static above {weights / pre_load:.3f} (minimum viable = "
                f"{minimum:.3f})."])
        rest -= draft_weights + draft_buffers

        spr = self._slots_per_request()
        r_req = requested if requested is not None else (SPEC_DEFAULT_MAX_RUNNING if self.spec.on else None)
        if requested is None and self.spec.on and self.spec.algorithm != "NGRAM":
            self.warnings.append("Max running requests is reset to 48 for speculative decoding. You can override "
                                 "this by explicitly setting --max-running-requests.")
        slots, state_gb, inter_gb, auto_sized = self._mamba(rest, spr, r_req)
        mamba_gb = state_gb + inter_gb
        rest_kv = rest - mamba_gb

        kv_dtype = flag_text(f, "kv-cache-dtype") or "auto"
        b = m.kv_bytes(kv_dtype) + (m.draft.kv_bytes_per_token if self.spec.on and m.draft else 0)
        kv_factor = math.prod(t.kv_pool_factor for t in self.techniques)
        kv_tokens = max(0, int(rest_kv * GIB * kv_factor / b)) // page * page
        user_cap = flag_int(f, "max-total-tokens")
        if user_cap is not None:
            if user_cap > kv_tokens:
                line = (f"max_total_tokens={user_cap} is larger than the profiled value {kv_tokens}. "
                        "Use the profiled value instead.")
                self.warnings.append(line)
                self.adjustments.append(Adjustment("max-total-tokens", user_cap, kv_tokens, line,
                                                   "larger than the memory allows"))
            kv_tokens = min(kv_tokens, user_cap)
        if kv_tokens <= 0 and self.crash is None:
            self._fail(FailureKind.NO_ROOM_FOR_KV, [
                "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                f"Current value: mem_fraction_static={fraction}"])
        kv_gb = kv_tokens * b / GIB

        running = self._max_running(kv_tokens, context_len, requested, r_req, slots, spr, auto_sized)
        if kv_tokens and kv_tokens < context_len:
            self.warnings.append(f"KV pool holds {kv_tokens} tokens, fewer than --context-length {context_len}. "
                                 "One full-length request cannot fit, ...")

        disabled_graphs = flag_on(f, "disable-cuda-graph") or flag_on(f, "disable-decode-cuda-graph")
        graph_gb = 0.0 if disabled_graphs else m.cuda_graph_gb * (1.0 + 0.004 * max_bs) * (
            1.0 + 0.15 * self.spec.draft_tokens / 4 if self.spec.on else 1.0)
        avail_after_load = pre_load - weights - draft_weights
        avail_after_pools = pre_load - (weights + draft_weights + draft_buffers + mamba_gb + kv_gb)
        available = avail_after_pools - graph_gb
        outside = self.profile.memory_rules.tokenizer_context_gb + sum(t.outside_gb for t in self.techniques)
        workspace = m.generation_workspace_gb
        if self.spec.on and m.draft is not None:
            workspace = max(0.1 * workspace, workspace - m.draft.buffers_gb * 0.2)
        # a technique may shrink the generation's temporaries (negative outside), never below half of them
        headroom = available - max(-workspace / 2, outside) - workspace
        if available < 0 and self.crash is None:
            self._fail(FailureKind.CUDA_GRAPH_FAILED, [
                "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 256.00 MiB.",
                "Possible solutions:",
                "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
                "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)",
                "3. disable decode CUDA graph by --disable-decode-cuda-graph"])
        first_gen_oom = self.crash is None and headroom < 0
        serve_crash = None
        if first_gen_oom:
            serve_crash = SimCrash(FailureKind.OOM_UNDER_LOAD, "first_generation", (
                "Scheduler hit an exception: Traceback (most recent call last):",
                "RuntimeError: Triton Error [CUDA]: out of memory"))
        self._technique_crashes()
        serve_crash = serve_crash or self._serve_crash()
        self._ignored_flags()

        used = total - max(0.0, headroom) if self.crash is None else overhead
        return MemoryPlan(
            total_gb=total, pre_load_gb=pre_load, mem_fraction_static=fraction, static_gb=static,
            weights_gb=weights, draft_weights_gb=draft_weights, draft_buffers_gb=draft_buffers,
            mamba_slots=slots, mamba_gb=mamba_gb, mamba_state_gb=state_gb, mamba_intermediate_gb=inter_gb,
            slots_per_request=spr, kv_tokens=kv_tokens, kv_gb=kv_gb,
            kv_dtype=m.default_kv_dtype if kv_dtype == "auto" else kv_dtype, kv_bytes_per_token=b,
            cuda_graph_gb=graph_gb, cuda_graph_max_bs=max_bs, workspace_gb=workspace, outside_gb=outside,
            avail_after_load_gb=avail_after_load, avail_after_pools_gb=avail_after_pools,
            available_gpu_mem_gb=available, headroom_gb=headroom, requested_max_running_requests=requested,
            max_running_requests=running, context_len=context_len, chunked_prefill_size=chunked,
            max_prefill_tokens=flag_int(f, "max-prefill-tokens") or 16384, page_size=page, spec=self.spec,
            mamba_strategy=self._strategy(page), techniques=tuple(t.name for t in self.techniques),
            adjustments=tuple(self.adjustments), warnings=tuple(self.warnings), boot_failure=self.crash,
            first_generation_oom=first_gen_oom, serve_crash=serve_crash,
            quality_damage=tuple(t.quality_damage for t in self.techniques if t.quality_damage),
            resolved_server_args=self._resolved(fraction, chunked, page, running, context_len, slots),
            gpu_used_bytes=int(used * GIB))

    def _fail(self, kind: FailureKind, lines: list[str], technique: str | None = None) -> None:
        if self.crash is None:
            self.crash = SimCrash(kind, "boot", ("Scheduler hit an exception: Traceback (most recent call last):",
                                                 *lines), technique)

    def _draft(self) -> tuple[float, float]:
        draft = self.model.draft
        if not self.spec.on or draft is None or self.spec.algorithm == "NGRAM":
            return 0.0, 0.0
        weights = draft.weights_gb * math.prod(t.draft_weights_factor for t in self.techniques)
        shared = any(t.share_draft_vocab for t in self.techniques)
        # buffers scale with the draft tokens verified per step (logits, hidden states); calibrated at 6
        buffers = draft.buffers_gb * (0.7 + 0.05 * self.spec.draft_tokens)
        return weights, buffers + (0.0 if shared else draft.private_vocab_gb)

    def _strategy(self, page: int) -> str:
        if not self.model.is_hybrid:
            return "none"
        if flag_on(self.flags, "disable-radix-cache"):
            return "disabled"
        strategy = flag_text(self.flags, "mamba-radix-cache-strategy") or "auto"
        if strategy == "auto":
            overlap = not flag_on(self.flags, "disable-overlap-schedule")
            return "extra_buffer" if (overlap or page > 1) else "no_buffer"
        return strategy

    def _slots_per_request(self) -> int:
        """``_calculate_mamba_ratio``, plus the draft's own slots where the build keeps them (MTP: 4 + 4)."""
        if not self.model.is_hybrid:
            return 1
        strategy = self._strategy(flag_int(self.flags, "page-size") or 1)
        overlap = not flag_on(self.flags, "disable-overlap-schedule")
        if strategy == "disabled":
            base = 1
        elif strategy == "extra_buffer":
            base = 3 + (2 if overlap else 1)
        elif strategy == "extra_buffer_lazy":
            base = 4
        else:
            base = 3
        draft = self.model.draft
        if self.spec.on and draft is not None and self.profile.memory_rules.draft_state_slots:
            base += draft.state_slots_per_request
        return base

    def _mamba(self, rest: float, spr: int, r_req: int | None) -> tuple[int, float, float, bool]:
        """(slots, state GiB, speculative intermediate GiB, auto-sized) per ``kv_cache_configurator``."""
        if not self.model.is_hybrid:
            return 0, 0.0, 0.0, False
        s = self.model.state_bytes_per_slot(flag_text(self.flags, "mamba-ssm-dtype")) / GIB
        replay = flag_on(self.flags, "enable-linear-replayssm-spec")
        d = self.spec.draft_tokens if self.spec.on and not replay and self.spec.algorithm != "NGRAM" else 0
        explicit = flag_int(self.flags, "max-mamba-cache-size")
        ratio = flag_float(self.flags, "mamba-full-memory-ratio")
        ratio = 0.9 if ratio is None else ratio
        requests = r_req if r_req is not None else 10**6
        auto_sized = explicit is None
        if explicit is not None:
            k = explicit
            capped = min(max(1, requests), k // spr)
        else:
            budget = max(0.0, rest) * ratio / (1.0 + ratio)
            rules = self.profile.memory_rules
            if rules.mamba_ratio_solver == "carve" and d:
                capped = max(1, min(requests, int(budget / (s * (spr + d)))))
                k = int((budget - s * (capped + 1) * d) / s) - 1
            elif d:
                k = int((budget - s * (1 + d)) // (s * (1 + d / spr)))
                capped = min(requests, max(0, k) // spr)
            else:
                k = int((budget - s) // s)
                capped = 0
            if rules.auto_mamba_slots_max is not None:
                k = min(k, rules.auto_mamba_slots_max)
            if k <= 0:
                self._fail(FailureKind.MAMBA_POOL_TOO_SMALL, [
                    "RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
                    f"max_mamba_cache_size={k} (total_rest_memory={rest:.2f} GB, mamba_cache_per_req="
                    f"{s * 1024:.2f} MB). Try: (1) reduce --max-running-requests, (2) increase "
                    "--mem-fraction-static, (3) reduce --speculative-num-draft-tokens, or (4) use GPUs with more "
                    "memory."])
                k = 0
        inter = s * (capped + 1) * d if d else 0.0
        if replay and self.spec.on:
            inter = 0.02 * (min(requests, max(1, k // spr)) + 1)
        return k, (k + 1) * s, inter, auto_sized

    def _max_running(self, kv_tokens: int, context_len: int, requested: int | None, r_req: int | None,
                     slots: int, spr: int, auto_sized: bool) -> int:
        """``resolve_max_num_reqs``: the KV estimate, the user's value, the Mamba clamp, with their warnings."""
        estimated = max(min(int(kv_tokens / max(1, context_len) * 512), 4096), 2048)
        running = min(r_req, kv_tokens // 2) if r_req is not None else min(estimated, kv_tokens // 2)
        capped = False
        if self.model.is_hybrid:
            cap = slots // spr
            if auto_sized and self.profile.memory_rules.mamba_ratio_solver == "carve":
                cap = max(1, cap)   # the carve build admits one request whatever the pool
            if cap < running:
                capped = True
                line = (f"max_running_requests is capped to {cap} by the mamba state cache (max_mamba_cache_size="
                        f"{slots}, {spr} state slots per request). To raise it: increase --mamba-full-memory-ratio "
                        "or --max-mamba-cache-size, or halve the state size with --mamba-ssm-dtype bfloat16.")
                self.warnings.append(line)
                if requested is not None:
                    self.adjustments.append(Adjustment("max-running-requests", requested, cap, line,
                                                       "clamped by Mamba state slots"))
            running = min(running, cap)
            if running <= 0 and self.crash is None:
                self._fail(FailureKind.MAMBA_POOL_TOO_SMALL, [
                    "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
                    f"max_mamba_cache_size={slots}, mamba_ratio={spr}, resulting max_num_reqs={running}. Try: (1) "
                    "reduce --max-running-requests, (2) increase --mem-fraction-static, or (3) use GPUs with more "
                    "memory."])
        if requested is not None and running < requested and not capped and kv_tokens > 0:
            line = (f"max_running_requests was reduced from the requested {requested} to {running} (per dp worker) "
                    "due to the available KV cache capacity.")
            self.warnings.append(line)
            self.adjustments.append(Adjustment("max-running-requests", requested, running, line,
                                               "reduced by KV capacity"))
        return max(0, running)

    def _technique_crashes(self) -> None:
        for t in self.techniques:
            if t.crash is not None and t.crash.phase == "boot" and self.crash is None:
                self.crash = SimCrash(t.crash.kind, "boot", t.crash.lines, t.name)

    def _serve_crash(self) -> SimCrash | None:
        for t in self.techniques:
            if t.crash is not None and t.crash.phase != "boot":
                return SimCrash(t.crash.kind, t.crash.phase, t.crash.lines, t.name)
        return None

    def _ignored_flags(self) -> None:
        for t in self.techniques:
            if t.ignored is None:
                continue
            requested = self.flags.get(t.ignored)
            line = f"server_args: {t.ignored.replace('-', '_')}={t.ignored_value!r}"
            if self.spec.on and t.ignored == "enable-mixed-chunk":
                line = (f"Mixed chunked prefill is disabled because of using {self.spec.algorithm.lower()} "
                        "speculative decoding.") if self.spec.algorithm else line
            self.adjustments.append(Adjustment(t.ignored, requested, t.ignored_value, line,
                                               t.note or "accepted and silently ignored"))

    def _resolved(self, fraction: float, chunked: int, page: int, running: int, context_len: int,
                  slots: int) -> dict[str, Any]:
        given: dict[str, Any] = {}
        for name, value in self.flags.items():
            spec = flag_by_name(name)
            if spec is not None and value is not None and value is not False:
                given[spec.dest] = value
        resolved: dict[str, Any] = dict(resolve_defaults(given))
        resolved.update(mem_fraction_static=fraction, chunked_prefill_size=chunked, page_size=page,
                        max_running_requests=running, context_length=context_len)
        if self.model.is_hybrid:
            resolved["max_mamba_cache_size"] = slots
            resolved["mamba_radix_cache_strategy"] = self._strategy(page)
            if resolved["mamba_radix_cache_strategy"] == "no_buffer":
                resolved["disable_overlap_schedule"] = True
        if self.spec.on:
            resolved.update(speculative_algorithm=self.spec.algorithm, speculative_num_steps=self.spec.steps,
                            speculative_eagle_topk=self.spec.topk,
                            speculative_num_draft_tokens=self.spec.draft_tokens)
        for t in self.techniques:
            if t.ignored is not None:
                resolved[t.ignored.replace("-", "_")] = t.ignored_value
        return resolved

