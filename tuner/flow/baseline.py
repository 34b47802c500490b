"""``measure_baseline``: the reference's boots, the noise they show, and the gate's policy that follows from it.

Every entry point that runs the A/B gate starts with this step: ``Study`` (the night's baseline), ``Worker`` (the
baseline on its own GPU) and ``compare_flags`` (A's boots). The reference is booted ``boots`` times, the first with
the stress probes and the quality reference; a boot that fails, fails its quality gate or measures no pass refuses
the reference (``StudyError``), since nothing can be compared with it. The boots' passes are dimensioned
(``dimension``): the boot-to-boot and pass-to-pass noise of this setup, from which ``Baseline.policy`` builds the
gate's policy (``gate_policy``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from elsa_tune.errors import StudyError
from elsa_tune.history.records import Phase
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.search_spaces.space import SearchSpace
from elsa_tune.tuner.ab.boot_sample import BootSample, PassMeasurement
from elsa_tune.tuner.ab.comparison import InsufficientData
from elsa_tune.tuner.ab.dimensioning import NoiseReport, dimension, outlier_boot
from elsa_tune.tuner.ab.gate import GatePolicy
from elsa_tune.tuner.ab.policy import gate_policy
from elsa_tune.tuner.flow.booter import BootPlan, BootResult
from elsa_tune.tuner.flow.night import boot_mean, geo
from elsa_tune.tuner.flow.settings import Settings

#: Resizes the measured pass after the first boot's passes; returns whether it did (that boot is then no sample).
PassFitter = Callable[[Sequence[PassMeasurement]], bool]


@dataclass(frozen=True)
class BaselineRequest:
    """What to boot as the reference, and how errors name it.

    Boots are tagged ``<tag>:<i>`` (a resumed run reads them back by tag). ``what`` names the reference in errors
    ("the baseline configuration", "A (a.yaml)"), ``where`` the setup ("on this setup", "on GPU 1"), ``runner``
    what is asked for more passes ("the study", "the worker"); ``remedy`` is said when a failed boot brings none of
    its own. ``extra_boots`` are added, once, when the mean of one of the first ``boots`` boots stands apart from the
    others (``outlier_boot`` at as few as four boots: too few to set one aside, enough to ask for more).
    ``noise_context`` is recorded with the noise report.
    """

    candidate: Candidate
    boots: int
    tag: str
    phase: Phase
    what: str
    where: str
    runner: str
    remedy: str
    technique: str | None = None
    extra_boots: int = 0
    noise_context: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Baseline:
    """The reference's noise samples (a boot whose pass was resized is not one), their noise, and the boots made."""

    samples: tuple[BootSample, ...]
    noise: NoiseReport
    booted: int

    @property
    def throughput(self) -> float | None:
        """Geometric mean of the samples' mean throughputs, the boot the noise report set aside left out."""
        means = [boot_mean(s.passes) for i, s in enumerate(self.samples) if i != self.noise.set_aside_boot]
        return geo([m for m in means if m is not None])

    @property
    def throughput_all_boots(self) -> float | None:
        """Geometric mean of every sample's mean throughput, a set-aside boot included."""
        return geo([m for m in (boot_mean(s.passes) for s in self.samples) if m is not None])

    def policy(self, space: SearchSpace, settings: Settings, *, looks: Sequence[int],
               context_target: int | None) -> GatePolicy:
        """The gate's policy on the setup this baseline measured: ``looks`` blocks per arm at each look."""
        return gate_policy(space, self.noise, settings, looks=looks, context_target=context_target)


def measure_baseline(boot: Callable[[BootPlan], BootResult], request: BaselineRequest, *, run_dir: Path,
                     fit_pass: PassFitter | None = None) -> Baseline:
    """Boot ``request``'s reference through ``boot`` until it has its samples, and dimension their noise.

    ``fit_pass`` is asked once, after the first boot, whether the measured pass must be resized. Raises
    ``StudyError`` when a boot refuses the reference or the samples cannot be dimensioned.
    """
    samples: list[BootSample] = []
    i, resized, wanted = 0, False, request.boots
    while len(samples) < wanted:
        result = boot(BootPlan(tag=f"{request.tag}:{i}", candidate=request.candidate, phase=request.phase,
                               probes=i == 0, technique=request.technique))
        i += 1
        _refuse(result, request, run_dir)
        if fit_pass is not None and not resized and fit_pass(result.sample.passes):
            resized = True
            continue
        samples.append(result.sample)
        if request.extra_boots and len(samples) == wanted == request.boots and _disagree(samples):
            wanted += request.extra_boots
    try:
        noise = dimension(samples, context=dict(request.noise_context))
    except InsufficientData as exc:
        raise StudyError(f"the boots of {request.what} {request.where} cannot be dimensioned: {exc}",
                         remedy=f"give {request.runner} more passes per boot (--pass-seconds) or a steadier "
                                "machine") from exc
    return Baseline(tuple(samples), noise, i)


def _refuse(result: BootResult, request: BaselineRequest, run_dir: Path) -> None:
    """Raise ``StudyError`` when this boot of the reference failed, failed its quality gate or measured nothing."""
    sample, record = result.sample, result.record
    server_log = f"server log: {run_dir / (record.log_path or '')}"
    if sample.failed is not None:
        f = sample.failed
        raise StudyError(f"{request.what} fails {request.where}: {f.kind.value}: {f.summary}",
                         remedy=f"{f.remedy or request.remedy}; {server_log}")
    if sample.quality_passed is False:
        raise StudyError(f"{request.what} failed its own stress probes {request.where}",
                         remedy=f"read the boot's probes; {server_log}")
    if not sample.passes:
        raise StudyError(f"{request.what} was not measured {request.where}: {record.note or record.outcome.value}",
                         remedy=f"give {request.what} flags whose KV pool holds the space's context target, or "
                                "pass another --space")


def _disagree(samples: Sequence[BootSample]) -> bool:
    """Whether one boot's mean log throughput stands apart from the others' (``outlier_boot`` at as few boots as
    there are samples)."""
    means = [boot_mean(s.passes) for s in samples]
    if any(m is None or m <= 0 for m in means):
        return False
    return outlier_boot(np.log(np.asarray(means, dtype=np.float64)), min_boots=len(samples)) is not None
