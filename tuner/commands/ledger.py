"""``elsa-tune ledger [PATH]``: the techniques measured and rejected, a "do not retry" table.

PATH is a run folder (its ledger is in the parent folder), a folder holding ``ledger.jsonl``, or the file
itself; the default is ``./elsa-runs``. Shows the latest verdict per technique and setup; ``--all`` shows
every entry (kept ones too), ``--json`` prints JSON lines for scripts.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from elsa_tune.errors import ConfigError
from elsa_tune.history.ledger import Ledger, LedgerEntry
from elsa_tune.history.reasons import interval, pct

NAME = "ledger"
HELP = "show the ledger of techniques measured and rejected (shared by the studies of a folder)"
EXAMPLES = ('elsa-tune ledger elsa-runs/demo',
            'elsa-tune ledger elsa-runs/ledger.jsonl --technique hicache --all --json')
DEFAULT_PATH = Path("elsa-runs")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT_PATH, metavar="RUN_DIR_OR_LEDGER",
                        help="a run folder, a folder holding ledger.jsonl, or the file (default: ./elsa-runs)")
    parser.add_argument("--json", action="store_true", help="print the entries as JSON lines")
    parser.add_argument("--technique", metavar="NAME", help="only techniques whose name contains NAME")
    parser.add_argument("--fingerprint", metavar="KEY",
                        help="only entries of this setup (a ledger key or setup key, or a prefix of one)")
    parser.add_argument("--all", action="store_true", help="every entry, kept ones too, not only the latest rejections")
    parser.set_defaults(func=run)


def select(entries: Sequence[LedgerEntry], *, technique: str | None = None, fingerprint: str | None = None,
           everything: bool = False) -> list[LedgerEntry]:
    """Filter entries; without ``everything`` keep the latest entry per (setup, technique) if it is a rejection."""
    chosen = [e for e in entries
              if (technique is None or technique.lower() in e.technique.lower())
              and (fingerprint is None or e.fingerprint.ledger_key().startswith(fingerprint)
                   or e.fingerprint.key().startswith(fingerprint))]
    if everything:
        return chosen
    latest: dict[tuple[str, str], LedgerEntry] = {}
    for e in chosen:
        latest[(e.fingerprint.ledger_key(), e.technique)] = e
    return [e for e in latest.values() if e.rejected]


def run(args: argparse.Namespace) -> int:
    if not args.path.exists():
        raise ConfigError(f"{args.path}: no such ledger, run folder or study folder",
                          remedy="pass the folder studies were written to (default ./elsa-runs) or a ledger.jsonl")
    ledger = Ledger.at(args.path)
    reader = logging.getLogger("elsa_tune.history.ledger")
    level = reader.level
    reader.setLevel(logging.ERROR)   # its corrupt-line warnings are said once, below, by this command
    try:
        read = ledger.entries()
    finally:
        reader.setLevel(level)
    entries = select(read, technique=args.technique, fingerprint=args.fingerprint, everything=args.all)
    for bad in ledger.problems():
        print(f"elsa-tune: warning: skipped corrupt ledger line {bad.describe(ledger.backend.source)}",
              file=sys.stderr)
    if args.json:
        for e in entries:
            print(json.dumps(e.to_dict(), ensure_ascii=False, sort_keys=True))
        return 0
    if not entries:
        print(f"no {'entries' if args.all else 'rejected techniques'} in {ledger.backend.source}")
        return 0
    rows = [_row(e) for e in entries]
    headers = ["technique", "why", "verdict", "effect", "date", "setup", "retest"]
    if sys.stdout.isatty():
        _rich_table(headers, rows, title=f"Measured and rejected — {ledger.backend.source}")
    else:
        print(f"# measured and rejected — {ledger.backend.source}")
        for row in rows:
            print("  ".join([row[0], "—", row[1]]))
            print(f"    {row[2]}, {row[3]}, {row[4]}, setup {row[5]}; {row[6]}")
    return 0


def _row(e: LedgerEntry) -> list[str]:
    effect = "n/a" if e.effect is None else f"{pct(e.effect)} {interval(e.ci_low, e.ci_high)}"
    return [e.technique, e.reason, e.decision.value, effect, e.date[:10],
            f"{e.fingerprint.runtime} {e.fingerprint.runtime_version or '?'} · {e.fingerprint.gpu_name or '?'} "
            f"({e.fingerprint.ledger_key()})", e.retest_when]


def _rich_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=True)
    for h in headers:
        table.add_column(h, overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console().print(table, markup=False)
