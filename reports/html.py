"""``report.html``: the report as one self-contained page (inline CSS, plots as base64 PNG, no scripts).

Everything quoted from server logs, flags, labels or user input passes through ``html.escape`` (``_e``)
at the point where it is written, and nothing else is ever interpolated raw: a log line such as
``<script>alert(1)</script>`` shows as text. The page loads no external asset.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Mapping, Sequence

from elsa_tune.history.reasons import interval, pct
from elsa_tune.reports import units
from elsa_tune.reports.deploy import SIMULATED
from elsa_tune.reports.model import Report, sigma_boot_text

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222;
padding:0 1em}
h1{font-size:1.6em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:.6em 0;font-size:13px}td,th{border:1px solid #ddd;padding:3px 7px;
vertical-align:top;text-align:left}th{background:#f4f4f4}code,pre{font:12px/1.4 ui-monospace,monospace}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;white-space:pre-wrap}.warn{background:#fff4e5;
border-left:4px solid #f0a020;padding:.5em .8em}.yes{color:#1a7f37;font-weight:600}.no{color:#c62828}
.inconclusive,.skipped,.undecided{color:#777}img{max-width:100%}.muted{color:#777}
#decision{border:1px solid #ccc;border-left:6px solid #777;padding:.2em 1em;margin:1em 0}
#decision.deploy{border-left-color:#1a7f37}#decision h2{margin-top:.4em;border:0}.sim{font-size:1.1em}
"""


def render_html(report: Report, plots: Mapping[str, bytes | None] | None = None) -> str:
    """The report page. ``plots`` maps ``"search"``, ``"forest"``, ``"headroom"`` to PNG bytes (or ``None``)."""
    plots = plots or {}
    parts: list[str] = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                        f"<title>elsa-tune report: {_e(report.study_name)}</title>", f"<style>{_CSS}</style>",
                        "</head><body>", f"<h1>elsa-tune report: {_e(report.study_name)}</h1>"]
    parts += _decision(report)
    parts += [f'<p class="warn">{_e(w)}</p>' for w in report.warnings]
    parts += _summary(report)
    parts += ["<h2>Winner vs baseline</h2>", f"<p><strong>{_e(report.summary_line())}</strong></p>"]
    parts += _table(["", "output tok/s (per-boot mean ± sd)", "boots", "label", "flags"],
                    [[name, units.num(arm.mean) + (f" ± {arm.stdev:,.1f}" if arm.stdev is not None else ""),
                      str(len(arm.throughputs)), arm.candidate.label, _Code(" ".join(arm.candidate.argv()))]
                     for name, arm in (("baseline", report.baseline), ("winner", report.winner)) if arm is not None])
    changes = report.winner_changes()
    if changes:
        parts += ["<p>Changes from the baseline:</p><ul>", *[f"<li><code>{_e(c)}</code></li>" for c in changes],
                  "</ul>"]
    parts += _noise(report)
    parts += ["<h2>Search</h2>", _img(plots.get("search"), "objective per boot")]
    parts += ["<h2>Tried / Result / Kept?</h2>"]
    parts += _table(["Tried", "flags / env", "Result", "Kept?"],
                    [[r.tried, _Code(r.delta), r.result, _Class(r.kept_word, r.kept_value)]
                     for r in report.keep_reject])
    parts += ["<h2>A/B tests</h2>", _img(plots.get("forest"), "A/B effects with confidence intervals")]
    parts += _table(["#", "phase", "technique", "delta", "effect", "CI", "p", "boots (inc./cand.)", "decision",
                     "guardrails"],
                    [[str(r.number), r.phase, r.technique, _Code(r.delta), pct(r.verdict.effect),
                      interval(r.verdict.ci_low, r.verdict.ci_high), units.p_value(r.verdict.p_value),
                      f"{r.verdict.boots_incumbent}/{r.verdict.boots_candidate}",
                      _Class(r.verdict.decision.value, r.kept.value),
                      "; ".join(f"{g.name}: {'pass' if g.passed else 'fail' if g.passed is False else 'undecided'}"
                                for g in r.verdict.guardrails)] for r in report.ab_rows])
    parts += ["<h2>Numeric search</h2>"]
    gpu_col = ["GPU"] if report.trial_gpus else []
    parts += _table(["trial", *gpu_col, "parameters", "state", "objective", "constraint", "boots"],
                    [[str(t.number), *([report.trial_gpus.get(t.number, "")] if gpu_col else []),
                      " ".join(f"{k}={v}" for k, v in t.params.items()),
                      t.state.value + (f" ({t.failure_kind})" if t.failure_kind else ""),
                      "n/a" if t.values is None or t.state.value != "complete"
                      else ", ".join(f"{v:,.1f}" for v in t.values), f"{t.constraint:g}", units.ids(t.boot_ids)]
                     for t in report.trials])
    parts += ["<h2>Silent adjustments seen</h2>",
              "<p>Flags the runtime accepted and then clamped or ignored, with the log line that proves it.</p>"]
    parts += _table(["flag", "requested", "effective", "evidence", "boots"],
                    [[f"--{a.flag}", a.requested, a.effective, _Code(a.evidence), units.ids(a.boots)]
                     for a in report.adjustments])
    parts += ["<h2>Failures</h2>"]
    if not report.failures:
        parts.append('<p class="muted">none</p>')
    for boot, reason, evidence in report.failures:
        parts.append(f"<h3>{_e(boot)}</h3><p>{_e(reason)}</p>")
        if evidence:
            parts.append(f"<pre>{_e(chr(10).join(evidence))}</pre>")
    parts += ["<h2>Memory headroom per boot</h2>", _img(plots.get("headroom"), "minimum free GPU memory per boot")]
    parts += _table(["boot", "phase", "config", "outcome", "min free GPU memory", "KV tokens", "slots", "tok/s"],
                    [[r.boot_id, r.phase, r.label, r.outcome.value, units.mib(r.min_free_bytes),
                      units.integer(r.kv_tokens), units.integer(r.slots), units.num(r.throughput)]
                     for r in report.boots])
    parts += ["<h2>Ledger: measured and rejected on this setup</h2>"]
    parts += _table(["technique", "why", "verdict", "date", "retest"],
                    [[e.technique, e.reason, e.decision.value, e.date[:10], e.retest_when]
                     for e in report.ledger if e.rejected])
    parts += [f'<p class="warn">ledger line skipped: {_e(p)}</p>' for p in report.ledger_problems]
    parts += _client(report)
    parts += [f'<p class="muted">Rendered from {_e(report.generated_from)} without measuring anything.</p>',
              "</body></html>", ""]
    return "\n".join(parts)


class _Code(str):
    """A cell shown as code (still escaped)."""


class _Class(str):
    """A cell with a CSS class (the class name is escaped too)."""

    css: str

    def __new__(cls, value: str, css: str) -> _Class:
        obj = super().__new__(cls, value)
        obj.css = css
        return obj


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _cell(value: object) -> str:
    if isinstance(value, _Code):
        return f"<td><code>{_e(value)}</code></td>" if value else "<td></td>"
    if isinstance(value, _Class):
        return f'<td class="{_e(value.css)}">{_e(value)}</td>'
    return f"<td>{_e(value)}</td>"


def _table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    body = [list(r) for r in rows]
    if not body:
        return ['<p class="muted">none</p>']
    out = ["<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in headers) + "</tr></thead><tbody>"]
    out += ["<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in body]
    return [*out, "</tbody></table>"]


def _img(png: bytes | None, alt: str) -> str:
    if not png:
        return '<p class="muted">no data to plot</p>'
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _decision(report: Report) -> list[str]:
    d = report.decision()
    out = [f'<p class="warn sim"><strong>{_e(SIMULATED)}:</strong> every number below comes from elsa-tune\'s '
           "simulated SGLang, not from a GPU.</p>"] if d.simulated else []
    out += [f'<section id="decision" class="{"deploy" if d.deploy else "keep"}"><h2>Decision</h2>',
            f"<p class=\"action\"><strong>{_e(d.action)}.</strong></p><ul>",
            f"<li><strong>Effect:</strong> {_e(d.effect)}</li>",
            f"<li><strong>Files</strong> ({_e(d.holds)}): "
            + ", ".join(f"<code>{_e(path)}</code> ({_e(what)})" for path, what in d.files) + "</li>"]
    if d.changes:
        out.append("<li><strong>Changes from the baseline:</strong> "
                   + ", ".join(f"<code>{_e(c)}</code>" for c in d.changes) + "</li>")
    c = report.client
    if c is not None:
        out.append(f"<li><strong>Clients:</strong> largest request {_e(units.integer(c.max_request_tokens))} tokens "
                   f"(prompt + output), at most {_e(units.integer(c.max_running_requests))} concurrent requests "
                   "served</li>")
    return [*out, f"<li><strong>Study:</strong> {_e(report.status)}; {_e(report.boot_count_text())}</li>",
            "</ul></section>"]


def _summary(report: Report) -> list[str]:
    study = report.study
    rows: list[list[object]] = [
        ["status", report.status],
        ["setup", report.fingerprint.describe() if report.fingerprint else "unknown"],
        ["setup key", _Code(report.fingerprint.key() if report.fingerprint else "?")],
        ["boots", report.boot_count_text()],
    ]
    if report.fingerprint is not None and units.simulated(report.fingerprint.runtime):
        rows.append(["time", units.SIMULATED_TIME])
    if study is not None:
        used = units.duration(study.updated_at - study.started_at)
        rows.insert(1, ["budget", f"{units.duration(study.budget_s)}{units.budget_clock(study.budget_clock)}, used "
                                  f"{used}; started {units.when(study.started_at)}"])
        if study.traffic:
            rows.append(["traffic", study.traffic])
        if study.context_target:
            rows.append(["context target", f"{study.context_target:,} tokens"])
    out = ["<h2>Study</h2>", *_table(["", ""], rows)]
    if study is not None and study.phases:
        out += _table(["phase", "budget", "used", "boots"],
                      [[p.name, units.duration(p.budget_s),
                        units.duration(p.ended_at - p.started_at) if p.ended_at is not None else "running",
                        str(p.boots)] for p in study.phases])
    return out


def _noise(report: Report) -> list[str]:
    noise = report.noise
    out = ["<h2>Baseline noise</h2>"]
    if noise is None:
        return [*out, "<p>Not measured: no baseline boot has two or more passes.</p>"]
    rows: list[list[object]] = [
        ["σ_boot (restart to restart)", sigma_boot_text(noise)],
        ["σ_run (pass to pass within a boot)", units.frac(noise.sigma_run)],
        ["warm-up: first pass vs steady state (discarded)", units.frac(noise.warmup_bias, signed=True)],
        ["boots / passes per boot", f"{noise.boots} / {noise.passes_per_boot:.1f}"],
        ["source", "recorded by the study" if noise.derived_from == "study" else "recomputed from the baseline boots"],
    ]
    if noise.mde is not None:
        rows.append(["smallest detectable effect", pct(noise.mde if noise.mde >= 1 else 1 + noise.mde)])
    return [*out, *_table(["", ""], rows)]


def _client(report: Report) -> list[str]:
    out = ["<h2>What clients must be told</h2>"]
    c = report.client
    if c is None:
        return [*out, "<p>Unknown: no successful boot of the winner reported its pools.</p>"]
    return [*out, *_table(["number", "value", "note"], [
        ["max_total_num_tokens", units.integer(c.max_total_num_tokens), "what really fits in the KV pool"],
        ["largest request (prompt + output)", units.integer(c.max_request_tokens),
         f"declared --context-length: {units.integer(c.declared_context_length)}"],
        ["running slots (effective)", units.integer(c.max_running_requests),
         f"requested: {units.integer(c.declared_max_running_requests)}"],
        ["context_len", units.integer(c.context_len), ""],
        ["measured on boots", units.ids(c.boot_ids), "see best/client.json"],
    ])]
