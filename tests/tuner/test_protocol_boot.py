"""The per-boot protocol: warm-up discarded, k measured passes, log summaries, failures never imputed."""

from __future__ import annotations

import math

import pytest

from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.tuner.protocol import BootSample, Covariates, PassMeasurement, failure_of, summarize
from elsa_tune.tuner.schedule import Arm


def boot(*tok_s: float, warm: int = 1, errors: float = 0.0) -> BootSample:
    passes = tuple(PassMeasurement(x, ttft_p50_s=0.4 + i / 100, ttft_p99_s=1.2, warmup=i < warm, error_fraction=errors)
                   for i, x in enumerate(tok_s))
    return BootSample(arm=Arm.CANDIDATE, block=3, position=1, passes=passes, kv_pool_tokens=358_000,
                      quality_passed=True, covariates=Covariates(sm_clock_mhz=2700, extra={"probe": 1.5}))


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
    assert sample.covariates.as_mapping() == {"sm_clock_mhz": 2700.0, "probe": 1.5}
