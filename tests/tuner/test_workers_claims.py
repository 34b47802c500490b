"""Work claims and the database ledger on SQLite (what the GPUs of one host share): fast, real databases."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from elsa_tune.errors import ConfigError
from elsa_tune.history.claims import ClaimState, WorkClaims, setup_lock
from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.history.ledger import Evidence, JsonlLedger, Ledger, LedgerEntry
from elsa_tune.history.pg_ledger import PostgresLedger, ledger_for
from elsa_tune.history.store import StudyStore
from elsa_tune.history.verdict import Decision, Verdict
from elsa_tune.tuner.worker_pool import parse_gpus


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'study.db'}"


def _entry(technique: str, *, gpu: str = "RTX 5090", decision: int = 1, verdict: Decision = Decision.REJECT,
           effect: float | None = 0.8) -> LedgerEntry:
    fp = Fingerprint(runtime="sglang-sim", runtime_version="0.5.23", model_path="tiny", gpu_name=gpu, driver="1")
    v = Verdict(decision=verdict, reason=f"{technique}: -20% at short prompts", effect=effect, ci_low=0.7,
                ci_high=0.9, p_value=0.01, boots_incumbent=4, boots_candidate=4)
    return LedgerEntry(technique=technique, fingerprint=fp, decision=verdict, reason=v.reason,
                       evidence=Evidence(study="shared", trials=(3,), boot_ids=(f"000{decision}-x",),
                                         decision=decision),
                       date="2026-11-29T15:00:00+00:00", retest_when=fp.retest_condition(),
                       flags_delta={"enable-mixed-chunk": True}, effect=effect, ci_low=0.7, ci_high=0.9, boots=8,
                       verdict=v)


def test_a_claimed_item_is_busy_for_others_and_done_items_hand_out_their_result(tmp_path: Path) -> None:
    a = WorkClaims(_url(tmp_path), "s", "worker-a", grace_s=30)
    b = WorkClaims(_url(tmp_path), "s", "worker-b", grace_s=30)
    first = a.claim("search", "cand-1", gpu="GPU-0")
    assert first.state is ClaimState.CLAIMED and first.attempts == 1
    busy = b.claim("search", "cand-1")
    assert busy.state is ClaimState.BUSY and busy.owner == "worker-a"
    assert b.claim("search", "cand-2").state is ClaimState.CLAIMED      # another item, another owner
    assert b.claim("baseline", "cand-1").state is ClaimState.CLAIMED    # same candidate, another phase
    assert a.finish(first, {"values": [123.0], "boot_ids": ["0004-trial-0"]})
    done = b.claim("search", "cand-1")
    assert done.state is ClaimState.DONE and done.result == {"values": [123.0], "boot_ids": ["0004-trial-0"]}
    other_study = WorkClaims(_url(tmp_path), "another-study", "worker-b")
    assert other_study.claim("search", "cand-1").state is ClaimState.CLAIMED
    assert [(i.phase, i.item, i.state) for i in a.items("search")] == [("search", "cand-1", "done"),
                                                                        ("search", "cand-2", "running")]


def test_a_silent_holder_loses_its_item_and_cannot_finish_it_afterwards(tmp_path: Path) -> None:
    dead = WorkClaims(_url(tmp_path), "s", "dead", grace_s=0.6, beat_s=0.2)
    alive = WorkClaims(_url(tmp_path), "s", "alive", grace_s=0.6, beat_s=0.2)
    held = dead.claim("search", "k")
    assert alive.claim("search", "k").state is ClaimState.BUSY
    time.sleep(0.8)                                  # no beat: as if the holder had been SIGKILLed
    taken = alive.claim("search", "k")
    assert taken.state is ClaimState.CLAIMED and taken.took_over == "dead" and taken.attempts == 2
    assert not dead.beat(held) and not dead.finish(held, {"values": [1.0]})
    assert alive.finish(taken, {"values": [2.0]})
    assert alive.claim("search", "k").result == {"values": [2.0]}


def test_holding_beats_so_a_long_item_stays_owned_and_an_error_releases_it(tmp_path: Path) -> None:
    owner = WorkClaims(_url(tmp_path), "s", "owner", grace_s=0.6, beat_s=0.1)
    other = WorkClaims(_url(tmp_path), "s", "other", grace_s=0.6, beat_s=0.1)
    claim = owner.claim("ab", "cand>inc")
    with owner.holding(claim):
        time.sleep(1.2)                               # twice the grace period, beating all along
        assert other.claim("ab", "cand>inc").state is ClaimState.BUSY
    assert owner.finish(claim, {"decision": "yes"})
    failing = owner.claim("ab", "second")
    with pytest.raises(RuntimeError), owner.holding(failing):
        raise RuntimeError("the boot's host went away")
    retry = other.claim("ab", "second")                # released at once: no wait for the grace period
    assert retry.state is ClaimState.CLAIMED and retry.took_over == "owner"


def test_racing_workers_claim_each_item_exactly_once(tmp_path: Path) -> None:
    url = _url(tmp_path)
    WorkClaims(url, "s", "setup")                    # the table exists before the race
    won: dict[str, list[str]] = {}
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def work(name: str) -> None:
        claims = WorkClaims(url, "s", name, grace_s=60)
        barrier.wait(timeout=30)
        for i in range(15):
            if claims.claim("search", f"cand-{i}").state is ClaimState.CLAIMED:
                with lock:
                    won.setdefault(f"cand-{i}", []).append(name)
        claims.close()

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(won) == sorted(f"cand-{i}" for i in range(15))
    assert all(len(owners) == 1 for owners in won.values()), won


def test_compare_and_set_changes_the_incumbent_only_from_the_value_compared_against(tmp_path: Path) -> None:
    a = WorkClaims(_url(tmp_path), "s", "a")
    b = WorkClaims(_url(tmp_path), "s", "b")
    assert a.get("incumbent") == (None, None)
    assert a.compare_and_set("incumbent", None, "base", {"values": {"x": 1}})
    assert not b.compare_and_set("incumbent", None, "base", {"values": {"x": 1}})   # set once
    assert b.compare_and_set("incumbent", "base", "t3", {"values": {"x": 3}})
    assert not a.compare_and_set("incumbent", "base", "t5", {"values": {"x": 5}})   # a compared with a stale one
    assert a.get("incumbent") == ("t3", {"values": {"x": 3}})
    assert a.items() == []                           # shared values are not work items


def test_database_ledger_round_trips_entries_and_keeps_one_row_per_decision(tmp_path: Path) -> None:
    backend = PostgresLedger(_url(tmp_path))
    ledger = Ledger(backend)
    hicache, mixed = _entry("hierarchical-cache", decision=1), _entry("mixed-chunk", decision=2)
    assert backend.append_new(hicache) and backend.append_new(mixed)
    assert not backend.append_new(hicache)           # a resumed worker recording the same decision again
    ledger.append(hicache)
    assert backend.count() == 2
    assert [e.to_dict() for e in ledger.entries(strict=True)] == [hicache.to_dict(), mixed.to_dict()]
    assert set(ledger.rejected_for(hicache.fingerprint)) == {"hierarchical-cache", "mixed-chunk"}
    other_gpu = _entry("mixed-chunk", gpu="RTX PRO 6000").fingerprint
    assert ledger.rejected_for(other_gpu) == {} and set(ledger.reopened_for(other_gpu)) == {"hierarchical-cache",
                                                                                             "mixed-chunk"}
    kept = _entry("mixed-chunk", decision=3, verdict=Decision.KEEP, effect=1.1)
    assert backend.append_new(kept)
    assert set(ledger.rejected_for(hicache.fingerprint)) == {"hierarchical-cache"}   # the latest verdict wins
    # A second handle on the same database (another worker) sees the same ledger.
    assert [e.key() for e in Ledger(PostgresLedger(_url(tmp_path))).entries()] == [hicache.key(), mixed.key(),
                                                                                    kept.key()]


def test_a_row_that_no_longer_parses_is_reported_not_fatal(tmp_path: Path) -> None:
    backend = PostgresLedger(_url(tmp_path))
    backend.append_new(_entry("mixed-chunk"))
    with backend.engine.begin() as conn:
        conn.execute(backend.table.insert().values(entry_key="bad", technique="x", ledger_key="y", study="s",
                                                   decision="reject", appended_at=0.0, entry='{"technique": 1}'))
    contents = backend.read()
    assert [e.technique for e in contents.entries] == ["mixed-chunk"]
    assert len(contents.corrupt) == 1 and "KeyError" in contents.corrupt[0].error


def test_ledger_for_uses_the_database_only_for_a_database_server(tmp_path: Path) -> None:
    run_dir = tmp_path / "root" / "host-gpu0"
    local = ledger_for(run_dir, f"sqlite:///{tmp_path / 'study.db'}")
    assert isinstance(local.backend, JsonlLedger) and local.backend.path == tmp_path / "root" / "ledger.jsonl"
    assert isinstance(ledger_for(run_dir, None).backend, JsonlLedger)


def test_gpu_lists_name_each_card_once() -> None:
    assert parse_gpus("0, 1,3") == ["0", "1", "3"]
    with pytest.raises(ConfigError):
        parse_gpus("0,0")
    with pytest.raises(ConfigError):
        parse_gpus(" , ")


def test_workers_opening_a_fresh_sqlite_study_at_once_all_succeed(tmp_path: Path) -> None:
    url = _url(tmp_path)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def open_all(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            with setup_lock(url):
                StudyStore(tmp_path / f"gpu{i}", storage_url=url, name=f"s@gpu{i}", heartbeat_interval=1,
                           grace_period=5)
                WorkClaims(url, "s", f"w{i}").close()
                PostgresLedger(url).close()
        except BaseException as exc:  # collected and asserted below: a thread cannot fail the test itself
            errors.append(exc)

    threads = [threading.Thread(target=open_all, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert (tmp_path / "study.db.setup-lock").exists()
