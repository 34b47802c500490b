"""report.md leads with the decision, lists every technique the study booted, and counts boots so they add up."""

from __future__ import annotations

from pathlib import Path

from elsa_history_factory import BASELINE, WINNER, HistoryBuilder, copy_history, verdict

from elsa_tune.history.records import Arm, BootOutcome, Phase
from elsa_tune.history.verdict import Decision
from elsa_tune.reports.build import write_outputs
from elsa_tune.reports.markdown import text
from elsa_tune.reports.model import build_report
from elsa_tune.reports.plots import incumbent_worth


def test_the_first_lines_are_the_decision(history_template: HistoryBuilder, tmp_path: Path) -> None:
    h = copy_history(history_template, tmp_path)
    head = "\n".join(write_outputs(h.run_dir, with_plots=False).markdown.read_text().splitlines()[:15])
    assert "**Deploy the winner: the gate confirmed it against the baseline.**" in head
    assert "output tok/s +11% [+6%, +16%] over 6 boots against the baseline" in head
    assert "`best/launch.sh`" in head and "`best/server-args.yaml`" in head
    assert "`--page-size 16 → 32`" in head and "largest request 100,480 tokens" in head


def test_an_unconfirmed_winner_is_reported_as_unconfirmed_not_as_the_baseline(history_template: HistoryBuilder,
                                                                             tmp_path: Path) -> None:
    h = copy_history(history_template, tmp_path)
    h.decision_number = 99       # after every decision of the template: the confirmation the report reads
    h.decide(Phase.CONFIRMATION, "winner vs baseline", dict(WINNER.flags),
             verdict=verdict(Decision.INCONCLUSIVE, 1.053, 0.96, 1.16, 6))
    decision = build_report(h.run_dir).decision()
    assert decision.action.startswith("The winner is unconfirmed: on fresh boots it showed no harm")
    assert "Keep the baseline" not in decision.action and decision.holds == "the winner (winner)"
    assert decision.effect.startswith("output tok/s +5.3% [−4%, +16%]")


def test_a_technique_booted_without_a_decision_is_listed_with_why(history_template: HistoryBuilder,
                                                                  tmp_path: Path) -> None:
    h = copy_history(history_template, tmp_path)
    track = BASELINE.merged(flags={"mamba-track-interval": 64}, label="mamba-track-interval-64")
    for outcome in (BootOutcome.MEASURED, BootOutcome.MEASURED, BootOutcome.READY):
        h.boot(track, Phase.SCREENING, Arm.CANDIDATE, outcome, values=[150.0, 151.0, 152.0],
               technique="mamba-track-interval-64")
    report = build_report(h.run_dir)
    row = next(r for r in report.keep_reject if r.tried == "mamba-track-interval-64")
    assert row.kept is None and row.kept_word == "No decision"
    assert row.result.startswith("no decision: its phase's time ran out, or the study stopped, before its A/B "
                                 "reached a decision; "
                                 "3 boots in its A/B (3 of it, 0 of the incumbent; 0025-mamba-track-interval-64 … "
                                 "0027-mamba-track-interval-64: 2 measured, 1 booted but not measured)")
    booted = {b.technique for b in report.boots if b.technique}
    assert booted <= {r.tried for r in report.keep_reject}
    assert sum(n for _, n in report.boot_counts()) == len(report.boots) == 27
    md = write_outputs(h.run_dir, with_plots=False).markdown.read_text()
    assert "| mamba-track-interval-64 | no decision: its phase's time ran out" in md
    assert "27 boots: 23 measured, 2 booted but not measured, 1 failed a stress probe" in md


def test_the_baseline_kept_says_what_was_left_open_not_that_nothing_beat_it(history_template: HistoryBuilder,
                                                                           tmp_path: Path) -> None:
    """A night too short for its tests keeps the baseline, and the first line says which tests ended inconclusive
    and which ran out of time, instead of "no technique or setting beat it" (seen on a real 7-minute night)."""
    import dataclasses

    from elsa_tune.history.study_record import StudyStatus

    h = copy_history(history_template, tmp_path)
    study = h.store.read_study()
    assert study is not None
    h.store.write_study(dataclasses.replace(study, incumbent=study.baseline, status=StudyStatus.FINISHED))
    assert build_report(h.run_dir).decision().action.startswith("Keep the baseline: ")
    h.decision_number = 50
    h.decide(Phase.SCREENING, "no-mtp", {"disable-mtp": True},
             verdict=verdict(Decision.INCONCLUSIVE, 1.20, 1.02, 1.41, 6))
    slow = BASELINE.merged(flags={"enable-two-batch-overlap": True}, label="enable-two-batch-overlap")
    h.boot(slow, Phase.SCREENING, Arm.CANDIDATE, BootOutcome.MEASURED, values=[150.0, 151.0, 152.0],
           technique="enable-two-batch-overlap")
    report = build_report(h.run_dir)
    inconclusive, undecided = report.open_techniques()
    assert "no-mtp" in inconclusive and undecided[-1] == "enable-two-batch-overlap"
    action = report.decision().action
    assert "no technique or setting beat it" not in action
    assert action.startswith("Keep the baseline: nothing was shown to beat it, but ")
    assert "ended inconclusive (" in action and "no-mtp" in action
    assert f"{len(undecided)} ran out of time before a decision (" in action
    assert action.endswith(f"and {len(undecided) - 4} more; a longer --budget tests them)" if len(undecided) > 4
                           else "enable-two-batch-overlap; a longer --budget tests them)")
    md = write_outputs(h.run_dir, with_plots=False).markdown.read_text()
    assert "nothing was shown to beat it" in "\n".join(md.splitlines()[:8])


def test_markdown_keeps_comparisons_readable_and_markup_inert() -> None:
    assert text("p <0.001, a <b>bold</b> & &amp; R&D") == "p <0.001, a &lt;b&gt;bold&lt;/b&gt; & &amp;amp; R&amp;D"


def test_the_plotted_incumbent_is_the_mean_of_its_boots_not_the_best_boot(history_template: HistoryBuilder,
                                                                           tmp_path: Path) -> None:
    report = build_report(copy_history(history_template, tmp_path).run_dir)
    worth = incumbent_worth(report.boots)
    baseline = [b.throughput for b in report.boots if b.phase == "baseline" and b.throughput is not None]
    assert worth[len(baseline) - 1][1] == sum(baseline) / len(baseline)
    winner = [b.throughput for b in report.boots if b.phase == "confirmation" and b.arm == "candidate"
              and b.throughput is not None]
    assert worth[-1] == (max(b.number for b in report.boots if b.phase == "confirmation" and b.arm == "candidate"),
                         sum(winner) / len(winner))


def test_best_holds_no_flags_under_another_candidates_verdict(history_template: HistoryBuilder,
                                                              tmp_path: Path) -> None:
    """Issue 31, case 1: a rerun rewound ``study.json`` (incumbent back to the baseline) while an earlier run's
    confirmation of the winner stayed in ``decisions/``; ``best/server-args.yaml`` then held the baseline's flags under
    "+11% … confirmed by the gate". The header and the flags come from one record: the incumbent."""
    import dataclasses

    from elsa_history_factory import STUDY

    from elsa_tune.history.decision import DecisionRecord
    from elsa_tune.history.study_record import StudyStatus

    h = copy_history(history_template, tmp_path)
    study = h.store.read_study()
    assert study is not None
    h.store.record_decision(DecisionRecord(study=STUDY, number=99, phase=Phase.CONFIRMATION,
                                           technique="final vs baseline", incumbent_key=study.baseline.key(),
                                           candidate_key=WINNER.key(),
                                           verdict=verdict(Decision.KEEP, 1.11, 1.06, 1.16, 6)))
    h.store.write_study(dataclasses.replace(study, incumbent=study.baseline, status=StudyStatus.INTERRUPTED))
    best = write_outputs(h.run_dir, with_plots=False).best
    assert best is not None
    header = (best / "server-args.yaml").read_text()
    assert f"# Label: {study.baseline.label} (candidate key {study.baseline.key()})" in header
    assert "confirmed by the gate" not in header and "+11%" not in header, header
    assert "Deploy the winner" not in (h.run_dir / "report.md").read_text()


def test_a_zero_sigma_boot_is_reported_as_not_resolvable_not_as_no_restart_noise(history_template: HistoryBuilder,
                                                                                 tmp_path: Path) -> None:
    """Four boots whose pass-to-pass noise hides the boot level estimate σ_boot at 0 (seen on a real H100 night whose
    independent check then read a 7% spread between fresh boots): the report says the estimate did not resolve it."""
    import dataclasses

    from elsa_tune.reports.model import sigma_boot_text

    h = copy_history(history_template, tmp_path)
    study = h.store.read_study()
    assert study is not None and study.noise is not None
    noise = dataclasses.replace(study.noise, sigma_boot=0.0, sigma_run=0.093, boots=4)
    assert sigma_boot_text(noise) == "0.0% (not resolvable above σ_run from 4 boots: restarts may still vary)"
    assert sigma_boot_text(study.noise) == f"{study.noise.sigma_boot * 100:.1f}%"
    h.store.write_study(dataclasses.replace(study, noise=noise))
    md = write_outputs(h.run_dir, with_plots=False).markdown.read_text()
    assert "σ_boot (restart to restart): 0.0% (not resolvable above σ_run from 4 boots" in md


def test_a_winner_kept_by_an_ab_against_the_baseline_itself_is_headed_with_that_ab(history_template: HistoryBuilder,
                                                                                 tmp_path: Path) -> None:
    """A winner no confirmation A/B followed (a search move or a retest decided in the confirmation's time) whose own
    keep was an A/B against the baseline is headed with that A/B's interval, not as an undecided winner."""
    import json

    from elsa_tune.history.decision import DecisionRecord

    h = copy_history(history_template, tmp_path)
    for path in (h.run_dir / "decisions").glob("*.json"):
        if json.loads(path.read_text()).get("phase") == "confirmation":
            path.unlink()
    assert build_report(h.run_dir).decision().action.startswith("Not decided yet")
    h.store.record_decision(DecisionRecord(
        study="s", number=60, phase=Phase.SEARCH, technique="search trial 4", flags_delta=dict(WINNER.flags),
        verdict=verdict(Decision.KEEP, 1.18, 1.13, 1.22, 4), incumbent_key=BASELINE.key(), candidate_key=WINNER.key()))
    decision = build_report(h.run_dir).decision()
    assert decision.action.startswith("Deploy the winner with care: an A/B against the baseline kept it")
    assert decision.effect == ("output tok/s +18% [+13%, +22%] over 8 boots against the baseline (the A/B that kept "
                               "it, decision 60)")
    assert decision.deploy and decision.holds == "the winner (winner)"


def test_a_search_trial_decided_under_its_trial_words_is_not_listed_as_undecided(history_template: HistoryBuilder,
                                                                                  tmp_path: Path) -> None:
    """A search trial's A/B boots carry its label ("trial-4") and its decision the words "search trial 4": the
    decision judged those boots' candidate, so no "no decision" row is added for them; a trial no decision judged
    still gets one."""
    from elsa_tune.history.decision import DecisionRecord

    h = copy_history(history_template, tmp_path)
    moved = BASELINE.merged(flags={"max-running-requests": 12}, label="trial-4")
    other = BASELINE.merged(flags={"max-running-requests": 16}, label="trial-5")
    for candidate in (moved, other):
        for arm, booted in ((Arm.CANDIDATE, candidate), (Arm.INCUMBENT, BASELINE)):   # its A/B's two arms
            h.boot(booted, Phase.SEARCH, arm, BootOutcome.MEASURED, values=[150.0, 151.0, 152.0],
                   technique=candidate.label)
    h.store.record_decision(DecisionRecord(
        study="s", number=61, phase=Phase.SEARCH, technique="search trial 4", flags_delta={"max-running-requests": 12},
        verdict=verdict(Decision.REJECT, 0.98, 0.9, 1.05, 4), incumbent_key=BASELINE.key(),
        candidate_key=moved.key()))
    rows = {r.tried: r for r in build_report(h.run_dir).keep_reject}
    assert "trial-4" not in rows and rows["search trial 4"].kept is not None
    assert rows["trial-5"].kept is None and rows["trial-5"].result.startswith("no decision")
