"""Server leases: a SIGKILLed owner's server is found and stopped; a live owner's is left alone.

Real processes throughout: a child Python process boots a simulated server (tiny profile) and is SIGKILLed,
leaving the server in its own session; a ``sleep`` in its own session stands in for a server where only the
process group matters.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from elsa_tune.runtime.lease import ENV_LEASE_DIR, LeaseBook, Owner, ServerLease, lease_dir
from elsa_tune.runtime.process_group import ProcessGroup, start_time
from elsa_tune.runtime.sim.runtime import SIM_TIMEOUTS, SimulatedSGLang
from elsa_tune.search_spaces.candidate import Candidate

PROFILE = "tiny-test"
SLEEPER = ("sh", "-c", "sleep 120 & sleep 120; wait")

#: A tuner that boots one simulated server, says where it is, and waits to be killed.
_OWNER = textwrap.dedent("""
    import json, sys, time
    from dataclasses import replace
    from pathlib import Path
    from elsa_tune.runtime.sim.runtime import SIM_TIMEOUTS, SimulatedSGLang
    from elsa_tune.search_spaces.candidate import Candidate
    card, boot = Path(sys.argv[1]), Path(sys.argv[2])
    runtime = SimulatedSGLang("tiny-test", card_dir=card, speedup=50.0, timeouts=replace(SIM_TIMEOUTS, boot_s=60.0))
    server = runtime.start(Candidate(label="orphan"), boot)
    print(json.dumps({"pid": int(server.handle), "port": server.port, "uuid": runtime.gpu.uuid}), flush=True)
    time.sleep(600)
""")


def boot_and_kill_owner(card: Path, boot: Path) -> dict[str, int | str]:
    """Run ``_OWNER`` until its server is ready, then SIGKILL it; the server is left running."""
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(card), str(boot)], stdout=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, text=True)
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()   # bounded by the child's boot timeout (60 s)
        assert line, f"the owner exited with {owner.wait(timeout=10)} before its server was ready"
        found: dict[str, int | str] = json.loads(line)
    finally:
        owner.kill()
        owner.wait(timeout=10)
        if owner.stdout is not None:
            owner.stdout.close()
    found["owner"] = owner.pid
    return found


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A "server": a process group of two sleeps in their own session."""
    proc = subprocess.Popen(list(SLEEPER), stdin=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 10
    while len(ProcessGroup(proc.pid).members()) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield proc
    finally:
        ProcessGroup(proc.pid).signal(signal.SIGKILL)
        proc.wait(timeout=10)


def lease_of(proc: subprocess.Popen[bytes], tmp_path: Path, owner: Owner) -> ServerLease:
    lease = ServerLease.for_server(proc.pid, gpu_uuid="GPU-test", port=1, run_dir=tmp_path, command=SLEEPER)
    return replace(lease, owner=owner)


def test_the_lease_folder_is_the_env_var_then_xdg_then_cache(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_LEASE_DIR, str(tmp_path / "mine"))
    assert lease_dir() == tmp_path / "mine"
    monkeypatch.delenv(ENV_LEASE_DIR)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert lease_dir() == tmp_path / "elsa-tune" / "leases"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert lease_dir() == tmp_path / "home" / ".cache" / "elsa-tune" / "leases"


def test_a_lease_lives_from_start_to_stop_and_says_whose_server_it_is(tmp_path: Path) -> None:
    book = LeaseBook(tmp_path / "leases")
    runtime = SimulatedSGLang(PROFILE, card_dir=tmp_path / "card", speedup=50.0,
                              timeouts=replace(SIM_TIMEOUTS, boot_s=60.0, stop_s=10.0), leases=book)
    server = runtime.start(Candidate(label="leased"), tmp_path / "boot")
    try:
        (lease,) = book.leases()
        assert lease.owner == Owner.me() and not lease.owner.is_dead()
        assert lease.server_pid == lease.server_pgid == int(server.handle)
        assert lease.server_start == start_time(lease.server_pid)
        assert (lease.gpu_uuid, lease.port, lease.run_dir) == (runtime.gpu.uuid, server.port, str(tmp_path / "boot"))
        assert lease.card_dir == str(tmp_path / "card") and "--sim-profile" in lease.command
        assert book.orphans() == [] and book.reap() == []    # our own server: never touched
    finally:
        runtime.stop(server)
    assert book.leases() == []


def test_a_killed_tuners_server_is_reaped_and_the_next_preflight_proceeds(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from elsa_tune.tuner.flow.preflight import run_preflight
    from elsa_tune.tuner.flow.settings import Settings

    card = tmp_path / "card"
    found = boot_and_kill_owner(card, tmp_path / "boot")
    pid = int(found["pid"])
    try:
        (lease,) = LeaseBook().leases()
        assert lease.owner.pid == found["owner"] and lease.owner.is_dead() and lease.server_pid == pid
        members = ProcessGroup(pid).members()
        assert pid in members   # orphaned: still serving after its owner died
        assert httpx.get(f"http://127.0.0.1:{found['port']}/health", timeout=10, trust_env=False).status_code == 200
        runtime = SimulatedSGLang(PROFILE, card_dir=card)
        assert pid in {p.pid for p in runtime.gpu.state().processes}   # preflight would have refused this card
        space = Path(__file__).resolve().parents[2] / "benchmarks" / "workers" / "tiny-space.yaml"
        with caplog.at_level(logging.WARNING, logger="elsa_tune.runtime.lease"):
            pre = run_preflight(Settings(gpu="sim", runtime="sim", sim_profile=PROFILE, space=str(space),
                                         traffic="demo"), card_dir=card, harvest_flags=False)
        assert pre.gpu_state is not None and pre.gpu_state.processes == ()
        assert any(lease.name in p for p in pre.problems)
        assert any(lease.name in r.getMessage() and "orphaned" in r.getMessage() for r in caplog.records)
        assert ProcessGroup(pid).members() == [] and LeaseBook().leases() == []
    finally:
        ProcessGroup(pid).signal(signal.SIGKILL)


def test_a_simulated_server_reaped_without_a_gpu_view_is_watched_through_the_card_view(tmp_path: Path) -> None:
    from elsa_tune.runtime.sim.card import SimulatedCards

    card = tmp_path / "card"
    found = boot_and_kill_owner(card, tmp_path / "boot")
    pid = int(found["pid"])
    try:
        assert pid in SimulatedCards().pids(card)
        (reaped,) = LeaseBook(cards=SimulatedCards()).reap()     # what ``elsa-tune leases --reap`` builds
        assert str(pid) in reaped.stopped and reaped.gpu_memory_released, reaped
        assert reaped.detail == "its processes hold no GPU memory any more"
        assert ProcessGroup(pid).members() == [] and not SimulatedCards().pids(card) & {pid}
    finally:
        ProcessGroup(pid).signal(signal.SIGKILL)


def test_a_card_busy_with_a_process_that_is_not_ours_is_still_refused(sleeper: subprocess.Popen[bytes],
                                                                     tmp_path: Path) -> None:
    from elsa_tune.errors import EnvironmentError_
    from elsa_tune.runtime.sim.card import CardLease, card_uuid
    from elsa_tune.tuner.flow.preflight import run_preflight
    from elsa_tune.tuner.flow.settings import Settings

    card = tmp_path / "card"
    CardLease(card, pid=sleeper.pid).set_used(1 << 30)   # someone else's process on the card, with no lease
    book = LeaseBook()
    live_owners = replace(lease_of(sleeper, tmp_path, Owner.me()), gpu_uuid=card_uuid(card))
    book.write(live_owners)                                # ... or a live owner's server: never ours to stop
    space = Path(__file__).resolve().parents[2] / "benchmarks" / "workers" / "tiny-space.yaml"
    with pytest.raises(EnvironmentError_, match=f"in use by .*{sleeper.pid}"):
        run_preflight(Settings(gpu="sim", runtime="sim", sim_profile=PROFILE, space=str(space), traffic="demo"),
                      card_dir=card, harvest_flags=False)
    assert sleeper.poll() is None and len(book.leases()) == 1


def test_a_live_owners_lease_is_left_alone(sleeper: subprocess.Popen[bytes], tmp_path: Path) -> None:
    book = LeaseBook(tmp_path / "leases")
    book.write(lease_of(sleeper, tmp_path, Owner.me()))
    assert book.reap() == [] and book.reap(gpu_uuid="GPU-test") == []
    assert sleeper.poll() is None and len(book.leases()) == 1


def test_a_reused_owner_pid_is_a_dead_owner(sleeper: subprocess.Popen[bytes], tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    me = Owner.me()
    assert me.start is not None
    reused = replace(me, start=me.start - 1)    # our pid, but the owner that started then is gone
    assert reused.is_dead()
    book = LeaseBook(tmp_path / "leases", stop_timeout_s=5.0)
    lease = lease_of(sleeper, tmp_path, reused)
    book.write(lease)
    assert book.reap(gpu_uuid="GPU-other") == [] and sleeper.poll() is None   # another GPU's lease: not this one
    with caplog.at_level(logging.WARNING, logger="elsa_tune.runtime.lease"):
        (reaped,) = book.reap(gpu_uuid="GPU-test")
    assert sleeper.wait(timeout=10) == -signal.SIGTERM and ProcessGroup(sleeper.pid).members() == []
    assert len(reaped.stopped) == 3 and not reaped.killed and reaped.name == lease.name
    assert book.leases() == [] and lease.name in caplog.text


def test_a_server_pid_reused_by_another_process_is_not_signalled(sleeper: subprocess.Popen[bytes],
                                                                 tmp_path: Path) -> None:
    book = LeaseBook(tmp_path / "leases")
    lease = lease_of(sleeper, tmp_path, replace(Owner.me(), pid=_dead_pid()))
    started = lease.server_start
    assert started is not None
    book.write(replace(lease, server_start=started + 1))
    (reaped,) = book.reap()
    assert reaped.stopped == () and "another process" in reaped.detail
    assert sleeper.poll() is None and book.leases() == []


def test_other_hosts_and_other_schemas_are_not_judged(sleeper: subprocess.Popen[bytes], tmp_path: Path) -> None:
    book = LeaseBook(tmp_path / "leases")
    elsewhere = replace(Owner.me(), host=socket.gethostname() + "-elsewhere", pid=_dead_pid())
    book.write(lease_of(sleeper, tmp_path, elsewhere))
    (book.directory / "future.lease.json").write_text(json.dumps({"schema_version": 99}))
    (book.directory / "torn.lease.json").write_text("{")
    assert book.reap() == [] and sleeper.poll() is None and len(book.leases()) == 1


def test_an_unwritable_lease_folder_does_not_stop_a_boot(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    runtime = SimulatedSGLang(PROFILE, card_dir=tmp_path / "card", speedup=50.0,
                              timeouts=replace(SIM_TIMEOUTS, boot_s=60.0, stop_s=10.0),
                              leases=LeaseBook(blocked / "leases"))
    server = runtime.start(Candidate(), tmp_path / "boot")
    assert runtime.stop(server).gpu_memory_released


def _dead_pid() -> int:
    """A pid that was ours a moment ago and is gone now."""
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    assert start_time(proc.pid) is None and proc.pid != os.getpid()
    return proc.pid


@pytest.mark.parametrize("change, why", [
    ({"server_start": None}, "no start time"),
    ({"command": ("python", "-m", "sglang.launch_server")}, "another command"),
    ({"server_pgid": "ours"}, "names group"),    # the test's own group: signalling it would stop pytest
])
def test_a_group_not_provably_the_servers_is_never_signalled(sleeper: subprocess.Popen[bytes], tmp_path: Path,
                                                             change: dict[str, object], why: str) -> None:
    # the case: a lease whose server start is null names any process group; its owner is dead
    book = LeaseBook(tmp_path / "leases", stop_timeout_s=1.0)
    lease = lease_of(sleeper, tmp_path, replace(Owner.me(), pid=_dead_pid()))
    if change.get("server_pgid") == "ours":
        change = {"server_pgid": os.getpgid(0)}
    book.write(replace(lease, **change))  # type: ignore[arg-type]
    (reaped,) = book.reap()
    assert reaped.stopped == () and why in reaped.detail and "nothing stopped" in reaped.detail
    assert sleeper.poll() is None and len(ProcessGroup(sleeper.pid).members()) == 3 and book.leases() == []


def test_another_users_process_is_never_signalled(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("starting a process as another user needs root")
    nobody = subprocess.Popen(["sleep", "120"], stdin=subprocess.DEVNULL, start_new_session=True, user=65534,
                              group=65534)
    try:
        book = LeaseBook(tmp_path / "leases", stop_timeout_s=1.0)
        lease = ServerLease.for_server(nobody.pid, gpu_uuid="GPU-test", port=1, run_dir=tmp_path,
                                       command=("sleep", "120"))
        book.write(replace(lease, owner=replace(Owner.me(), pid=_dead_pid())))
        (reaped,) = book.reap()
        assert reaped.stopped == () and "belongs to user 65534" in reaped.detail and nobody.poll() is None
    finally:
        nobody.kill()
        nobody.wait(timeout=10)


def test_a_script_run_through_its_interpreter_is_the_same_command() -> None:
    from elsa_tune.runtime.lease import same_command

    assert same_command(("serve.py", "--port", "1"), ("/usr/bin/python3", "/opt/serve.py", "--port", "1"))
    assert same_command(("sleep", "120"), ("sleep", "120"))
    assert not same_command(("sleep", "120"), ("sleep", "121"))
    assert not same_command(("serve.py", "--port", "1"), ("/usr/bin/python3", "/opt/other.py", "--port", "1"))
    assert not same_command((), ("sleep",))
