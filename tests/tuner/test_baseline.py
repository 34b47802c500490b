"""``measure_baseline``: the step the study, a worker and ``compare`` share — the reference's boots, their noise, the
policy — on boots made up here (their throughputs chosen, no runtime)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from elsa_tune.errors import StudyError
from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.history.records import Arm as RecordArm
from elsa_tune.history.records import BootOutcome, BootRecord, Phase
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.tuner.ab.boot_sample import BootSample, PassMeasurement
from elsa_tune.tuner.ab.schedule import Arm
from elsa_tune.tuner.flow.baseline import BaselineRequest, measure_baseline
from elsa_tune.tuner.flow.booter import BootPlan, BootResult
from elsa_tune.tuner.flow.study import EXTRA_BASELINE_BOOTS

REFERENCE = Candidate({"mem-fraction-static": 0.8}, label="baseline")
FINGERPRINT = Fingerprint(runtime="sglang-sim", runtime_version="0.5.23", model_path="tiny", gpu_name="RTX 5090")


class Booter:
    """Boots whose mean throughput is the next of ``means`` (``None``: a boot that crashed), each with ``passes``
    passes (the first a warm-up), recording each plan."""

    def __init__(self, means: Sequence[float | None], *, passes: int = 3) -> None:
        self.means = list(means)
        self.passes = passes
        self.plans: list[BootPlan] = []

    def boot(self, plan: BootPlan) -> BootResult:
        mean = self.means[len(self.plans)]
        self.plans.append(plan)
        failure = None if mean is not None else Failure(FailureKind.WEIGHTS_OOM, "out of memory loading the weights",
                                                        remedy="")
        passes = () if mean is None or not self.passes else (
            PassMeasurement(mean * 0.873, 0.5, 1.5, warmup=True),
            *(PassMeasurement(mean * (1 + 0.005 * i), 0.5, 1.5) for i in range(self.passes - 1)))
        record = BootRecord(study="s", boot_id=f"{len(self.plans):04d}", boot_number=len(self.plans),
                            phase=plan.phase, arm=RecordArm.INCUMBENT, candidate=plan.candidate,
                            fingerprint=FINGERPRINT, started_at=0.0, ended_at=60.0,
                            outcome=BootOutcome.BOOT_FAILED if failure else BootOutcome.MEASURED,
                            log_path=f"boots/{len(self.plans):04d}/server.log", tag=plan.tag)
        sample = BootSample(arm=Arm.INCUMBENT, block=0, position=0, passes=passes, failed=failure,
                            candidate_key=plan.candidate.key())
        return BootResult(record, sample)


def _request(boots: int = 4, **overrides: object) -> BaselineRequest:
    values: dict[str, object] = {"candidate": REFERENCE, "boots": boots, "tag": "baseline", "phase": Phase.BASELINE,
                                 "what": "the baseline configuration", "where": "on this setup",
                                 "runner": "the study", "remedy": "fix the base flags of the search space"}
    values.update(overrides)
    return BaselineRequest(**values)  # type: ignore[arg-type]


def test_the_reference_is_booted_its_boots_times_the_first_with_the_probes(tmp_path: Path) -> None:
    booter = Booter([40.0, 41.0, 39.5, 40.5])
    baseline = measure_baseline(booter.boot, _request(tag="compare:A", phase=Phase.COMPARE, technique="A"),
                                run_dir=tmp_path)
    assert [p.tag for p in booter.plans] == ["compare:A:0", "compare:A:1", "compare:A:2", "compare:A:3"]
    assert [p.probes for p in booter.plans] == [True, False, False, False]
    assert {p.technique for p in booter.plans} == {"A"} and {p.phase for p in booter.plans} == {Phase.COMPARE}
    assert len(baseline.samples) == baseline.booted == baseline.noise.boots == 4
    assert baseline.throughput == pytest.approx(baseline.throughput_all_boots) == pytest.approx(40.25, rel=0.01)


def test_more_boots_are_asked_for_when_one_of_the_first_stands_apart(tmp_path: Path) -> None:
    apart = [53.4, 40.1, 36.6, 40.5]
    booter = Booter([*apart, 40.0, 39.0])
    baseline = measure_baseline(booter.boot, _request(extra_boots=EXTRA_BASELINE_BOOTS), run_dir=tmp_path)
    assert len(baseline.samples) == 4 + EXTRA_BASELINE_BOOTS
    # without extra boots (a worker, a comparison), the boots asked for are the boots made
    assert len(measure_baseline(Booter(apart).boot, _request(), run_dir=tmp_path).samples) == 4
    # boots that agree ask for nothing more
    assert measure_baseline(Booter([45.0, 40.1, 36.6, 40.5]).boot, _request(extra_boots=EXTRA_BASELINE_BOOTS),
                            run_dir=tmp_path).booted == 4


def test_a_boot_whose_pass_was_resized_is_no_sample(tmp_path: Path) -> None:
    booter = Booter([80.0, 40.0, 41.0, 39.5, 40.5])
    asked: list[int] = []

    def fit_pass(passes: Sequence[PassMeasurement]) -> bool:
        asked.append(len(passes))
        return True

    baseline = measure_baseline(booter.boot, _request(), run_dir=tmp_path, fit_pass=fit_pass)
    assert asked == [3]                           # asked once, after the first boot
    assert baseline.booted == 5 and len(baseline.samples) == 4
    assert baseline.throughput == pytest.approx(40.25, rel=0.01)


def test_a_reference_that_fails_or_measures_nothing_is_refused_with_its_server_log(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="the baseline configuration fails on this setup: weights_oom") as failed:
        measure_baseline(Booter([40.0, None]).boot, _request(), run_dir=tmp_path)
    assert failed.value.remedy.startswith("fix the base flags of the search space; server log: ")
    assert failed.value.remedy.endswith("boots/0002/server.log")
    with pytest.raises(StudyError, match=r"A \(a.yaml\) was not measured on GPU 1"):
        measure_baseline(Booter([40.0], passes=0).boot, _request(what="A (a.yaml)", where="on GPU 1"),
                         run_dir=tmp_path)
    with pytest.raises(StudyError, match="cannot be dimensioned") as short:
        measure_baseline(Booter([40.0] * 4, passes=2).boot, _request(runner="the worker"), run_dir=tmp_path)
    assert short.value.remedy.startswith("give the worker more passes per boot")
