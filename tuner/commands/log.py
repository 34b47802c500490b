"""``elsa-tune log explain SERVER_LOG [--json] [--flags "..."]``: what an SGLang, llama-server or vLLM log says.

The log is read by the runtime family that wrote it (``runtime.family.detect``; SGLang when none claims it):
its ``BootReport`` in the family's own words (SGLang's pools and slots; llama.cpp's context per slot, buffers
per device and layers offloaded; vLLM's KV tokens, printed maximum concurrency, available KV memory and the
flags it received), the phases, the adjustments with their evidence, the warnings, and the classified failure
with its evidence and remedy when the log shows one. ``--flags`` takes the launch flags that were requested
(``"--max-running-requests 4"``, ``"-c 4096 -np 4"``, ``"vllm serve m --max-num-seqs 8"`` or a whole launch
command) so silent clamps and silently ignored flags can be shown. ``-`` reads stdin.

Exit status: 0 when the log shows no failure, 1 when it shows one, 2 for a missing or empty file.
"""

from __future__ import annotations

import argparse
import json
import sys

from elsa_tune import exit_codes
from elsa_tune.errors import ConfigError
from elsa_tune.input_file import read_input
from elsa_tune.runtime.boot_report import BootReport
from elsa_tune.runtime.failure import Failure
from elsa_tune.runtime.family import FamilyName, ReportSection, RuntimeFamily, detect, family

NAME = "log"
HELP = "explain an SGLang, llama-server or vLLM log: the boot report, or the classified failure with its remedy"
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


_MAX_LOG_BYTES = 1 << 30   # a server log of a day's boots is megabytes; a gigabyte is not one log


def _read(path: str) -> str:
    if path == "-":
        text = sys.stdin.read()
    else:
        try:
            raw = read_input(path, "the server log", limit=_MAX_LOG_BYTES)
        except OSError as exc:
            raise ConfigError(f"cannot read the server log {path!r}: {exc.strerror or exc}",
                              remedy="pass the path of a server log (or - to read stdin)") from exc
        text = raw.decode("utf-8", errors="replace")
        if b"\0" in raw[:65536] or text[:65536].count("\ufffd") > len(text[:65536]) // 100:
            raise ConfigError(f"{path!r} is binary data, not a server log",
                              remedy="pass the text log an SGLang, llama-server or vLLM server wrote (its "
                                     "stdout/stderr)")
    if not text.strip():
        raise ConfigError(f"the server log {path!r} is empty", remedy="pass a log that a server wrote")
    return text


def run_explain(args: argparse.Namespace) -> int:
    text = _read(args.server_log)
    runtime = detect(text) or family(FamilyName.SGLANG)
    candidate = runtime.read_flags(args.flags) if args.flags else None
    report = runtime.boot_report(text, candidate)
    failure = runtime.classify(text) if runtime.looks_failed(text) else None
    if failure is None and _says_nothing(report):
        raise ConfigError(f"nothing in {args.server_log!r} reads as an SGLang, llama-server or vLLM log (no version, "
                          "pool, slot, phase or failure line)",
                          remedy="pass the log an SGLang server, llama-server (-lv 4) or vLLM wrote (its "
                                 "stdout/stderr, from the first line)")
    if args.json:
        print(json.dumps({"family": runtime.name.value, "report": report.to_dict(),
                          "failure": failure.to_dict() if failure else None}, indent=2, default=str))
    else:
        print(render(runtime, report, failure))
    return exit_codes.FAILED if failure else exit_codes.OK


def _says_nothing(report: BootReport) -> bool:
    """No line of the log was recognised: the report is the empty report."""
    return report.to_dict() == BootReport().to_dict()


def render(runtime: RuntimeFamily, report: BootReport, failure: Failure | None) -> str:
    """The human-readable explanation: the family's sections, then what every boot report has (buffers, phases,
    adjustments, warnings) and the failure with its evidence and remedy."""
    sections = runtime.explain(report)
    width = max((len(label) for label, _ in sections[0].rows), default=0) if sections else 0
    out: list[str] = []
    for section in sections:
        out += _section(section, width)
    if report.buffers:
        out += _section(ReportSection("Buffers", tuple((f"{b.device} {b.kind}", f"{b.mib:,.2f} MiB")
                                                      for b in report.buffers)), width)
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
            requested = "unset" if adj.requested is None else repr(adj.requested)
            effective = "unused" if adj.effective is None else repr(adj.effective)
            out.append(f"  --{adj.flag}: {requested} → {effective}  [{adj.reason}]")
            out.append(f"      evidence: {adj.evidence}")
    if report.warnings:
        out += ["Warnings", *(f"  {w}" for w in report.warnings)]
    if failure is not None:
        out += [f"Failure: {failure.kind.value} ({failure.phase})", f"  {failure.summary}", "  evidence:",
                *(f"    {line}" for line in failure.evidence), f"  remedy: {failure.remedy}"]
    return "\n".join(out)


def _section(section: ReportSection, width: int) -> list[str]:
    return [section.title, *(f"  {label:<{width}}  {value}" for label, value in section.rows)]
