"""SGLang's startup log (and ``GET /server_info``) → ``BootReport``: what a boot really produced.

Formats of SGLang 0.5.9 … 0.5.23 (the fixtures in ``tests/runtime/logs/``). Lines may carry a
``[2026-02-27 17:10:28 DP0 TP0]`` prefix (milliseconds optional), a docker-compose ``name  | ``
prefix, or none. Per-rank values are read from rank 0 (the first rank that printed them).

``build_report(log_text, candidate, server_info)`` is the entry point. It diffs the candidate's
requested flags against what the runtime resolved (the ``server_args={...}`` dump, the scheduler
summary line, ``/server_info`` and the known override warnings), so silent clamps and silently
ignored flags become ``Adjustment`` records, each with the line that proves it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from elsa_tune.runtime.boot_report import Adjustment, BootPhase, BootReport
from elsa_tune.runtime.flags import number
from elsa_tune.search_spaces.candidate import Candidate

READY_LINE = "The server is fired up and ready to roll!"

_COMPOSE = re.compile(r"^[\w.-]+\s+\|\s?")
_PREFIX = re.compile(
    r"^\[(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)(?P<tags>(?: [A-Z_]+\d+)*)\]\s?"
)
_RANK = re.compile(r"(?:TP|DP|PP|EP|ATTN_CP|MOE_DP)(\d+)")

_SUMMARY = re.compile(r"max_total_num_tokens=\d+.*")
_KV = re.compile(
    r"^(?P<label>[\w ]*?)\s*KV Cache (?:is allocated|VA upper bound)\. "
    r"(?:dtype: (?P<dtype>[\w.]+), )?#tokens: (?P<tokens>\d+), "
    r"(?:K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB|KV size: (?P<kv>[\d.]+) GB)"
)
_KV_DTYPE = re.compile(r"Using KV cache dtype: ([\w.]+)")
_MAMBA = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (?P<size>\d+),(?P<rest>.*)")
_GB_PART = re.compile(r"(\w+) size: ([\d.]+) ?GB")
_WEIGHT_BEGIN = re.compile(r"Load weight begin\. avail mem=([\d.]+) GB")
_WEIGHT_END = re.compile(
    r"Load weight end\.(?: elapsed=(?P<s>[\d.]+) s,)?.*?avail mem=(?P<avail>[\d.]+) GB, mem usage=(?P<usage>[\d.]+) GB"
)
_POOL_END = re.compile(r"Memory pool end\. avail mem=([\d.]+) GB")
_GRAPH_END = re.compile(
    r"Capture (?P<name>.*?)\s*(?:cuda|CUDA) graph end\. (?:bs=\[[^\]]*\], )?(?:Time elapsed: |elapsed=)"
    r"(?P<s>[\d.]+) s[.,] mem usage=(?P<usage>[\d.]+) GB[.,] avail mem=(?P<avail>[\d.]+) GB"
)
_SERVER_ARGS = re.compile(r"server_args=(?P<body>\{.*|ServerArgs\(.*)$")
_VERSION = re.compile(r"(?:sglang|SGLang)(?: version|==| v)[ =:]*v?(\d+\.\d+\.\d+[\w.+-]*)")

# Known override warnings: pattern → (flag, group index of the effective value or None).
_OVERRIDES: tuple[tuple[re.Pattern[str], str, int | None], ...] = (
    (re.compile(r"max_running_requests is capped to (\d+) by the mamba state cache"), "max-running-requests", 1),
    (re.compile(r"max_running_requests was reduced from the requested \d+ to (\d+)"), "max-running-requests", 1),
    (re.compile(r"Max running requests is reset to (\d+) for speculative decoding"), "max-running-requests", 1),
    (re.compile(r"max_total_tokens=\d+ is larger than the profiled value (-?\d+)"), "max-total-tokens", 1),
    (re.compile(r"speculative_num_draft_tokens is adjusted to speculative_num_steps \+ 1"),
     "speculative-num-draft-tokens", None),
    (re.compile(r"[Mm]ixed chunked prefill (?:is|are) disabled"), "enable-mixed-chunk", None),
    (re.compile(r"chang(?:e|ing) page_size (?:from \d+ )?to (\d+)"), "page-size", 1),
)
# Requested flags that the log reports back as a number, and the line that says it.
_REPORTED = {"context-length": "context_len", "chunked-prefill-size": "chunked_prefill_size",
             "max-prefill-tokens": "max_prefill_tokens", "max-mamba-cache-size": "mamba_cache_size"}
_REPORTED_LINES = {"context-length": _SUMMARY, "chunked-prefill-size": _SUMMARY, "max-prefill-tokens": _SUMMARY,
                   "max-mamba-cache-size": _MAMBA}
_WARN_KV_SHORT = re.compile(r"KV pool holds \d+ tokens, fewer than --context-length \d+")


@dataclass(frozen=True)
class LogLine:
    """One log line: the raw text, the message without its prefix, its time and rank tags."""

    raw: str
    message: str
    at: datetime | None
    tags: str

    @property
    def rank0(self) -> bool:
        return all(int(n) == 0 for n in _RANK.findall(self.tags))


def split_lines(text: str) -> list[LogLine]:
    """Parse every line's prefix; tolerant of any line that has none."""
    return _split(text.splitlines())


def _split(raws: Iterable[str]) -> list[LogLine]:
    lines = []
    for raw in raws:
        body = raw.rstrip("\r")
        if "|" in body[:64] and _COMPOSE.match(body):
            body = _COMPOSE.sub("", body, count=1)
        match = _PREFIX.match(body)
        if match:
            stamp = match["ts"].replace(",", ".").replace("T", " ")
            try:
                at: datetime | None = datetime.fromisoformat(stamp)
            except ValueError:
                at = None
            lines.append(LogLine(raw.rstrip(), body[match.end():].rstrip(), at, match["tags"].strip()))
        else:
            lines.append(LogLine(raw.rstrip(), body.rstrip(), None, ""))
    return lines


def boot_lines(text: str) -> list[LogLine]:
    """The log's lines without the per-step runtime lines (what boot parsing and classification read)."""
    return _split(raw for raw in text.splitlines() if "Decode batch" not in raw and "Prefill batch" not in raw)


def _first(lines: Sequence[LogLine], pattern: re.Pattern[str]) -> tuple[LogLine, re.Match[str]] | None:
    fallback = None
    for line in lines:
        match = pattern.search(line.message)
        if match:
            if line.rank0:
                return line, match
            fallback = fallback or (line, match)
    return fallback


def parse_summary(message: str) -> dict[str, int | float | str]:
    """The scheduler summary ``max_total_num_tokens=…, …, available_gpu_mem=X GB`` as a dict."""
    values: dict[str, int | float | str] = {}
    for part in message.split(","):
        if "=" in part:
            key, _, value = part.strip().partition("=")
            values[key.strip()] = number(value.removesuffix("GB").strip())
    return values


def parse_server_args(body: str) -> dict[str, Any]:
    """Parse ``{'k': v, ...}`` (0.5.2x) or ``ServerArgs(k=v, ...)`` (≤0.5.9), tolerating non-literals.

    Values that ``ast.literal_eval`` cannot read (enum reprs, objects) are kept as their source text.
    """
    body = body.strip()
    if body.startswith("{"):
        try:
            value = ast.literal_eval(body)
            if isinstance(value, dict):
                return {str(k): v for k, v in value.items()}
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            pass
        inner, sep = body[1:-1] if body.endswith("}") else body[1:], ":"
    else:
        start = body.find("(")
        inner, sep = body[start + 1: -1 if body.endswith(")") else None], "="
    result: dict[str, Any] = {}
    for piece in _split_top_level(inner):
        key, found, value = piece.partition(sep)
        if not found:
            continue
        key = key.strip().strip("'\"")
        if not key.isidentifier():
            continue
        try:
            result[key] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            result[key] = value.strip()
    return result


def _split_top_level(text: str) -> Iterable[str]:
    depth, quote, start, escaped = 0, "", 0, False
    for i, char in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            yield text[start:i]
            start = i + 1
    yield text[start:]


def _phase_seconds(start: LogLine | None, end: LogLine | None) -> float | None:
    if start is None or end is None or start.at is None or end.at is None:
        return None
    return round((end.at - start.at).total_seconds(), 3)


def parse_log(text: str) -> BootReport:
    """Everything the log says about a boot, without requested flags (no adjustments)."""
    lines = boot_lines(text)
    fields: dict[str, Any] = {}
    phases: list[BootPhase] = []

    summary = _first(lines, _SUMMARY)
    summary_line = summary[0] if summary else None
    if summary:
        values = parse_summary(summary[1].group(0))
        for key in ("max_total_num_tokens", "chunked_prefill_size", "max_prefill_tokens", "max_running_requests",
                    "context_len"):
            if isinstance(values.get(key), int):
                fields[key] = values[key]
        mem = values.get("available_gpu_mem", values.get("available_cpu_mem"))
        if isinstance(mem, int | float):
            fields["available_gpu_mem_gb"] = float(mem)

    kv = next(((ln, m) for ln in lines if (m := _KV.search(ln.message)) and not m["label"].strip() and ln.rank0),
              None) or _first(lines, _KV)
    if kv:
        match = kv[1]
        fields["kv_pool_tokens"] = int(match["tokens"])
        sizes = [float(match[g]) for g in ("k", "v", "kv") if match[g]]
        fields["kv_pool_gb"] = round(sum(sizes), 3)
        if match["dtype"]:
            fields["kv_dtype"] = match["dtype"]
    dtype = _first(lines, _KV_DTYPE)
    if dtype and "kv_dtype" not in fields:
        fields["kv_dtype"] = dtype[1].group(1)

    mamba = _first(lines, _MAMBA)
    if mamba:
        fields["mamba_cache_size"] = int(mamba[1]["size"])
        fields["mamba_pool_gb"] = round(sum(float(gb) for _, gb in _GB_PART.findall(mamba[1]["rest"])), 3)

    begin = _first(lines, _WEIGHT_BEGIN)
    end = _first(lines, _WEIGHT_END)
    if end:
        match = end[1]
        fields["weights_mem_gb"] = float(match["usage"])
        seconds = float(match["s"]) if match["s"] else _phase_seconds(begin[0] if begin else None, end[0])
        phases.append(BootPhase("load_weights", seconds, float(match["usage"]), float(match["avail"])))
    pool = _first(lines, _POOL_END)
    if pool:
        phases.append(BootPhase("memory_pool", _phase_seconds(end[0] if end else None, pool[0]), None,
                                float(pool[1].group(1))))

    graphs: dict[str, tuple[LogLine, re.Match[str]]] = {}
    for line in lines:
        graph_match = _GRAPH_END.search(line.message)
        if not graph_match:
            continue
        match = graph_match
        label = re.sub(r"\W+", "_", match["name"].strip().lower())
        name = f"cuda_graph_{label}" if label else "cuda_graph"
        if name not in graphs or (line.rank0 and not graphs[name][0].rank0):
            graphs[name] = (line, match)
    graph_seen = bool(graphs)
    graph_mem = 0.0
    last_graph: LogLine | None = None
    for name, (line, match) in graphs.items():
        graph_mem += float(match["usage"])
        if last_graph is None or (line.at and last_graph.at and line.at > last_graph.at):
            last_graph = line
        phases.append(BootPhase(name, float(match["s"]), float(match["usage"]), float(match["avail"])))
    if graph_seen:
        fields["cuda_graph_mem_gb"] = round(graph_mem, 3)

    ready = next((ln for ln in lines if READY_LINE in ln.message), None)
    if ready:
        warm_from = summary_line or last_graph or (pool[0] if pool else None)
        phases.append(BootPhase("warmup", _phase_seconds(warm_from, ready)))
        first = next((ln for ln in lines if ln.at is not None), None)
        fields["boot_seconds"] = _phase_seconds(first, ready)

    args = _first(lines, _SERVER_ARGS)
    if args:
        fields["server_args"] = parse_server_args(args[1]["body"])
    version = _first(lines, _VERSION)
    if version:
        fields["runtime_version"] = version[1].group(1)

    warnings = tuple(dict.fromkeys(ln.message for ln in lines if _is_notable_warning(ln.message)))
    return BootReport(phases=tuple(phases), warnings=warnings, **fields)


def _is_notable_warning(message: str) -> bool:
    return any(p.search(message) for p, _, _ in _OVERRIDES) or bool(_WARN_KV_SHORT.search(message))


def merge_server_info(report: BootReport, info: Mapping[str, Any]) -> BootReport:
    """Fill what the log did not say from ``GET /server_info``; the log wins where both speak.

    ``internal_states[0].effective_max_running_requests_per_dp`` is the runtime's own effective slot
    count; when it disagrees with the log's summary line, the disagreement is kept as a warning.
    """
    changes: dict[str, Any] = {}
    states = info.get("internal_states") or [{}]
    state: Mapping[str, Any] = (states[0] if isinstance(states, list) and states and isinstance(states[0], Mapping)
                                else {})
    raw_memory = state.get("memory_usage")
    memory: Mapping[str, Any] = raw_memory if isinstance(raw_memory, Mapping) else {}
    candidates: dict[str, Any] = {
        "max_total_num_tokens": info.get("max_total_num_tokens", state.get("max_total_num_tokens")),
        "max_running_requests": state.get("effective_max_running_requests_per_dp"),
        "chunked_prefill_size": info.get("chunked_prefill_size"),
        "max_prefill_tokens": info.get("max_prefill_tokens"),
        "runtime_version": info.get("version"),
        "weights_mem_gb": memory.get("weight"),
        "kv_pool_gb": memory.get("kvcache"),
        "kv_pool_tokens": memory.get("token_capacity"),
    }
    graph = memory.get("graph")
    if isinstance(graph, Mapping) and graph:
        candidates["cuda_graph_mem_gb"] = round(sum(float(v) for v in graph.values()), 3)
    for key, value in candidates.items():
        if value is not None and getattr(report, key) is None:
            changes[key] = value
    warnings = list(report.warnings)
    effective = state.get("effective_max_running_requests_per_dp")
    if effective is not None and report.max_running_requests is not None and effective != report.max_running_requests:
        warnings.append(f"/server_info effective_max_running_requests_per_dp={effective} "
                        f"but the log's summary says max_running_requests={report.max_running_requests}")
    resolved = {k: v for k, v in info.items() if k not in ("internal_states", "launch_command", "kv_events")}
    server_args = dict(resolved)
    server_args.update(report.server_args)
    return replace(report, server_args=server_args, warnings=tuple(warnings), **changes)


def _same(requested: Any, effective: Any) -> bool:
    if isinstance(requested, bool) or isinstance(effective, bool):
        return bool(requested) == bool(effective) and effective is not None
    if isinstance(requested, int | float) and isinstance(effective, int | float):
        return abs(float(requested) - float(effective)) <= 1e-9 * max(1.0, abs(float(requested)))
    if isinstance(effective, list | tuple):
        text = str(requested).replace(",", " ").split()
        return [str(x) for x in effective] == text
    if isinstance(requested, str) and isinstance(effective, int | float):
        return _same(number(requested), effective)
    return str(requested).strip().lower() == str(effective).strip().lower()


def find_adjustments(candidate: Candidate, report: BootReport, log_text: str = "") -> tuple[Adjustment, ...]:
    """Every requested flag whose effective value differs, with the evidence line.

    Three sources, most specific first: the known override warnings, the scheduler summary line
    (effective ``max_running_requests`` and ``context_len``), and the resolved ``server_args``.
    """
    lines = boot_lines(log_text)
    requested = {k: v for k, v in candidate.flags.items() if v is not None and v is not False}
    found: dict[str, Adjustment] = {}

    for line in lines:
        for pattern, flag, group in _OVERRIDES:
            match = pattern.search(line.message)
            if not match or flag not in requested or flag in found:
                continue
            effective: Any = number(match.group(group)) if group else report.server_args.get(flag.replace("-", "_"))
            if effective is not None and _same(requested[flag], effective):
                continue
            found[flag] = Adjustment(flag, requested[flag], effective, line.raw, reason="runtime override warning")

    summary = _first(lines, _SUMMARY)
    per_dp = _per_dp(requested)
    if "max-running-requests" in requested and report.max_running_requests is not None:
        asked = int(number(str(requested["max-running-requests"]))) // per_dp
        if asked != report.max_running_requests and "max-running-requests" not in found:
            evidence = summary[0].raw if summary else "/server_info effective_max_running_requests_per_dp"
            fewer = report.max_running_requests < asked
            reason = ("silent clamp: the scheduler runs fewer requests than asked" if fewer
                      else "the scheduler runs more requests than asked")
            found["max-running-requests"] = Adjustment(
                "max-running-requests", requested["max-running-requests"], report.max_running_requests, evidence,
                reason=reason)
        elif "max-running-requests" in found:
            old = found["max-running-requests"]
            found["max-running-requests"] = replace(old, effective=report.max_running_requests)
    for flag, field_name in _REPORTED.items():
        effective = getattr(report, field_name)
        if flag not in requested or flag in found or effective is None or _same(requested[flag], effective):
            continue
        said = next((ln.raw for ln in lines if _REPORTED_LINES[flag].search(ln.message)), "")
        found[flag] = Adjustment(flag, requested[flag], effective, said or f"/server_info {field_name}={effective}",
                                 reason=f"the runtime reports {field_name}={effective}")

    args_line = _first(lines, _SERVER_ARGS)
    for flag, value in requested.items():
        key = flag.replace("-", "_")
        if flag in found or key not in report.server_args:
            continue
        effective = report.server_args[key]
        if _same(value, effective):
            continue
        ignored = value is True and effective in (False, None)
        evidence = f"server_args: {key!r}: {effective!r}"
        if args_line:
            prefix = args_line[0].raw[: len(args_line[0].raw) - len(args_line[0].message)]
            evidence = f"{prefix}server_args={{... {key!r}: {effective!r} ...}}"
        found[flag] = Adjustment(flag, value, effective, evidence,
                                 reason="accepted and silently ignored" if ignored else "resolved to a different value")
    order = list(candidate.flags)
    return tuple(sorted(found.values(), key=lambda a: order.index(a.flag) if a.flag in order else len(order)))


def _per_dp(requested: Mapping[str, Any]) -> int:
    if not requested.get("enable-dp-attention"):
        return 1
    try:
        return max(1, int(number(str(requested.get("dp-size", 1)))))
    except (TypeError, ValueError):
        return 1


def build_report(log_text: str, candidate: Candidate | None = None,
                 server_info: Mapping[str, Any] | None = None) -> BootReport:
    """The ``BootReport`` of one boot: log, then ``/server_info``, then the adjustments."""
    report = parse_log(log_text)
    if server_info:
        report = merge_server_info(report, server_info)
    if candidate is not None:
        report = replace(report, adjustments=find_adjustments(candidate, report, log_text))
    return replace(report, warnings=tuple(dict.fromkeys((*report.warnings, *_derived_warnings(report, candidate)))))


def _derived_warnings(report: BootReport, candidate: Candidate | None) -> list[str]:
    """Consequences the runtime does not log but the numbers show (clamped requests, a pool short of the context)."""
    warnings = []
    if (report.context_len is not None and report.max_total_num_tokens is not None
            and report.max_total_num_tokens < report.context_len):
        warnings.append(f"the KV pool holds {report.max_total_num_tokens} tokens but context_len is "
                        f"{report.context_len}: one full-length request cannot fit; tell clients "
                        f"{report.max_total_num_tokens}, not the declared context length")
    requested = candidate.flags if candidate is not None else {}
    if report.server_args.get("disable_overlap_schedule") is True and not requested.get("disable-overlap-schedule"):
        warnings.append("overlap scheduling is off although not requested (server_args shows "
                        "disable_overlap_schedule=True; e.g. the Mamba no_buffer strategy forces it)")
    return warnings


def looks_booted(log_text: str) -> bool:
    """True when the log reached readiness (the ready line)."""
    return READY_LINE in log_text
