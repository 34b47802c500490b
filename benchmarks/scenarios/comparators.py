"""Other tuning protocols on the same virtual boots and the same simulated budget as the study.

Each protocol sees only what a boot shows (``VirtualBench.boot``: a noisy ``BootSample`` with the boot's failure,
KV pool and quality result) and pays each boot's simulated seconds on the bench's clock; it stops when the budget
is spent (a comparison cut short keeps the incumbent). What it recommends is scored by the oracle's truth.

- ``random``: random search with the same gate: a configuration drawn uniformly (every parameter from its range,
  each technique on with probability ½), one screening boot with the probes (a failed boot, a failed quality
  gate or a pool below the context target rejects it), then ``tuner/gate.run_ab`` against the incumbent with the
  gate's default policy and the space's TTFT margins; a KEEP replaces the incumbent.
- ``grid``: a vLLM-style grid (``auto_tune.sh``): every combination of 3 points per numeric parameter and each
  technique off/on, in a fixed nested order, one boot each; the fastest measured boot that passed its probes wins.
- ``naive``: the field's protocol: one boot of the baseline, then each technique in the space's order and then
  one-parameter changes, one boot each, kept whenever that boot was faster than the incumbent's.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from elsa_tune.errors import ConfigError
from elsa_tune.history.records import Arm
from elsa_tune.history.verdict import Decision
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.search_spaces.parameter import Value
from elsa_tune.search_spaces.rules import DerivationError, RuleViolation
from elsa_tune.search_spaces.space import SearchSpace
from elsa_tune.tuner.ab.boot_sample import BootSample
from elsa_tune.tuner.ab.gate import GatePolicy, GuardrailPolicy, run_ab
from elsa_tune.tuner.flow.virtual import VirtualBench

METHODS = ("random", "grid", "naive")
#: draws a protocol may make (most end in a boot, so the budget ends a protocol long before this)
_MAX_DRAWS = 100_000


class OutOfBudget(Exception):
    """The simulated budget is spent: the protocol stops where it is."""


@dataclass(frozen=True)
class ProtocolResult:
    """What a protocol recommends (values and techniques) and what it spent."""

    method: str
    values: dict[str, Value]
    techniques: tuple[str, ...]
    recommended: Candidate
    boots: int
    sim_seconds: float


class _Boots:
    """Boots on the bench, counted, refused once the budget is spent."""

    def __init__(self, bench: VirtualBench, budget_s: float) -> None:
        self.bench = bench
        self.budget_s = budget_s
        self.count = 0

    def boot(self, candidate: Candidate, *, probes: bool = False, arm: Arm = Arm.INCUMBENT, block: int = 0,
             position: int = 0) -> BootSample:
        if self.bench.clock.now() >= self.budget_s:
            raise OutOfBudget()
        self.count += 1
        return self.bench.boot(candidate, self.count, probes=probes, arm=arm, block=block, position=position)


class _Sampler:
    """``tuner/protocol.BootSampler`` over the bench: incumbent ``a`` and candidate ``b``."""

    def __init__(self, boots: _Boots, a: Candidate, b: Candidate) -> None:
        self.boots, self.a, self.b = boots, a, b

    def boot(self, arm: Arm, block: int, position: int) -> BootSample:
        return self.boots.boot(self.a if arm is Arm.INCUMBENT else self.b, arm=arm, block=block, position=position)


def measured(sample: BootSample) -> float | None:
    """Mean throughput of the boot's measured passes (``None`` for a failed boot)."""
    if sample.failed is not None:
        return None
    values = [p.output_throughput_tok_s for p in sample.measured[1:] or sample.measured]
    return statistics.fmean(values) if values else None


def passes_probes(sample: BootSample, target: int | None) -> bool:
    return (sample.failed is None and sample.quality_passed is not False
            and (not target or (sample.kv_pool_tokens or 0) >= target))


def run_protocol(method: str, bench: VirtualBench, space: SearchSpace, budget_s: float, seed: int) -> ProtocolResult:
    boots = _Boots(bench, budget_s)
    state = _State(space.baseline_values(), ())
    with contextlib.suppress(OutOfBudget):
        {"random": _random, "grid": _grid, "naive": _naive}[method](boots, space, state, random.Random(seed), seed)
    return ProtocolResult(method, dict(state.values), state.techniques,
                          space.candidate(dict(state.values), list(state.techniques)), boots.count,
                          bench.clock.now())


@dataclass
class _State:
    values: dict[str, Value]
    techniques: tuple[str, ...]


def _build(space: SearchSpace, values: dict[str, Value], techniques: Sequence[str]) -> Candidate | None:
    try:
        return space.candidate(values, list(techniques))
    except (RuleViolation, DerivationError, ConfigError):
        return None


def _screenable(space: SearchSpace) -> list[str]:
    return [t.name for t in space.techniques if t.screen]


def _random(boots: _Boots, space: SearchSpace, state: _State, rng: random.Random, seed: int) -> None:
    g = space.guardrails
    target = boots.bench.context_target
    policy = GatePolicy(guardrails=GuardrailPolicy(      # the study's guardrails (``tuner/flow/study.py``)
        ttft_p50_margin=1 + g.ttft_p50_margin, ttft_p99_margin=1 + g.ttft_p99_margin,
        kv_pool_min_ratio=None if target else GuardrailPolicy().kv_pool_min_ratio, require_quality=g.quality_gate))
    for trial in range(_MAX_DRAWS):
        values = {p.name: p.coerce(p.sample(rng)) for p in space.parameters}
        techniques = tuple(t for t in _screenable(space) if rng.random() < 0.5)
        candidate = _build(space, values, techniques)
        incumbent = space.candidate(dict(state.values), list(state.techniques))
        if candidate is None or candidate.key() == incumbent.key():
            continue
        if not passes_probes(boots.boot(candidate, probes=True, arm=Arm.CANDIDATE), target):
            continue
        ab = run_ab(_Sampler(boots, incumbent, candidate), policy, rng_seed=seed * 1000 + trial)
        if ab.verdict.decision is Decision.KEEP:
            state.values, state.techniques = values, techniques


def _grid_points(space: SearchSpace) -> Iterator[tuple[dict[str, Value], tuple[str, ...]]]:
    names = [p.name for p in space.parameters]
    grids = [p.grid(3) for p in space.parameters]
    techniques = _screenable(space)
    for combo in itertools.product(*grids):
        for switches in itertools.product((False, True), repeat=len(techniques)):
            yield dict(zip(names, combo, strict=True)), tuple(t for t, on in zip(techniques, switches, strict=True)
                                                              if on)


def _grid(boots: _Boots, space: SearchSpace, state: _State, rng: random.Random, seed: int) -> None:
    del rng, seed   # a fixed order, as vLLM's script sweeps its lists
    best = -1.0
    target = boots.bench.context_target
    for values, techniques in _grid_points(space):
        candidate = _build(space, values, techniques)
        if candidate is None:
            continue
        sample = boots.boot(candidate, probes=True)
        value = measured(sample)
        if value is not None and passes_probes(sample, target) and value > best:
            best, state.values, state.techniques = value, values, techniques


def _naive(boots: _Boots, space: SearchSpace, state: _State, rng: random.Random, seed: int) -> None:
    del seed
    target = boots.bench.context_target
    current = measured(boots.boot(space.baseline(), probes=True)) or 0.0

    def attempt(values: dict[str, Value], techniques: tuple[str, ...]) -> None:
        nonlocal current
        candidate = _build(space, values, techniques)
        if candidate is None:
            return
        sample = boots.boot(candidate, probes=True)
        value = measured(sample)
        if value is not None and passes_probes(sample, target) and value > current:
            current, state.values, state.techniques = value, values, techniques

    for name in _screenable(space):
        attempt(dict(state.values), (*state.techniques, name))
    for _ in range(_MAX_DRAWS if space.parameters else 0):
        p = rng.choice(space.parameters)
        value = p.coerce(p.sample(rng))
        if value != state.values.get(p.name):
            attempt({**state.values, p.name: value}, state.techniques)
