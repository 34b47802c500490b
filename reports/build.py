"""``write_outputs``: render ``report.md``, ``report.html`` and ``best/`` from a run folder.

The tuner calls it after every decision; ``elsa-tune report RUN_DIR`` calls it on demand. It only reads
history and writes files atomically, so it is idempotent (same history, same bytes) and a study killed
at any point still leaves complete outputs from its last decision.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from elsa_tune.durable_file import write_atomic
from elsa_tune.history.ledger import Ledger
from elsa_tune.reports import plots
from elsa_tune.reports.deploy import build_bundle
from elsa_tune.reports.html import render_html
from elsa_tune.reports.markdown import render_markdown
from elsa_tune.reports.model import Report, build_report

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outputs:
    report: Report
    markdown: Path
    html: Path
    best: Path | None          # ``None`` when history holds no configuration to deploy yet


def write_outputs(run_dir: str | Path, *, ledger: Ledger | None = None, with_plots: bool = True) -> Outputs:
    """Render every output of ``run_dir`` from its history. Raises ``HistoryError`` for an unreadable record."""
    report = build_report(run_dir, ledger=ledger)
    root = report.run_dir
    figures = {"search": plots.search_plot(report), "forest": plots.forest_plot(report.ab_rows),
               "headroom": plots.headroom_plot(report.boots)} if with_plots else {}
    markdown = root / "report.md"
    html = root / "report.html"
    write_atomic(markdown, render_markdown(report))
    write_atomic(html, render_html(report, figures))
    best: Path | None = None
    bundle = build_bundle(report)
    if bundle is not None:
        best = root / "best"
        for name, (content, executable) in bundle.files().items():
            write_atomic(best / name, content, mode=0o755 if executable else 0o644)
    log.info("outputs of %s written: %s, %s%s", report.study_name, markdown.name, html.name,
             ", best/" if best else "")
    return Outputs(report=report, markdown=markdown, html=html, best=best)
