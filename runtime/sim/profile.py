"""Sim profiles: what a card, a model and the techniques on top of them truly do, as data.

A profile file (``runtime/sim/profiles/<name>.yaml``) names a card file (``card-<card>.yaml``) and a model
file (``model-<model>.yaml``) and adds the techniques' true effects, the noise and the runtime version, so a
new card is one new YAML. Every number carries its provenance in the YAML's comments (which seed, which
table). ``load_profile`` takes a profile name or a path; ``list_profiles`` lists the shipped ones.

A profile file's keys::

    name, card, model, runtime_version
    memory_rules: {mamba_ratio_solver, auto_mamba_slots_max, runtime_overhead_gb, tokenizer_context_gb,
                   draft_state_slots, cached_state_sets_max}            # how this build accounts (MemoryRules)
    noise: {boot_sigma, run_sigma, first_pass_slowdown, warm_requests, correlation_s, seed}
    base_flags: {flag: value}                  # applied under every launch (the user's flags win)
    techniques: [{name, match: {flags: {...}, env: {...}, spec: bool}, decode: [[ctx, x]], prefill: [[ctx, x]],
                  regime: {...}, static_gb, outside_gb, kv_pool_factor, crash: {phase, kind, lines}, ignored,
                  ignored_value, quality_damage, note, ...}]            # see technique.py
    configs: {name: {extends, flags, env, note}}                      # named launch configurations

A match value is compared as text (``true`` = set to anything but 0/false, ``false`` = absent) or with
``{gte: x}``/``{lte: x}``. The card and model files hold ``CardProfile``/``ModelProfile`` fields.

The figures describe what the simulated SGLang does; they are calibrated against published measurements on
the profiled cards and are never a measurement of real hardware.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from elsa_tune.errors import ConfigError
from elsa_tune.runtime.sim.technique import TechniqueEffect, technique_from_yaml
from elsa_tune.search_spaces.candidate import FlagValue

SCHEMA_VERSION = 1
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
_CARD_PREFIX = "card-"
_MODEL_PREFIX = "model-"
GIB = float(1 << 30)


@dataclass(frozen=True)
class CardProfile:
    """A GPU as the simulator sees it. ``memory_gb`` is the total SGLang reads (GiB, ``torch.cuda`` units).

    ``context_overhead_gb`` is what the CUDA contexts and runtime hold before the scheduler measures free memory.
    Compute scales with ``(power_limit_w / default_power_w) ** power_exponent`` (prefill is compute-bound, so
    a power cap costs it most), decode scales with it raised to ``decode_power_exponent``.
    """

    name: str
    memory_gb: float
    bandwidth_gbs: float
    bf16_tflops: float
    fp8_tflops: float
    fp4_tflops: float
    power_limit_w: float
    default_power_w: float
    context_overhead_gb: float = 0.2
    power_exponent: float = 0.5
    decode_power_exponent: float = 0.1
    sm: str = "sm120"
    uuid: str = ""

    def power_factor(self, *, decode: bool, power_limit_w: float | None = None) -> float:
        """Speed factor of a power cap relative to the card's default (1.0 at the default)."""
        limit = self.power_limit_w if power_limit_w is None else power_limit_w
        ratio = max(0.05, min(1.0, limit / self.default_power_w))
        return float(ratio ** (self.decode_power_exponent if decode else self.power_exponent))


@dataclass(frozen=True)
class DraftProfile:
    """A model's built-in draft head (MTP / EAGLE): memory it takes and what one draft step costs.

    ``private_vocab_gb`` is the embedding + output-head copy a stock runtime keeps for the draft (~2 GB for a 248K
    vocabulary) until a technique shares them. ``acceptance`` is the per-token acceptance probability of a chain
    draft by content regime; the mean accepted length of a topk-1 chain of ``k`` steps is ``(1 - p**(k+1)) / (1 - p)``
    (the bonus token included). ``prefill_workspace_gb_per_100k`` is what the draft needs outside the pools while
    the prompt is read (the target's hidden states it consumes), per 100K tokens of context.
    """

    weights_gb: float
    buffers_gb: float
    private_vocab_gb: float = 0.0
    kv_bytes_per_token: int = 0
    state_slots_per_request: int = 0
    step_s: float = 0.001
    step_s_per_token: float = 0.0
    default_steps: tuple[int, int, int] = (3, 1, 4)
    acceptance: Mapping[str, float] = field(default_factory=dict)
    topk_bonus: float = 0.04
    prefill_workspace_gb_per_100k: float = 0.0

    def accept_length(self, regime: str, steps: int, topk: int = 1) -> float:
        """Mean accepted tokens per verify step (bonus included) for a chain of ``steps`` draft tokens."""
        p = self.acceptance_p(regime)
        if steps <= 0:
            return 1.0
        base = float(steps + 1) if p >= 1.0 else (1.0 - p ** (steps + 1)) / (1.0 - p)
        # a wider tree (topk > 1) keeps a few more tokens, with diminishing returns
        return base * (1.0 + self.topk_bonus * math.log2(max(1, topk)))

    def acceptance_p(self, regime: str) -> float:
        if regime in self.acceptance:
            return float(self.acceptance[regime])
        if "default" in self.acceptance:
            return float(self.acceptance["default"])
        raise ConfigError(f"no speculative acceptance for regime {regime!r}",
                          remedy="add the regime (or a 'default') under draft.acceptance in the model YAML")


@dataclass(frozen=True)
class ModelProfile:
    """A model checkpoint as the simulator needs it: memory per component, KV and state sizes, step costs.

    ``kv_bytes_per_token`` is keyed by KV dtype (``fp8_e4m3``, ``bf16``, …; ``auto`` names the default).
    ``ssm_bytes_per_slot`` is keyed by Mamba SSM dtype (``float32``, ``bfloat16``); ``conv_bytes_per_slot`` is
    the convolution window. Decode: ``decode_bytes_per_step`` are the weight bytes one forward reads at batch 1;
    MoE models touch more experts as the batch grows (``moe_experts``/``moe_active``/``moe_bytes_fraction``).
    Long context costs ``kv_bytes_per_token / (bandwidth · attention_read_efficiency)`` per cached token.
    Prefill: ``prefill_s_per_token`` (linear part at the card's default power) plus a quadratic attention term
    ``prefill_s_per_token_ctx`` per token per context token.
    """

    name: str
    served_name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    full_attention_layers: int
    linear_attention_layers: int
    context_length: int
    weights_gb: Mapping[str, float]
    kv_bytes_per_token: Mapping[str, int]
    default_kv_dtype: str
    ssm_bytes_per_slot: Mapping[str, int]
    conv_bytes_per_slot: int
    default_ssm_dtype: str
    decode_bytes_per_step: float
    decode_fixed_s: float
    attention_read_efficiency: float
    prefill_s_per_token: float
    prefill_s_per_token_ctx: float
    prefill_chunk_overhead_s: float
    verify_s_per_token: float
    verify_attention_factor: float
    batch_compute_s_per_token: float
    generation_workspace_gb: float
    cuda_graph_gb: float
    draft: DraftProfile | None = None
    moe_experts: int = 0
    moe_active: int = 0
    moe_bytes_fraction: float = 0.0
    is_hybrid: bool = False
    is_vision: bool = False
    active_params_b: float = 0.0
    accuracy: float = 1.0                # share of known questions answered right (answers.py; a skill, no reasoning)
    image_max_tokens: int = 16384        # tokens of the largest image the vision encoder takes
    image_workspace_gb: float = 0.0      # vision-encoder temporaries for the largest image, outside the pools

    @property
    def total_weights_gb(self) -> float:
        return float(sum(self.weights_gb.values()))

    def kv_bytes(self, dtype: str) -> int:
        name = self.default_kv_dtype if dtype in ("auto", "") else _KV_ALIASES.get(dtype, dtype)
        if name not in self.kv_bytes_per_token:
            raise ConfigError(f"model {self.name} has no KV size for kv-cache-dtype {dtype!r}",
                              remedy=f"use one of {sorted(self.kv_bytes_per_token)}")
        return int(self.kv_bytes_per_token[name])

    def state_bytes_per_slot(self, ssm_dtype: str | None) -> int:
        """One Mamba/GDN state slot (SSM + convolution window), 0 for a model with no linear attention."""
        if not self.is_hybrid:
            return 0
        name = ssm_dtype or self.default_ssm_dtype
        name = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16", "float16": "bfloat16"}.get(name, name)
        if name not in self.ssm_bytes_per_slot:
            raise ConfigError(f"model {self.name} has no SSM state size for dtype {name!r}",
                              remedy=f"use one of {sorted(self.ssm_bytes_per_slot)}")
        return int(self.ssm_bytes_per_slot[name]) + self.conv_bytes_per_slot


_KV_ALIASES = {"bfloat16": "bf16", "fp8_e5m2": "fp8_e4m3", "mxfp8": "fp8_e4m3", "fp4_mx_block16": "nvfp4"}


NOISE_FAMILIES = ("lognormal", "t3", "contaminated", "drift_linear", "drift_step")


@dataclass(frozen=True)
class NoiseProfile:
    """Noise as real servers show it: boot drift, run noise, a slow first pass after boot, and the seed.

    ``family`` shapes the boot drift (``noise.boot_drift``): ``lognormal`` (``exp(N(0, boot_sigma))``), ``t3`` (a
    Student t with 3 degrees of freedom scaled to ``boot_sigma``: rare large drifts), ``contaminated`` (lognormal,
    and a ``contamination`` share of boots ``contamination_slowdown`` slower), ``drift_linear`` (lognormal on top of
    a slowdown growing by ``drift_per_hour`` per hour of the study) and ``drift_step`` (lognormal, every boot after
    ``step_at_s`` seconds of the study ``step_size`` slower).
    """

    boot_sigma: float = 0.10
    run_sigma: float = 0.03
    first_pass_slowdown: float = 0.127
    warm_requests: int = 16
    correlation_s: float = 5.0
    seed: int = 0
    family: str = "lognormal"
    contamination: float = 0.1
    contamination_slowdown: float = 0.25
    drift_per_hour: float = 0.02
    step_at_s: float = 4 * 3600.0
    step_size: float = 0.10

    def __post_init__(self) -> None:
        if self.family not in NOISE_FAMILIES:
            raise ValueError(f"noise family {self.family!r} is not one of {', '.join(NOISE_FAMILIES)}")


@dataclass(frozen=True)
class MemoryRules:
    """How this runtime build does its memory accounting where builds differ.

    ``mamba_ratio_solver``: ``joint`` is SGLang 0.5.23's ``--mamba-full-memory-ratio`` solve (state slots and
    the speculative intermediate caches for ``slots/ratio`` requests share the Mamba budget, the unused part
    returns to KV); ``carve`` sizes the intermediate caches for the admitted requests first and gives the rest of
    the Mamba budget to slots (as measured pools across ratios show). ``auto_mamba_slots_max`` caps an auto-sized
    pool. ``tokenizer_context_gb`` is the CUDA context the HTTP/tokenizer process takes from the headroom after the
    pools are sized (~630 MB when it imports GPU libraries). ``runtime_overhead_gb`` is what the build allocates
    before the scheduler measures free memory (workspaces, communicators), on top of the card's CUDA context.
    ``cached_state_sets_max`` caps how many cached prompts keep a reusable recurrent state whatever the spare slots
    (a hybrid model's two alternating contexts can lose their prefix under every memory configuration).
    """

    mamba_ratio_solver: str = "joint"
    auto_mamba_slots_max: int | None = None
    runtime_overhead_gb: float = 0.0
    tokenizer_context_gb: float = 0.0
    draft_state_slots: bool = True
    cached_state_sets_max: int | None = None


@dataclass(frozen=True)
class NamedConfig:
    """A launch configuration a seed describes (e.g. ``stock``, ``elsa-1.7``): flags and env, with its source."""

    name: str
    flags: Mapping[str, FlagValue]
    env: Mapping[str, str]
    note: str = ""


@dataclass(frozen=True)
class SimProfile:
    """Everything the simulated SGLang needs: card, model, techniques, noise and the runtime version it mimics."""

    name: str
    card: CardProfile
    model: ModelProfile
    techniques: tuple[TechniqueEffect, ...] = ()
    noise: NoiseProfile = NoiseProfile()
    memory_rules: MemoryRules = MemoryRules()
    runtime_version: str = "0.5.23"
    base_flags: Mapping[str, FlagValue] = field(default_factory=dict)
    configs: Mapping[str, NamedConfig] = field(default_factory=dict)
    source: str = ""
    schema_version: int = SCHEMA_VERSION

    def config(self, name: str) -> NamedConfig:
        """A named launch configuration of this profile (``ConfigError`` naming the known ones)."""
        if name not in self.configs:
            raise ConfigError(f"profile {self.name} has no config {name!r}",
                              remedy=f"use one of: {', '.join(sorted(self.configs)) or '(none)'}")
        return self.configs[name]

    def active_techniques(self, flags: Mapping[str, FlagValue], env: Mapping[str, str],
                          spec_on: bool) -> tuple[TechniqueEffect, ...]:
        """The techniques whose conditions all hold for this launch."""
        return tuple(t for t in self.techniques if t.matches(flags, env, spec_on))


# ---- loading ---------------------------------------------------------------------------------------------


def list_profiles(directory: Path = PROFILES_DIR) -> list[str]:
    """Names of the shipped profiles (card and model files are not profiles)."""
    return sorted(p.stem for p in directory.glob("*.yaml")
                  if not p.stem.startswith((_CARD_PREFIX, _MODEL_PREFIX)))


def load_profile(name_or_path: str | Path) -> SimProfile:
    """Load a profile by shipped name (``rtx5090-qwen3.8-27b-nvfp4``) or by path to a YAML file.

    Card and model files are looked up beside the profile file, then among the shipped ones.
    """
    path = _resolve(name_or_path)
    data = _read(path)
    try:
        card = _card(_read(_sibling(path, _CARD_PREFIX, str(data["card"]))))
        model = _model(_read(_sibling(path, _MODEL_PREFIX, str(data["model"]))))
        techniques = tuple(technique_from_yaml(t) for t in data.get("techniques") or ())
        noise = NoiseProfile(**(data.get("noise") or {}))
        rules = MemoryRules(**(data.get("memory_rules") or {}))
        return SimProfile(name=str(data.get("name", path.stem)), card=card, model=model, techniques=techniques,
                          noise=noise, memory_rules=rules, runtime_version=str(data.get("runtime_version", "0.5.23")),
                          base_flags=MappingProxyType(dict(data.get("base_flags") or {})),
                          configs=MappingProxyType(_configs(data.get("configs") or {})), source=str(path))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"sim profile {path}: {exc!r}",
                          remedy="compare the file with a shipped profile in runtime/sim/profiles/") from exc


def _configs(data: Mapping[str, Any]) -> dict[str, NamedConfig]:
    """Named configs; ``extends: other`` starts from another config's flags and env."""
    out: dict[str, NamedConfig] = {}

    def build(name: str, seen: tuple[str, ...] = ()) -> NamedConfig:
        if name in out:
            return out[name]
        if name in seen or name not in data:
            raise ValueError(f"config {name!r} is unknown or extends itself")
        raw = data[name] or {}
        flags: dict[str, FlagValue] = {}
        env: dict[str, str] = {}
        if raw.get("extends"):
            parent = build(str(raw["extends"]), (*seen, name))
            flags.update(parent.flags)
            env.update(parent.env)
        for key, value in (raw.get("flags") or {}).items():
            if value is None:
                flags.pop(key, None)
            else:
                flags[str(key)] = value
        env.update({str(k): str(v) for k, v in (raw.get("env") or {}).items()})
        out[name] = NamedConfig(name, MappingProxyType(flags), MappingProxyType(env), str(raw.get("note", "")))
        return out[name]

    for name in data:
        build(str(name))
    return out


def _resolve(name_or_path: str | Path) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return candidate
    shipped = PROFILES_DIR / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    raise ConfigError(f"no sim profile {str(name_or_path)!r}",
                      remedy=f"use a path to a YAML file or one of: {', '.join(list_profiles())}")


def _sibling(profile_path: Path, prefix: str, name: str) -> Path:
    for directory in (profile_path.parent, PROFILES_DIR):
        candidate = directory / f"{prefix}{name}.yaml"
        if candidate.is_file():
            return candidate
    raise ConfigError(f"sim profile {profile_path}: no {prefix}{name}.yaml",
                      remedy=f"put {prefix}{name}.yaml beside the profile or in {PROFILES_DIR}")


def _read(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read sim profile {path}: {exc}", remedy="fix the YAML syntax") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"sim profile {path} is not a mapping", remedy="see a shipped profile for the layout")
    return data


def _numbers(data: Mapping[str, Any], text_fields: tuple[str, ...]) -> dict[str, Any]:
    """YAML 1.1 reads ``19.96e9`` (no exponent sign) as text: take such scalars as numbers."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, str) and key not in text_fields:
            with contextlib.suppress(ValueError):
                value = float(value)
        out[key] = value
    return out


def _card(data: Mapping[str, Any]) -> CardProfile:
    fields = _numbers(data, ("name", "sm", "uuid"))
    return CardProfile(**{k: v for k, v in fields.items() if k != "schema_version"})


def _model(data: Mapping[str, Any]) -> ModelProfile:
    fields = {k: v for k, v in _numbers(data, ("name", "served_name", "default_kv_dtype", "default_ssm_dtype")).items()
              if k not in ("schema_version", "draft")}
    for key in ("weights_gb", "kv_bytes_per_token", "ssm_bytes_per_slot"):
        fields[key] = MappingProxyType(dict(fields.get(key) or {}))
    draft = data.get("draft")
    if draft:
        d = _numbers(draft, ())
        d["default_steps"] = tuple(d.get("default_steps", (3, 1, 4)))
        d["acceptance"] = MappingProxyType(dict(d.get("acceptance") or {}))
        fields["draft"] = DraftProfile(**d)
    return ModelProfile(**fields)
