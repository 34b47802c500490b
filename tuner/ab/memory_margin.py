"""``memory_margin``: the speed margin a memory technique's non-inferiority test is run at.

A memory technique is kept for the KV pool it buys (a fact its first boot measures); its speed only has to be shown
no worse than a margin. A fixed margin narrower than the boot noise lets the cap decide nothing: at σ_boot 8% and
12 boots per arm no interval is narrow enough to place a true "no change" above −2%. The margin is therefore the
smallest one the test's own cap can decide: the planned minimum detectable effect of a fixed-n t at the cap's boots
per arm, at the nominal level of the cap's efficacy boundary (the level the night's false-keep control gives the
test) and the policy's power, under the measured σ_boot and σ_run. It is never below ``MIN_MARGIN`` and never above
what the space's guardrails allow a kept change to cost: the TTFT median margin (``MAX_MARGIN`` when that guardrail
is off).
"""

from __future__ import annotations

import math

from elsa_tune.tuner.ab.comparison import InsufficientData, mde_for
from elsa_tune.tuner.ab.gate import GatePolicy

#: The narrowest margin: a speed change this small is never worth a memory technique's rejection.
MIN_MARGIN = 0.02
#: The widest margin when the space has no TTFT median guardrail to bound it.
MAX_MARGIN = 0.10


def margin_ceiling(policy: GatePolicy) -> float:
    """The widest speed cost the space's guardrails allow a kept change: its TTFT median margin."""
    ratio = policy.guardrails.ttft_p50_margin
    return MAX_MARGIN if ratio is None else max(MIN_MARGIN, ratio - 1.0)


def memory_margin(policy: GatePolicy) -> float:
    """The speed margin for a memory technique tested under ``policy`` (its looks, level, noise and power).

    A throughput ratio ``1 − m`` with ``log(1 − m) = −(t_level + t_power) · SE_cap``: a technique of truly unchanged
    speed is shown non-inferior at the cap with the policy's power. Bounded by ``MIN_MARGIN`` and
    ``margin_ceiling``.
    """
    bounds = policy.boundaries()
    try:
        mde = mde_for(policy.looks[-1], sigma_boot=policy.sigma_boot, sigma_run=policy.sigma_run,
                      measured_passes=policy.measured_passes, alpha=bounds.nominal_p[-1], power=policy.power)
    except InsufficientData:
        return margin_ceiling(policy)
    needed = -math.expm1(-math.log1p(mde)) if math.isfinite(mde) else 1.0
    return min(margin_ceiling(policy), max(MIN_MARGIN, needed))
