"""``Candidate``: one launch configuration of a runtime, the unit every layer passes around."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

#: A flag's value: ``True`` is a store_true switch, ``False``/``None`` means "leave the flag out".
FlagValue = str | int | float | bool | None

SCHEMA_VERSION = 1


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(sorted((mapping or {}).items())))


@dataclass(frozen=True)
class Candidate:
    """A runtime configuration: SGLang's own flag names without dashes, environment, a label.

    ``flags`` maps e.g. ``"mem-fraction-static"`` to ``0.9`` and ``"enable-metrics"`` to ``True``.
    ``key()`` is stable across processes and orderings: two candidates with equal flags and env
    have the same key whatever their label.
    """

    flags: Mapping[str, FlagValue] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    label: str = ""

    def __post_init__(self) -> None:
        for name in self.flags:
            if name.startswith("-") or "_" in name:
                raise ValueError(f"flag {name!r}: use SGLang's dashed name without leading dashes")
        object.__setattr__(self, "flags", _frozen(self.flags))
        object.__setattr__(self, "env", _frozen({k: str(v) for k, v in self.env.items()}))

    def key(self) -> str:
        """A short stable hash of flags and env (the label is not part of it)."""
        payload = json.dumps({"flags": dict(self.flags), "env": dict(self.env)}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    def argv(self) -> list[str]:
        """The flags as SGLang command-line arguments, in a stable order."""
        args: list[str] = []
        for name, value in self.flags.items():
            if value is None or value is False:
                continue
            if value is True:
                args.append(f"--{name}")
            else:
                args.extend([f"--{name}", _render(value)])
        return args

    def with_flags(self, label: str | None = None, **changes: FlagValue) -> Candidate:
        """A copy with flags changed (``None`` removes a flag). Keyword names use underscores."""
        flags = dict(self.flags)
        for raw, value in changes.items():
            name = raw.replace("_", "-")
            if value is None:
                flags.pop(name, None)
            else:
                flags[name] = value
        return Candidate(flags=flags, env=self.env, label=self.label if label is None else label)

    def merged(self, flags: Mapping[str, FlagValue] | None = None, env: Mapping[str, str] | None = None,
               label: str | None = None) -> Candidate:
        """A copy with ``flags`` and ``env`` laid over this candidate's (``None`` values remove)."""
        new_flags = dict(self.flags)
        for name, value in (flags or {}).items():
            if value is None:
                new_flags.pop(name, None)
            else:
                new_flags[name] = value
        new_env = dict(self.env)
        new_env.update(env or {})
        return Candidate(flags=new_flags, env=new_env, label=self.label if label is None else label)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "flags": dict(self.flags), "env": dict(self.env),
                "label": self.label}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Candidate:
        return cls(flags=dict(data.get("flags", {})), env=dict(data.get("env", {})), label=str(data.get("label", "")))


def _render(value: FlagValue) -> str:
    if isinstance(value, float):
        return repr(value) if value != int(value) else f"{value:.1f}" if abs(value) < 1e15 else repr(value)
    return str(value)
