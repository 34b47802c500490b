"""``Fingerprint``: which runtime, model and GPU a number was measured on.

Every stored number carries one. ``key()`` identifies the exact setup (a resumed study refuses to
mix boots from two keys). ``ledger_key()`` is coarser: two fingerprints "match for the ledger" when
the runtime (name + version or image digest), the model (its ``config.json`` hash, else its path),
the GPU model and the driver match; the launch command, the card's UUID and its power cap do not
re-open a rejected technique. A changed ledger key re-opens every technique rejected under the old one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elsa_tune.runtime.gpu import GpuState

SCHEMA_VERSION = 1
# schema history: 1 — first version.


@dataclass(frozen=True)
class Fingerprint:
    """The setup a record was measured on. Unknown parts are ``None``, never guessed."""

    runtime: str                               # "sglang", "sglang-sim", a fork's name
    runtime_version: str | None = None
    image_digest: str | None = None            # container image (repo@sha256:…) when run in Docker
    launch_command: tuple[str, ...] = ()       # argv before the candidate's flags
    model_path: str | None = None
    model_config_hash: str | None = None       # sha256 of config.json (first 16 hex digits)
    gpu_name: str | None = None
    gpu_uuid: str | None = None
    driver: str | None = None
    cuda: str | None = None
    power_limit_w: float | None = None
    schema_version: int = SCHEMA_VERSION

    def key(self) -> str:
        """A stable 12-hex-digit hash of every field: the exact setup."""
        return _digest({k: v for k, v in self.to_dict().items() if k != "schema_version"})

    def ledger_key(self) -> str:
        """A stable hash of what decides whether a rejection still holds: runtime, model, GPU, driver."""
        return _digest(self._ledger_parts())

    def matches_for_ledger(self, other: Fingerprint) -> bool:
        return self.ledger_key() == other.ledger_key()

    def differences(self, other: Fingerprint) -> list[str]:
        """The ledger-relevant parts that differ, as ``"name: old → new"`` (empty when they match)."""
        mine, theirs = self._ledger_parts(), other._ledger_parts()
        return [f"{name}: {mine[name]} → {theirs[name]}" for name in mine if mine[name] != theirs[name]]

    def retest_condition(self) -> str:
        """One sentence: when a technique rejected under this fingerprint deserves another try."""
        parts = [f"{self.runtime} ≠ {self.runtime_version}" if self.runtime_version
                 else f"the {self.runtime} build changes"]
        if self.image_digest:
            parts.append(f"the image is not {self.image_digest}")
        parts.append("the model changes")
        if self.gpu_name:
            parts.append(f"the GPU is not a {self.gpu_name}")
        if self.driver:
            parts.append(f"driver ≠ {self.driver}")
        return "retest when " + ", ".join(parts[:-1]) + " or " + parts[-1]

    def describe(self) -> str:
        """One line for reports: ``sglang 0.5.23 · Qwen3.6 (cfg 1a2b…) · RTX 5090 · driver 620.70``."""
        runtime = " ".join(p for p in (self.runtime, self.runtime_version) if p)
        if self.image_digest:
            runtime += f" ({self.image_digest})"
        model = Path(self.model_path).name if self.model_path else "unknown model"
        if self.model_config_hash:
            model += f" (config {self.model_config_hash[:8]})"
        gpu = self.gpu_name or "unknown GPU"
        if self.power_limit_w is not None:
            gpu += f" @ {self.power_limit_w:.0f} W"
        extras = [f"driver {self.driver}" if self.driver else "", f"CUDA {self.cuda}" if self.cuda else ""]
        return " · ".join(p for p in [runtime, model, gpu, *extras] if p)

    def _ledger_parts(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "runtime_version": self.runtime_version, "image": self.image_digest,
                "model": self.model_config_hash or self.model_path, "gpu": self.gpu_name, "driver": self.driver}

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["launch_command"] = list(self.launch_command)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fingerprint:
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        kwargs["launch_command"] = tuple(data.get("launch_command", ()))
        return cls(**kwargs)

    @classmethod
    def build(cls, *, runtime: str, runtime_version: str | None, launch_command: Sequence[str] = (),
              model_path: str | Path | None = None, gpu: GpuState | None = None,
              image_digest: str | None = None) -> Fingerprint:
        """Assemble a fingerprint from what preflight knows; hashes the model's ``config.json`` if present."""
        model = str(model_path) if model_path is not None else None
        return cls(runtime=runtime, runtime_version=runtime_version, image_digest=image_digest,
                   launch_command=tuple(launch_command), model_path=model,
                   model_config_hash=model_config_hash(model) if model else None,
                   gpu_name=gpu.name if gpu else None, gpu_uuid=gpu.uuid if gpu else None,
                   driver=gpu.driver if gpu else None, cuda=gpu.cuda_driver if gpu else None,
                   power_limit_w=gpu.power_limit_w if gpu else None)


def model_config_hash(model_path: str | Path) -> str | None:
    """sha256 (16 hex digits) of ``<model_path>/config.json``, canonicalised; ``None`` when absent.

    The JSON is re-serialised with sorted keys so that whitespace or key order does not change the hash.
    A path that is not a local folder (a hub id like ``Qwen/Qwen3-8B``) has no hash.
    """
    config = Path(model_path) / "config.json"
    try:
        raw = config.read_bytes()
    except OSError:
        return None
    try:
        canonical = json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode()
    except (UnicodeDecodeError, json.JSONDecodeError):
        canonical = raw
    return hashlib.sha256(canonical).hexdigest()[:16]


def _digest(payload: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]
