"""``gate_policy``: the A/B gate's policy for one GPU, from the search space's guardrails and the measured noise.

The single-GPU study and every worker of a shared study build their policy here, so a comparison on any GPU
is judged by the same rules: the space's TTFT margins as non-inferiority ratios, its quality gate, its error
ceiling (never below 0.5%), and the KV-pool guardrail unless a context target is checked on every first boot.
"""

from __future__ import annotations

from collections.abc import Sequence

from elsa_tune.search_spaces.space import SearchSpace
from elsa_tune.tuner.ab.dimensioning import NoiseReport
from elsa_tune.tuner.ab.gate import GatePolicy, GuardrailPolicy
from elsa_tune.tuner.flow.settings import Settings

#: Blocks per arm at each look of a search worker's A/Bs when the settings give none (a worker started by hand; a
#: study's fleet passes its own looks). A worker's A/B promotes one trial among many within its budget, so it stops
#: at 6 blocks per arm, the least with which a study's own looks end (``Study._looks``).
SEARCH_LOOKS = (2, 4, 6)
#: Blocks per arm at each look of ``elsa-tune compare`` when the settings give none: the gate's own default
#: (``GatePolicy.looks``), a cap of 12 boots per arm. A comparison is a single A/B that has its whole budget, so
#: it may run to the gate's full cap where a search's many A/Bs cannot.
COMPARISON_LOOKS = (4, 8, 12)
#: Monte Carlo replicates of the boundary calibration for a study's policy.
REPLICATES = 4000


def guardrail_policy(space: SearchSpace, *, context_target: int | None) -> GuardrailPolicy:
    """The guardrails of ``space`` as the gate tests them.

    With a context target the pool is checked against it on every first boot; a pool that shrinks but still
    holds the target is no reason to reject a faster configuration, so the KV-pool ratio guardrail is off.
    """
    g = space.guardrails
    return GuardrailPolicy(ttft_p50_margin=1.0 + g.ttft_p50_margin if g.ttft_p50_margin is not None else None,
                           ttft_p99_margin=1.0 + g.ttft_p99_margin if g.ttft_p99_margin is not None else None,
                           kv_pool_min_ratio=None if context_target else GuardrailPolicy().kv_pool_min_ratio,
                           require_quality=g.quality_gate)


def gate_policy(space: SearchSpace, noise: NoiseReport, settings: Settings, *, looks: Sequence[int],
                context_target: int | None) -> GatePolicy:
    """The gate's policy on the GPU whose baseline ``noise`` measured: ``looks`` blocks per arm at each look."""
    return GatePolicy.from_dimensioning(noise, looks=tuple(looks),
                                        guardrails=guardrail_policy(space, context_target=context_target),
                                        measured_passes=settings.measured_passes,
                                        warmup_passes=settings.warmup_passes, replicates=REPLICATES,
                                        max_error_fraction=max(0.005, space.guardrails.max_error_rate))
