"""The per-boot protocol: warm-up discarded, k measured passes, log summaries, failures never imputed."""

from __future__ import annotations

import math

import pytest

from elsa_tune.history.records import Arm, Covariates
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.tuner.ab.boot_sample import BootSample, PassMeasurement, failure_of, summarize


def boot(*tok_s: float, warm: int = 1, errors: float = 0.0) -> BootSample:
    passes = tuple(PassMeasurement(x, ttft_p50_s=0.4 + i / 100, ttft_p99_s=1.2, warmup=i < warm, error_fraction=errors)
                   for i, x in enumerate(tok_s))
    return BootSample(arm=Arm.CANDIDATE, block=3, position=1, passes=passes, kv_pool_tokens=358_000,
                      quality_passed=True, covariates=Covariates(sm_clock_mhz=2700, probe_score=1.5))


def test_summary_is_log_of_mean_of_the_measured_passes() -> None:
    s = summarize(boot(872, 995, 1005, 1002), measured_passes=2)
    assert s.log_throughput == pytest.approx(math.log(1000.0))
    assert s.log_ttft_p50 == pytest.approx(math.log(0.415))
    assert s.log_ttft_p99 == pytest.approx(math.log(1.2))
    assert s.measured_passes == 2 and not s.unusable and s.kv_pool_tokens == 358_000


def test_unsteady_boot_is_flagged_but_kept() -> None:
    s = summarize(boot(800, 1000, 1200), measured_passes=2, sigma_run=0.03)
    assert s.unsteady and not s.unusable


@pytest.mark.parametrize("sample, why", [
    (boot(900, 1000), "measured passes"),
    (boot(900, 1000, 0.0), "non-positive"),
    (boot(900, 1000, float("inf")), "non-positive"),
    (boot(900, 1000, 1000, errors=0.02), "failed"),
])
def test_unusable_boots_are_never_zero(sample: BootSample, why: str) -> None:
    s = summarize(sample, measured_passes=2)
    assert why in s.unusable and math.isnan(s.log_throughput)


def test_failure_of_prefers_the_boots_own_failure() -> None:
    own = Failure(kind=FailureKind.CUDA_GRAPH_FAILED, summary="capture failed", remedy="--disable-cuda-graph")
    crashed = BootSample(arm=Arm.CANDIDATE, block=0, position=0, failed=own)
    assert failure_of(crashed) is own
    assert failure_of(boot(900, 1000, errors=0.001)) is None
    made = failure_of(boot(900, 1000, errors=0.01))
    assert made is not None and "1.0%" in made.summary


def test_boot_sample_round_trips() -> None:
    sample = boot(872, 995, 1005)
    assert BootSample.from_dict(sample.to_dict()) == sample
    assert sample.covariates.drifting() == {"sm_clock_mhz": 2700.0, "probe_score": 1.5}


def test_a_schema_1_boot_sample_is_read() -> None:
    """Schema 1 wrote the arm's letter, the power limit as ``power_w`` and an ``extra`` mapping of covariates."""
    old = {"schema_version": 1, "arm": "B", "block": 3, "position": 1, "candidate_key": "k",
           "passes": [{"output_throughput_tok_s": 990.0, "warmup": True}], "kv_pool_tokens": 358_000,
           "quality_passed": True, "failed": None,
           "covariates": {"sm_clock_mhz": 2700.0, "mem_clock_mhz": None, "temperature_c": 61.0,
                          "free_memory_mib": None, "power_w": 575.0, "probe_score": None, "started_at": 12.0,
                          "extra": {}}}
    sample = BootSample.from_dict(old)
    assert sample.arm is Arm.CANDIDATE and sample.schema_version == 2
    assert sample.covariates == Covariates(sm_clock_mhz=2700.0, temperature_c=61.0, power_limit_w=575.0,
                                           started_at=12.0)
    assert sample.to_dict()["arm"] == "candidate"


def _tail_boot(requests: int, p90: float = 0.9) -> BootSample:
    passes = tuple(PassMeasurement(1000.0, ttft_p50_s=0.4, ttft_p99_s=3.0, ttft_p90_s=p90, warmup=i == 0,
                                   requests_ok=requests) for i in range(3))
    return BootSample(arm=Arm.CANDIDATE, block=0, position=0, passes=passes, kv_pool_tokens=1000, quality_passed=True)


def test_a_boot_too_small_for_a_p99_judges_its_tail_at_p90_and_says_so() -> None:
    few = summarize(_tail_boot(15), measured_passes=2)          # 30 requests: their p99 is their maximum
    assert few.tail_quantile == 0.9 and few.tail_requests == 30
    assert few.log_ttft_p99 == pytest.approx(math.log(0.9))
    many = summarize(_tail_boot(60), measured_passes=2)         # 120 requests estimate a p99
    assert many.tail_quantile == 0.99 and many.log_ttft_p99 == pytest.approx(math.log(3.0))
    # a record without request counts (written before they were kept) keeps the p99 it always had
    assert summarize(boot(872, 995, 1005), measured_passes=2).tail_quantile == 0.99


def test_the_tail_guardrail_says_at_which_quantile_it_was_judged() -> None:
    from elsa_tune.tuner.ab.gate import GatePolicy, GuardrailPolicy, _guardrails

    a = [summarize(_tail_boot(15, 0.9 + i / 100), measured_passes=2) for i in range(4)]
    b = [summarize(_tail_boot(15, 0.91 + i / 100), measured_passes=2) for i in range(4)]
    policy = GatePolicy(guardrails=GuardrailPolicy(ttft_p50_margin=None, kv_pool_min_ratio=None,
                                                   require_quality=False))
    results, _ = _guardrails(a, b, policy, 0.05)
    tail = next(g for g in results if g.name == "ttft_p99")
    assert "judged at p90: 30 requests per boot cannot estimate a p99" in tail.detail
