"""Loading a ``SearchSpace`` from YAML, with every error pointing at the file and line of the culprit.

The YAML is read with a PyYAML loader that keeps the line of every mapping key and list item, then
checked section by section: unknown keys (with the nearest known one as the hint), types, ranges,
expressions, flags named in expressions, and finally the space as a whole: the baseline must obey
every rule and derive cleanly, each screened technique must apply to the baseline, and every rule must
be satisfiable by at least one candidate of the space (checked over the baseline, the techniques, a grid
and a seeded random sample).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import os
import shlex
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from elsa_tune.errors import ConfigError, SpaceError
from elsa_tune.input_file import read_input
from elsa_tune.runtime.family import FamilyName, family
from elsa_tune.search_spaces.consistency import check_space
from elsa_tune.search_spaces.document import (
    MAX_BYTES,
    LineList,
    LineMap,
    Problem,
    boolean,
    fail,
    fraction,
    integer,
    keys,
    mapping,
    number,
    read_document,
    string,
)
from elsa_tune.search_spaces.expression import Expression, ExpressionError
from elsa_tune.search_spaces.parameter import Parameter, ParameterKind, Value
from elsa_tune.search_spaces.rules import Derived, Rule
from elsa_tune.search_spaces.space import (
    SCHEMA_VERSION,
    Budget,
    Guardrails,
    ModelSpec,
    Objective,
    PriorVerdict,
    ProbeSettings,
    ReasonCategory,
    RuntimeSpec,
    SearchSpace,
    Technique,
    TechniqueKind,
)

SHIPPED_PACKAGE = "elsa_tune.search_spaces"
METRICS = {
    "output_throughput": "maximize", "total_throughput": "maximize", "request_throughput": "maximize",
    "goodput": "maximize", "ttft_p50": "minimize", "ttft_p99": "minimize", "tpot_p50": "minimize",
    "tpot_p99": "minimize", "itl_p50": "minimize", "e2e_latency_p50": "minimize", "e2e_latency_p99": "minimize",
}


def list_shipped_spaces() -> list[str]:
    """Names of the search spaces shipped with elsa-tune (usable as ``load_space(name)``)."""
    root = resources.files(SHIPPED_PACKAGE)
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def resolve_space_path(path_or_name: str | Path) -> Path:
    """A file path as given, or the shipped space of that name."""
    candidate = Path(path_or_name)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists() or "/" in str(path_or_name):
        if not candidate.is_file():
            raise SpaceError(f"search space file {str(candidate)!r} does not exist", path=str(candidate),
                             remedy=f"give an existing YAML file or a shipped name: {', '.join(list_shipped_spaces())}")
        return candidate
    shipped = resources.files(SHIPPED_PACKAGE) / f"{path_or_name}.yaml"
    if not shipped.is_file():
        hint = difflib.get_close_matches(str(path_or_name), list_shipped_spaces(), n=1)
        raise SpaceError(f"no shipped search space named {str(path_or_name)!r}",
                         remedy=(f"did you mean {hint[0]!r}? " if hint else "") +
                         f"shipped spaces: {', '.join(list_shipped_spaces())}; or give a path to a YAML file")
    return Path(str(shipped))


def load_space(path_or_name: str | Path) -> SearchSpace:
    """Load and fully validate a search space; raise ``SpaceError`` with file and line on any problem."""
    path = resolve_space_path(path_or_name)
    try:
        text = read_input(path, "the search space", limit=MAX_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpaceError(f"cannot read the search space: {exc}", path=str(path),
                         remedy="check the file's permissions and that it is UTF-8 text") from exc
    return parse_space(text, str(path))


def parse_space(text: str, path: str) -> SearchSpace:
    """Parse YAML ``text`` (``path`` is used in messages) into a validated ``SearchSpace``."""
    try:
        data = read_document(text)
    except Problem as exc:
        raise SpaceError(str(exc), path=path, line=exc.line, remedy="fix the YAML at that line") from exc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise SpaceError(f"malformed YAML: {exc.problem or exc.context}", path=path, line=line,
                         remedy="fix the YAML syntax at that line (indentation, a missing colon or quote)") from exc
    except yaml.YAMLError as exc:
        raise SpaceError(f"malformed YAML: {exc}", path=path, remedy="fix the YAML syntax") from exc
    if not isinstance(data, LineMap):
        raise SpaceError("a search space must be a YAML mapping (name:, model:, base:, parameters:, ...)",
                         path=path, line=1, remedy="start from a shipped space: `elsa-tune space show generic-sglang`")
    try:
        space = _Parser(data).space(path, hashlib.sha256(text.encode()).hexdigest())
    except Problem as exc:
        raise SpaceError(str(exc), path=path, line=exc.line, remedy=_remedy(str(exc))) from exc
    check_space(space)
    return space


def _remedy(message: str) -> str:
    if "unknown key" in message:
        return "remove the key or fix its spelling (see the shipped spaces for the format)"
    if "expression" in message or "`" in message:
        return "expressions use flag names, numbers, + - * / // %, comparisons, and/or/not, min max round int"
    return "fix the value at that line"


class _Parser:
    TOP = ("schema_version", "name", "description", "model", "gpu", "runtime", "base", "parameters", "derived",
           "rules", "techniques", "objectives", "guardrails", "probes", "budget")

    def __init__(self, data: LineMap) -> None:
        self.model_flag = family(FamilyName.SGLANG).model_flag
        self.data = data

    def space(self, path: str, digest: str) -> SearchSpace:
        d = self.data
        keys(d, self.TOP)
        version = d.get("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            fail(f"schema_version {version!r} is not supported (this elsa-tune reads {SCHEMA_VERSION})", d,
                  "schema_version")
        name = string(d, "name", required=True)
        base = mapping(d, "base")
        keys(base, ("flags", "env"))
        runtime = self.runtime(mapping(d, "runtime"))
        self.model_flag = family(runtime.family).model_flag
        base_flags = self._flag_map(mapping(base, "flags"))
        base_env = _env_map(mapping(base, "env"))
        parameters = tuple(self.parameter(n, spec, mapping(d, "parameters"), base_flags)
                           for n, spec in mapping(d, "parameters").items())
        for p in parameters:
            if p.flag:
                base_flags.pop(p.flag, None)
        gpu_name, gpu_mem = self.gpu(d)
        return SearchSpace(
            name=name, path=path, description=string(d, "description") or "", model=self.model(mapping(d, "model")),
            runtime=runtime, gpu=gpu_name, gpu_memory_gib=gpu_mem,
            base_flags=base_flags, base_env=base_env, parameters=parameters,
            derived=tuple(self.derived(mapping(d, "derived"))), rules=tuple(self.rules(d)),
            techniques=tuple(self.technique(n, t, mapping(d, "techniques"))
                             for n, t in mapping(d, "techniques").items()),
            objectives=self.objectives(d), guardrails=self.guardrails(mapping(d, "guardrails")),
            probes=self.probes(mapping(d, "probes")), budget=self.budget(mapping(d, "budget")),
            base_lines=dict(mapping(base, "flags").key_lines), digest=digest,
        )

    def model(self, m: LineMap) -> ModelSpec:
        keys(m, ("path", "hybrid_mamba", "vision", "speculative_head", "context_target", "retrieves_needles"))
        path = string(m, "path")
        return ModelSpec(path=os.path.expanduser(path) if path else path,
                         hybrid_mamba=boolean(m, "hybrid_mamba", False), vision=boolean(m, "vision", False),
                         speculative_head=boolean(m, "speculative_head", False),
                         context_target=integer(m, "context_target", None, low=1),
                         retrieves_needles=boolean(m, "retrieves_needles", True))

    def gpu(self, d: LineMap) -> tuple[str | None, float | None]:
        value = d.get("gpu")
        if value is None or isinstance(value, str):
            return value, None
        if not isinstance(value, LineMap):
            fail("gpu must be a card name or a mapping with name and memory_gib", d, "gpu")
        keys(value, ("name", "memory_gib"))
        return string(value, "name"), number(value, "memory_gib", None, low=1.0)

    def _flag_map(self, m: LineMap, *, allow_none: bool = False) -> dict[str, Any]:
        return _flag_map(m, self.model_flag, allow_none=allow_none)

    def runtime(self, r: LineMap) -> RuntimeSpec:
        keys(r, ("family", "command", "image", "volumes", "shm_size", "version"))
        family_raw = string(r, "family") or FamilyName.SGLANG.value
        try:
            runtime_family = family(family_raw)
        except ConfigError:
            fail(f"runtime.family {family_raw!r} is not one of {', '.join(f.value for f in FamilyName)}", r, "family")
        command_raw = r.get("command")
        image = string(r, "image")
        if command_raw is not None and image is not None:
            fail("runtime takes either command or image, not both", r, "image")
        command: tuple[str, ...] | None
        if isinstance(command_raw, str):
            try:
                command = tuple(shlex.split(command_raw))
            except ValueError as exc:     # an unclosed quote
                fail(f"runtime.command cannot be split as a shell would: {exc}", r, "command")
            if not command:
                fail("runtime.command is empty", r, "command")
        elif isinstance(command_raw, list) and command_raw and all(isinstance(a, str) for a in command_raw):
            command = tuple(command_raw)
        elif command_raw is None:
            command = None if image else runtime_family.default_launch
        else:
            fail("runtime.command must be a non-empty list of strings (the launch argv)", r, "command")
        volumes = r.get("volumes", [])
        if not isinstance(volumes, list) or not all(isinstance(v, str) and ":" in v for v in volumes):
            fail("runtime.volumes must be a list of 'host_path:container_path[:ro]' strings", r, "volumes")
        if volumes and not image:
            fail("runtime.volumes only apply to a Docker image", r, "volumes")
        return RuntimeSpec(family=runtime_family.name, command=command, image=image, volumes=tuple(volumes),
                           shm_size=string(r, "shm_size"),
                           version=string(r, "version"))

    def parameter(self, name: str, spec: Any, parent: LineMap, base: Mapping[str, Any]) -> Parameter:
        line = parent.key_lines[name]
        if not isinstance(spec, LineMap):
            raise Problem(f"parameter {name!r} must be a mapping with type, range or choices and baseline", line)
        keys(spec, ("type", "flag", "env", "low", "high", "step", "log", "choices", "baseline", "description"))
        kind_raw = string(spec, "type", required=True)
        try:
            kind = ParameterKind(kind_raw)
        except ValueError:
            fail(f"parameter {name!r}: type {kind_raw!r} is not one of int, float, categorical, bool", spec, "type")
        env = string(spec, "env")
        flag = string(spec, "flag") or (None if env else name)
        if flag and env:
            fail(f"parameter {name!r} sets either a flag or an env variable, not both", spec, "env")
        if flag:
            _check_flag_name(flag, spec.key_lines.get("flag", line))
        baseline = spec.get("baseline", base.get(flag) if flag else None)
        if baseline is None:
            raise Problem(f"parameter {name!r} needs a baseline value (or a value in base.flags)", line)
        low = high = step = None
        choices: tuple[Value, ...] = ()
        log = boolean(spec, "log", False)
        if kind in (ParameterKind.INT, ParameterKind.FLOAT):
            read = integer if kind is ParameterKind.INT else number
            low, high = read(spec, "low", None, required=True), read(spec, "high", None, required=True)
            step = read(spec, "step", None, low=0)
            assert low is not None and high is not None
            if low > high:
                fail(f"parameter {name!r}: low {low} is above high {high}", spec, "high")
            if step is not None and step <= 0:
                fail(f"parameter {name!r}: step must be positive", spec, "step")
            if log and low <= 0:
                fail(f"parameter {name!r}: a log range needs low > 0", spec, "low")
            if log and step is not None:
                # Optuna's distributions refuse the combination; a lattice is linear by definition.
                fail(f"parameter {name!r}: step and log cannot be combined", spec, "step")
        elif kind is ParameterKind.CATEGORICAL:
            raw = spec.get("choices")
            if not isinstance(raw, list) or not raw or len({repr(c) for c in raw}) != len(raw):
                fail(f"parameter {name!r}: choices must be a non-empty list without repeats", spec,
                      "choices" if "choices" in spec else None)
            if not all(isinstance(c, str | int | float | bool) for c in raw):
                fail(f"parameter {name!r}: choices must be strings, numbers or bools", spec, "choices")
            choices = tuple(raw)
        param = Parameter(name=name, kind=kind, baseline=baseline, flag=flag, env=env,
                          low=float(low) if low is not None else None, high=float(high) if high is not None else None,
                          step=float(step) if step is not None else None, log=log, choices=choices,
                          description=string(spec, "description") or "", line=line)
        problem = param.problem(baseline)
        if problem:
            raise Problem(f"parameter {name!r}: baseline {problem}", spec.key_lines.get("baseline", line))
        return dataclasses.replace(param, baseline=param.coerce(baseline))

    def derived(self, d: LineMap) -> Iterator[Derived]:
        for flag, spec in d.items():
            line = d.key_lines[flag]
            _check_flag_name(flag, line)
            when = None
            if isinstance(spec, LineMap):
                keys(spec, ("value", "when"))
                source = spec.get("value")
                when = _expr(spec.get("when"), spec.key_lines.get("when", line)) if "when" in spec else None
            else:
                source = spec
            yield Derived(flag=flag, expression=_expr(source, line), when=when, line=line)

    def rules(self, d: LineMap) -> Iterator[Rule]:
        raw = d.get("rules")
        if raw is None:
            return
        if not isinstance(raw, LineList):
            fail("rules must be a list of {rule: EXPRESSION, message: TEXT}", d, "rules")
        for item, line in zip(raw, raw.item_lines, strict=True):
            if isinstance(item, str):
                yield Rule(name=item, expression=_expr(item, line), line=line)
                continue
            if not isinstance(item, LineMap):
                raise Problem("a rule is an expression or a mapping {rule:, message:, name:}", line)
            keys(item, ("rule", "message", "name"))
            source = string(item, "rule", required=True)
            expression = _expr(source, item.key_lines["rule"])
            yield Rule(name=string(item, "name") or expression.source, expression=expression,
                       message=string(item, "message") or "", line=item.key_lines["rule"])

    def technique(self, name: str, spec: Any, parent: LineMap) -> Technique:
        line = parent.key_lines[name]
        if not isinstance(spec, LineMap):
            raise Problem(f"technique {name!r} must be a mapping with kind, rationale, flags/env", line)
        keys(spec, ("kind", "rationale", "flags", "env", "requires", "screen", "prior"))
        kind_raw = string(spec, "kind", required=True)
        try:
            kind = TechniqueKind(kind_raw)
        except ValueError:
            fail(f"technique {name!r}: kind {kind_raw!r} is not speed or memory", spec, "kind")
        flags_map = mapping(spec, "flags")
        flags = self._flag_map(flags_map, allow_none=True)
        env = _env_map(mapping(spec, "env"))
        screen = boolean(spec, "screen", True)
        if screen and not flags and not env:
            raise Problem(f"technique {name!r} changes no flag and no env variable (set screen: false to keep it "
                           "on record only)", line)
        requires = _expr(spec["requires"], spec.key_lines["requires"]) if "requires" in spec else None
        prior = None
        if "prior" in spec:
            p = mapping(spec, "prior")
            keys(p, ("verdict", "reason", "source", "category"))
            verdict = string(p, "verdict", required=True)
            if verdict not in ("keep", "reject", "inconclusive"):
                fail(f"technique {name!r}: prior verdict {verdict!r} is not keep, reject or inconclusive", p,
                      "verdict")
            prior = PriorVerdict(verdict=verdict, reason=string(p, "reason", required=True),
                                 source=string(p, "source") or "", categories=_categories(name, p))
        return Technique(name=name, kind=kind, rationale=string(spec, "rationale", required=True), flags=flags, env=env,
                         requires=requires, screen=screen, prior=prior, line=line,
                         flag_lines=dict(flags_map.key_lines))

    def objectives(self, d: LineMap) -> tuple[Objective, ...]:
        raw = d.get("objectives", [{"metric": "output_throughput"}])
        if not isinstance(raw, list) or not raw:
            fail("objectives must be a non-empty list of {metric:, direction:, workload:}", d, "objectives")
        lines = raw.item_lines if isinstance(raw, LineList) else [d.line] * len(raw)
        out = []
        for item, line in zip(raw, lines, strict=True):
            if not isinstance(item, dict):
                raise Problem("an objective is a mapping {metric:, direction:, workload:, weight:}", line)
            if isinstance(item, LineMap):
                keys(item, ("metric", "direction", "workload", "weight"))
            metric = item.get("metric")
            if metric not in METRICS:
                hint = difflib.get_close_matches(str(metric), list(METRICS), n=1)
                raise Problem(f"objective metric {metric!r} is unknown" + (f" (did you mean {hint[0]!r}?)" if hint
                               else f"; use one of {', '.join(METRICS)}"), line)
            direction = item.get("direction", METRICS[metric])
            if direction not in ("maximize", "minimize"):
                raise Problem(f"objective direction {direction!r} is not maximize or minimize", line)
            weight = item.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
                raise Problem(f"objective weight {weight!r} must be a positive number", line)
            workload = item.get("workload")
            if workload is not None and not isinstance(workload, str):
                raise Problem("objective workload must be a workload name", line)
            out.append(Objective(metric=metric, direction=direction, workload=workload, weight=float(weight)))
        return tuple(out)

    def guardrails(self, g: LineMap) -> Guardrails:
        keys(g, ("ttft_p50_margin", "ttft_p99_margin", "kv_pool_tokens_floor", "min_context_tokens",
                  "max_error_rate", "quality_gate"))
        default = Guardrails()
        return Guardrails(
            ttft_p50_margin=fraction(g, "ttft_p50_margin", default.ttft_p50_margin),
            ttft_p99_margin=fraction(g, "ttft_p99_margin", default.ttft_p99_margin),
            kv_pool_tokens_floor=integer(g, "kv_pool_tokens_floor", None, low=1),
            min_context_tokens=integer(g, "min_context_tokens", None, low=1),
            max_error_rate=fraction(g, "max_error_rate", default.max_error_rate),
            quality_gate=boolean(g, "quality_gate", default.quality_gate))

    def probes(self, p: LineMap) -> ProbeSettings:
        keys(p, ("headroom_floor_mib", "probe_timeout_s", "hang_s", "boot_timeout_s"))
        default = ProbeSettings()
        settings = ProbeSettings(
            headroom_floor_mib=integer(p, "headroom_floor_mib", default.headroom_floor_mib, low=64, high=65536),
            probe_timeout_s=number(p, "probe_timeout_s", default.probe_timeout_s, low=1.0),
            hang_s=number(p, "hang_s", default.hang_s, low=1.0),
            boot_timeout_s=number(p, "boot_timeout_s", default.boot_timeout_s, low=10.0))
        if settings.hang_s >= settings.probe_timeout_s:
            fail(f"probes.hang_s ({settings.hang_s:g}) must be below probes.probe_timeout_s "
                  f"({settings.probe_timeout_s:g}), or a hang is never detected before the timeout", p,
                  "hang_s" if "hang_s" in p else "probe_timeout_s")
        return settings

    def budget(self, b: LineMap) -> Budget:
        keys(b, ("hours", "max_boots", "boots_per_arm"))
        return Budget(hours=number(b, "hours", None, low=0.01), max_boots=integer(b, "max_boots", None, low=1),
                      boots_per_arm=integer(b, "boots_per_arm", None, low=2))


def _categories(technique: str, prior: LineMap) -> tuple[ReasonCategory, ...]:
    """A prior's ``category``: one ``ReasonCategory`` value or a list of them (optional)."""
    raw = prior.get("category")
    if raw is None:
        return ()
    items = raw if isinstance(raw, list) else [raw]
    out = []
    for item in items:
        try:
            out.append(ReasonCategory(str(item)))
        except ValueError:
            fail(f"technique {technique!r}: prior category {item!r} is not one of "
                 f"{', '.join(c.value for c in ReasonCategory)}", prior, "category")
    return tuple(out)


def _check_flag_name(flag: str, line: int | None) -> None:
    if flag.startswith("-") or "_" in flag or not flag or " " in flag:
        raise Problem(f"flag {flag!r}: write SGLang's dashed name without leading dashes "
                       f"(e.g. {flag.lstrip('-').replace('_', '-')!r})", line)


def _flag_map(m: LineMap, model_flag: str, *, allow_none: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for flag, value in m.items():
        line = m.key_lines[flag]
        _check_flag_name(flag, line)
        if flag == model_flag:
            raise Problem("set the model under model.path, not as a flag", line)
        if value is None and not allow_none:
            raise Problem(f"flag {flag!r} has no value (use true for a switch, or remove it)", line)
        if isinstance(value, list | dict):
            raise Problem(f"flag {flag!r}: give a single value (quote JSON values as a string)", line)
        out[flag] = value
    return out


def _env_map(m: LineMap) -> dict[str, str]:
    out = {}
    for key, value in m.items():
        if not key.replace("_", "").isalnum() or key[0].isdigit():
            raise Problem(f"env variable name {key!r} is not valid", m.key_lines[key])
        if isinstance(value, list | dict) or value is None:
            raise Problem(f"env variable {key!r} needs a scalar value", m.key_lines[key])
        out[key] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return out


def _expr(source: Any, line: int | None) -> Expression:
    if not isinstance(source, str | int | float) or isinstance(source, bool):
        raise Problem(f"expected an expression, got {source!r}", line)
    try:
        return Expression.parse(str(source))
    except ExpressionError as exc:
        raise Problem(f"bad expression: {exc}", line) from exc
