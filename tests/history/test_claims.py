"""Work claims on SQLite (what the GPUs of one host share): fast, real databases."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from elsa_tune.history.claims import ClaimState, WorkClaims, setup_lock
from elsa_tune.history.pg_ledger import PostgresLedger
from elsa_tune.history.store import StudyStore


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'study.db'}"


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
