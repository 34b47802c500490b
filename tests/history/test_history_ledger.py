from __future__ import annotations

import logging
import multiprocessing
from pathlib import Path

import pytest
from elsa_history_factory import HistoryBuilder, fingerprint

from elsa_tune.errors import HistoryError
from elsa_tune.history.decision import DecisionRecord
from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.history.ledger import Evidence, JsonlLedger, Ledger, LedgerBackend, LedgerEntry
from elsa_tune.history.records import Phase
from elsa_tune.history.verdict import Decision
from elsa_tune.runtime.failure import Failure, FailureKind

APPENDERS = 4
PER_APPENDER = 25


def _entry(technique: str, fp: Fingerprint, decision: Decision = Decision.REJECT) -> LedgerEntry:
    return LedgerEntry(technique=technique, fingerprint=fp, decision=decision, reason="−5% [−8%, −2%] over 8 boots",
                       evidence=Evidence(study="s", boot_ids=("0001-a",)), date="2026-11-29T01:00:00+00:00",
                       retest_when=fp.retest_condition(), flags_delta={"page-size": 64}, effect=0.95, ci_low=0.92,
                       ci_high=0.98, boots=8)


def test_study_ledger_sits_beside_the_run_dirs(history: HistoryBuilder) -> None:
    h = history
    ledger = Ledger.for_run_dir(h.run_dir)
    assert Path(ledger.backend.source) == h.run_dir.parent / "ledger.jsonl"
    assert isinstance(ledger.backend, LedgerBackend)
    entries = ledger.entries(strict=True)
    assert [e.technique for e in entries] == ["hicache", "mixed-chunk", "attention-backend triton",
                                              "fused-qk-norm-rope", "page-size 32"]
    hicache = entries[0]
    assert hicache.reason.startswith("crashes: AttributeError: 'HybridLinearKVPool' object has no attribute")
    assert hicache.evidence.boot_ids and hicache.evidence.log_excerpt
    assert hicache.retest_when.startswith("retest when sglang ≠ 0.5.23")
    triton = entries[2]
    assert triton.effect == 0.72 and triton.ci_low == 0.64 and triton.boots == 4
    # Ledger.at resolves a run dir, the parent folder and the file alike
    for where in (h.run_dir, h.run_dir.parent, h.run_dir.parent / "ledger.jsonl"):
        assert len(Ledger.at(where).entries()) == 5


def test_rejected_for_same_fingerprint_and_reopened_for_a_new_one(history: HistoryBuilder) -> None:
    h = history
    ledger = Ledger.for_run_dir(h.run_dir)
    rejected = ledger.rejected_for(h.fp)
    # fused-qk-norm-rope's test was inconclusive at +1.2% [−4%, +7%]: the next study tests it again
    assert set(rejected) == {"hicache", "mixed-chunk", "attention-backend triton"}
    assert ledger.latest_for(h.fp)["fused-qk-norm-rope"].unresolved
    assert ledger.skip_note(rejected["hicache"]).startswith("rejected 2026-")
    other_card = Fingerprint.from_dict({**h.fp.to_dict(), "gpu_uuid": "GPU-other", "power_limit_w": 575.0})
    assert set(ledger.rejected_for(other_card)) == set(rejected)
    new_driver = fingerprint(h.root / "models" / "qwen", driver="625.01")
    assert ledger.rejected_for(new_driver) == {}
    reopened = ledger.reopened_for(new_driver)
    assert set(reopened) == {*rejected, "fused-qk-norm-rope"}
    assert reopened["hicache"][1] == ["driver: 620.70 → 625.01"]
    # a later KEEP of the same technique on the same setup re-opens it
    ledger.append(_entry("hicache", h.fp, Decision.KEEP))
    assert "hicache" not in ledger.rejected_for(h.fp)


def test_skipped_decisions_are_not_ledger_material(tmp_path: Path) -> None:
    fp = fingerprint(tmp_path)
    skipped = DecisionRecord(study="s", number=1, phase=Phase.SCREENING, technique="x", skipped="rejected before")
    with pytest.raises(ValueError, match="skipped"):
        LedgerEntry.from_decision(skipped, fp)
    crash = DecisionRecord(study="s", number=2, phase=Phase.SCREENING, technique="ngram",
                           failure=Failure(FailureKind.OOM_UNDER_LOAD, "OOM", "lower", evidence=("CUDA OOM",)))
    entry = LedgerEntry.from_decision(crash, fp)
    assert entry.decision is Decision.REJECT and entry.effect is None and entry.evidence.log_excerpt == ("CUDA OOM",)


def _append_many(path: str, worker: int) -> None:
    fp = Fingerprint(runtime="sglang", runtime_version="0.5.23", gpu_name="RTX 5090", driver="620.70")
    ledger = Ledger(JsonlLedger(path))
    for i in range(PER_APPENDER):
        ledger.append(_entry(f"w{worker}-t{i}-" + "x" * 2000, fp))


def test_concurrent_appenders_never_interleave(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.jsonl")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, w)) for w in range(APPENDERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    ledger = Ledger(JsonlLedger(path))
    entries = ledger.entries(strict=True)
    assert len(entries) == APPENDERS * PER_APPENDER
    assert len({e.technique for e in entries}) == APPENDERS * PER_APPENDER
    for w in range(APPENDERS):  # each appender's entries keep their order
        mine = [int(e.technique.split("-")[1][1:]) for e in entries if e.technique.startswith(f"w{w}-")]
        assert mine == list(range(PER_APPENDER))


def test_corrupt_line_is_reported_with_its_number(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fp = fingerprint(tmp_path)
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(JsonlLedger(path))
    ledger.append(_entry("a", fp))
    with open(path, "a") as handle:
        handle.write('{"technique": "torn", "fingerpr')     # a writer killed mid-line, no newline
    ledger.append(_entry("b", fp))                          # must not glue onto the torn line
    with open(path, "a") as handle:
        handle.write("[1, 2]\n")
    with caplog.at_level(logging.WARNING):
        entries = ledger.entries()
    assert [e.technique for e in entries] == ["a", "b"]
    assert [bad.number for bad in ledger.problems()] == [2, 4]
    assert "ledger.jsonl:2:" in caplog.text and "ledger.jsonl:4:" in caplog.text
    with pytest.raises(HistoryError, match=r"ledger\.jsonl:2: JSONDecodeError") as caught:
        ledger.entries(strict=True)
    assert caught.value.remedy.startswith("fix or delete line 2 of ")


def test_a_resumed_study_records_each_decision_once(history: HistoryBuilder) -> None:
    ledger = history.store.ledger
    before = ledger.entries()
    decisions = history.store.load().decisions
    for decision in decisions:                         # the resumed study replays every decision
        ledger.record(decision, history.fp, run_dir=history.run_dir)
    after = ledger.entries()
    assert len(after) == len(before) + 1               # only the confirmation was not in the ledger yet
    assert after[-1].technique == "winner vs baseline" and after[-1].evidence.decision == decisions[-1].number
    for decision in decisions:
        ledger.record(decision, history.fp)
    assert len(ledger.entries()) == len(after)
    skipped = DecisionRecord(study="s", number=99, phase=Phase.SCREENING, technique="x", skipped="rejected before")
    assert ledger.record(skipped, history.fp) is None


def _unresolved(technique: str, fp: Fingerprint, study: str, *, decision: Decision = Decision.INCONCLUSIVE,
                ci_high: float = 1.07, futility: str | None = None) -> LedgerEntry:
    from elsa_tune.history.verdict import Futility, Verdict

    verdict = Verdict(decision=decision, reason="no demonstrated benefit", effect=1.01, ci_low=0.95, ci_high=ci_high,
                      p_value=0.4, boots_incumbent=4, boots_candidate=4,
                      futility=Futility(futility) if futility else None)
    return LedgerEntry(technique=technique, fingerprint=fp, decision=decision, reason="no demonstrated benefit",
                       evidence=Evidence(study=study, boot_ids=(f"0001-{study}",)), date="2026-11-29T01:00:00+00:00",
                       retest_when=fp.retest_condition(), effect=1.01, ci_low=0.95, ci_high=ci_high, boots=8,
                       verdict=verdict)


def test_a_test_that_did_not_decide_is_tested_again_until_two_studies_left_it_so(tmp_path: Path) -> None:
    """Inconclusive with an interval reaching a gain, or stopped by the boot-saving rule: the next study on the setup
    tests it again; a second study that leaves it so (however many entries each wrote) has it skipped."""
    fp = fingerprint(tmp_path)
    ledger = Ledger(JsonlLedger(tmp_path / "ledger.jsonl"))
    ledger.append(_unresolved("inconclusive", fp, "s1"))
    ledger.append(_unresolved("stopped-early", fp, "s1", decision=Decision.REJECT, ci_high=1.8,
                              futility="boot_saving"))
    ledger.append(_unresolved("shown-no-gain", fp, "s1", decision=Decision.REJECT, ci_high=1.02, futility="ci"))
    ledger.append(_unresolved("shown-slower", fp, "s1", ci_high=0.98))
    assert set(ledger.rejected_for(fp)) == {"shown-no-gain", "shown-slower"}
    ledger.append(_unresolved("inconclusive", fp, "s2"))            # a continued test in the same study counts once
    ledger.append(_unresolved("inconclusive", fp, "s2", ci_high=1.05))
    assert set(ledger.rejected_for(fp)) == {"shown-no-gain", "shown-slower", "inconclusive"}
    ledger.append(_entry("stopped-early", fp, Decision.KEEP))
    assert "stopped-early" not in ledger.rejected_for(fp)
