"""``report.md``: the report as Markdown a person reviews in ten minutes.

Every quoted string (log lines, reasons, flags) goes through ``cell``/``text``: pipes and newlines cannot
break a table and ``<``/``>``/``&`` become entities, so a log line can never inject HTML into a renderer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from elsa_tune.history.reasons import interval, pct
from elsa_tune.reports import units
from elsa_tune.reports.deploy import SIMULATED
from elsa_tune.reports.model import Report, sigma_boot_text


def render_markdown(report: Report) -> str:
    """The report, leading with the decision (what to deploy, its effect, the files) in its first lines."""
    out: list[str] = [f"# elsa-tune report: {text(report.study_name)}", ""]
    out += _decision(report)
    for warning in report.warnings:
        out.append(f"> **Warning:** {text(warning)}")
    if report.warnings:
        out.append("")
    out += _summary(report)
    out += _winner(report)
    out += _noise(report)
    out += ["## Tried / Result / Kept?", ""]
    out += table(["Tried", "Result", "Kept?"],
                 [[r.tried + (f" (`{r.delta}`)" if r.delta and r.delta != r.tried else ""), r.result, r.kept_word]
                  for r in report.keep_reject], code_cols=())
    out += ["## A/B tests", ""]
    out += table(["#", "phase", "technique", "effect", "CI", "p", "boots (inc./cand.)", "decision"],
                 [[str(r.number), r.phase, r.technique, pct(r.verdict.effect),
                   interval(r.verdict.ci_low, r.verdict.ci_high), units.p_value(r.verdict.p_value),
                   f"{r.verdict.boots_incumbent}/{r.verdict.boots_candidate}", r.verdict.decision.value]
                  for r in report.ab_rows])
    out += ["## Numeric search", ""]
    gpu_col = ["GPU"] if report.trial_gpus else []
    if report.trial_gpus:
        out += [f"Searched on {len({g.split(' (')[0] for g in report.trial_gpus.values()})} GPUs at once; each "
                "trial was measured on the GPU shown, and each A/B ran all its boots on one GPU.", ""]
    out += table(["trial", *gpu_col, "parameters", "state", "objective", "constraint", "boots"],
                 [[str(t.number), *([report.trial_gpus.get(t.number, "")] if gpu_col else []),
                   " ".join(f"{k}={v}" for k, v in t.params.items()), t.state.value
                   + (f" ({t.failure_kind})" if t.failure_kind else ""),
                   "n/a" if t.values is None or t.state.value != "complete"
                   else ", ".join(f"{v:,.1f}" for v in t.values),
                   f"{t.constraint:g}", units.ids(t.boot_ids)] for t in report.trials])
    out += ["## Silent adjustments seen", "",
            "Flags the runtime accepted and then clamped or ignored, with the log line that proves it.", ""]
    out += table(["flag", "requested", "effective", "evidence", "boots"],
                 [[f"--{a.flag}", a.requested, a.effective, a.evidence, units.ids(a.boots)]
                  for a in report.adjustments])
    out += ["## Failures", ""]
    out += table(["boot", "what happened", "evidence"],
                 [[boot, reason, evidence[0] if evidence else ""] for boot, reason, evidence in report.failures])
    out += ["## Memory headroom per boot", ""]
    out += table(["boot", "phase", "config", "outcome", "min free GPU memory", "KV tokens", "slots", "tok/s"],
                 [[r.boot_id, r.phase, r.label, r.outcome.value, units.mib(r.min_free_bytes),
                   units.integer(r.kv_tokens), units.integer(r.slots), units.num(r.throughput)]
                  for r in report.boots])
    out += ["## Ledger: measured and rejected on this setup", ""]
    out += table(["technique", "why", "verdict", "date", "retest"],
                 [[e.technique, e.reason, e.decision.value, e.date[:10], e.retest_when]
                  for e in report.ledger if e.rejected])
    for problem in report.ledger_problems:
        out.append(f"> ledger line skipped: {text(problem)}")
    out += _client(report)
    out += [f"_Rendered from `{text(report.generated_from)}` without measuring anything "
            "(`elsa-tune report RUN_DIR` re-renders it)._", ""]
    return "\n".join(out)


def _summary(report: Report) -> list[str]:
    study, noise = report.study, report.noise
    out = ["## Study", "",
           f"- **Status:** {text(report.status)}",
           f"- **Setup:** {text(report.fingerprint.describe()) if report.fingerprint else 'unknown'}",
           f"- **Setup key:** `{report.fingerprint.key() if report.fingerprint else '?'}` "
           f"(ledger key `{report.fingerprint.ledger_key() if report.fingerprint else '?'}`)",
           f"- **Boots:** {text(report.boot_count_text())}",
           f"- **Result:** {text(report.summary_line())}"]
    if report.fingerprint is not None and units.simulated(report.fingerprint.runtime):
        out.append(f"- **Time:** {units.SIMULATED_TIME}")
    if study is not None:
        used = study.updated_at - study.started_at
        out.insert(3, f"- **Budget:** {units.duration(study.budget_s)}{units.budget_clock(study.budget_clock)}, used "
                      f"{units.duration(used)}; started {units.when(study.started_at)}")
        if study.traffic:
            out.insert(4, f"- **Traffic:** {text(study.traffic)}")
        if study.context_target:
            out.append(f"- **Context target:** {study.context_target:,} tokens")
    if noise is not None:
        out.append(f"- **Noise:** σ_boot {sigma_boot_text(noise)}, σ_run {units.frac(noise.sigma_run)}")
    out.append("")
    if study is not None and study.phases:
        out += ["| phase | budget | used | boots |", "|---|---|---|---|"]
        for p in study.phases:
            used_p = (p.ended_at - p.started_at) if p.ended_at is not None else None
            out.append(f"| {cell(p.name)} | {units.duration(p.budget_s)} | "
                       f"{units.duration(used_p) if used_p is not None else 'running'} | {p.boots} |")
        out.append("")
    return out


def _decision(report: Report) -> list[str]:
    d = report.decision()
    out = ([f"> **{SIMULATED}:** every number below comes from elsa-tune's simulated runtime, not from a GPU.", ""]
           if d.simulated else [])
    out += ["## Decision", "", f"**{text(d.action)}.**", "",
            f"- **Effect:** {text(d.effect)}",
            f"- **Files** ({text(d.holds)}): {', '.join(f'`{path}` ({text(what)})' for path, what in d.files)}"]
    if d.changes:
        out.append(f"- **Changes from the baseline:** {', '.join(f'`{cell(c)}`' for c in d.changes)}")
    c = report.client
    if c is not None:
        out.append(f"- **Clients:** largest request {units.integer(c.max_request_tokens)} tokens (prompt + output), "
                   f"at most {units.integer(c.max_running_requests)} concurrent requests served")
    return [*out, f"- **Study:** {text(report.status)}; {text(report.boot_count_text())}", ""]


def _winner(report: Report) -> list[str]:
    out = ["## Winner vs baseline", "", text(report.summary_line()), ""]
    rows = []
    for name, arm in (("baseline", report.baseline), ("winner", report.winner)):
        if arm is None:
            continue
        spread = f" ± {arm.stdev:,.1f}" if arm.stdev is not None else ""
        rows.append([name, f"{units.num(arm.mean)}{spread}", str(len(arm.throughputs)), arm.candidate.label,
                     " ".join(arm.candidate.argv())])
    out += table(["", "output tok/s (per-boot mean ± sd)", "boots", "label", "flags"], rows, code_cols=(4,))
    changes = report.winner_changes()
    if changes:
        out += ["Changes from the baseline:", "", *[f"- `{cell(c).replace('`', '')}`" for c in changes], ""]
    return out


def _noise(report: Report) -> list[str]:
    noise = report.noise
    out = ["## Baseline noise", ""]
    if noise is None:
        return [*out, "Not measured: no baseline boot has two or more passes.", ""]
    source = "recorded by the study" if noise.derived_from == "study" else "recomputed from the baseline boots"
    aside = ""
    if noise.set_aside_boot is not None and noise.set_aside_off_median is not None:
        aside = (f" (boot {noise.set_aside_boot + 1} of {noise.boots} set aside as an outlier: "
                 f"{pct(1 + noise.set_aside_off_median)} off the others' median; with it "
                 f"{units.frac(noise.sigma_boot_all)})")
    out += [f"- σ_boot (restart to restart): {sigma_boot_text(noise)}{aside}",
            f"- σ_run (pass to pass within a boot): {units.frac(noise.sigma_run)}",
            f"- warm-up: the first pass after a boot reads {units.frac(noise.warmup_bias, signed=True)} vs "
            "steady state (discarded)",
            f"- {noise.boots} boots, {noise.passes_per_boot:.1f} passes per boot ({source})"]
    if noise.mde is not None:
        out.append(f"- smallest effect the gate could detect: {pct(noise.mde if noise.mde >= 1 else 1 + noise.mde)}")
    return [*out, ""]


def _client(report: Report) -> list[str]:
    out = ["## What clients must be told", ""]
    c = report.client
    if c is None:
        return [*out, "Unknown: no successful boot of the winner reported its pools.", ""]
    out += [f"- **max_total_num_tokens (what really fits):** {units.integer(c.max_total_num_tokens)}",
            f"- **largest request (prompt + output):** {units.integer(c.max_request_tokens)} tokens"
            + (f" — not the declared --context-length {c.declared_context_length:,}"
               if c.declared_context_length and c.max_request_tokens and c.declared_context_length
               > c.max_request_tokens else ""),
            f"- **running slots (effective):** {units.integer(c.max_running_requests)}"
            + (f" (requested {c.declared_max_running_requests})"
               if c.declared_max_running_requests not in (None, c.max_running_requests) else ""),
            f"- **context_len:** {units.integer(c.context_len)}",
            f"- from boots {units.ids(c.boot_ids)}; see `best/client.json`", ""]
    return out


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, code_cols: Sequence[int] = ()) -> list[str]:
    body = [list(r) for r in rows]
    if not body:
        return ["_none_", ""]
    out = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    for row in body:
        cells = [f"`{cell(v).replace('`', '')}`" if i in code_cols and v else cell(v) for i, v in enumerate(row)]
        out.append("| " + " | ".join(cells) + " |")
    return [*out, ""]


def cell(value: object) -> str:
    return text(value).replace("|", "\\|")


def text(value: object) -> str:
    """Neutralise quoted text for Markdown: one line, and every ``<`` or ``&`` that could open an HTML tag,
    comment or entity (``<s``, ``</``, ``<!``, ``<?``, ``&amp``) written as an entity; a ``<`` before a digit or
    a space (``<0.001``) cannot start markup in CommonMark and stays as it reads."""
    s = " ".join(str(value).split())
    s = _ENTITY_OPENER.sub("&amp;", s)
    return _TAG_OPENER.sub("&lt;", s).replace(">", "&gt;")


_TAG_OPENER = re.compile(r"<(?=[A-Za-z/!?])")
_ENTITY_OPENER = re.compile(r"&(?=[A-Za-z#])")
