"""``elsa-tune leases``: lists leases with their owner's state; ``--reap`` stops the servers of dead owners."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from elsa_tune.runtime.lease import LeaseBook, Owner, ServerLease
from elsa_tune.runtime.process_group import ProcessGroup
from elsa_tune.tuner.cli import main


def test_leases_lists_and_reaps_only_the_dead_owners_servers(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=10)
    orphan, alive = (subprocess.Popen(["sleep", "120"], stdin=subprocess.DEVNULL, start_new_session=True)
                     for _ in range(2))
    try:
        book = LeaseBook()
        leases = [dataclasses.replace(ServerLease.for_server(server.pid, gpu_uuid="GPU-test", port=1,
                                                             run_dir=tmp_path, command=("sleep", "120")), owner=owner)
                  for server, owner in ((orphan, dataclasses.replace(Owner.me(), pid=gone.pid)),
                                        (alive, Owner.me()))]
        for lease in leases:
            book.write(lease)
        assert main(["leases"]) == 0
        listed = capsys.readouterr().out
        assert "2 lease(s)" in listed and "owner dead" in listed and "owner alive" in listed
        assert orphan.poll() is None and alive.poll() is None
        assert main(["leases", "--reap", "--stop-timeout", "5"]) == 0
        reaped = capsys.readouterr().out
        assert f"reaped {leases[0].name}: stopped {orphan.pid}" in reaped and "1 orphaned lease(s) reaped" in reaped
        assert orphan.wait(timeout=10) < 0 and alive.poll() is None
        assert book.leases() == [leases[1]]
    finally:
        for server in (orphan, alive):
            ProcessGroup(server.pid).stop(1.0, leader=server)
