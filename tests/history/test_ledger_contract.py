"""The ledger's contract, run against every backend: the JSONL file, the SQL table on SQLite, and on PostgreSQL.

Each backend is opened twice on the same store (two studies, or two workers of one study): what one handle
appends the other reads, in append order; an entry is recorded once however often a resumed study records it;
the latest verdict of a technique wins; an unreadable entry is reported, never fatal.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.history.ledger import Evidence, JsonlLedger, Ledger, LedgerBackend, LedgerEntry
from elsa_tune.history.pg_ledger import PostgresLedger, ledger_for
from elsa_tune.history.verdict import Decision, Verdict


@dataclass(frozen=True)
class Store:
    """One ledger store: ``open`` gives a new handle on it, ``corrupt`` writes one entry that does not parse."""

    open: Callable[[], LedgerBackend]
    corrupt: Callable[[], None]


def _jsonl(tmp_path: Path) -> Store:
    path = tmp_path / "ledger.jsonl"

    def corrupt() -> None:
        with path.open("a") as handle:
            handle.write('{"technique": 1}\n')

    return Store(lambda: JsonlLedger(path), corrupt)


def _sql(url: str) -> Store:
    def corrupt() -> None:
        backend = PostgresLedger(url)
        with backend.engine.begin() as conn:
            conn.execute(backend.table.insert().values(entry_key="bad", technique="x", ledger_key="y", study="s",
                                                       decision="reject", appended_at=0.0, entry='{"technique": 1}'))
        backend.close()

    return Store(lambda: PostgresLedger(url), corrupt)


@pytest.fixture(params=["jsonl", "sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "jsonl":
        return _jsonl(tmp_path)
    if request.param == "sqlite":
        return _sql(f"sqlite:///{tmp_path / 'study.db'}")
    return _sql(str(request.getfixturevalue("postgres_url")))


def _fingerprint(gpu: str = "RTX 5090") -> Fingerprint:
    return Fingerprint(runtime="sglang-sim", runtime_version="0.5.23", model_path="tiny", gpu_name=gpu, driver="1")


def _entry(technique: str, *, gpu: str = "RTX 5090", decision: int = 1, verdict: Decision = Decision.REJECT,
           effect: float | None = 0.8, study: str = "shared") -> LedgerEntry:
    fp = _fingerprint(gpu)
    v = Verdict(decision=verdict, reason=f"{technique}: -20% at short prompts", effect=effect, ci_low=0.7,
                ci_high=0.9, p_value=0.01, boots_incumbent=4, boots_candidate=4)
    return LedgerEntry(technique=technique, fingerprint=fp, decision=verdict, reason=v.reason,
                       evidence=Evidence(study=study, trials=(3,), boot_ids=(f"000{decision}-x",), decision=decision),
                       date="2026-11-29T15:00:00+00:00", retest_when=fp.retest_condition(),
                       flags_delta={"enable-mixed-chunk": True}, effect=effect, ci_low=0.7, ci_high=0.9, boots=8,
                       verdict=v)


def test_an_empty_store_has_no_entries_and_no_problems(store: Store) -> None:
    ledger = Ledger(store.open())
    assert ledger.entries(strict=True) == [] and ledger.problems() == []
    assert ledger.rejected_for(_fingerprint()) == {}


def test_entries_round_trip_in_append_order_and_a_second_handle_reads_them(store: Store) -> None:
    ledger = Ledger(store.open())
    hicache, mixed = _entry("hierarchical-cache", decision=1), _entry("mixed-chunk", decision=2)
    assert ledger.append_once(hicache) and ledger.append_once(mixed)
    assert not ledger.append_once(hicache)            # a resumed study recording the same decision again
    assert [e.to_dict() for e in ledger.entries(strict=True)] == [hicache.to_dict(), mixed.to_dict()]
    assert [e.key() for e in Ledger(store.open()).entries(strict=True)] == [hicache.key(), mixed.key()]


def test_the_latest_verdict_wins_and_another_fingerprint_reopens(store: Store) -> None:
    ledger = Ledger(store.open())
    for entry in (_entry("hierarchical-cache", decision=1), _entry("mixed-chunk", decision=2)):
        ledger.append_once(entry)
    fp = _fingerprint()
    assert set(ledger.rejected_for(fp)) == {"hierarchical-cache", "mixed-chunk"}
    other_gpu = _fingerprint("RTX PRO 6000")
    assert ledger.rejected_for(other_gpu) == {}
    assert set(ledger.reopened_for(other_gpu)) == {"hierarchical-cache", "mixed-chunk"}
    Ledger(store.open()).append_once(_entry("mixed-chunk", decision=3, verdict=Decision.KEEP, effect=1.1))
    assert set(ledger.rejected_for(fp)) == {"hierarchical-cache"}
    assert ledger.latest_for(fp)["mixed-chunk"].decision is Decision.KEEP


def test_an_entry_that_does_not_parse_is_reported_not_fatal(store: Store) -> None:
    ledger = Ledger(store.open())
    ledger.append_once(_entry("mixed-chunk"))
    store.corrupt()
    ledger.append_once(_entry("hierarchical-cache", decision=2))
    assert [e.technique for e in ledger.entries()] == ["mixed-chunk", "hierarchical-cache"]
    problems = ledger.problems()
    assert len(problems) == 1 and "KeyError" in problems[0].error


def test_handles_appending_at_once_lose_nothing(store: Store) -> None:
    def append(worker: int) -> None:
        backend = store.open()
        for i in range(8):
            backend.append(_entry(f"t{worker}-{i}", decision=100 * worker + i, study=f"w{worker}"))

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(append, range(4)))              # an append that raised raises here
    entries = Ledger(store.open()).entries(strict=True)
    assert sorted(e.technique for e in entries) == sorted(f"t{w}-{i}" for w in range(4) for i in range(8))


def test_ledger_for_uses_the_database_only_for_a_database_server(tmp_path: Path) -> None:
    run_dir = tmp_path / "root" / "host-gpu0"
    local = ledger_for(run_dir, f"sqlite:///{tmp_path / 'study.db'}")
    assert isinstance(local.backend, JsonlLedger) and local.backend.path == tmp_path / "root" / "ledger.jsonl"
    assert isinstance(ledger_for(run_dir, None).backend, JsonlLedger)
