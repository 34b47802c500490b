"""Field-like noise for the simulated server: boot drift, run-to-run wander, a cold first pass.

Three multiplicative factors on every step's duration, all seeded from ``--sim-seed``:

- **boot drift**: ``exp(N(0, boot_sigma))``, drawn once per boot (restarts of one build differ by ~10–15%);
- **run noise**: a per-pass factor ``exp(N(0, run_sigma))``, drawn afresh whenever the server comes back
  from idle (a measurement pass starts after a pause), so two passes of one boot differ by about
  ``run_sigma`` (within-run σ is ~3% on real servers), plus a small mean-reverting (Ornstein–Uhlenbeck) wander within a
  pass (``run_sigma / 3``, correlation time ``correlation_s`` of simulated time);
- **cold first pass**: steps are ``1 + first_pass_slowdown`` slower until the boot has served
  ``warm_requests`` requests (a real first run after a restart reads ~13% slow).

The truth (``truth.py``) has none of these; only the real-time server applies them.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from elsa_tune.runtime.sim.profile import NoiseProfile


@dataclass(frozen=True)
class NoiseSettings:
    """The knobs, normally from the profile's ``NoiseProfile``. Zeros give a noiseless server."""

    boot_sigma: float = 0.10
    run_sigma: float = 0.03
    first_pass_slowdown: float = 0.127
    warm_requests: int = 16
    correlation_s: float = 5.0

    @classmethod
    def quiet(cls) -> NoiseSettings:
        return cls(boot_sigma=0.0, run_sigma=0.0, first_pass_slowdown=0.0, warm_requests=0)


class ServingNoise:
    """The noise of one boot. ``factor(sim_time_s)`` multiplies a step's duration; not thread-safe."""

    def __init__(self, settings: NoiseSettings, seed: int) -> None:
        self.settings = settings
        self._rng = random.Random(f"elsa-sim-noise:{seed}")
        self.drift = math.exp(self._rng.gauss(0.0, settings.boot_sigma)) if settings.boot_sigma > 0 else 1.0
        self.passes = 0
        self.pass_factor = 1.0
        self._wander = 0.0
        self._last_t = 0.0
        self.finished_requests = 0
        self.new_pass()

    @property
    def cold(self) -> bool:
        return self.finished_requests < self.settings.warm_requests

    def request_finished(self) -> None:
        self.finished_requests += 1

    def new_pass(self) -> None:
        """The server comes back from idle: a new measurement pass gets its own run factor."""
        self.passes += 1
        sigma = self.settings.run_sigma
        self.pass_factor = math.exp(self._rng.gauss(0.0, sigma)) if sigma > 0 else 1.0

    def factor(self, sim_time_s: float) -> float:
        """The duration multiplier for a step starting at ``sim_time_s`` (seconds of simulated serving)."""
        s = self.settings
        sigma = s.run_sigma / 3
        if sigma > 0:
            dt = max(0.0, sim_time_s - self._last_t)
            self._last_t = max(self._last_t, sim_time_s)
            keep = math.exp(-dt / s.correlation_s) if s.correlation_s > 0 else 0.0
            self._wander = self._wander * keep + sigma * math.sqrt(max(0.0, 1 - keep * keep)) * \
                self._rng.gauss(0.0, 1.0)
        cold = 1.0 + s.first_pass_slowdown if self.cold else 1.0
        return self.drift * self.pass_factor * math.exp(self._wander) * cold


def boot_drift(noise: NoiseProfile, rng: random.Random, study_time_s: float = 0.0) -> float:
    """One boot's drift factor on step durations (``>1`` is slower) for the profile's noise family.

    ``study_time_s`` is when the boot starts, in seconds since the study began (the drifting families use it).
    Every family draws the same number of variates from ``rng``, so a boot's seed fixes its draw whatever the family.
    """
    z = rng.gauss(0.0, 1.0)
    chi = sum(rng.gauss(0.0, 1.0) ** 2 for _ in range(3))
    u = rng.random()
    sigma = noise.boot_sigma
    if noise.family == "t3":
        # t(3) has variance 3: scaled by 1/sqrt(3) its spread matches the lognormal's σ, with heavy tails
        return math.exp(sigma * z / math.sqrt(max(chi / 3.0, 1e-12)) / math.sqrt(3.0))
    factor = math.exp(sigma * z)
    if noise.family == "contaminated" and u < noise.contamination:
        factor *= 1.0 + noise.contamination_slowdown
    elif noise.family == "drift_linear":
        factor *= 1.0 + noise.drift_per_hour * study_time_s / 3600.0
    elif noise.family == "drift_step" and study_time_s >= noise.step_at_s:
        factor *= 1.0 + noise.step_size
    return factor
