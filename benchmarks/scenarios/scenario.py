"""A generated scenario: a sim profile (profile + card + model YAML), a search space YAML and a traffic, as files.

``generate(index, root)`` draws scenario ``index`` from the priors (``hardware.py``, ``outcomes.py``,
``shapes.py``) with a generator seeded by the index alone, writes it under ``root/scenario-NNN/`` and checks it the
way a user's files are checked: ``load_profile``, ``load_space`` (rules satisfiable, every technique applies to the
baseline), and the simulator's truth of the baseline on the workload the study measures (it must boot and serve
with a pool at least the context target). A draw that fails a check is drawn again (a new attempt of the same
index), so scenario ``index`` is always the same files.

The space: 3–8 parameters. ``mem-fraction-static`` (its top value may leave no room for the first generation: a
cliff), ``max-running-requests``, ``chunked-prefill-size``, ``speculative-num-steps`` when the model has a draft
head, and knobs (``SGLANG_*`` environment integers of a patched build). A knob is inert or carries hidden effects in
the profile: a gain that turns into a crash under load past a threshold at high concurrency (an infeasible region
and an interaction), a prefill effect that depends on the chunk size, a gain that costs static memory.
Techniques: 3–6 drawn outcomes, in a random screening order.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hardware import draw_card, draw_model
from oracle import Oracle
from outcomes import Baseline, Carriers, draw_outcome, draw_technique
from shapes import SHAPES, write_shape

from elsa_tune.errors import ElsaTuneError
from elsa_tune.runtime.sim.memory import auto_chunked_prefill, auto_mem_fraction, plan_memory
from elsa_tune.runtime.sim.profile import NoiseProfile, load_profile
from elsa_tune.search_spaces.loader import load_space

NOISE_FAMILIES = ("lognormal", "t3", "contaminated", "drift_linear", "drift_step")
#: configurations the exhaustive truth may have to evaluate (parameter lattice × technique subsets)
ORACLE_LIMIT = 300


class Rejected(Exception):
    """A draw that fails a check; the generator draws again."""


@dataclass(frozen=True)
class Scenario:
    """One generated scenario's files and what was drawn (``planted``: technique → outcome, never scored)."""

    name: str
    folder: Path
    profile: Path
    space: Path
    traffic: str
    shape: str
    noise_family: str
    planted: Mapping[str, str] = field(default_factory=dict)
    attempt: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else (dict(v) if isinstance(v, Mapping) else v)
                for k, v in dataclasses.asdict(self).items()}


def generate(index: int, root: Path, *, traffic: str | None = None, attempts: int = 60,
             oracle_limit: int = ORACLE_LIMIT, budget_s: float = 8 * 3600.0) -> Scenario:
    """Scenario ``index`` under ``root`` (drawn again until it passes every check); ``traffic`` overrides the shape;
    ``oracle_limit`` caps the configurations the exhaustive truth evaluates (small scenarios for fast tests);
    ``budget_s`` is the study budget whose measured workload the checks replay."""
    last = ""
    for attempt in range(attempts):
        rng = random.Random(f"scenario:{index}:{attempt}")
        try:
            return _draw(rng, index, attempt, root, traffic, oracle_limit, budget_s)
        except Rejected as exc:
            last = str(exc)
        except ElsaTuneError as exc:
            last = f"{type(exc).__name__}: {exc}"
    raise RuntimeError(f"scenario {index}: no valid draw in {attempts} attempts (last: {last})")


def _draw(rng: random.Random, index: int, attempt: int, root: Path, traffic: str | None, oracle_limit: int,
          budget_s: float) -> Scenario:
    name = f"scenario-{index:03d}"
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    card = draw_card(rng, name)
    model = draw_model(rng, name, card)
    shape = "custom" if traffic else rng.choice(SHAPES)
    traffic_arg = traffic or write_shape(shape, folder / "traffic.parquet", index)
    spec_on = "draft" in model and rng.random() < 0.7
    slots = rng.choice((16, 24, 32)) if shape == "concurrency" else rng.choice((1, 2, 4, 8))
    chunk = auto_chunked_prefill(card["memory_gb"])[0]
    fraction = round(auto_mem_fraction(card["memory_gb"], chunk, slots) - rng.uniform(0.0, 0.06), 2)
    parameters, base_flags, derived, knobs = _parameters(rng, fraction, slots, chunk, spec_on)
    hidden = _knob_effects(rng, knobs, slots)
    matched = {key for effect in hidden for key in (effect["match"].get("env") or {})}
    grid = math.prod(_points(p) for p in parameters.values() if "env" not in p or p["env"] in matched)
    if grid > oracle_limit:      # the same count as ``Oracle.grid_size``, before any file or truth
        raise Rejected(f"{grid} parameter combinations for the exhaustive truth (limit {oracle_limit})")
    noise = _noise(rng, index)
    profile = {"schema_version": 1, "name": name, "card": name, "model": name, "runtime_version": "0.5.23",
               "memory_rules": {"mamba_ratio_solver": "joint", "runtime_overhead_gb": round(rng.uniform(0.1, 0.6), 2),
                                "tokenizer_context_gb": round(rng.uniform(0.0, 0.6), 2), "draft_state_slots": False},
               "noise": noise, "base_flags": {}, "techniques": hidden}
    space: dict[str, Any] = {
             "schema_version": 1, "name": name, "description": f"generated scenario {index} ({shape} traffic)",
             "model": {"path": f"scenarios/{name}", "hybrid_mamba": bool(model["is_hybrid"]), "vision": False,
                       "speculative_head": "draft" in model, "context_target": 1},
             "runtime": {"command": ["python", "-m", "sglang.launch_server"], "version": "0.5.23"},
             "base": {"flags": base_flags}, "parameters": parameters, "derived": derived,
             "objectives": [{"metric": "output_throughput", "direction": "maximize"}],
             "guardrails": {"ttft_p50_margin": 0.10, "ttft_p99_margin": 0.20, "min_context_tokens": 1,
                            "quality_gate": True},
             "probes": {"headroom_floor_mib": 256, "probe_timeout_s": 900, "hang_s": 120, "boot_timeout_s": 1800}}
    _write(folder, name, card, model, profile, space)

    # the baseline as it stands (no technique yet): it must boot and serve; its pool sets the context target
    oracle = Oracle(folder / f"{name}.yaml", folder / "space.yaml", traffic_arg, budget_s=budget_s)
    if oracle.grid_size() > oracle_limit:
        raise Rejected(f"{oracle.grid_size()} parameter combinations for the exhaustive truth (limit {oracle_limit})")
    base = oracle.truth(oracle.space.baseline())
    if base.crashed or not base.output_tokens_per_s or base.plan is None:
        raise Rejected(f"the baseline does not serve: {base.crash_reason}")
    target = max(1024, int(base.kv_pool_tokens * rng.uniform(0.35, 0.75)) // 1024 * 1024)
    longest = max(r.input_tokens + r.output_tokens for r in oracle.workload.closed_loop_requests()) \
        if not oracle.workload.requests else max(r.input_tokens + r.output_tokens for r in oracle.workload.requests)
    if target < longest:
        raise Rejected(f"the context target {target} is below the longest request ({longest} tokens)")
    plan = plan_memory(oracle.profile, oracle.space.baseline().flags, oracle.space.baseline().env)
    baseline = Baseline(headroom_gb=plan.headroom_gb, kv_tokens=plan.kv_tokens, kv_gb=plan.kv_gb,
                        kv_share=plan.kv_gb / max(1e-9, plan.kv_gb + plan.mamba_gb), weights_gb=plan.weights_gb,
                        context_target=target, spec_on=spec_on, hybrid=bool(model["is_hybrid"]),
                        default_kv_dtype=str(model["default_kv_dtype"]))
    techniques, effects, planted = _techniques(rng, baseline)
    profile["techniques"] = hidden + effects
    space["techniques"] = techniques
    space["model"]["context_target"] = target
    space["guardrails"]["min_context_tokens"] = target
    _write(folder, name, card, model, profile, space)

    oracle = Oracle(folder / f"{name}.yaml", folder / "space.yaml", traffic_arg, budget_s=budget_s)
    if oracle.truth(oracle.space.baseline()) != base:
        raise Rejected("a technique changed the baseline")
    size = oracle.size()
    if size > oracle_limit:
        raise Rejected(f"{size} configurations for the exhaustive truth (limit {oracle_limit})")
    family = str(noise.get("family", "lognormal"))
    return Scenario(name=name, folder=folder, profile=folder / f"{name}.yaml", space=folder / "space.yaml",
                    traffic=traffic_arg, shape=shape, noise_family=family, planted=planted, attempt=attempt)


def _points(p: Mapping[str, Any]) -> int:
    if p["type"] == "categorical":
        return len(p["choices"])
    return int(round((p["high"] - p["low"]) / p.get("step", 1))) + 1   # noqa: RUF046 (YAML numbers are Any)


def _write(folder: Path, name: str, card: Mapping[str, Any], model: Mapping[str, Any],
           profile: Mapping[str, Any], space: Mapping[str, Any]) -> None:
    for path, data in ((folder / f"card-{name}.yaml", card), (folder / f"model-{name}.yaml", model),
                       (folder / f"{name}.yaml", profile), (folder / "space.yaml", space)):
        path.write_text(yaml.safe_dump(dict(data), sort_keys=False, width=120))
    load_profile(folder / f"{name}.yaml")
    load_space(str(folder / "space.yaml"))


def _parameters(rng: random.Random, fraction: float, slots: int, chunk: int, spec_on: bool
                ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[str]]:
    step = rng.choice((0.02, 0.03, 0.04))
    params: dict[str, Any] = {
        "mem-fraction-static": {"type": "float", "low": round(fraction - step, 2), "high": round(fraction + step, 2),
                                "step": step, "baseline": fraction},
        "max-running-requests": ({"type": "int", "low": 1, "high": 3, "baseline": 1} if slots == 1 else
                                 {"type": "int", "low": slots // 2, "high": slots * 3 // 2, "step": slots // 2,
                                  "baseline": slots}),
    }
    choices = sorted({chunk, rng.choice((1024, 2048, 4096, 8192))})
    if len(choices) > 1 or rng.random() < 0.5:
        params["chunked-prefill-size"] = {"type": "categorical", "choices": choices or [chunk], "baseline": chunk}
    base: dict[str, Any] = {}
    derived: dict[str, Any] = {}
    if spec_on:
        base.update({"speculative-algorithm": "EAGLE", "speculative-eagle-topk": 1})
        params["speculative-num-steps"] = {"type": "int", "low": 2, "high": 4, "baseline": 3}
        derived["speculative-num-draft-tokens"] = {"value": "speculative-num-steps + 1",
                                                   "when": "speculative-eagle-topk == 1"}
    knobs: list[str] = []
    words = rng.sample(("TILE", "SPLITK", "WAVES", "STAGES", "UNROLL", "BLOCKS", "LANES"), 5)
    wanted = min(rng.randint(max(3, len(params)), 8), len(params) + len(words))
    while len(params) < wanted:
        knob = f"SGLANG_SCHED_{words[len(knobs)]}"
        knobs.append(knob)
        params[knob.lower().replace("_", "-")] = {"type": "int", "low": 1, "high": 3, "baseline": 1, "env": knob}
    return params, base, derived, knobs


def _knob_effects(rng: random.Random, knobs: list[str], slots: int) -> list[dict[str, Any]]:
    """Hidden effects of the knobs (the first one or two; the rest are inert: the tuner is not told which)."""
    effects: list[dict[str, Any]] = []
    for knob in knobs[:rng.choice((1, 1, 2))]:
        kind = rng.choice(("plateau-cliff", "chunk-interaction", "memory-tradeoff"))
        gain = round(rng.uniform(1.02, 1.2), 3)
        if kind == "plateau-cliff":
            effects.append({"name": f"{knob}-gain", "match": {"env": {knob: {"gte": 2}}}, "decode": [[1000, gain]]})
            effects.append({"name": f"{knob}-cliff", "match": {"env": {knob: {"gte": 3}},
                                                               "flags": {"max-running-requests": {"gte": slots}}},
                            "crash": {"phase": "under_load", "kind": "oom_under_load", "lines": [
                                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]}})
        elif kind == "chunk-interaction":
            effects.append({"name": f"{knob}-big-chunks", "match": {"env": {knob: {"gte": 2}},
                                                                    "flags": {"chunked-prefill-size": {"gte": 4096}}},
                            "prefill": [[1000, round(rng.uniform(1.1, 1.4), 3)]], "decode": [[1000, gain]]})
            effects.append({"name": f"{knob}-small-chunks", "match": {"env": {knob: {"gte": 2}},
                                                                      "flags": {"chunked-prefill-size": {"lte": 2048}}},
                            "prefill": [[1000, round(rng.uniform(0.6, 0.9), 3)]]})
        else:
            effects.append({"name": f"{knob}-tradeoff", "match": {"env": {knob: {"gte": 2}}},
                            "decode": [[1000, gain]], "static_gb": round(rng.uniform(0.2, 1.5), 2)})
            effects.append({"name": f"{knob}-top", "match": {"env": {knob: {"gte": 3}}},
                            "decode": [[1000, round(rng.uniform(0.7, 1.05), 3)]]})
    return effects


def _techniques(rng: random.Random, baseline: Baseline
                ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, str]]:
    carriers = Carriers(rng)
    space: dict[str, Any] = {}
    effects: list[dict[str, Any]] = []
    planted: dict[str, str] = {}
    count = rng.randint(3, 6)
    while len(space) < count:
        outcome = draw_outcome(rng, baseline, exclude=("unlock-pair",) if count - len(space) < 2 else ())
        drawn = draw_technique(rng, outcome, f"t{len(space) + 1}-{outcome}", baseline, carriers)
        space.update(drawn.space)
        effects.extend(drawn.profile)
        planted.update(dict.fromkeys(drawn.space, outcome))
    order = list(space)
    rng.shuffle(order)
    return {k: space[k] for k in order}, effects, planted


def _noise(rng: random.Random, index: int) -> dict[str, Any]:
    noise: dict[str, Any] = {"boot_sigma": round(rng.uniform(0.03, 0.10), 3),
                             "run_sigma": round(rng.uniform(0.01, 0.03), 3),
                             "first_pass_slowdown": round(rng.uniform(0.05, 0.15), 3), "warm_requests": 8,
                             "seed": index}
    if "family" not in {f.name for f in dataclasses.fields(NoiseProfile)}:
        return noise                                   # this build's noise model has one family: lognormal
    family = rng.choice(NOISE_FAMILIES)
    noise["family"] = family
    if family == "contaminated":
        noise.update(contamination=round(rng.uniform(0.05, 0.15), 2),
                     contamination_slowdown=round(rng.uniform(0.15, 0.35), 2))
    elif family == "drift_linear":
        noise["drift_per_hour"] = round(rng.uniform(-0.01, 0.01), 4)
    elif family == "drift_step":
        noise.update(step_at_s=float(round(rng.uniform(3600, 6 * 3600))), step_size=round(rng.uniform(-0.08, 0.08), 3))
    return noise
