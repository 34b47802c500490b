"""Claims and the ledger on a real PostgreSQL server, raced by several processes starting on a fresh database."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from elsa_tune.history.claims import WorkClaims
from elsa_tune.history.ledger import Ledger
from elsa_tune.history.pg_ledger import PostgresLedger, ledger_for

pytestmark = pytest.mark.slow

# One racer: waits for the start file, then creates the tables, appends 12 ledger entries and claims 20 items.
RACER = r"""
import json, sys, time
from pathlib import Path
from elsa_tune.history.claims import ClaimState, WorkClaims, setup_lock
from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.history.ledger import Evidence, LedgerEntry
from elsa_tune.history.pg_ledger import PostgresLedger
from elsa_tune.history.verdict import Decision
from elsa_tune.history.store import StudyStore

url, name, start, out = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
while not start.exists():
    time.sleep(0.01)
with setup_lock(url):
    StudyStore(out.parent / name, storage_url=url, name="race@" + name, heartbeat_interval=1, grace_period=5)
ledger = PostgresLedger(url)
claims = WorkClaims(url, "race", name, grace_s=60)
fp = Fingerprint(runtime="sglang-sim", runtime_version="0.5.23", model_path="tiny", gpu_name="RTX 5090")
added = 0
won = []
for i in range(20):
    if i < 12:
        entry = LedgerEntry(technique=f"t{i}", fingerprint=fp, decision=Decision.REJECT, reason="crashes",
                            evidence=Evidence(study="race", decision=i, boot_ids=(f"b{i}",)), date="2026-11-29",
                            retest_when="never")
        added += ledger.append_new(entry)
    if claims.claim("search", f"cand-{i}").state is ClaimState.CLAIMED:
        won.append(i)
out.write_text(json.dumps({"added": added, "won": won}))
"""


def test_racing_processes_on_a_fresh_database_never_duplicate_an_entry_or_a_claim(postgres_url: str,
                                                                                  tmp_path: Path) -> None:
    start = tmp_path / "go"
    racers = []
    for i in range(5):
        out = tmp_path / f"racer{i}.json"
        racers.append((subprocess.Popen([sys.executable, "-c", RACER, postgres_url, f"r{i}", str(start), str(out)],
                                        stderr=subprocess.PIPE), out))
    start.touch()
    for proc, _ in racers:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-3000:]
    results = [json.loads(out.read_text()) for _, out in racers]
    assert sum(r["added"] for r in results) == 12                 # each entry appended by exactly one racer
    won = sorted(i for r in results for i in r["won"])
    assert won == list(range(20))                                 # each item claimed by exactly one racer
    ledger = Ledger(PostgresLedger(postgres_url))
    entries = ledger.entries(strict=True)
    assert sorted(e.technique for e in entries) == sorted(f"t{i}" for i in range(12))
    assert len(WorkClaims(postgres_url, "race", "check").items("search")) == 20
    chosen = ledger_for(tmp_path / "root" / "host-gpu0", postgres_url)
    assert isinstance(chosen.backend, PostgresLedger) and len(chosen.entries()) == 12
