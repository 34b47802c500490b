"""``MemoryModel``: the KV pool and the running slots a candidate would get, predicted from the boots so far.

SGLang decides ``max_total_num_tokens`` at boot from the static memory fraction, the speculative draft's
buffers and the Mamba state pool (MTP can cost a 32 GB card ~160K tokens of context; the Mamba ratio carves the
rest as ``KV ≈ rest / (1 + ratio)``). Those effects are close to linear in a handful of terms, so a ridge
least-squares fit on the pools the runtime *reported* (never the declared context length) predicts the
next candidate's pool well enough to skip, without a boot, candidates that cannot hold the context target.

The model says how wrong it is: ``error()`` is the leave-one-out relative error of the fit, and a
candidate is skipped only when even its prediction plus twice that error misses the target. With fewer
than ``min_points`` boots it predicts nothing (statistics never fail open: no data, no skip).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from elsa_tune.history.records import BootRecord
from elsa_tune.search_spaces.candidate import FlagValue
from elsa_tune.search_spaces.space import SearchSpace

SCHEMA_VERSION = 1
RIDGE = 1e-3


@dataclass(frozen=True)
class Observation:
    """One boot's flags and what the runtime reported (``slots`` = effective ``max_running_requests``)."""

    flags: Mapping[str, FlagValue]
    kv_tokens: int
    slots: int | None = None


@dataclass(frozen=True)
class Prediction:
    """A predicted pool with the model's relative error (``None`` when the model cannot predict yet)."""

    kv_tokens: float | None
    slots: int | None
    relative_error: float | None
    points: int
    error_tokens: float | None = None    # leave-one-out mean absolute error, in tokens

    def misses(self, target: int | None) -> bool:
        """True only when the pool confidently misses ``target``: even the prediction plus twice the model's
        error (relative or in tokens, whichever is larger; at least 2% of the target) stays below it."""
        if target is None or self.kv_tokens is None or self.relative_error is None:
            return False
        margin = max(2.0 * self.relative_error * self.kv_tokens, 2.0 * (self.error_tokens or 0.0), 0.02 * target)
        return self.kv_tokens + margin < target


def features(flags: Mapping[str, FlagValue], numeric: Sequence[str]) -> list[float]:
    """The regression terms of a candidate: static fraction, draft depth, Mamba carve, slots, other numbers."""
    def num(name: str, default: float = 0.0) -> float:
        value = flags.get(name)
        if isinstance(value, bool) or value is None:
            return default
        try:
            return float(value)
        except (TypeError, ValueError):
            return default

    fraction = num("mem-fraction-static", 0.9)
    spec = 1.0 if flags.get("speculative-algorithm") else 0.0
    steps = num("speculative-num-steps") * spec
    draft = num("speculative-num-draft-tokens") * spec
    ratio = num("mamba-full-memory-ratio", 0.9)
    carve = 1.0 / (1.0 + ratio)
    requests = num("max-running-requests", 1.0)
    mamba_slots = num("max-mamba-cache-size", requests * 8.0)
    base = [1.0, fraction, spec, steps, draft, requests, mamba_slots]
    row = base + [carve * x for x in base]
    known = {"mem-fraction-static", "speculative-num-steps", "speculative-num-draft-tokens",
             "mamba-full-memory-ratio", "max-running-requests", "max-mamba-cache-size"}
    others = [num(name) for name in numeric if name not in known]
    row += others + [carve * x for x in others]
    return row


@dataclass
class MemoryModel:
    """Ridge least squares of the reported KV pool on ``features``; refit on every ``add``.

    ``numeric`` names the space's other numeric flags (each becomes a linear term). Not a record: it is
    rebuilt from the boots in history whenever the study (re)starts.
    """

    numeric: tuple[str, ...] = ()
    min_points: int = 4
    observations: list[Observation] = field(default_factory=list)
    #: candidates the search skipped without a boot on this model's prediction (``search_phase.boot_trial``)
    skipped: int = 0
    #: relative errors of the predictions made before a boot that then reported its pool
    prediction_errors: list[float] = field(default_factory=list)
    _coef: np.ndarray | None = None
    _scale: np.ndarray | None = None
    _loo: float | None = None
    _loo_tokens: float | None = None

    @classmethod
    def for_space(cls, space: SearchSpace) -> MemoryModel:
        """An empty model whose linear terms are the space's numeric flags."""
        return cls(numeric=tuple(p.flag for p in space.parameters if p.flag and p.is_numeric))

    def add(self, observation: Observation) -> None:
        if observation.kv_tokens <= 0:
            return
        self.observations.append(observation)
        self._fit()


    def add_boots(self, boots: Iterable[BootRecord]) -> None:
        """Learn from every recorded boot that reported its KV pool (a resumed or shared study's history)."""
        before = len(self.observations)
        self.observations.extend(
            Observation(record.candidate.flags, record.report.max_total_num_tokens, record.report.max_running_requests)
            for record in boots if record.report and record.report.max_total_num_tokens)
        if len(self.observations) > before:
            self._fit()  # once for the whole history, not once per boot
    def error(self) -> float | None:
        """Leave-one-out mean absolute relative error of the pool prediction (``None`` before the fit)."""
        return self._loo

    def predict(self, flags: Mapping[str, FlagValue]) -> Prediction:
        slots = self._slots(flags)
        if self._coef is None or self._scale is None:
            return Prediction(None, slots, None, len(self.observations))
        exact = [o.kv_tokens for o in self.observations if dict(o.flags) == dict(flags)]
        if exact:   # the pool is deterministic per configuration: a seen config needs no model
            return Prediction(float(exact[-1]), slots, 0.0, len(self.observations), 0.0)
        x = np.asarray(features(flags, self.numeric)) / self._scale
        return Prediction(max(0.0, float(x @ self._coef)), slots, self._loo, len(self.observations),
                          self._loo_tokens)

    def _slots(self, flags: Mapping[str, FlagValue]) -> int | None:
        requested = flags.get("max-running-requests")
        seen = [o.slots for o in self.observations
                if o.slots is not None and o.flags.get("max-running-requests") == requested
                and o.flags.get("max-mamba-cache-size") == flags.get("max-mamba-cache-size")]
        if seen:
            return min(seen)
        return int(requested) if isinstance(requested, (int, float)) and not isinstance(requested, bool) else None

    def _fit(self) -> None:
        distinct = {tuple(sorted((k, str(v)) for k, v in o.flags.items())) for o in self.observations}
        if len(distinct) < self.min_points:
            self._coef, self._scale, self._loo, self._loo_tokens = None, None, None, None
            return
        x = np.asarray([features(o.flags, self.numeric) for o in self.observations], dtype=np.float64)
        y = np.asarray([o.kv_tokens for o in self.observations], dtype=np.float64)
        scale = np.maximum(np.abs(x).max(axis=0), 1e-9)
        xs = x / scale
        self._coef = _ridge(xs, y)
        self._scale = scale
        errors, tokens = [], []
        for i in range(len(y)):
            keep = np.arange(len(y)) != i
            coef = _ridge(xs[keep], y[keep])
            miss = abs(max(0.0, float(xs[i] @ coef)) - y[i])
            errors.append(miss / y[i])
            tokens.append(miss)
        self._loo = float(np.mean(errors)) if errors else None
        self._loo_tokens = float(np.mean(tokens)) if tokens else None

    def describe(self) -> str:
        err = self._loo
        return (f"memory model on {len(self.observations)} boots: "
                + (f"leave-one-out error {err:.1%}" if err is not None and math.isfinite(err) else "not fitted yet"))


def _ridge(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    gram = x.T @ x + RIDGE * np.eye(x.shape[1])
    coef: np.ndarray = np.linalg.solve(gram, x.T @ y)
    return coef
