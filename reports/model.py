"""``Report``: everything a person reviews in the morning, computed from history alone.

``build_report(run_dir)`` reads the run folder (``RunDir``) and the shared ledger and never measures,
never talks to a runtime: a report is a pure function of history, so ``elsa-tune report RUN_DIR``
re-renders it at any time, also for a study that was killed. Renderers (``markdown.py``, ``html.py``,
``plots.py``, ``deploy.py``) take a ``Report`` and format it; none of them reads files.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from elsa_tune.history.decision import DecisionRecord, Kept
from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.history.ledger import Ledger, LedgerEntry
from elsa_tune.history.reasons import effect_text, pct, reason_from_failure
from elsa_tune.history.records import Arm, BootOutcome, BootRecord, Phase, TrialRecord
from elsa_tune.history.run_dir import History, RunDir
from elsa_tune.history.study_record import NoiseRecord, StudyRecord
from elsa_tune.history.verdict import Verdict
from elsa_tune.reports import units
from elsa_tune.runtime.family import of_runtime_name
from elsa_tune.search_spaces.candidate import Candidate

KEPT_WORDS = {Kept.YES: "Yes", Kept.NO: "No", Kept.INCONCLUSIVE: "No (inconclusive)", Kept.SKIPPED: "Skipped"}
NO_DECISION = "No decision"
SIMULATED_RUNTIME = "sglang-sim"
#: How each boot outcome reads in the boot count (every outcome is counted, so the parts add up to the total).
OUTCOME_WORDS = {BootOutcome.MEASURED: "measured", BootOutcome.READY: "booted but not measured",
                 BootOutcome.PROBE_FAILED: "failed a stress probe or the quality gate",
                 BootOutcome.BOOT_FAILED: "failed to boot", BootOutcome.DIED: "died or hung after booting",
                 BootOutcome.INTERRUPTED: "interrupted"}


@dataclass(frozen=True)
class BootRow:
    boot_id: str
    number: int
    phase: str
    arm: str
    label: str
    technique: str | None
    outcome: BootOutcome
    throughput: float | None
    min_free_bytes: int | None
    kv_tokens: int | None
    slots: int | None
    started_at: float
    seconds: float
    failure: str = ""
    key: str = ""               # the candidate's key: which configuration this boot measured


@dataclass(frozen=True)
class AbRow:
    number: int
    phase: str
    technique: str
    delta: str
    verdict: Verdict
    kept: Kept
    result: str


@dataclass(frozen=True)
class KeepRejectRow:
    """One row of the "Tried / Result / Kept?" table; ``kept`` is ``None`` for a technique that was booted but
    never reached a decision (``result`` says why)."""

    tried: str
    delta: str
    result: str
    kept: Kept | None

    @property
    def kept_word(self) -> str:
        return NO_DECISION if self.kept is None else KEPT_WORDS[self.kept]

    @property
    def kept_value(self) -> str:
        return "undecided" if self.kept is None else self.kept.value


@dataclass(frozen=True)
class Decision:
    """What the operator should do, first in every report: ``action`` is one sentence, ``effect`` the gate's
    estimate with its interval (or why there is none), ``files`` the deploy files with what each is for."""

    action: str
    effect: str
    holds: str                   # the configuration best/ holds: "the winner (label)", "the baseline"
    deploy: bool                 # the files in best/ hold a configuration better than the baseline
    files: tuple[tuple[str, str], ...]
    changes: tuple[str, ...]
    simulated: bool


@dataclass(frozen=True)
class AdjustmentSeen:
    flag: str
    requested: str
    effective: str
    evidence: str
    boots: tuple[str, ...]


@dataclass(frozen=True)
class ArmSummary:
    """Per-boot throughputs of one configuration: mean and spread over boots, never over passes."""

    candidate: Candidate
    boot_ids: tuple[str, ...]
    throughputs: tuple[float, ...]

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.throughputs) if self.throughputs else None

    @property
    def stdev(self) -> float | None:
        return statistics.stdev(self.throughputs) if len(self.throughputs) >= 2 else None


@dataclass(frozen=True)
class ClientNumbers:
    """What clients must be told, from the winner's boots (the smallest seen when boots differ).

    ``declared_context_length`` is what ``--context-length`` asked for; ``max_request_tokens`` is what
    really fits: ``min(context_len, max_total_num_tokens)`` (``--context-length``
    reserves nothing). ``None`` means not measured.
    """

    max_total_num_tokens: int | None
    max_running_requests: int | None
    context_len: int | None
    declared_context_length: int | None
    declared_max_running_requests: int | None
    boot_ids: tuple[str, ...]

    @property
    def max_request_tokens(self) -> int | None:
        known = [v for v in (self.context_len, self.max_total_num_tokens) if v is not None]
        return min(known) if known else None


@dataclass(frozen=True)
class Report:
    run_dir: Path
    study_name: str
    status: str
    fingerprint: Fingerprint | None
    study: StudyRecord | None
    noise: NoiseRecord | None
    boots: tuple[BootRow, ...]
    incomplete_boots: tuple[str, ...]
    ab_rows: tuple[AbRow, ...]
    keep_reject: tuple[KeepRejectRow, ...]
    adjustments: tuple[AdjustmentSeen, ...]
    baseline: ArmSummary | None
    winner: ArmSummary | None
    confirmation: DecisionRecord | None
    client: ClientNumbers | None
    ledger: tuple[LedgerEntry, ...]
    ledger_problems: tuple[str, ...]
    failures: tuple[tuple[str, str, tuple[str, ...]], ...]   # boot id, reason, evidence lines
    trials: tuple[TrialRecord, ...]
    warnings: tuple[str, ...]
    generated_from: str
    #: A study that searched on several GPUs (``tune --gpu 0,1``): trial number → the GPU that measured it.
    trial_gpus: Mapping[int, str] = field(default_factory=dict)
    #: The A/B that kept the winner against the baseline itself (a retest or a search move decided in the
    #: confirmation's time), when no confirmation A/B followed it.
    kept_against_baseline: DecisionRecord | None = None

    @property
    def winner_ratio(self) -> float | None:
        if self.baseline is None or self.winner is None or not self.baseline.mean or self.winner.mean is None:
            return None
        return self.winner.mean / self.baseline.mean

    def winner_changes(self) -> list[str]:
        """The winner's differences from the baseline: ``--page-size 16 → 32``, ``+ --enable-x``, ``env A=1``."""
        if self.baseline is None or self.winner is None:
            return []
        return candidate_changes(self.baseline.candidate, self.winner.candidate)

    @property
    def simulated(self) -> bool:
        """Whether the study measured elsa-tune's simulated SGLang (its numbers are no hardware's)."""
        return self.fingerprint is not None and units.simulated(self.fingerprint.runtime)

    def boot_counts(self) -> list[tuple[str, int]]:
        """Boots per outcome, every outcome that occurred, so the parts add up to ``len(boots)``."""
        counts = {outcome: sum(1 for b in self.boots if b.outcome is outcome) for outcome in OUTCOME_WORDS}
        return [(OUTCOME_WORDS[o], n) for o, n in counts.items() if n]

    def boot_count_text(self) -> str:
        """"97 boots: 85 measured, 5 booted but not measured, 7 failed to boot" (+ folders never finished)."""
        parts = ", ".join(f"{n} {word}" for word, n in self.boot_counts())
        text = f"{len(self.boots)} boots" + (f": {parts}" if parts else "")
        if self.incomplete_boots:
            text += f"; and {len(self.incomplete_boots)} boot folder(s) the study was stopped during"
        return text

    def config_use(self) -> str:
        """How the measured runtime family takes ``best/server-args.yaml`` (its ``Deployment.config_use``)."""
        return of_runtime_name(self.fingerprint.runtime if self.fingerprint is not None else None
                               ).deployment.config_use

    def decision(self) -> Decision:
        """The decision the report leads with: deploy the confirmed winner, or keep the baseline, and why."""
        files = (("best/launch.sh", "run it on this host"),
                 ("best/docker-compose.yml", "or run it in a container: docker compose -f best/docker-compose.yml up"),
                 ("best/server-args.yaml", f"its flags as a file: {self.config_use()}"),
                 ("best/client.md", "the request limits clients must be told"))
        changes = tuple(self.winner_changes())
        confirmed = self.confirmation is not None and self.confirmation.verdict is not None
        if self.winner is None:
            rejected = self.confirmation is not None and self.confirmation.kept is Kept.NO
            action = ("Keep the baseline: the winner was rejected against it on fresh boots" if rejected else
                      "Keep the baseline: " + self._nothing_beat_it()
                      + ("" if self.status == "finished" else f" so far (the study is {self.status})"))
            effect = (f"the rejected winner: {self.confirmation.result}" if self.confirmation is not None and rejected
                      else "no change from the baseline")
            return Decision(action, effect, "the baseline", False, files, changes, self.simulated)
        holds = f"the winner ({self.winner.candidate.label})"
        if confirmed and self.confirmation is not None and self.confirmation.verdict is not None:
            effect = (f"output tok/s {effect_text(self.confirmation.verdict)} against the baseline "
                      "(the confirmation A/B on fresh boots of both, with the gate's interval)")
            if self.confirmation.kept is Kept.YES:
                return Decision("Deploy the winner: the gate confirmed it against the baseline", effect, holds,
                                True, files, changes, self.simulated)
            return Decision("The winner is unconfirmed: on fresh boots it showed no harm against the baseline, but "
                            "the gate did not demonstrate its gain; best/ holds it, and keeping the baseline is the "
                            "cautious choice", effect, holds, False, files, changes, self.simulated)
        kept = self.kept_against_baseline
        if kept is not None and kept.verdict is not None:
            return Decision("Deploy the winner with care: an A/B against the baseline kept it under the night's "
                            "false-keep control, but no time was left to confirm it on fresh boots",
                            f"output tok/s {effect_text(kept.verdict)} against the baseline (the A/B that kept it, "
                            f"decision {kept.number})", holds, True, files, changes, self.simulated)
        ratio = f"{pct(self.winner_ratio)} on per-boot means" if self.winner_ratio is not None else "not measured"
        return Decision("Not decided yet: the winner has not been confirmed against the baseline"
                        + (" (the study is still running)" if self.status == "running" else ""),
                        f"{ratio} (no confirmation A/B, so no interval)", holds, False, files, changes,
                        self.simulated)

    def open_techniques(self) -> tuple[list[str], list[str]]:
        """What the study left open: the techniques (and trials) whose last decision was inconclusive, and those it
        booted but never decided (their phase's time ran out), each in the order the report lists them."""
        last: dict[str, Kept | None] = {}
        for row in self.keep_reject:
            last[row.tried] = row.kept
        return ([name for name, kept in last.items() if kept is Kept.INCONCLUSIVE],
                [name for name, kept in last.items() if kept is None])

    def _nothing_beat_it(self) -> str:
        """Why the baseline stays, without claiming more than the study showed: "no technique or setting beat it"
        only when nothing was left open; otherwise how many tests ended inconclusive and how many ran out of time."""
        inconclusive, undecided = self.open_techniques()
        if not inconclusive and not undecided:
            return "no technique or setting beat it"
        parts = []
        if inconclusive:
            parts.append(f"{len(inconclusive)} test{_s(inconclusive)} ended inconclusive ({_names(inconclusive)})")
        if undecided:
            noun = "" if inconclusive else " test" + _s(undecided)
            parts.append(f"{len(undecided)}{noun} ran out of time before a decision ({_names(undecided)}; "
                         "a longer --budget tests them)")
        return "nothing was shown to beat it, but " + " and ".join(parts)

    def summary_line(self) -> str:
        """"winner +10.9% [+6%, +16%] over 6 boots vs baseline" or why there is none."""
        if self.confirmation is not None and self.confirmation.verdict is not None:
            word = {Kept.YES: "confirmed by the gate", Kept.NO: "rejected by the gate: keep the baseline"}.get(
                self.confirmation.kept, "not confirmed by the gate")
            return f"winner vs baseline: {effect_text(self.confirmation.verdict)} ({word})"
        if self.winner_ratio is not None:
            return f"winner vs baseline: {pct(self.winner_ratio)} on per-boot means (not confirmed by the gate)"
        return ("no winner: the baseline stays" if self.status == "finished"
                else "no winner yet: the baseline is the incumbent")


def build_report(run_dir: str | Path, *, ledger: Ledger | None = None) -> Report:
    """Read ``run_dir`` (and its ledger) and assemble the report. Raises ``HistoryError`` for unreadable records."""
    history = RunDir(run_dir).load()
    study = history.study
    ledger = ledger or Ledger.for_run_dir(history.run_dir)
    fingerprint = study.fingerprint if study else (history.boots[0].fingerprint if history.boots else None)
    warnings: list[str] = []
    keys = {b.fingerprint.key() for b in history.boots}
    if len(keys) > 1:
        warnings.append(f"boots were measured on {len(keys)} different setups (fingerprints {sorted(keys)}); "
                        "numbers across them are not comparable")
    baseline_c = study.baseline if study else _first_baseline(history)
    winner_c = study.incumbent if study else None
    baseline = _arm(history, baseline_c) if baseline_c else None
    winner = _arm(history, winner_c) if winner_c and baseline_c and winner_c.key() != baseline_c.key() else None
    confirmation = next((d for d in reversed(history.decisions) if d.phase is Phase.CONFIRMATION), None)
    if confirmation is not None and not _about_recommendation(confirmation, study):
        confirmation = None
    noise = (study.noise if study and study.noise else None) or derive_noise(
        [b for b in history.boots if b.phase is Phase.BASELINE])
    ledger_entries: tuple[LedgerEntry, ...] = ()
    problems: tuple[str, ...] = ()
    if fingerprint is not None:
        ledger_entries = tuple(ledger.latest_for(fingerprint).values())
        problems = tuple(bad.describe(ledger.backend.source) for bad in ledger.problems())
    if history.incomplete_boots:
        warnings.append(f"{len(history.incomplete_boots)} boot(s) never finished (the study was stopped during "
                        f"them): {', '.join(history.incomplete_boots)}")
    status = study.status.value if study else "unknown (no study.json: stopped before its first decision?)"
    fleet_trials, trial_gpus = worker_trials(history.run_dir)
    return Report(
        run_dir=history.run_dir, study_name=study.name if study else history.run_dir.name, status=status,
        fingerprint=fingerprint, study=study, noise=noise, boots=tuple(_boot_row(b) for b in history.boots),
        incomplete_boots=history.incomplete_boots,
        ab_rows=tuple(AbRow(d.number, d.phase.value, d.technique, d.delta_text(), d.verdict, d.kept, d.result)
                      for d in history.decisions if d.verdict is not None),
        keep_reject=(*(KeepRejectRow(d.technique, d.delta_text(), d.result, d.kept)
                       for d in history.decisions if d.phase is not Phase.CONFIRMATION),
                     *_undecided(history, status)),
        adjustments=_adjustments(history.boots), baseline=baseline, winner=winner, confirmation=confirmation,
        client=_client_numbers(history, winner_c or baseline_c), ledger=ledger_entries, ledger_problems=problems,
        failures=tuple((b.boot_id, _failure_text(b), b.failure.evidence if b.failure else ())
                       for b in history.boots if b.failure is not None),
        trials=tuple(sorted([*history.trials, *fleet_trials], key=lambda t: t.number)), trial_gpus=trial_gpus,
        warnings=tuple(warnings), generated_from=str(history.run_dir),
        kept_against_baseline=_kept_against_baseline(history, baseline_c, winner_c if winner is not None else None,
                                                     confirmation))


def _kept_against_baseline(history: History, baseline: Candidate | None, winner: Candidate | None,
                           confirmation: DecisionRecord | None) -> DecisionRecord | None:
    """The last A/B that kept ``winner`` against ``baseline`` itself, when no confirmation A/B judged the winner."""
    if baseline is None or winner is None or confirmation is not None:
        return None
    return next((d for d in reversed(history.decisions)
                 if d.kept is Kept.YES and d.verdict is not None and d.incumbent_key == baseline.key()
                 and d.candidate_key == winner.key()), None)


def _s(items: Sequence[object]) -> str:
    return "" if len(items) == 1 else "s"


def _names(names: Sequence[str], most: int = 4) -> str:
    """At most ``most`` names, then how many more."""
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _span(ids: Sequence[str]) -> str:
    return ids[0] if len(ids) == 1 else f"{ids[0]} … {ids[-1]}"


def _undecided(history: History, status: str) -> list[KeepRejectRow]:
    """Techniques the study booted that no decision names or judged (a search trial's A/B boots carry the trial's
    label, its decision the words "search trial N": the candidate tells them apart), each with the reason it has
    none."""
    decided = {d.technique for d in history.decisions}
    judged = {d.candidate_key for d in history.decisions if d.candidate_key}
    booted: dict[str, list[BootRecord]] = {}
    for b in history.boots:
        if b.technique and b.technique not in decided and b.phase is not Phase.CONFIRMATION:
            booted.setdefault(b.technique, []).append(b)
    rows = []
    for technique, boots in booted.items():
        if any(b.arm is Arm.CANDIDATE and b.candidate.key() in judged for b in boots):
            continue
        outcomes = ", ".join(f"{n} {OUTCOME_WORDS[o]}" for o in OUTCOME_WORDS
                             if (n := sum(1 for b in boots if b.outcome is o)))
        why = ("its A/B is still running" if status == "running"
               else "its phase's time ran out, or the study stopped, before its A/B reached a decision")
        own = sum(1 for b in boots if b.arm is Arm.CANDIDATE)
        rows.append(KeepRejectRow(technique, "", f"no decision: {why}; {len(boots)} boots in its A/B ({own} of it, "
                                  f"{len(boots) - own} of the incumbent; {_span([b.boot_id for b in boots])}: "
                                  f"{outcomes})", None))
    return rows


def sigma_boot_text(noise: NoiseRecord) -> str:
    """σ_boot as the report prints it: a 0% estimate says that the boot level did not show above the pass-to-pass
    noise of the boots it came from (the variance component went negative), not that restarts were seen not to vary."""
    text = units.frac(noise.sigma_boot)
    if noise.sigma_boot is not None and noise.sigma_boot <= 0.0 and noise.sigma_run:
        text += f" (not resolvable above σ_run from {noise.boots} boots: restarts may still vary)"
    return text


def candidate_changes(old: Candidate, new: Candidate) -> list[str]:
    """Flag and environment differences between two candidates, in a stable order."""
    changes: list[str] = []
    for name in sorted(set(old.flags) | set(new.flags)):
        before, after = old.flags.get(name), new.flags.get(name)
        if before == after:
            continue
        if before in (None, False):
            changes.append(f"+ --{name}" + ("" if after is True else f" {after}"))
        elif after in (None, False):
            changes.append(f"− --{name}" + ("" if before is True else f" {before}"))
        else:
            changes.append(f"--{name} {before} → {after}")
    for name in sorted(set(old.env) | set(new.env)):
        if old.env.get(name) != new.env.get(name):
            changes.append(f"env {name}: {old.env.get(name, '(unset)')} → {new.env.get(name, '(unset)')}")
    return changes


def derive_noise(boots: Sequence[BootRecord]) -> NoiseRecord | None:
    """Recompute the baseline's noise from its boots when the study did not record it.

    σ_boot: standard deviation of log per-boot means; σ_run: pooled within-boot standard deviation of log
    steady passes; warm-up bias: mean of first pass / steady mean − 1. ``None`` when nothing was measured.
    """
    per_boot = [(b.passes()[0], b.passes()[1:]) for b in boots if len(b.passes()) >= 2]
    per_boot = [(first, [v for v in steady if v > 0]) for first, steady in per_boot]
    per_boot = [(first, steady) for first, steady in per_boot if steady and first > 0]
    if not per_boot:
        return None
    means = [statistics.fmean(steady) for _, steady in per_boot]
    sigma_boot = statistics.stdev([math.log(m) for m in means]) if len(means) >= 2 else None
    within = [(len(s) - 1, statistics.variance([math.log(v) for v in s])) for _, s in per_boot if len(s) >= 2]
    dof = sum(n for n, _ in within)
    sigma_run = math.sqrt(sum(n * var for n, var in within) / dof) if dof else None
    warmup = statistics.fmean(first / statistics.fmean(steady) - 1 for first, steady in per_boot)
    passes = statistics.fmean(len(steady) + 1 for _, steady in per_boot)
    return NoiseRecord(sigma_boot=sigma_boot, sigma_run=sigma_run, warmup_bias=warmup, boots=len(per_boot),
                       passes_per_boot=passes, derived_from="boots")


def _about_recommendation(decision: DecisionRecord, study: StudyRecord | None) -> bool:
    """Whether a confirmation decision speaks for what ``best/`` holds: its candidate is the study's incumbent, or the
    incumbent is the baseline because the gate rejected that candidate. A confirmation of another candidate (an earlier
    run's, before the incumbent changed; a winner that then failed its soak) must not head another configuration's
    flags. A record that names no candidate (an older one) is taken as it is."""
    if study is None or not decision.candidate_key:
        return True
    incumbent = study.incumbent.key()
    if decision.candidate_key == incumbent:
        return True
    return incumbent == study.baseline.key() and decision.kept is Kept.NO


def _first_baseline(history: History) -> Candidate | None:
    return next((b.candidate for b in history.boots if b.phase is Phase.BASELINE), None)


def _arm(history: History, candidate: Candidate) -> ArmSummary:
    boots = [b for b in history.boots_of(candidate.key()) if b.outcome.feasible]
    measured = [(b.boot_id, t) for b in boots if (t := b.boot_throughput()) is not None]
    return ArmSummary(candidate, tuple(i for i, _ in measured), tuple(t for _, t in measured))


def _boot_row(b: BootRecord) -> BootRow:
    free = b.min_free_gpu_bytes
    probe_free = [p.min_free_bytes for p in b.probes if p.min_free_bytes is not None]
    if probe_free:
        free = min([*probe_free, *([free] if free is not None else [])])
    return BootRow(boot_id=b.boot_id, number=b.boot_number, phase=b.phase.value, arm=b.arm.value,
                   label=b.candidate.label, technique=b.technique, outcome=b.outcome,
                   throughput=b.boot_throughput() if b.outcome.feasible else None, min_free_bytes=free,
                   kv_tokens=b.report.max_total_num_tokens if b.report else None,
                   slots=b.report.max_running_requests if b.report else None, started_at=b.started_at,
                   seconds=b.seconds, failure=_failure_text(b) if b.failure else "", key=b.candidate.key())


def _failure_text(b: BootRecord) -> str:
    return str(reason_from_failure(b.failure)) if b.failure else ""


def _adjustments(boots: Sequence[BootRecord]) -> tuple[AdjustmentSeen, ...]:
    seen: dict[tuple[str, str, str], tuple[str, list[str]]] = {}
    for b in boots:
        for a in b.report.adjustments if b.report else ():
            key = (a.flag, repr(a.requested), repr(a.effective))
            seen.setdefault(key, (a.evidence or a.reason, []))[1].append(b.boot_id)
    return tuple(AdjustmentSeen(flag, _show(req), _show(eff), evidence, tuple(ids))
                 for (flag, req, eff), (evidence, ids) in seen.items())


def _show(text: str) -> str:
    return "ignored" if text == "None" else text.strip("'")


def _client_numbers(history: History, candidate: Candidate | None) -> ClientNumbers | None:
    if candidate is None:
        return None
    reports = [(b.boot_id, b.report) for b in history.boots_of(candidate.key())
               if b.report is not None and b.outcome.feasible]
    if not reports:
        return None

    def smallest(values: Sequence[int | None]) -> int | None:
        known = [v for v in values if v is not None]
        return min(known) if known else None

    declared_ctx = candidate.flags.get("context-length")
    declared_slots = candidate.flags.get("max-running-requests")
    return ClientNumbers(
        max_total_num_tokens=smallest([r.max_total_num_tokens for _, r in reports]),
        max_running_requests=smallest([r.max_running_requests for _, r in reports]),
        context_len=smallest([r.context_len for _, r in reports]),
        declared_context_length=int(declared_ctx) if isinstance(declared_ctx, (int, float, str))
        and str(declared_ctx).isdigit() else None,
        declared_max_running_requests=int(declared_slots) if isinstance(declared_slots, (int, float, str))
        and str(declared_slots).isdigit() else None,
        boot_ids=tuple(i for i, _ in reports))


def worker_trials(run_dir: Path) -> tuple[list[TrialRecord], dict[int, str]]:
    """The search trials of a study whose search ran on several GPUs: its workers' run folders sit inside its own
    (``<run_dir>/<host>-gpu<N>/``, each ``study.json`` naming the worker's GPU). Returns the trials (boot ids as
    ``folder/boot``) and, per trial number, the GPU whose boot measured it ("GPU 1", or "GPU 1 (trial 4's boot)"
    for a trial told the result of an identical candidate's boot)."""
    workers: list[tuple[str, str, History]] = []
    for folder in sorted(p for p in run_dir.iterdir() if p.is_dir() and (p / "study.json").is_file()):
        history = RunDir(folder).load()
        worker = history.study.worker if history.study else None
        if isinstance(worker, Mapping) and worker.get("gpu") is not None:
            workers.append((folder.name, str(worker["gpu"]), history))
    boots = {(name, b.boot_id): (gpu, b.trial_number) for name, gpu, h in workers for b in h.boots
             if b.phase is Phase.SEARCH}
    trials: dict[int, TrialRecord] = {}
    gpus: dict[int, str] = {}
    for name, gpu, history in workers:
        for t in history.trials:
            if t.number in trials:
                continue
            own = [b for b in t.boot_ids if boots.get((name, b), ("", None))[1] == t.number]
            measured = [(folder, b) for b in t.boot_ids for (folder, boot_id) in boots
                        if boot_id == b and folder != name] if not own else []
            if own:
                trials[t.number] = replace(t, boot_ids=tuple(f"{name}/{b}" for b in t.boot_ids))
                gpus[t.number] = f"GPU {gpu}"
            elif measured:
                other, boot = measured[0]
                other_gpu, other_trial = boots[(other, boot)]
                trials[t.number] = replace(t, boot_ids=tuple(f"{other}/{b}" for b in t.boot_ids))
                gpus[t.number] = f"GPU {other_gpu} (trial {other_trial}'s boot)"
            else:
                trials[t.number] = t
                gpus[t.number] = f"GPU {gpu} (no boot)" if not t.boot_ids else f"GPU {gpu}"
    return list(trials.values()), gpus
