"""A memory technique is judged for what it buys: its pool, measured, and its speed within a margin."""

from __future__ import annotations

import math

from elsa_tune.history.decision import DecisionRecord, Kept
from elsa_tune.history.records import Arm, Phase
from elsa_tune.history.verdict import Decision, Verdict
from elsa_tune.search_spaces.space import ReasonCategory
from elsa_tune.tuner.ab.boot_sample import BootSample, PassMeasurement
from elsa_tune.tuner.ab.gate import GatePolicy, GuardrailPolicy, decide

NOISE = [0.01, -0.02, 0.015, -0.01, 0.0, 0.02, -0.015, 0.005]


def _boots(arm: Arm, logs: list[float], pool: int) -> list[BootSample]:
    out = []
    for i, y in enumerate(logs):
        tput = 1000.0 * math.exp(y)
        passes = (PassMeasurement(tput * 0.88, 0.5, 1.5, warmup=True), PassMeasurement(tput, 0.5, 1.5),
                  PassMeasurement(tput, 0.5, 1.5))
        out.append(BootSample(arm=arm, block=i, position=0, passes=passes, kv_pool_tokens=pool, quality_passed=True))
    return out


def _memory_verdict(speed: float, pools: tuple[int, int]) -> Verdict:
    policy = GatePolicy(kind="memory", looks=(8,), replicates=4000,
                        guardrails=GuardrailPolicy(ttft_p50_margin=None, ttft_p99_margin=None))
    a = _boots(Arm.INCUMBENT, NOISE, pools[0])
    b = _boots(Arm.CANDIDATE, [y + math.log(speed) for y in NOISE[::-1]], pools[1])
    return decide(a, b, policy, 1)


def test_a_kept_memory_technique_says_what_it_bought_and_is_kept_for_memory() -> None:
    verdict = _memory_verdict(1.078, (300_144, 600_288))
    assert verdict.decision is Decision.KEEP and verdict.category is ReasonCategory.KEPT_FOR_MEMORY
    assert (verdict.kv_pool_incumbent, verdict.kv_pool_candidate, verdict.speed_margin) == (300_144, 600_288, 0.02)
    record = DecisionRecord(study="s", number=1, phase=Phase.SCREENING, technique="fp8-kv", verdict=verdict)
    assert record.kept is Kept.YES and record.category is ReasonCategory.KEPT_FOR_MEMORY
    assert record.result.startswith("pool 300,144 → 600,288 tokens (×2.0), speed +7.8% [")
    assert record.result.endswith("over 16 boots, within the margin −2.0%")
    again = DecisionRecord.from_dict(record.to_dict())                  # the store keeps the facts, typed
    assert again.verdict is not None and again.verdict.kv_pool_candidate == 600_288
    assert again.category is ReasonCategory.KEPT_FOR_MEMORY and again.result == record.result


def test_an_undecided_memory_technique_still_names_its_pool_gain() -> None:
    noisy = [y * 12 for y in NOISE]                                     # ±20% boots: speed cannot be decided
    policy = GatePolicy(kind="memory", looks=(8,), replicates=4000,
                        guardrails=GuardrailPolicy(ttft_p50_margin=None, ttft_p99_margin=None))
    verdict = decide(_boots(Arm.INCUMBENT, noisy, 300_144),
                     _boots(Arm.CANDIDATE, [y - 0.01 for y in noisy[::-1]], 600_288), policy, 1)
    assert verdict.decision is Decision.INCONCLUSIVE
    record = DecisionRecord(study="s", number=1, phase=Phase.SCREENING, technique="fp8-kv", verdict=verdict)
    assert record.result.startswith("pool 300,144 → 600,288 tokens (×2.0), speed ")
    assert "not shown within the margin −2.0%" in record.result
    speed = DecisionRecord(study="s", number=2, phase=Phase.SCREENING, technique="fast",
                           verdict=Verdict(decision=Decision.KEEP, reason="gate", effect=1.1, ci_low=1.05,
                                           ci_high=1.15, p_value=0.01, boots_incumbent=6, boots_candidate=6,
                                           category=ReasonCategory.KEPT))
    assert speed.category is ReasonCategory.KEPT and not speed.result.startswith("pool")
