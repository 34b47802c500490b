"""A decision's reason filed under the seeds' few words: crash, oom, hang, ignored, context drop, slower …"""

from __future__ import annotations

import pytest

from elsa_tune.history.decision import DecisionRecord
from elsa_tune.history.reasons import reason_category
from elsa_tune.history.records import Phase
from elsa_tune.history.verdict import Decision, GuardrailResult, Verdict
from elsa_tune.runtime.boot_report import Adjustment
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.search_spaces.space import ReasonCategory as C


def _verdict(decision: Decision, reason: str = "gate", effect: float | None = None, high: float | None = None,
             guardrails: tuple[GuardrailResult, ...] = (), **extra: object) -> Verdict:
    """A verdict as a schema-3 record stored it (its facts in ``extra``), read back through ``Verdict.from_dict``:
    the categories and sentences below hold for old records as for new ones (the typed fields they are read into)."""
    old = Verdict(decision=decision, reason=reason, effect=effect, ci_low=None if effect is None else effect - 0.1,
                  ci_high=high, p_value=None, boots_incumbent=6, boots_candidate=6, guardrails=guardrails).to_dict()
    return Verdict.from_dict({**old, "schema_version": 3, "extra": extra})


@pytest.mark.parametrize(("kind", "expected"), [
    (FailureKind.HANG, C.HANG), (FailureKind.BOOT_TIMEOUT, C.HANG), (FailureKind.OOM_UNDER_LOAD, C.OOM),
    (FailureKind.HOST_OOM_KILLED, C.OOM), (FailureKind.WEIGHTS_OOM, C.OOM), (FailureKind.TECHNIQUE_CRASH, C.CRASH),
    (FailureKind.UNKNOWN_CRASH, C.CRASH), (FailureKind.BAD_FLAG, C.CRASH), (FailureKind.CUDA_GRAPH_FAILED, C.CRASH),
])
def test_a_failed_boot_is_filed_by_its_kind(kind: FailureKind, expected: C) -> None:
    assert reason_category(None, Failure(kind, "it failed", "fix it")) is expected


def test_a_cuda_graph_capture_that_ran_out_of_memory_is_an_oom() -> None:
    failure = Failure(FailureKind.CUDA_GRAPH_FAILED, "CUDA-graph capture failed at boot", "lower it",
                      evidence=("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 544 MiB",))
    assert reason_category(None, failure) is C.OOM


def test_ignored_kept_and_no_decision() -> None:
    ignored = Adjustment(flag="enable-mixed-chunk", requested=True, effective=False, reason="ignored",
                         evidence="server_args shows False")
    assert reason_category(None, None, (ignored,)) is C.IGNORED
    assert reason_category(_verdict(Decision.KEEP, effect=1.2, high=1.3)) is C.KEPT
    assert reason_category(None) is None


def test_inconclusive_is_no_gain_whatever_the_estimate() -> None:
    # seed 004's "nothing measurable": the gate's "no demonstrated benefit: +0.4% [−3%, +4%] over 12 boots"
    assert reason_category(_verdict(Decision.INCONCLUSIVE, effect=1.004, high=1.04)) is C.NO_GAIN
    assert reason_category(_verdict(Decision.INCONCLUSIVE, effect=1.14, high=1.33)) is C.NO_GAIN


def test_screening_shortcuts_are_read_from_their_facts_never_their_sentence() -> None:
    context = _verdict(Decision.REJECT, "context drops to 12,256 tokens, below the 63,000-token target",
                       kv_pool=12256, context_target=63000)
    assert reason_category(context) is C.CONTEXT_DROP
    # a sentence alone is never parsed back into a category
    assert reason_category(_verdict(Decision.REJECT, "context drops to 12,256 tokens, below the target")) \
        is C.NO_GAIN
    slow = _verdict(Decision.REJECT, "−70% on its screening boot (540 vs 1,826 tok/s)", z=-11.0)
    assert reason_category(slow) is C.SLOWER
    typed = Verdict(decision=Decision.REJECT, reason="anything at all", effect=None, ci_low=None, ci_high=None,
                    p_value=None, boots_incumbent=0, boots_candidate=1, category=C.CONTEXT_DROP)
    assert reason_category(typed) is C.CONTEXT_DROP          # the decider's category wins
    assert Verdict.from_dict(typed.to_dict()).category is C.CONTEXT_DROP
    pool = _verdict(Decision.REJECT, "−20% KV pool (107,328 vs 134,144 tokens), no memory gain", kv_pool=107328,
                    incumbent_kv_pool=134144)
    assert reason_category(pool) is C.MEMORY_LOSS
    assert reason_category(_verdict(Decision.REJECT, "failed the quality gate", quality_failed=True)) \
        is C.WRONG_ANSWERS


def test_gate_rejections_by_failure_guardrail_and_effect() -> None:
    crashed = _verdict(Decision.REJECT, "a candidate boot failed: hang: no token",
                       failure=Failure(FailureKind.HANG, "no token for 120 s", "drop it").to_dict())
    assert reason_category(crashed) is C.HANG
    memory = GuardrailResult("memory_gain", False, 0.8, 0.8, 0.8, 1.02, "KV pool ratio 0.800")
    assert reason_category(_verdict(Decision.REJECT, "a memory technique must grow the KV pool",
                                    guardrails=(memory,))) is C.MEMORY_LOSS
    ttft = GuardrailResult("ttft_p99", False, 1.54, 1.2, 1.95, 1.2, "confidently worse")
    assert reason_category(_verdict(Decision.REJECT, "guardrail ttft_p99 failed: ratio 1.542", effect=1.01,
                                    high=1.2, guardrails=(ttft,), failed_guardrail="ttft_p99")) is C.SLOWER
    # a guardrail merely not shown non-inferior does not make a futility stop "slower"
    pending = GuardrailResult("ttft_p50", False, 1.02, 0.9, 1.15, 1.1, "not shown")
    assert reason_category(_verdict(Decision.REJECT, "futile at look 1: estimate −1.9%", effect=0.981, high=1.58,
                                    guardrails=(pending,))) is C.NO_GAIN
    # "slower" only where the interval shows it; an interval that still reaches a gain is "no gain"
    assert reason_category(_verdict(Decision.REJECT, "futile", effect=0.85, high=1.05)) is C.NO_GAIN
    assert reason_category(_verdict(Decision.REJECT, "futile", effect=0.64, high=1.53)) is C.NO_GAIN
    assert reason_category(_verdict(Decision.REJECT, "futile", effect=0.95, high=0.99)) is C.SLOWER  # shown slower
    assert reason_category(_verdict(Decision.REJECT, "futile", effect=0.95, high=1.05)) is C.NO_GAIN


def test_a_decision_carries_its_category_and_a_skipped_one_none() -> None:
    hung = DecisionRecord(study="s", number=1, phase=Phase.SCREENING, technique="mamba-cache-32",
                          failure=Failure(FailureKind.HANG, "no token for 120 s while the server stayed up", "drop"))
    assert hung.category is C.HANG and hung.result.startswith("server hangs with no error")
    skipped = DecisionRecord(study="s", number=2, phase=Phase.SCREENING, technique="x", skipped="rejected before")
    assert skipped.category is None


def test_a_futile_stop_whose_interval_reaches_a_gain_is_said_as_no_benefit_not_as_a_slowdown() -> None:
    from elsa_tune.history.reasons import reason_from_verdict

    not_shown = GuardrailResult("ttft_p99", False, 1.05, 0.8, 1.4, 1.2, "not shown non-inferior yet")
    wide = _verdict(Decision.REJECT, "futile at look 1: estimate −8.7% is not above +3.0%", effect=0.913, high=2.25,
                    guardrails=(not_shown,))
    assert reason_from_verdict(wide).startswith("no demonstrated benefit (stopped early, futile): −8.7% [")
    # a futile stop with a gain estimate: its guardrails were only not yet shown, they are not the reason
    small_gain = _verdict(Decision.REJECT, "futile: the gain's upper bound +2.3% is below +3%", effect=1.01,
                          high=1.023, guardrails=(not_shown,), futile=True)
    assert reason_from_verdict(small_gain).startswith("no demonstrated benefit: +1.0% [")
    shown = _verdict(Decision.REJECT, "futile at look 2: estimate −22% is not above +3.0%", effect=0.78, high=0.9)
    assert reason_from_verdict(shown).startswith("slower: −22% [")     # an interval below zero: a measured slowdown


def test_an_ab_whose_candidate_boot_failed_says_that_failure() -> None:
    from elsa_tune.history.reasons import reason_from_verdict

    failure = Failure(FailureKind.UNKNOWN_CRASH, "pass 0 failed 25.0% of its requests (limit 0.5%)", "read the log",
                      phase="serve")
    failed = Verdict(decision=Decision.REJECT, reason="a candidate boot failed", effect=None, ci_low=None,
                     ci_high=None, p_value=None, boots_incumbent=0, boots_candidate=1, failure=failure)
    assert reason_from_verdict(failed) == ("an A/B boot failed: crashes: pass 0 failed 25.0% of its requests "
                                           "(limit 0.5%)")


def test_an_inconclusive_held_back_by_the_night_or_a_guardrail_says_which() -> None:
    """"No demonstrated benefit" would misstate a gain the gate showed: the sentence names what held it back."""
    from dataclasses import replace

    from elsa_tune.history.reasons import reason_from_verdict

    demoted = replace(_verdict(Decision.INCONCLUSIVE, "+23.1% throughput (p = 0.0218 ≤ 0.0410 at the cap); but after "
                               "false-keep control (lond online, test 9 at level 0.0075) its adjusted p 0.2733 exceeds "
                               "0.10: the incumbent stays", effect=1.23, high=1.33, multiplicity_level=0.10,
                               held_by_night_control=True),
                      ci_low=1.14, adjusted_p_value=0.2733)
    assert reason_from_verdict(demoted) == ("not kept under the night's false-keep control: +23% [+14%, +33%] over "
                                            "12 boots, adjusted p 0.27 > 0.10")
    tail = GuardrailResult("ttft_p99", None, 1.073, 0.96, 1.256, 1.2, "ratio 1.073, upper bound 1.256 vs margin 1.20")
    for reason in ("the gain passed but guardrail ttft_p99 was not shown non-inferior at the cap (ratio 1.073, …); "
                   "the incumbent stays",
                   "the gain crossed at the cap (p = 0.0150 ≤ 0.0410 at the cap) but after 6 more blocks guardrail "
                   "ttft_p99 was still not shown non-inferior (ratio 1.073, …); the incumbent stays"):
        pending = replace(_verdict(Decision.INCONCLUSIVE, reason, effect=1.165, high=1.33, guardrails=(tail,),
                                   pending_guardrail="ttft_p99"),
                          ci_low=1.007)
        assert reason_from_verdict(pending) == ("+17% [+0.7%, +33%] over 12 boots, but ttft_p99 not shown within "
                                                "+20%: +7.3% [−4%, +26%]")
        assert reason_category(pending) is C.NO_GAIN
    plain = _verdict(Decision.INCONCLUSIVE, "inconclusive at the cap of 6 blocks: +1.0% …", effect=1.01, high=1.07)
    assert reason_from_verdict(plain).startswith("no demonstrated benefit: +1.0% [")
