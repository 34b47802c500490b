"""``Settings``: everything one study is told, defined once, typed, frozen.

Precedence, lowest first: the defaults below < ``ELSA_TUNE_<NAME>`` environment variables < the command
line. Unknown ``ELSA_TUNE_*`` variables are warned about (a typo must not silently do nothing); a value
that does not parse is a ``ConfigError`` naming the variable. Settings are never mutated: a phase that
needs a different value builds a new object with ``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from elsa_tune.errors import ConfigError
from elsa_tune.finite_number import number_problem
from elsa_tune.tuner.flow.budget import parse_duration

log = logging.getLogger(__name__)

ENV_PREFIX = "ELSA_TUNE_"
#: the fastest a simulated server may run its clock (simulated seconds per wall second)
MAX_SPEEDUP = 1e6


class Launcher(enum.StrEnum):
    """How the runtime is started: a local process, a Docker container, or the simulated server."""

    PROCESS = "process"
    DOCKER = "docker"
    SIM = "sim"


RUNTIMES = tuple(launcher.value for launcher in Launcher)
#: ``--runtime`` also takes a runtime family's name: that family as a local process.
FAMILIES = ("sglang", "llamacpp", "vllm")
#: ``--gpu cpu``: no GPU, the server runs on the host and its memory is the host's (``runtime/host_memory.py``).
CPU = "cpu"
#: Environment variables with this prefix that belong to other parts of elsa-tune, not to Settings.
_FOREIGN_ENV = frozenset({"ELSA_TUNE_DEBUG", "ELSA_TUNE_CACHE"})


@dataclass(frozen=True)
class Settings:
    """One study's settings. ``gpu`` is an NVML index or UUID, ``"sim"`` for the simulated card, or ``"cpu"`` for a
    server on the host's CPU and memory. ``family`` is the runtime family (``sglang``, ``llamacpp``) when the
    command line names one (``--runtime llamacpp``); ``None`` takes the search space's.

    ``budget_s`` is the whole study's wall time; ``out`` ``None`` means ``./elsa-runs/<study>/``.
    ``pass_seconds`` sizes a measured pass of the traffic (a few seconds on the simulator, minutes on a
    GPU); ``baseline_boots`` dimensions the noise; ``looks`` overrides the gate's sequential looks
    (blocks per arm at each look; empty: derived from the budget).
    """

    gpu: str = "0"
    traffic: str = "demo"
    space: str = "generic-sglang"
    model: str | None = None
    budget_s: float = 8 * 3600.0
    out: Path | None = None
    study: str | None = None
    runtime: Launcher = Launcher.PROCESS
    family: str | None = None
    launch: str | None = None
    image: str | None = None
    sim_profile: str | None = None
    sim_speedup: float = 40.0
    seed: int = 0
    verbosity: int = 0
    log_file: Path | None = None
    resume: bool = False
    baseline_boots: int = 4
    warmup_passes: int = 1
    measured_passes: int = 2
    pass_seconds: float | None = None
    soak_s: float = 600.0
    looks: tuple[int, ...] = ()
    max_trials: int = 200
    boot_timeout_s: float | None = None
    live: bool | None = None
    virtual: bool = False
    schema_version: int = 1

    def __post_init__(self) -> None:
        if self.runtime in FAMILIES:
            object.__setattr__(self, "family", str(self.runtime))
            object.__setattr__(self, "runtime", Launcher.PROCESS)
        if self.runtime not in RUNTIMES:
            raise ConfigError(f"unknown runtime {self.runtime!r}",
                              remedy=f"use one of: {', '.join((*RUNTIMES, *FAMILIES))}")
        object.__setattr__(self, "runtime", Launcher(self.runtime))
        if self.family is not None and self.family not in FAMILIES:
            raise ConfigError(f"unknown runtime family {self.family!r}", remedy=f"use one of: {', '.join(FAMILIES)}")
        if self.gpu == "sim" and self.runtime is not Launcher.SIM:
            object.__setattr__(self, "runtime", Launcher.SIM)
        if self.virtual and self.runtime is not Launcher.SIM:
            raise ConfigError("a virtual study runs on the simulated runtime only",
                              remedy="pass --gpu sim --sim-profile NAME with --virtual")
        if self.runtime is Launcher.SIM and not self.sim_profile:
            raise ConfigError("the simulated runtime needs a profile",
                              remedy="pass --sim-profile NAME (see runtime/sim/profiles/, e.g. "
                                     "rtx5090-qwen3.8-27b-nvfp4)")
        for name, kind in _KINDS.items():     # the one finite-number rule, whichever source gave the value
            value = getattr(self, name, None)
            numbers = value if kind == "ints" and isinstance(value, tuple) else (value,)
            if kind in ("float", "int", "ints") and value is not None and any(number_problem(v) for v in numbers):
                raise ConfigError(f"{_source(name)}: {number_problem(next(v for v in numbers if number_problem(v)))}",
                                  remedy=f"give {_source(name)} a finite value")
        if not re.fullmatch(r"[A-Za-z0-9_,.:-]+", self.gpu):
            raise ConfigError(f"--gpu {self.gpu!r} is not a GPU: an NVML index, a UUID, sim or cpu",
                              remedy="pass e.g. --gpu 0, --gpu 0,1, --gpu GPU-<uuid> (nvidia-smi -L), --gpu sim")
        if self.boot_timeout_s is not None and self.boot_timeout_s <= 0:
            raise ConfigError(f"{_source('boot_timeout_s')} is {self.boot_timeout_s:g}: a boot cannot be given no time",
                              remedy="give it a positive number of seconds (e.g. 600), or unset it for the space's "
                                     "probes.boot_timeout_s")
        if self.sim_speedup > MAX_SPEEDUP:
            raise ConfigError(f"{_source('sim_speedup')} {self.sim_speedup:g} is more than {MAX_SPEEDUP:g}: the "
                              "simulated server's timers would be shorter than the host can keep",
                              remedy="use e.g. 40 (the default), or --virtual for a study in simulated time alone")
        if self.budget_s <= 0:
            raise ConfigError("the budget must be positive", remedy="pass e.g. --budget 8h")
        if self.baseline_boots < 3:
            raise ConfigError("the baseline needs at least 3 boots to measure boot-to-boot noise",
                              remedy="set --baseline-boots (ELSA_TUNE_BASELINE_BOOTS) to 3 or more")
        if self.measured_passes < 1 or self.warmup_passes < 0:
            raise ConfigError("measured passes must be >= 1 and warm-up passes >= 0",
                              remedy="the first pass after a boot is always warm-up: use 1 warm-up, 2 measured")
        if (self.pass_seconds is not None and self.pass_seconds <= 0) or self.sim_speedup <= 0:
            raise ConfigError("pass_seconds and sim_speedup must be positive", remedy="use e.g. 120 and 40")
        if any(b < 1 for b in self.looks) or list(self.looks) != sorted(set(self.looks)):
            raise ConfigError(f"looks must be increasing positive block counts, got {list(self.looks)}",
                              remedy="e.g. 2,4,6")

    @property
    def pass_s(self) -> float:
        """Target length of one measured pass: given, or sized so that ~150 boots of 3 passes (and ~3 s of boot
        and stop each) fit the budget: 8h → ~1 min, 30m → ~3 s, 8m → the 1 s floor."""
        if self.pass_seconds is not None:
            return self.pass_seconds
        return min(180.0, max(1.0, (self.budget_s / 150.0 - 3.0) / 3.0))

    @property
    def study_name(self) -> str:
        if self.study:
            return self.study
        base = Path(self.space).name if self.space else "study"
        base = base.rsplit(".", 1)[0] if base.endswith((".yaml", ".yml")) else base
        return f"{base}-sim" if self.runtime is Launcher.SIM else base

    @property
    def run_dir(self) -> Path:
        return self.out if self.out is not None else Path("elsa-runs") / self.study_name

    @property
    def simulated(self) -> bool:
        return self.runtime is Launcher.SIM

    @property
    def speedup(self) -> float:
        """Simulated seconds per wall second of the runtime's clock: 1 on a GPU and in a virtual study, where every
        second is the simulated system's own."""
        return self.sim_speedup if self.simulated and not self.virtual else 1.0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["out"] = str(self.out) if self.out else None
        data["log_file"] = str(self.log_file) if self.log_file else None
        data["looks"] = list(self.looks)
        data["runtime"] = self.runtime.value
        return data

    @classmethod
    def resolve(cls, cli: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Settings:
        """Defaults < ``ELSA_TUNE_*`` in ``environ`` (default ``os.environ``) < ``cli`` (``None`` = not given)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        by_name = {f.name: f for f in fields(cls)}
        for key, raw in env.items():
            if not key.startswith(ENV_PREFIX) or key in _FOREIGN_ENV:
                continue
            name = key[len(ENV_PREFIX):].lower()
            if name not in by_name or name == "schema_version":
                log.warning("ignoring unknown environment variable %s (settings are: %s)", key,
                            ", ".join(ENV_PREFIX + n.upper() for n in by_name if n != "schema_version"))
                continue
            values[name] = _parse(name, raw, source=key)
        for name, value in cli.items():
            if value is None or name not in by_name:
                continue
            values[name] = _parse(name, value, source=f"--{name.replace('_', '-')}") if isinstance(value, str) \
                else _coerce(name, value)
        return cls(**values)


def _parse(name: str, raw: str, *, source: str) -> Any:
    try:
        if name == "budget_s":
            return parse_duration(raw)
        if name in ("soak_s", "pass_seconds", "sim_speedup") and not raw.replace(".", "", 1).isdigit():
            return parse_duration(raw)
        kind = _KINDS.get(name, "str")
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            lowered = raw.strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(raw)
            return lowered in ("1", "true", "yes")
        if kind == "path":
            return Path(raw)
        if kind == "ints":
            return tuple(int(x) for x in raw.replace(" ", "").split(",") if x)
        return raw
    except ValueError as exc:
        raise ConfigError(f"{source}: cannot read {raw!r} as {_KINDS.get(name, 'text')}",
                          remedy=f"give {source} a valid value") from exc


def _source(name: str) -> str:
    """How a person sets ``name``: the environment variable, and the flag where ``elsa-tune tune`` has one."""
    flag = _FLAGS.get(name)
    return f"{flag} ({ENV_PREFIX}{name.upper()})" if flag else f"{ENV_PREFIX}{name.upper()}"


_FLAGS = {"budget_s": "--budget", "sim_speedup": "--sim-speedup", "seed": "--seed",
          "baseline_boots": "--baseline-boots", "pass_seconds": "--pass-seconds", "out": "--out",
          "log_file": "--log-file"}


def _coerce(name: str, value: Any) -> Any:
    kind = _KINDS.get(name, "str")
    if kind == "path" and not isinstance(value, Path):
        return Path(value)
    if kind == "ints":
        return tuple(int(v) for v in value)
    return value


_KINDS: dict[str, str] = {
    "budget_s": "float", "sim_speedup": "float", "seed": "int", "verbosity": "int", "resume": "bool",
    "baseline_boots": "int", "warmup_passes": "int", "measured_passes": "int", "pass_seconds": "float",
    "soak_s": "float", "looks": "ints", "max_trials": "int", "boot_timeout_s": "float", "live": "bool",
    "out": "path", "log_file": "path",
}
