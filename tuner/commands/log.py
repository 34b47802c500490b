"""``elsa-tune log explain SERVER_LOG [--json] [--flags "..."]``: what an SGLang or llama-server log says happened.

Prints the ``BootReport`` (pool sizes, slots, phase timings, adjustments with their evidence) of any
SGLang server log, and the classified failure with its evidence and remedy when the log shows one.
A log that ``runtime.family.detect`` reads as llama.cpp's ``llama-server`` is read by that family instead:
context per slot, slots, the KV cache, buffers per device, layers offloaded, adjustments and the failure.
``--flags`` takes the launch flags that were requested (``"--max-running-requests 4 --page-size 32"``,
``"-c 4096 -np 4"`` or a whole launch command) so silent clamps and silently ignored flags can be shown.
``-`` reads stdin.

Exit status: 0 when the log shows no failure, 1 when it shows one, 2 for a missing or empty file.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from elsa_tune import exit_codes
from elsa_tune.errors import ConfigError
from elsa_tune.input_file import read_input
from elsa_tune.runtime.boot_report import BootReport
from elsa_tune.runtime.classify import classify, looks_failed
from elsa_tune.runtime.failure import Failure
from elsa_tune.runtime.family import FamilyName, RuntimeFamily, detect
from elsa_tune.runtime.llamacpp.flags import canonical
from elsa_tune.runtime.startup_log import build_report, number
from elsa_tune.search_spaces.candidate import Candidate, FlagValue

NAME = "log"
HELP = "explain an SGLang or llama-server log: the boot report, or the classified failure with its remedy"
EXAMPLES = ('elsa-tune log explain server.log',
            'elsa-tune log explain - --json --flags "--page-size 32"')


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="log_command", metavar="ACTION", required=True)
    explain = sub.add_parser("explain", help=HELP, description=HELP)
    explain.add_argument("server_log", metavar="SERVER_LOG", help="path to the log, or - for stdin")
    explain.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    explain.add_argument("--flags", default="", metavar="FLAGS",
                         help='the requested launch flags, e.g. "--max-running-requests 4 --enable-mixed-chunk"')
    explain.set_defaults(func=run_explain)


def parse_flags(text: str) -> Candidate:
    """Launch flags (or a whole launch command) → ``Candidate``; anything before the first flag is ignored."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"--flags cannot be parsed: {exc}", remedy="quote the flags as one shell string") from exc
    flags: dict[str, FlagValue] = {}
    i = next((n for n, t in enumerate(tokens) if t.startswith("--")), len(tokens))
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--"):
            raise ConfigError(f"--flags: unexpected value {token!r}", remedy='write flags as "--name value --switch"')
        name, eq, inline = token[2:].partition("=")
        name = name.replace("_", "-")
        if eq:
            flags[name], i = inline, i + 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            flags[name], i = number(tokens[i + 1]), i + 2
        else:
            flags[name], i = True, i + 1
    return Candidate(flags=flags, label="log explain")


_MAX_LOG_BYTES = 1 << 30   # a server log of a day's boots is megabytes; a gigabyte is not one log


def _read(path: str) -> str:
    if path == "-":
        text = sys.stdin.read()
    else:
        try:
            raw = read_input(path, "the server log", limit=_MAX_LOG_BYTES)
        except OSError as exc:
            raise ConfigError(f"cannot read the server log {path!r}: {exc.strerror or exc}",
                              remedy="pass the path of an SGLang server log (or - to read stdin)") from exc
        text = raw.decode("utf-8", errors="replace")
        if b"\0" in raw[:65536] or text[:65536].count("\ufffd") > len(text[:65536]) // 100:
            raise ConfigError(f"{path!r} is binary data, not a server log",
                              remedy="pass the text log an SGLang server wrote (its stdout/stderr)")
    if not text.strip():
        raise ConfigError(f"the server log {path!r} is empty", remedy="pass a log that SGLang wrote")
    return text


def parse_llamacpp_flags(text: str) -> Candidate:
    """llama-server launch flags (``-c 4096 -np 4 --flash-attn on``, or a whole command) → ``Candidate``.

    Single-dash spellings count as flags; known short spellings become their long name (``c`` → ``ctx-size``).
    """
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"--flags cannot be parsed: {exc}", remedy="quote the flags as one shell string") from exc
    flags: dict[str, FlagValue] = {}
    i = next((n for n, t in enumerate(tokens) if _is_flag(t)), len(tokens))
    while i < len(tokens):
        token = tokens[i]
        if not _is_flag(token):
            raise ConfigError(f"--flags: unexpected value {token!r}", remedy='write flags as "-c 4096 --flag value"')
        name, eq, inline = token.lstrip("-").partition("=")
        name = canonical(name.replace("_", "-"))
        if eq:
            flags[name], i = inline, i + 1
        elif i + 1 < len(tokens) and not _is_flag(tokens[i + 1]):
            flags[name], i = number(tokens[i + 1]), i + 2
        else:
            flags[name], i = True, i + 1
    return Candidate(flags=flags, label="log explain")


def _is_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not isinstance(number(token), int | float)


def run_explain(args: argparse.Namespace) -> int:
    text = _read(args.server_log)
    family = detect(text)
    if family is not None and family.name is FamilyName.LLAMACPP:
        return _explain_with(family, text, args)
    candidate = parse_flags(args.flags) if args.flags else None
    report = build_report(text, candidate)
    failure = classify(text) if looks_failed(text) else None
    if failure is None and _says_nothing(report):
        raise ConfigError(f"nothing in {args.server_log!r} reads as an SGLang or llama-server log (no version, pool, "
                          "slot, phase or failure line)",
                          remedy="pass the log an SGLang server or llama-server (-lv 4) wrote (its stdout/stderr, from "
                                 "the first line)")
    if args.json:
        print(json.dumps({"report": report.to_dict(), "failure": failure.to_dict() if failure else None},
                         indent=2, default=str))
    else:
        print(render(report, failure))
    return exit_codes.FAILED if failure else exit_codes.OK


def _explain_with(family: RuntimeFamily, text: str, args: argparse.Namespace) -> int:
    candidate = parse_llamacpp_flags(args.flags) if args.flags else None
    report = family.boot_report(text, candidate)
    failure = family.classify(text) if family.looks_failed(text) else None
    if args.json:
        print(json.dumps({"family": family.name.value, "report": report.to_dict(),
                          "failure": failure.to_dict() if failure else None}, indent=2, default=str))
    else:
        print(render_llamacpp(report, failure))
    return exit_codes.FAILED if failure else exit_codes.OK


def _says_nothing(report: BootReport) -> bool:
    """No line of the log was recognised: the report is the empty report."""
    return report.to_dict() == BootReport().to_dict()


def _gb(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} GB"


def _n(value: Any) -> str:
    return "—" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def _mib(report: BootReport, kind: str, gb: float | None) -> str:
    """The MiB llama.cpp printed for ``kind`` buffers (summed over devices), else ``gb`` in MiB."""
    printed = [b.mib for b in report.buffers if b.kind == kind]
    if printed:
        return f"{sum(printed):,.2f} MiB"
    return "—" if gb is None else f"{gb * 1024:,.2f} MiB"


def render_llamacpp(report: BootReport, failure: Failure | None) -> str:
    """The human-readable explanation of a llama-server log."""
    unified = {True: "one unified pool shared by all slots", False: "one share per slot", None: "—"}
    offload = ("—" if report.layers_offloaded is None
               else f"{report.layers_offloaded}/{_n(report.layers_total)} layers on the GPU")
    rows = [
        ("runtime", f"llama-server {_n(report.runtime_version)}"),
        ("context per slot (n_ctx_seq)", _n(report.context_len)),
        ("slots (-np)", _n(report.max_running_requests)),
        ("context total (n_ctx)", _n(report.max_total_num_tokens)),
        ("KV cache", f"{_mib(report, 'kv', report.kv_pool_gb)}, {_n(report.kv_pool_tokens)} cells, "
                     f"type {_n(report.kv_dtype)}"),
        ("KV layout", unified[report.kv_unified]),
        ("weights", _mib(report, "model", report.weights_mem_gb)),
        ("offload", offload),
        ("speculative decoding", {True: "active", False: "off", None: "—"}[report.speculative]),
        ("boot time", "—" if report.boot_seconds is None else f"{report.boot_seconds:.2f} s"),
    ]
    width = max(len(label) for label, _ in rows)
    out = ["Boot report (llama.cpp)"] + [f"  {label:<{width}}  {value}" for label, value in rows]
    if report.buffers:
        out.append("Buffers")
        for buffer in report.buffers:
            out.append(f"  {buffer.device + ' ' + buffer.kind:<{width}}  {buffer.mib:,.2f} MiB")
    if report.phases:
        out.append("Phases")
        out += [f"  {p.name:<{width}}  {'—' if p.seconds is None else f'{p.seconds:.2f} s'}" for p in report.phases]
    if report.adjustments:
        out.append("Adjustments (requested → effective)")
        for adj in report.adjustments:
            requested = "unset" if adj.requested is None else repr(adj.requested)
            effective = "unused" if adj.effective is None else repr(adj.effective)
            out.append(f"  --{adj.flag}: {requested} → {effective}  [{adj.reason}]")
            out.append(f"      evidence: {adj.evidence}")
    out += _closing_lines(report, failure)
    return "\n".join(out)


def render(report: BootReport, failure: Failure | None) -> str:
    """The human-readable explanation."""
    out = ["Boot report"]
    rows = [
        ("runtime version", _n(report.runtime_version)),
        ("KV pool (max_total_num_tokens)", _n(report.max_total_num_tokens)),
        ("running-request slots (effective)", _n(report.max_running_requests)),
        ("context length", _n(report.context_len)),
        ("chunked prefill / max prefill", f"{_n(report.chunked_prefill_size)} / {_n(report.max_prefill_tokens)}"),
        ("weights", _gb(report.weights_mem_gb)),
        ("KV cache", f"{_gb(report.kv_pool_gb)}, {_n(report.kv_pool_tokens)} tokens, dtype {_n(report.kv_dtype)}"),
        ("Mamba state", f"{_gb(report.mamba_pool_gb)}, {_n(report.mamba_cache_size)} slots"),
        ("CUDA graphs", _gb(report.cuda_graph_mem_gb)),
        ("GPU memory left after boot", _gb(report.available_gpu_mem_gb)),
        ("boot time", "—" if report.boot_seconds is None else f"{report.boot_seconds:.1f} s"),
    ]
    width = max(len(label) for label, _ in rows)
    out += [f"  {label:<{width}}  {value}" for label, value in rows]
    if report.phases:
        out.append("Phases")
        for phase in report.phases:
            seconds = "—" if phase.seconds is None else f"{phase.seconds:.2f} s"
            extra = []
            if phase.mem_usage_gb is not None:
                extra.append(f"uses {phase.mem_usage_gb:.2f} GB")
            if phase.avail_mem_gb is not None:
                extra.append(f"{phase.avail_mem_gb:.2f} GB left")
            out.append(f"  {phase.name:<{width}}  {seconds}" + (f"  ({', '.join(extra)})" if extra else ""))
    if report.adjustments:
        out.append("Adjustments (requested → effective)")
        for adj in report.adjustments:
            out.append(f"  --{adj.flag}: {adj.requested!r} → {adj.effective!r}  [{adj.reason}]")
            out.append(f"      evidence: {adj.evidence}")
    out += _closing_lines(report, failure)
    return "\n".join(out)


def _closing_lines(report: BootReport, failure: Failure | None) -> list[str]:
    """The warnings of a boot report, then the failure with its evidence and remedy (every family's render)."""
    out = ["Warnings", *(f"  {w}" for w in report.warnings)] if report.warnings else []
    if failure is not None:
        out += [f"Failure: {failure.kind.value} ({failure.phase})", f"  {failure.summary}", "  evidence:",
                *(f"    {line}" for line in failure.evidence), f"  remedy: {failure.remedy}"]
    return out
