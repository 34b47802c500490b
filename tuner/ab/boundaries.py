"""Group-sequential efficacy boundaries for the gate's t statistic, calibrated by Monte Carlo and cached.

The gate looks at the data after several numbers of blocks (e.g. 4, 8, 12). Looking repeatedly at a fixed-n
test inflates false keeps (peeking after every pair: 17.5% instead of 5%). Each look's t is first put on a
common z scale through its own nominal one-sided p (z = Φ⁻¹(1 − p), so looks with different degrees of
freedom, Student or Welch, are comparable); the critical z at look j is ``C · w_j`` with a boundary shape
``w_j`` (O'Brien–Fleming: √(n_K/n_j), strict early and lenient late; Pocock: constant) and one constant
``C`` chosen so that, under no effect, the probability of crossing at any look is ``alpha`` (less two Monte
Carlo standard errors, so that simulation error cannot push the real rate above ``alpha``). The gate
therefore compares a look's nominal p with ``nominal_p[j] = 1 − Φ(C·w_j)`` (≈ .0014/.0175/.0426 for OBF at
4/8/12).

``C`` is found by simulation under a normal model — boot effect σ_boot, pass noise σ_run, the
protocol's ``k`` measured passes collapsed as log of their mean, the gate's own Student/Welch/paired
switch and its robust (biweight) summary of each arm — because small-sample t statistics at correlated looks have
no convenient closed form. The
efficacy bound ignores futility stops (they are non-binding: stopping early for futility can only
lower the false-keep rate) and the noise floor (likewise). The sorted null sample of the
boundary-scaled maximum is kept to turn an observed t into a design-adjusted p-value, which the
night's multiple-testing control consumes.

Calibrations are deterministic for a design and seed, memoised in-process, and optionally stored in
``cache_dir`` (``$ELSA_TUNE_CACHE`` by default) as ``.npz`` files named by the design's hash. The null sample
does not depend on ``alpha``: a design that differs from a memoised one only in ``alpha`` (the night's false-keep
control gives each test its own level) takes that sample and fits its constant without a new simulation.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import math
import os
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from elsa_tune.durable_file import replacing
from elsa_tune.tuner.ab.comparison import BIWEIGHT_C, Analysis, FloatArray, t_statistics

log = logging.getLogger(__name__)

#: 2: the design's ``winsor``; 3: the design's ``robust`` (the biweight comparison), ``winsor`` off by default
SCHEMA_VERSION = 3
CACHE_ENV = "ELSA_TUNE_CACHE"
_CHUNK = 5_000


class Shape(enum.StrEnum):
    """The shape of the efficacy boundaries over the looks: O'Brien–Fleming (strict early, close to the fixed test
    at the cap) or Pocock (one nominal level at every look)."""

    OBF = "obf"
    POCOCK = "pocock"


@dataclass(frozen=True)
class Design:
    """Everything the boundaries depend on. ``looks`` are boots per arm (= blocks) at each look."""

    looks: tuple[int, ...] = (4, 8, 12)
    alpha: float = 0.05
    shape: Shape = Shape.OBF
    analysis: Analysis = Analysis.UNPAIRED
    sigma_boot: float = 0.10
    sigma_run: float = 0.03
    measured_passes: int = 2
    welch_ratio: float = 2.0
    replicates: int = 20_000
    seed: int = 20_241_129
    winsor: float | None = None
    robust: float | None = BIWEIGHT_C

    def __post_init__(self) -> None:
        if not self.looks or any(b <= a for a, b in zip(self.looks, self.looks[1:], strict=False)):
            raise ValueError(f"looks must be increasing, got {self.looks}")
        if self.looks[0] < 2:
            raise ValueError("the first look needs at least 2 boots per arm")
        if not 0 < self.alpha < 0.5:
            raise ValueError(f"alpha must be in (0, 0.5), got {self.alpha}")
        closed: tuple[tuple[str, type[enum.StrEnum]], ...] = (("shape", Shape), ("analysis", Analysis))
        for name, members in closed:   # a value read from JSON becomes its member; any other is refused
            value = getattr(self, name)
            if value not in {m.value for m in members}:
                raise ValueError(f"{name} must be one of {[m.value for m in members]}, got {value!r}")
            object.__setattr__(self, name, members(value))
        if self.sigma_boot < 0 or self.sigma_run < 0 or self.sigma_boot + self.sigma_run <= 0:
            raise ValueError("the noise model needs a positive σ_boot or σ_run")
        if self.replicates < 1_000:
            raise ValueError("calibrating with fewer than 1000 replicates is too coarse")

    def rounded(self) -> Design:
        """The same design with σ's rounded to 0.1% so near-identical dimensionings share a cache entry."""
        return Design(looks=self.looks, alpha=self.alpha, shape=self.shape, analysis=self.analysis,
                      sigma_boot=round(self.sigma_boot, 3), sigma_run=round(self.sigma_run, 3),
                      measured_passes=self.measured_passes, welch_ratio=self.welch_ratio,
                      replicates=self.replicates, seed=self.seed, winsor=self.winsor,
                      robust=self.robust)

    def key(self) -> str:
        text = json.dumps({**asdict(self), "schema_version": SCHEMA_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def weights(self) -> tuple[float, ...]:
        n_max = self.looks[-1]
        if self.shape is Shape.POCOCK:
            return tuple(1.0 for _ in self.looks)
        return tuple(math.sqrt(n_max / n) for n in self.looks)


@dataclass(frozen=True)
class Boundaries:
    """Critical t values per look and their nominal one-sided p equivalents.

    ``nominal_p[j]`` is the fixed-n p-value a look must reach (e.g. .0014/.0175/.0426 for OBF at
    4/8/12 blocks); ``achieved_alpha`` is the Monte Carlo false-keep rate of the efficacy rule alone.
    """

    design: Design
    constant: float
    z_critical: tuple[float, ...]
    nominal_p: tuple[float, ...]
    achieved_alpha: float
    null_max: FloatArray = field(repr=False, compare=False)
    schema_version: int = SCHEMA_VERSION

    def crosses(self, look: int, p_nominal: float) -> bool:
        """Does a nominal one-sided p at look ``look`` (1-based) cross the efficacy boundary?"""
        return math.isfinite(p_nominal) and p_nominal <= self.nominal_p[look - 1]

    def t_critical(self, look: int, df: float) -> float:
        """The critical t at ``look`` for a statistic with ``df`` degrees of freedom."""
        return float(stats.t.isf(self.nominal_p[look - 1], df))

    def adjusted_p(self, look: int, p_nominal: float) -> float:
        """Design-adjusted one-sided p of stopping at ``look`` with nominal p ``p_nominal``.

        P_H0(max_j Z_j/w_j ≥ z/w_look): the smallest overall alpha at which a design of this shape
        would have crossed by this look. Valid (conservative) for sequential use; add-one Monte Carlo.
        """
        if not math.isfinite(p_nominal):
            return 1.0
        scaled = float(stats.norm.isf(min(max(p_nominal, 1e-300), 1.0))) / self.design.weights()[look - 1]
        size = int(self.null_max.size)
        beyond = size - int(np.searchsorted(self.null_max, scaled, side="left"))
        return (beyond + 1) / (size + 1)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "design": asdict(self.design), "constant": self.constant,
                "z_critical": list(self.z_critical), "nominal_p": list(self.nominal_p),
                "achieved_alpha": self.achieved_alpha}


_memo: dict[Design, Boundaries] = {}
_memo_lock = threading.Lock()


def smallest_level(replicates: int) -> float:
    """The smallest overall level ``calibrate`` places from ``replicates`` null replicates (a few of them beyond
    the constant, two Monte Carlo standard errors inside the level)."""
    return 5.0 / replicates


def calibrate(design: Design, *, cache_dir: str | Path | None = None) -> Boundaries:
    """Boundaries for ``design``: from the in-process memo, the disk cache, or a fresh simulation."""
    design = design.rounded()
    with _memo_lock:
        hit = _memo.get(design)
        sibling = None if hit is not None else next(
            (b for d, b in _memo.items() if replace(d, alpha=design.alpha) == design), None)
    if hit is not None:
        return hit
    if sibling is not None:       # the same null sample at another level: only the constant changes
        result = _fit(design, sibling.null_max)
        with _memo_lock:
            _memo[design] = result
        return result
    folder = Path(cache_dir) if cache_dir is not None else (Path(os.environ[CACHE_ENV]) if CACHE_ENV in os.environ
                                                             else None)
    found = _load(folder, design) if folder is not None else None
    result = found if found is not None else _simulate(design)
    if found is None and folder is not None:
        _store(folder, result)
    with _memo_lock:
        _memo[design] = result
    return result


def null_maxima(design: Design) -> FloatArray:
    """The boundary-scaled maximum over looks of the gate's z (probit of nominal p) under no effect."""
    rng = np.random.default_rng(design.seed)
    n_max, k = design.looks[-1], design.measured_passes
    weights = np.asarray(design.weights())
    out = np.empty(design.replicates)
    for start in range(0, design.replicates, _CHUNK):
        rows = min(_CHUNK, design.replicates - start)
        ya = _boot_values(rng, rows, n_max, k, design.sigma_boot, design.sigma_run)
        yb = _boot_values(rng, rows, n_max, k, design.sigma_boot, design.sigma_run)
        best = np.full(rows, -np.inf)
        for j, n in enumerate(design.looks):
            _, _, df, t, _ = t_statistics(ya[:, :n], yb[:, :n], analysis=design.analysis, winsor=design.winsor,
                                          robust=design.robust, welch_ratio=design.welch_ratio)
            z = stats.norm.isf(stats.t.sf(np.nan_to_num(t, nan=-np.inf), df))
            best = np.maximum(best, np.nan_to_num(z, nan=-np.inf) / weights[j])   # no valid test: no crossing
        out[start:start + rows] = best
    out.sort()
    return out


def _boot_values(rng: np.random.Generator, rows: int, boots: int, k: int, sigma_boot: float,
                 sigma_run: float) -> FloatArray:
    """Per-boot log of the mean of k passes, each pass exp(β + ε)."""
    beta = rng.normal(0.0, sigma_boot, size=(rows, boots, 1))
    eps = rng.normal(0.0, sigma_run, size=(rows, boots, k))
    values: FloatArray = np.log(np.exp(beta + eps).mean(axis=-1))
    return values


def _simulate(design: Design) -> Boundaries:
    return _fit(design, null_maxima(design))


def _fit(design: Design, maxima: FloatArray) -> Boundaries:
    """The boundaries of ``design`` from its sorted null sample of the boundary-scaled maximum."""
    # Aim two Monte Carlo standard errors below alpha, so the finite simulation errs on the safe side.
    target = design.alpha - 2.0 * math.sqrt(design.alpha * (1.0 - design.alpha) / design.replicates)
    if target <= 0.0:
        raise ValueError(f"a level of {design.alpha:.2g} is below what {design.replicates} null replicates can "
                         f"calibrate (at least {smallest_level(design.replicates):.2g})")
    constant = float(np.quantile(maxima, 1.0 - target, method="higher"))
    z_crit = tuple(constant * w for w in design.weights())
    nominal = tuple(float(stats.norm.sf(z)) for z in z_crit)
    achieved = float(np.mean(maxima >= constant))
    log.info("calibrated boundaries %s: C=%.3f nominal p %s (achieved alpha %.4f, %d replicates)",
             design.key(), constant, ", ".join(f"{p:.4f}" for p in nominal), achieved, design.replicates)
    return Boundaries(design=design, constant=constant, z_critical=z_crit, nominal_p=nominal,
                      achieved_alpha=achieved, null_max=maxima)


def _path(folder: Path, design: Design) -> Path:
    return folder / f"gate-boundaries-{design.key()}.npz"


def _load(folder: Path, design: Design) -> Boundaries | None:
    path = _path(folder, design)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            maxima = np.asarray(data["null_max"], dtype=np.float64)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("ignoring unreadable boundary cache %s: %s", path, exc)
        return None
    if meta.get("design") != asdict(design) or maxima.size != design.replicates:
        log.warning("ignoring boundary cache %s: it was made for another design", path)
        return None
    return Boundaries(design=design, constant=float(meta["constant"]), z_critical=tuple(meta["z_critical"]),
                      nominal_p=tuple(meta["nominal_p"]), achieved_alpha=float(meta["achieved_alpha"]),
                      null_max=maxima)


def _store(folder: Path, result: Boundaries) -> None:
    try:
        with replacing(_path(folder, result.design)) as handle:
            np.savez(handle, meta=np.asarray(json.dumps(result.to_dict())), null_max=result.null_max)
    except OSError as exc:   # a cache is an optimisation: a read-only disk must not stop a study
        log.warning("could not store boundary cache in %s: %s", folder, exc)
