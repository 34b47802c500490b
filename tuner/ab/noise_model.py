"""The normal noise model of boot-to-boot and pass-to-pass variation as a ``BootSampler``.

log throughput of arm c, boot b, pass i = μ_c + β_cb + ε_cbi (+ a warm-up penalty on the first pass,
+ an optional linear drift per boot slot), β ~ N(0, σ_boot²), ε ~ N(0, σ_run²). The candidate's true
effect is known, so the gate's operating characteristics can be measured against the truth: this is
what the gate's tests and ``benchmarks/gate`` feed it. It is a model of noise, not a measurement of
hardware; the study uses a sampler that boots the real (or simulated) runtime.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from elsa_tune.history.records import Arm, Covariates
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.tuner.ab.boot_sample import BootSample, PassMeasurement

WARMUP_PENALTY = math.log(1 - 0.127)   # the first run after a restart reads ~13% slow


@dataclass
class NoiseModelSampler:
    """Seeded synthetic boots with a known true ``effect`` (candidate/incumbent throughput − 1).

    ``ttft_effect`` scales the candidate's TTFT (1.2 = 20% slower first tokens); ``kv_pool`` gives each
    arm's KV pool tokens; ``crash_on_boot`` makes the candidate's n-th boot (0-based) crash;
    ``quality_b`` is the candidate's quality-gate outcome. ``drift_per_slot`` adds a linear drift in
    log throughput per boot in run order (what ABBA·BAAB cancels). A boot's log TTFT moves by
    ``−ttft_coupling · β`` (a slow boot is slow to first token too) plus ``sigma_ttft`` of its own.
    ``family`` shapes β: ``lognormal`` (normal on the log scale), ``t3`` (Student t with 3 degrees of freedom scaled
    to ``sigma_boot``), ``contaminated`` (a ``contamination`` share of boots ``contamination_slowdown`` slower) or
    ``drift_step`` (every boot from ``step_at_slot`` on ``step_size`` slower).
    """

    effect: float = 0.0
    sigma_boot: float = 0.10
    sigma_run: float = 0.03
    measured_passes: int = 2
    warmup_passes: int = 1
    base_tok_s: float = 1000.0
    ttft_s: float = 0.5
    ttft_effect: float = 1.0
    sigma_ttft: float = 0.02
    ttft_coupling: float = 0.3
    kv_pool: tuple[int, int] = (300_000, 300_000)
    quality_b: bool | None = True
    crash_on_boot: int | None = None
    drift_per_slot: float = 0.0
    family: str = "lognormal"
    contamination: float = 0.1
    contamination_slowdown: float = 0.25
    step_at_slot: int = 8
    step_size: float = 0.10
    seed: int = 0
    boots: list[BootSample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def _drift(self, slot: int) -> float:
        """The boot's drift β in log throughput for the noise family (a slow boot has a negative β)."""
        beta = float(self._rng.normal(0.0, self.sigma_boot)) + self.drift_per_slot * slot
        if self.family == "t3":
            beta *= 1.0 / math.sqrt(max(float(self._rng.chisquare(3)) / 3.0, 1e-12)) / math.sqrt(3.0)
        elif self.family == "contaminated":
            if float(self._rng.random()) < self.contamination:
                beta -= math.log1p(self.contamination_slowdown)
        elif self.family == "drift_step":
            if slot >= self.step_at_slot:
                beta -= math.log1p(self.step_size)
        elif self.family != "lognormal":
            raise ValueError(f"unknown noise family {self.family!r}")
        return beta

    def boot(self, arm: Arm, block: int, position: int) -> BootSample:
        slot = len(self.boots)
        candidate_boots = sum(b.arm is Arm.CANDIDATE for b in self.boots)
        if arm is Arm.CANDIDATE and self.crash_on_boot is not None and candidate_boots == self.crash_on_boot:
            sample = BootSample(arm=arm, block=block, position=position, failed=Failure(
                kind=FailureKind.OOM_UNDER_LOAD, phase="serve", summary="CUDA out of memory on the first generation",
                remedy="lower --mem-fraction-static"))
            self.boots.append(sample)
            return sample
        mu = math.log(self.base_tok_s) + (math.log1p(self.effect) if arm is Arm.CANDIDATE else 0.0)
        beta = self._drift(slot)
        passes = []
        for i in range(self.warmup_passes + self.measured_passes):
            warm = i < self.warmup_passes
            log_tput = mu + beta + float(self._rng.normal(0.0, self.sigma_run)) + (WARMUP_PENALTY if warm else 0.0)
            # TTFT moves against throughput within a boot, plus its own noise and the candidate's TTFT effect.
            log_ttft = (math.log(self.ttft_s) - self.ttft_coupling * beta
                        + float(self._rng.normal(0.0, self.sigma_ttft))
                        + (math.log(self.ttft_effect) if arm is Arm.CANDIDATE else 0.0))
            passes.append(PassMeasurement(output_throughput_tok_s=math.exp(log_tput), ttft_p50_s=math.exp(log_ttft),
                                          ttft_p99_s=3.0 * math.exp(log_ttft), warmup=warm))
        sample = BootSample(
            arm=arm, block=block, position=position, passes=tuple(passes),
            kv_pool_tokens=self.kv_pool[1 if arm is Arm.CANDIDATE else 0],
            quality_passed=self.quality_b if arm is Arm.CANDIDATE else True,
            covariates=Covariates(sm_clock_mhz=2400.0 + 100.0 * beta, temperature_c=60.0 - 20.0 * beta))
        self.boots.append(sample)
        return sample
