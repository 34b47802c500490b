"""``elsa-tune leases [--reap]``: the servers elsa-tune started on this host, and whose owner is gone.

Every server a runtime starts is leased to the tuner or worker that started it (``runtime/lease.py``); the lease
is removed when the server is stopped. A lease left behind by a killed tuner names a server that may still hold
its GPU. Preflight stops those on its own GPU before a study; ``--reap`` stops them on every GPU now (SIGTERM,
SIGKILL after the timeout, then a wait for the GPU memory). A live owner's server is never touched.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from elsa_tune.tuner.argument_types import nonnegative_float

NAME = "leases"
HELP = "list the servers elsa-tune started on this host; --reap stops those whose tuner was killed"
EXAMPLES = ('elsa-tune leases',
            'elsa-tune leases --reap --json')


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reap", action="store_true",
                        help="stop the servers whose owner is dead (a killed tuner or worker), on every GPU")
    parser.add_argument("--dir", default=None, type=Path, metavar="DIR",
                        help="the lease folder (default $ELSA_LEASE_DIR, $XDG_RUNTIME_DIR/elsa-tune/leases or "
                             "~/.cache/elsa-tune/leases)")
    parser.add_argument("--stop-timeout", default=30.0, type=nonnegative_float, metavar="S",
                        help="seconds between SIGTERM and SIGKILL when reaping (default 30)")
    parser.add_argument("--json", action="store_true",
                        help="print the leases (and, with --reap, what was reaped) as one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from elsa_tune.errors import ConfigError
    from elsa_tune.runtime.lease import LeaseBook
    from elsa_tune.runtime.sim.card import SimulatedCards

    if args.dir is not None and not args.dir.is_dir():
        what = "is not a folder" if args.dir.exists() else "does not exist"
        raise ConfigError(f"the lease folder {args.dir} {what}",
                          remedy="give --dir the folder the tuner writes its leases to ($ELSA_LEASE_DIR), or leave "
                                 "it out for the default")
    if not args.stop_timeout >= 0 or args.stop_timeout == float("inf"):
        raise ConfigError(f"--stop-timeout {args.stop_timeout} is not a number of seconds",
                          remedy="give --stop-timeout a finite number of seconds ≥ 0, e.g. 30")
    book = LeaseBook(args.dir, stop_timeout_s=args.stop_timeout, cards=SimulatedCards())
    leases = book.leases()
    if args.json:
        listed = [{"name": lease.name, "server_pid": lease.server_pid, "gpu_uuid": lease.gpu_uuid, "port": lease.port,
                   "run_dir": lease.run_dir, "owner_pid": lease.owner.pid, "owner_host": lease.owner.host,
                   "owner_dead": lease.owner.is_dead(), "created_at": lease.created_at} for lease in leases]
        done = [{"name": r.name, "stopped": list(r.stopped), "killed": r.killed, "detail": r.detail}
                for r in (book.reap() if args.reap else [])]
        print(json.dumps({"directory": str(book.directory), "leases": listed, "reaped": done}, indent=2))
        return 0
    print(f"{len(leases)} lease(s) in {book.directory}")
    for lease in leases:
        owner = "owner dead" if lease.owner.is_dead() else (
            "owner alive" if lease.owner.on_this_host() else f"owner on {lease.owner.host}")
        print(f"  {lease.describe()} [{owner}]")
    if args.reap:
        reaped = book.reap()
        for r in reaped:
            print(f"reaped {r.name}: {'stopped ' + ', '.join(r.stopped) if r.stopped else 'nothing running'}"
                  f"{' (killed)' if r.killed else ''}; {r.detail}")
        print(f"{len(reaped)} orphaned lease(s) reaped")
    return 0
