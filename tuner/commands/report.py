"""``elsa-tune report RUN_DIR``: re-render report.md, report.html and best/ from a study's history.

Nothing is measured and no runtime is started: the outputs are a function of the run folder (and the
ledger beside it), so this works on a finished, a running or a killed study.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from elsa_tune.errors import ConfigError

NAME = "report"
HELP = "re-render report.md, report.html and best/ of a study from its history (measures nothing)"
EXAMPLES = ('elsa-tune report elsa-runs/demo',
            'elsa-tune report elsa-runs/demo --json --no-plots')


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path,
                        help="the study's folder (holds study.json, boots/), e.g. elsa-runs/demo")
    parser.add_argument("--no-plots", action="store_true", help="skip the figures (faster; the HTML says so)")
    parser.add_argument("--json", action="store_true",
                        help="print the decision, the boot counts and the files written as one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_dir: Path = args.run_dir
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no such run directory",
                          remedy="pass the folder a study wrote, e.g. elsa-runs/<study>/")
    if not (run_dir / "boots").is_dir() and not (run_dir / "study.json").exists():
        raise ConfigError(f"{run_dir}: not a study folder (no study.json, no boots/)",
                          remedy="pass the folder a study wrote, e.g. elsa-runs/<study>/")
    if (run_dir / "compare.json").exists() and not (run_dir / "study.json").exists():
        raise ConfigError(f"{run_dir} holds a comparison (elsa-tune compare), not a study: it has no winner to report",
                          remedy=f"read {run_dir / 'compare.json'}, or rerun the same elsa-tune compare command to "
                                 "print its verdict from the recorded boots")
    for name, folder in (("report.md", False), ("report.html", False), ("best", True)):
        path = run_dir / name     # checked before rendering: a folder, FIFO or device there is refused untouched
        if os.path.lexists(path) and (path.is_dir() != folder or not (folder or path.is_file())):
            raise ConfigError(f"{path} is not the {'folder' if folder else 'file'} a report writes there",
                              remedy=f"move {path} aside: elsa-tune report writes report.md, report.html and best/ "
                                     "in the run folder")
    from elsa_tune.reports.build import write_outputs  # matplotlib is slow to import: only when rendering

    outputs = write_outputs(run_dir, with_plots=not args.no_plots)
    report = outputs.report
    if args.json:
        decision = report.decision()
        print(json.dumps({
            "study": report.study_name, "status": report.status, "simulated": report.simulated,
            "decision": {"action": decision.action, "effect": decision.effect, "deploy": decision.deploy,
                         "holds": decision.holds, "changes": list(decision.changes)},
            "summary": report.summary_line(), "boots": len(report.boots),
            "boot_outcomes": dict(report.boot_counts()), "decisions": len(report.keep_reject),
            "warnings": list(report.warnings), "report_md": str(outputs.markdown), "report_html": str(outputs.html),
            "best": str(outputs.best) if outputs.best else None}, indent=2))
        return 0
    print(f"{report.study_name}: {report.summary_line()}")
    print(f"  {len(report.boots)} boots, {len(report.keep_reject)} decisions, status {report.status}")
    for warning in report.warnings:
        print(f"  warning: {warning}")
    print(f"  wrote {outputs.markdown}")
    print(f"  wrote {outputs.html}")
    if outputs.best is not None:
        print(f"  wrote {outputs.best}/ (launch.sh, docker-compose.yml, server-args.yaml, client.json, client.md)")
    return 0
