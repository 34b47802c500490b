"""``elsa-tune compare``: two flag files through the study's gate on the virtual runtime (seconds of CPU), the verdict's
exit status, the interval, and a record of every boot in the run folder. Every number here is simulated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from elsa_tune import exit_codes
from elsa_tune.history.records import Phase
from elsa_tune.history.run_dir import RunDir
from elsa_tune.history.verdict import Decision, Futility, Verdict
from elsa_tune.tuner.cli import main
from elsa_tune.tuner.flow.flag_comparison import Outcome, outcome_of

REPO = Path(__file__).resolve().parents[2]
TINY_SPACE = str(REPO / "benchmarks" / "workers" / "tiny-space.yaml")
A = (REPO / "tests" / "e2e" / "data" / "tiny-flags.yaml").read_text()
#: a larger static fraction: +17% throughput on the tiny profile's noiseless truth
FASTER = A.replace("mem-fraction-static: 0.6", "mem-fraction-static: 0.7")
#: a Mamba-hybrid model crashes in the hierarchical cache's pool (``HybridLinearKVPool`` has no ``layer_num``)
CRASHES = A + "enable-hierarchical-cache: true\n"


def compare(tmp_path: Path, capsys: pytest.CaptureFixture[str], a: str, b: str, *extra: str,
            out: str = "run") -> tuple[int, dict[str, object]]:
    (tmp_path / "a.yaml").write_text(a)
    (tmp_path / "b.yaml").write_text(b)
    code = main(["compare", "--a", str(tmp_path / "a.yaml"), "--b", str(tmp_path / "b.yaml"), "--gpu", "sim",
                 "--virtual", "--sim-profile", "tiny-test", "--space", TINY_SPACE, "--out", str(tmp_path / out),
                 "--json", "-q", *extra])
    return code, json.loads(capsys.readouterr().out)


def test_a_clearly_better_b_exits_0_with_its_interval_above_1(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, result = compare(tmp_path, capsys, A, FASTER)
    assert code == exit_codes.OK and result["outcome"] == "better" and result["gate_decision"] == "keep"
    assert isinstance(result["ci_low"], float) and isinstance(result["ci_high"], float)
    assert 1.0 < result["ci_low"] < result["effect"] < result["ci_high"]   # type: ignore[operator]
    assert result["simulated"] is True
    # every boot is recorded in the run folder, as a study records it, and the result beside them
    history = RunDir(tmp_path / "run").load()
    assert len(history.boots) == result["boots"] and all(b.phase is Phase.COMPARE for b in history.boots)
    assert all(b.log_path and (tmp_path / "run" / b.log_path).is_file() for b in history.boots)
    assert json.loads((tmp_path / "run" / "compare.json").read_text())["outcome"] == "better"
    (decision,) = history.decisions
    assert decision.verdict is not None and decision.verdict.decision is Decision.KEEP
    assert dict(decision.flags_delta) == {"mem-fraction-static": 0.7}
    assert "host" not in history.boots[0].candidate.flags                 # elsa-tune owns the address

    # rerunning the same comparison in the same folder reuses every recorded boot and reaches the same verdict
    again, repeat = compare(tmp_path, capsys, A, FASTER)
    assert again == code and repeat["effect"] == result["effect"]
    assert len(RunDir(tmp_path / "run").load().boots) == len(history.boots)
    # the folder is a comparison's, not a study's: `elsa-tune report` says so instead of recommending a "baseline"
    assert main(["report", str(tmp_path / "run")]) == exit_codes.USAGE
    assert "holds a comparison" in capsys.readouterr().err and not (tmp_path / "run" / "best").exists()
    # another comparison in that folder is refused before it boots anything
    (tmp_path / "c.yaml").write_text(CRASHES)
    assert main(["compare", "--a", str(tmp_path / "a.yaml"), "--b", str(tmp_path / "c.yaml"), "--gpu", "sim",
                 "--virtual", "--sim-profile", "tiny-test", "--space", TINY_SPACE,
                 "--out", str(tmp_path / "run")]) == exit_codes.USAGE
    assert "holds another comparison" in capsys.readouterr().err
    assert len(RunDir(tmp_path / "run").load().boots) == len(history.boots)


def test_identical_flags_are_not_better(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, result = compare(tmp_path, capsys, A, A.replace("# today's", "# a copy of today's"))
    assert result["outcome"] in ("no difference shown", "equivalent") and result["gate_decision"] != "keep"
    assert code in (exit_codes.NO_DIFFERENCE, exit_codes.EQUIVALENT) and code == result["exit_code"]
    assert result["ci_low"] < 1.0 < result["ci_high"]                        # type: ignore[operator]


def test_a_crashing_b_has_its_own_exit_status_and_reason(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, result = compare(tmp_path, capsys, A, CRASHES)
    assert code == exit_codes.CANDIDATE and result["outcome"] == "B failed"
    assert "technique_crash" in str(result["reason"]) and "layer_num" in str(result["reason"])
    assert result["failure"] and result["ci_low"] is None           # no A/B ran: no interval is made up
    history = RunDir(tmp_path / "run").load()
    assert len(history.boots) == 4 + 1                              # A's noise boots and B's one probed boot


def test_a_b_whose_latency_guardrail_fails_is_worse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, result = compare(tmp_path, capsys, FASTER, A)
    assert code == exit_codes.WORSE and result["outcome"] == "worse"
    assert "guardrail ttft_p" in str(result["reason"])


def test_the_console_summary_names_the_verdict_and_says_it_is_simulated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.yaml").write_text(A)
    (tmp_path / "b.yaml").write_text(CRASHES)
    code = main(["compare", "--a", str(tmp_path / "a.yaml"), "--b", str(tmp_path / "b.yaml"), "--gpu", "sim",
                 "--virtual", "--sim-profile", "tiny-test", "--space", TINY_SPACE, "--out", str(tmp_path / "run"),
                 "-q"])
    out = capsys.readouterr().out
    assert code == exit_codes.CANDIDATE
    assert "verdict: B failed: technique_crash" in out and "SIMULATED" in out and "5 boots recorded in" in out


def test_a_budget_spent_before_the_gate_decides_is_no_difference_shown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a virtual boot of the tiny card takes about 2 simulated minutes: 20 minutes end the A/B before its first look
    code, result = compare(tmp_path, capsys, A, FASTER, "--budget", "20m")
    assert code == exit_codes.NO_DIFFERENCE and result["outcome"] == "no difference shown"
    assert "budget of 20 minutes was spent" in str(result["reason"]) and result["ci_low"] is None
    (decision,) = RunDir(tmp_path / "run").load().decisions
    assert decision.verdict is None and len(decision.boots_candidate) == 1   # B's probed boot (the A/B's are in boots/)


def _verdict(decision: Decision, low: float, high: float, **facts: Any) -> Verdict:
    return Verdict(decision=decision, reason="r", effect=(low * high) ** 0.5, ci_low=low, ci_high=high, p_value=0.5,
                   boots_incumbent=12, boots_candidate=12, **facts)


@pytest.mark.parametrize(("verdict", "outcome"), [
    (_verdict(Decision.KEEP, 1.04, 1.20), Outcome.BETTER),
    (_verdict(Decision.REJECT, 0.85, 0.97, futility=Futility.CI), Outcome.WORSE),
    (_verdict(Decision.INCONCLUSIVE, 0.90, 0.99), Outcome.WORSE),
    (_verdict(Decision.REJECT, 0.98, 1.02, futility=Futility.CI), Outcome.EQUIVALENT),
    (_verdict(Decision.INCONCLUSIVE, 0.99, 1.025), Outcome.EQUIVALENT),
    (_verdict(Decision.INCONCLUSIVE, 0.95, 1.10), Outcome.NO_DIFFERENCE),
    (_verdict(Decision.REJECT, 0.96, 1.02, futility=Futility.CI), Outcome.NO_DIFFERENCE),  # the low end beyond −3%
    (_verdict(Decision.REJECT, 1.01, 1.30, failed_guardrail="ttft_p99"), Outcome.WORSE),
    (_verdict(Decision.REJECT, 1.01, 1.30, quality_failed=True), Outcome.B_FAILED),
])
def test_the_outcome_the_gates_verdict_shows(verdict: Verdict, outcome: Outcome) -> None:
    assert outcome_of(verdict, min_effect=0.03)[0] is outcome
