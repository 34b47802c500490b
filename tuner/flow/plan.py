"""``StudyPlan``: what ``elsa-tune --dry-run`` shows — the study a command line would run, without booting.

``plan_study(pre)`` reads the preflight's findings (space, runtime flags, settings) and the ledger beside the run
folder, and returns the phases with their share of the budget and an estimate of their boots, every candidate the
study boots before its numeric search (the baseline and each screened technique on it) as a full command line with
the flags the runtime does not know, the techniques the ledger will skip and those never screened automatically.

Boot counts are estimates: a boot is taken to cost its passes (warm-up + measured, ``pass_s`` each) plus a
start-up (60 s on a real GPU, as a study assumes before its first boot; 3 s on the simulator), and an A/B ends
between its first and its last look (2 × blocks per arm). Nothing is booted and nothing is written.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elsa_tune.errors import ConfigError
from elsa_tune.history.ledger import Ledger
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.tuner.flow.budget import DEFAULT_SHARES, BudgetPhase
from elsa_tune.tuner.flow.preflight import Preflight

STARTUP_S = {True: 3.0, False: 60.0}     # simulated, real


@dataclass(frozen=True)
class PhasePlan:
    name: str
    budget_s: float
    boots_low: int
    boots_high: int


@dataclass(frozen=True)
class CandidatePlan:
    label: str
    technique: str | None
    argv: tuple[str, ...]
    unknown_flags: tuple[str, ...]      # flags the runtime's --help does not list (empty when it was not read)
    refused: str = ""                   # why the space's rules refuse the technique on the baseline

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True)
class StudyPlan:
    study: str
    run_dir: Path
    budget_s: float
    boot_s: float
    looks: tuple[int, ...]
    phases: tuple[PhasePlan, ...]
    candidates: tuple[CandidatePlan, ...]
    flags_checked: bool
    ledger_skips: tuple[tuple[str, str], ...]     # technique, the ledger's note
    not_screened: tuple[tuple[str, str], ...]     # technique, why
    problems: tuple[str, ...]

    @property
    def boots_low(self) -> int:
        return sum(p.boots_low for p in self.phases)

    @property
    def boots_high(self) -> int:
        return sum(p.boots_high for p in self.phases)

    @property
    def ok(self) -> bool:
        """No candidate carries a flag the runtime does not know."""
        return not any(c.unknown_flags for c in self.candidates)

    def to_dict(self) -> dict[str, Any]:
        return {"study": self.study, "run_dir": str(self.run_dir), "budget_s": self.budget_s, "boot_s": self.boot_s,
                "looks": list(self.looks), "boots": {"low": self.boots_low, "high": self.boots_high},
                "phases": [{"name": p.name, "budget_s": p.budget_s, "boots_low": p.boots_low,
                            "boots_high": p.boots_high} for p in self.phases],
                "candidates": [{"label": c.label, "technique": c.technique, "argv": list(c.argv),
                                "unknown_flags": list(c.unknown_flags), "refused": c.refused or None}
                               for c in self.candidates],
                "flags_checked": self.flags_checked, "ok": self.ok,
                "ledger_skips": [{"technique": t, "note": n} for t, n in self.ledger_skips],
                "not_screened": [{"technique": t, "why": w} for t, w in self.not_screened],
                "problems": list(self.problems)}

    def lines(self) -> list[str]:
        """The plan as a person reads it."""
        out = [f"plan of study {self.study} in {self.run_dir} (dry run: nothing booted, nothing written)",
               f"budget {_duration(self.budget_s)}; a boot ≈ {self.boot_s:.0f} s; the gate looks at "
               f"{', '.join(map(str, self.looks))} blocks per arm; about {self.boots_low}–{self.boots_high} boots",
               "", "phases:"]
        out += [f"  {p.name:<13} {_duration(p.budget_s):>8}  {p.boots_low}–{p.boots_high} boots" for p in self.phases]
        out += ["", "candidates booted before the numeric search"
                + ("" if self.flags_checked else " (flags not checked: the runtime's --help was not read)") + ":"]
        for c in self.candidates:
            verdict = (f"UNKNOWN FLAGS {', '.join('--' + f for f in c.unknown_flags)}" if c.unknown_flags
                       else f"refused on the baseline: {c.refused}" if c.refused else "ok")
            out += [f"  {c.label}: {verdict}", *([f"    {c.command}"] if c.argv else [])]
        if self.ledger_skips:
            out += ["", "skipped by the ledger:", *[f"  {t}: {n}" for t, n in self.ledger_skips]]
        if self.not_screened:
            out += ["", "not screened automatically:", *[f"  {t}: {w}" for t, w in self.not_screened]]
        if self.problems:
            out += ["", "preflight warnings:", *[f"  {p}" for p in self.problems]]
        return out


def plan_study(pre: Preflight) -> StudyPlan:
    """The plan of the study ``pre`` prepares (see the module docstring); boots nothing, writes nothing."""
    settings, space = pre.settings, pre.space
    boot_s = STARTUP_S[settings.simulated] + (settings.warmup_passes + settings.measured_passes) * settings.pass_s
    ledger = Ledger.for_run_dir(settings.run_dir)
    rejected = ledger.rejected_for(pre.fingerprint)
    skips = tuple((t.name, ledger.skip_note(rejected[t.name])) for t in space.techniques
                  if t.screen and t.name in rejected)
    not_screened = tuple((t.name, " ".join(t.rationale.split())) for t in space.techniques if not t.screen)
    screened = [t for t in space.techniques if t.screen and t.name not in rejected]
    looks = settings.looks or _looks(settings.budget_s, boot_s, len(screened))

    def boots(phase: BudgetPhase, low: int, high: int) -> PhasePlan:
        budget = DEFAULT_SHARES[phase] * settings.budget_s
        fit = max(0, int(budget // boot_s))
        return PhasePlan(phase.value, budget, min(low, fit), min(high, fit))

    ab_low, ab_high = 2 * looks[0], 2 * looks[-1]
    phases = (boots(BudgetPhase.BASELINE, settings.baseline_boots, settings.baseline_boots),
              boots(BudgetPhase.SCREENING, len(screened), ab_high * len(screened)),
              boots(BudgetPhase.SEARCH, int(DEFAULT_SHARES[BudgetPhase.SEARCH] * settings.budget_s // boot_s),
                    int(DEFAULT_SHARES[BudgetPhase.SEARCH] * settings.budget_s // boot_s)),
              boots(BudgetPhase.CONFIRMATION, ab_low, ab_high))
    baseline = space.baseline()
    candidates = [_checked(pre, baseline, None)]
    for t in screened:
        try:
            candidate = space.candidate(space.baseline_values(), [t.name], label=t.name)
        except ConfigError as exc:       # a rule refusing the technique on the baseline is part of the plan
            candidates.append(CandidatePlan(t.name, t.name, (), (), refused=str(exc)))
            continue
        candidates.append(_checked(pre, candidate, t.name))
    return StudyPlan(study=settings.study_name, run_dir=settings.run_dir, budget_s=settings.budget_s, boot_s=boot_s,
                     looks=tuple(looks), phases=phases, candidates=tuple(candidates),
                     flags_checked=pre.flags is not None, ledger_skips=skips, not_screened=not_screened,
                     problems=pre.problems)


def _checked(pre: Preflight, candidate: Candidate, technique: str | None) -> CandidatePlan:
    unknown = tuple(name for name in candidate.flags if pre.flags is not None and name not in pre.flags)
    return CandidatePlan(candidate.label or "baseline", technique, (*pre.launch, *candidate.argv()), unknown)


def _looks(budget_s: float, boot_s: float, techniques: int) -> tuple[int, ...]:
    """Blocks per arm at each look, sized as the study sizes them: the techniques' A/Bs fit the screening share."""
    per_technique = DEFAULT_SHARES[BudgetPhase.SCREENING] * budget_s / max(1, techniques) / boot_s
    cap = int(max(6, min(12, per_technique)))
    return tuple(sorted({max(2, round(cap / 3)), max(3, round(2 * cap / 3)), max(4, cap)}))


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60}h {minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m {int(seconds % 60):02d}s"
