"""Generated scenarios through the virtual-time study: the recommendation, the reasons and the keeps against truth.

A handful of small generated scenarios (fixed indices, a 16-request decode-heavy trace, spaces of at most 60
configurations, a one-hour simulated budget, so the file takes seconds of CPU) are run through
``run_virtual_study`` and scored by ``benchmarks/scenarios`` exactly as the benchmark scores them. The thresholds
are the issue's targets loosened for a short budget and three studies; a change to the study's rules that breaks
generalisation (a kept crash, a kept quality regression, a recommendation far from the best, reasons filed under
the wrong category) fails here.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from oracle import Oracle
from scenario import Scenario, generate
from score import Score, score_study
from shapes import write_shape

from elsa_tune.history.decision import Kept
from elsa_tune.history.records import Phase
from elsa_tune.history.run_dir import RunDir
from elsa_tune.history.study_record import ConfirmationStatus
from elsa_tune.history.verdict import Futility
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.search_spaces.loader import load_space
from elsa_tune.search_spaces.space import ReasonCategory
from elsa_tune.tuner.flow.virtual import run_virtual_study

INDICES = (9, 3, 5)
BUDGET_S = 3600.0
#: small spaces so the exhaustive truth takes a second or two
ORACLE_LIMIT = 60

_PLANTED = {"crash-boot": ReasonCategory.CRASH, "hang": ReasonCategory.HANG,
            "wrong-answers": ReasonCategory.WRONG_ANSWERS, "ignored": ReasonCategory.IGNORED,
            "clamped": ReasonCategory.IGNORED, "oom-outside-pool": ReasonCategory.OOM}


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> list[Scenario]:
    root = tmp_path_factory.mktemp("scenarios")
    traffic = write_shape("decode-heavy", root / "traffic.parquet", seed=0, requests=16)
    return [generate(i, root, traffic=traffic, oracle_limit=ORACLE_LIMIT, budget_s=BUDGET_S) for i in INDICES]


@pytest.fixture(scope="module")
def oracles(scenarios: list[Scenario]) -> list[Oracle]:
    return [Oracle(s.profile, s.space, s.traffic, budget_s=BUDGET_S) for s in scenarios]


@pytest.fixture(scope="module")
def studies(scenarios: list[Scenario], oracles: list[Oracle], tmp_path_factory: pytest.TempPathFactory
            ) -> list[tuple[Scenario, Score]]:
    out = []
    for s, oracle in zip(scenarios, oracles, strict=True):
        best, _, how = oracle.best()
        assert how == "exhaustive"
        result = run_virtual_study(profile=s.profile, space=s.space, traffic=s.traffic, budget_s=BUDGET_S, seed=0,
                                   out=tmp_path_factory.mktemp(s.name) / "study")
        out.append((s, score_study(oracle, result.recommended, result.decisions, best)))
    return out


def test_a_scenario_is_files_a_user_could_have_written(scenarios: list[Scenario], oracles: list[Oracle],
                                                       tmp_path: Path) -> None:
    for s, oracle in zip(scenarios, oracles, strict=True):
        profile, space = load_profile(s.profile), load_space(str(s.space))
        assert 16 <= profile.card.memory_gb <= 192 and 150 <= profile.card.default_power_w <= 1000
        assert 3 <= len(space.parameters) <= 8 and 3 <= len(space.techniques) <= 7
        base = oracle.truth(space.baseline())
        assert oracle.feasible(base), f"{s.name}: the baseline must boot, serve and hold the context target"
    again = generate(INDICES[0], tmp_path, traffic=scenarios[0].traffic, oracle_limit=ORACLE_LIMIT,
                     budget_s=BUDGET_S)
    assert again.profile.read_text() == scenarios[0].profile.read_text()          # an index is always the same draw
    assert again.space.read_text() == scenarios[0].space.read_text()


def test_expected_categories_come_from_the_truth_of_each_technique(scenarios: list[Scenario],
                                                                  oracles: list[Oracle]) -> None:
    checked = 0
    for s, oracle in zip(scenarios, oracles, strict=True):
        base = oracle.space.baseline()
        for technique, outcome in s.planted.items():
            with_it = oracle.space.candidate(oracle.space.baseline_values(), [technique])
            truth = oracle.technique_truth(technique, base, with_it)
            if outcome in _PLANTED:
                assert truth.expected[0] is _PLANTED[outcome], (s.name, technique, truth)
                assert not truth.true_effect_positive(oracle.space.technique(technique).kind)
                checked += 1
    assert checked >= 2, "the handful must hold failures whose category the truth fixes"


def test_a_cuda_graph_capture_that_ran_out_of_memory_is_expected_as_an_oom() -> None:
    """The truth's crash lines are the failure's evidence, as a boot's log is the study's: SGLang's "Capture cuda
    graph failed: CUDA out of memory" files under oom (the 35B profile's speculative-adaptive, seed 000's note)."""
    oracle = Oracle("rtx5090-qwen3.6-35b-a3b-nvfp4", "qwen3.6-35b-a3b-nvfp4-rtx5090", "demo", budget_s=BUDGET_S)
    with_it = oracle.space.candidate(oracle.space.baseline_values(), ["speculative-adaptive"])
    truth = oracle.technique_truth("speculative-adaptive", oracle.space.baseline(), with_it)
    assert truth.crashed and truth.expected == (ReasonCategory.OOM,)


def test_the_study_recommends_near_the_best_and_keeps_nothing_harmful(studies: list[tuple[Scenario, Score]]) -> None:
    shares = [score.share for _, score in studies]
    assert all(0.0 < share <= 1.0 + 1e-9 for share in shares), shares        # feasible, never above the exhaustive best
    assert statistics.median(shares) >= 0.90, shares
    assert sum(score.damage_keeps for _, score in studies) == 0
    harmful = sum(score.harmful_total for _, score in studies)
    assert sum(score.false_keeps for _, score in studies) <= max(1, harmful // 10)


def test_the_recorded_reasons_are_the_truths(studies: list[tuple[Scenario, Score]]) -> None:
    judged = [j for _, score in studies for j in score.judged]
    assert judged, "the studies decided no technique"
    wrong = [f"{j.technique}: {j.category} vs {[c.value for c in j.truth.expected]}" for j in judged if not j.right]
    assert len(wrong) <= len(judged) // 5, wrong


def test_a_comparison_continued_in_the_next_phase_spends_each_boot_once(tmp_path: Path) -> None:
    """An A/B the screening allowance cut is finished in the search phase from its recorded boots: the clock and the
    boot count take every boot once (a slow generated case whose screening cannot finish its A/Bs)."""
    s = generate(34, tmp_path)
    result = run_virtual_study(profile=s.profile, space=s.space, traffic=s.traffic, budget_s=8 * 3600, seed=0,
                               out=tmp_path / "study")
    history = RunDir(result.run_dir).load()
    assert result.boots == len(history.boots)
    assert sum(b.seconds for b in history.boots) == pytest.approx(result.sim_seconds, rel=0.02)
    assert sum(p.boots for p in history.study.phases) == len(history.boots)   # the phase table adds up


def test_a_technique_that_lacked_memory_is_screened_with_the_memory_technique_that_frees_it(tmp_path: Path) -> None:
    """A generated "unlock pair": a speed technique that drops the context below the target alone, and a memory
    technique (no speed change, a larger pool) that is not kept on its own. The speed technique is screened again
    as one change together with the memory technique, even when the screening phase ends during that pair's A/B
    (it waits on the night and is finished where screening continues), and the pair is what is recommended."""
    s = generate(33, tmp_path)
    result = run_virtual_study(profile=s.profile, space=s.space, traffic=s.traffic, budget_s=8 * 3600, seed=1,
                               out=tmp_path / "study")
    space = load_space(s.space)
    room = next(t for t in space.techniques if t.name.endswith("unlock-pair-room"))
    speed = next(t for t in space.techniques if t.name == room.name.removesuffix("-room"))
    alone, *pairs = [d for d in result.decisions if d.technique == speed.name]
    assert alone.category is ReasonCategory.CONTEXT_DROP
    assert pairs and all(pair.env_delta.get(k) == v for pair in pairs for k, v in room.env.items())   # one change
    assert pairs[-1].category is ReasonCategory.KEPT          # at its first test or its retest
    assert result.recommended.key() == space.candidate(space.baseline_values(), [room.name, speed.name]).key()


def test_a_memory_technique_in_the_winner_through_its_pair_is_filed_kept_for_memory(tmp_path: Path) -> None:
    """The generated unlock pair: the memory technique is not kept on its own (no gain shown), the speed technique
    screened together with it is; the recommendation holds both, so the memory technique's last decision, the one
    its ledger entry and the scores read, is "kept for memory", names the pair's keep and says what the pool bought."""
    s = generate(33, tmp_path)
    result = run_virtual_study(profile=s.profile, space=s.space, traffic=s.traffic, budget_s=8 * 3600, seed=1,
                               out=tmp_path / "study")
    space = load_space(s.space)
    room = next(t for t in space.techniques if t.name.endswith("unlock-pair-room"))
    speed = room.name.removesuffix("-room")
    assert result.recommended.key() == space.candidate(space.baseline_values(), [room.name, speed]).key()
    *earlier, last = [d for d in result.decisions if d.technique == room.name]
    assert earlier and all(d.kept is not Kept.YES for d in earlier)          # never kept on its own
    assert earlier[-1].category is ReasonCategory.NO_GAIN
    assert last.kept is Kept.YES and last.category is ReasonCategory.KEPT_FOR_MEMORY
    assert last.verdict is not None and last.verdict.kv_pool_candidate and last.verdict.kv_pool_incumbent
    assert last.verdict.kv_pool_candidate > last.verdict.kv_pool_incumbent
    assert f"kept with {speed} as one change" in last.result and "tokens (×" in last.result
    entries = [e for e in RunDir(result.run_dir).load().decisions if e.technique == room.name]
    assert entries[-1].category is ReasonCategory.KEPT_FOR_MEMORY              # what the study's records say


def test_a_slow_model_in_a_short_night_decides_its_most_promising_technique_on_its_screening_boot(
        tmp_path: Path) -> None:
    """A generated slow model (boots of minutes, 15 in two hours): after the screening boots no A/B can reach its
    cap before the confirmation's share, so the technique whose screening boot is far above the incumbent's is
    decided by the one-boot test at the night's false-keep level (each such test spends a test of that control) and
    kept; a later one-boot test reads a screening boot on the incumbent as it now is."""
    s = generate(303, tmp_path)
    result = run_virtual_study(profile=s.profile, space=s.space, traffic=s.traffic, budget_s=2 * 3600, seed=20,
                               out=tmp_path / "study")
    short = [d for d in result.decisions if "no A/B fits in the night" in d.result]
    assert short and all(d.verdict is not None and d.verdict.adjusted_p_value is not None for d in short)
    decision = short[0]
    assert decision.verdict is not None
    assert decision.verdict.boots_candidate == 1 and decision.kept is Kept.YES
    assert decision.category is ReasonCategory.KEPT
    assert result.recommended.key() != load_space(s.space).baseline().key()


def test_the_search_sweeps_every_one_parameter_move_before_its_first_a_b_and_tests_the_fastest_first(
        tmp_path: Path) -> None:
    """A generated case whose one winning move is not the first one drawn: the search boots the incumbent's values
    and each one-parameter move once before any A/B, then A/Bs the move whose boot was fastest first (a boot is one
    noisy sample; an A/B on the first lucky one would spend the phase before the winner is booted)."""
    s = generate(69, tmp_path)
    result = run_virtual_study(profile=s.profile, space=s.space, traffic=s.traffic, budget_s=8 * 3600, seed=0,
                               out=tmp_path / "study")
    history = RunDir(result.run_dir).load()
    tags = [(b.tag or "") for b in history.boots if (b.tag or "").startswith("search:")]
    first_ab = next(i for i, t in enumerate(tags) if ":ab:" in t)
    swept = tags[:first_ab]
    space = load_space(s.space)
    moves = sum(len(p.neighbours(v)) for p in space.parameters for v in [space.baseline_values()[p.name]])
    assert len(swept) == 1 + moves and ":ab:" not in "".join(swept)
    speed = {str(b.tag): b.throughput_tok_s or 0.0 for b in history.boots}
    fastest = max(swept[1:], key=lambda t: speed[t])
    first = next(d for d in result.decisions if d.technique.startswith("search trial"))
    assert first.technique == f"search trial {fastest.removeprefix('search:')}"


def test_a_promising_technique_is_retested_at_the_start_of_the_search_when_its_first_look_fits(
        tmp_path: Path) -> None:
    """A slow generated case: the unlock pair left inconclusive with its interval above no change (+7.8% [+2%, +14%])
    is retested with fresh boots at the start of the search phase, before any search boot, although its cap would
    not fit there; it is kept and then confirmed against the baseline like any winner."""
    s = generate(67, tmp_path)
    result = run_virtual_study(profile=s.profile, space=s.space, traffic=s.traffic, budget_s=8 * 3600, seed=0,
                               out=tmp_path / "study")
    assert not any(n.startswith("no time to retest") for n in result.notes)
    retest = next(d for d in result.decisions if "retest with fresh boots" in d.result)
    history = RunDir(result.run_dir).load()
    retest_boots = set(retest.boots_candidate + retest.boots_incumbent)
    order = [b.boot_id for b in history.boots]
    first_search = min(i for i, b in enumerate(history.boots) if b.phase is Phase.SEARCH
                       and b.boot_id not in retest_boots)
    assert max(order.index(b) for b in retest_boots) < first_search
    assert retest.kept is Kept.YES and result.recommended.key() != load_space(s.space).baseline().key()
    study = RunDir(result.run_dir).read_study()
    assert study is not None and study.confirmation is not None
    assert study.confirmation.status is ConfirmationStatus.CONFIRMED


@pytest.mark.xfail(strict=True, reason="generated case 76 no longer tells this story: every probed boot now also "
                   "runs the concurrent long-context probe (~30 simulated s), and the confirmation has too little time "
                   "left for the longer retest (its looks stay at 6); the story needs a generated case re-pinned")
def test_a_night_with_nothing_to_confirm_spends_its_end_on_the_tests_it_left_open(tmp_path: Path) -> None:
    """A generated case whose best technique (truth ×1.115, step-drift noise) is stopped at its first look to save
    boots on an interval that says nothing ([−49%, +86%]), and nothing beats the baseline: the confirmation's time
    continues that same test to its cap (read back, not booted again), then retests it, still inconclusive, with a
    longer test combined with the first; it is kept and recommended."""
    s = generate(76, tmp_path)
    result = run_virtual_study(profile=s.profile, space=s.space, traffic=s.traffic, budget_s=8 * 3600, seed=0,
                               out=tmp_path / "study")
    mine = [d for d in result.decisions if d.technique == "t3-speed-gain"]
    assert [d.kept for d in mine] == [Kept.NO, Kept.INCONCLUSIVE, Kept.YES]
    stopped, continued, longer = mine
    assert stopped.verdict is not None and stopped.verdict.futility is Futility.BOOT_SAVING
    assert continued.result.startswith("continued to its cap (an early look had stopped it to save boots")
    assert set(stopped.boots_incumbent) <= set(continued.boots_incumbent)
    assert longer.result.startswith("retest with fresh boots") and longer.ab_result is not None
    assert longer.ab_result["policy"]["looks"][-1] > continued.ab_result["policy"]["looks"][-1]  # type: ignore[index]
    assert result.recommended.key() == longer.candidate_key
