"""``ProcessGroup``: a server's process group, read from /proc, signalled and stopped as one.

Every local server runs in its own session and process group, so that a Ctrl-C of the tuner does not hit it
directly. Stopping one is the same whether it is our child (``SGLangProcess.stop``) or the orphan of a
killed tuner (``runtime/lease.py``): SIGTERM the group, wait, SIGKILL after the timeout, then sweep the
stragglers (schedulers that outlive their launcher). Only our own child can be reaped by ``wait``; an
orphan is reaped by init, so the wait for it watches the group's members in /proc instead.

``start_time`` is a process's start in clock ticks since boot (/proc/<pid>/stat field 22): together with the
pid it names one process, so a reused pid is not mistaken for the one a lease recorded.

``ProcessGroup.run`` is the one way elsa-tune runs a short child program whose answer it reads (a runtime's
``--help``, its version, its own argument parser): the child gets a session and process group of its own, the
whole run has one deadline (not one per read), and the group is stopped in a ``finally`` whether the child
answered, timed out or the caller was interrupted, so a grandchild that keeps the pipes open or outlives its
parent is stopped with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

_PROC = Path("/proc")
#: How long a SIGKILLed group may take to disappear before we give up and say so.
KILL_WAIT_S = 10.0
#: How long the members a bounded run leaves behind get between SIGTERM and SIGKILL.
RUN_STOP_GRACE_S = 2.0


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3, the state, is index 0)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or ``None`` when it is gone, a zombie, or /proc is absent."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20 or fields[0] == "Z":
        return None
    return int(fields[19])


def boot_id() -> str | None:
    """This boot of the kernel: start times and pids of another boot name nothing on this one."""
    try:
        return (_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return None


def is_running(pid: int, started: int | None) -> bool:
    """``pid`` is alive (not a zombie) and, when ``started`` is known, is the process that started then."""
    if not _PROC.is_dir():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    now = start_time(pid)
    return now is not None and (started is None or now == started)


class ProcessGroup:
    """One process group by its id (the pid of its leader, the server's launcher)."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid

    @staticmethod
    def run(argv: Sequence[str], *, deadline_s: float, env: Mapping[str, str] | None = None,
            stdin_text: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in a new process group, feed it ``stdin_text``, and collect its output within ``deadline_s``.

        Output is decoded as UTF-8 (undecodable bytes replaced). Past the deadline the group is stopped and
        ``subprocess.TimeoutExpired`` is raised; ``OSError`` (``FileNotFoundError``, ``PermissionError``) when
        ``argv[0]`` cannot be started. However it ends, no member of the group is left running.
        """
        popen = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL if stdin_text is None else subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=None if env is None else dict(env), start_new_session=True)
        try:
            stdout, stderr = popen.communicate(None if stdin_text is None else stdin_text.encode(),
                                               timeout=deadline_s)
        finally:
            ProcessGroup(popen.pid).stop(RUN_STOP_GRACE_S, leader=popen)
            for stream in (popen.stdin, popen.stdout, popen.stderr):
                if stream is not None:
                    stream.close()
        return subprocess.CompletedProcess(list(argv), popen.returncode, stdout.decode(errors="replace"),
                                           stderr.decode(errors="replace"))

    def members(self) -> list[int]:
        """Live (non-zombie) processes of the group, read from /proc; falls back to ``killpg(pgid, 0)``."""
        if not _PROC.is_dir():
            try:
                os.killpg(self.pgid, 0)
            except (ProcessLookupError, PermissionError):
                return []
            return [self.pgid]
        members = []
        for entry in _PROC.iterdir():
            if not entry.name.isdigit():
                continue
            fields = _stat_fields(int(entry.name))
            if fields is not None and len(fields) > 2 and fields[0] != "Z" and fields[2] == str(self.pgid):
                members.append(int(entry.name))
        return members

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def stop(self, timeout_s: float, *, leader: subprocess.Popen[bytes] | None = None) -> bool:
        """SIGTERM the group, SIGKILL after ``timeout_s``, wait until no member is left; ``True`` if killed.

        ``leader`` is the group's leader when it is our child (it is then reaped with ``wait``); without it the
        leader is watched in /proc. Safe to call on a group that is already gone.
        """
        killed = False
        if self.members():
            self.signal(signal.SIGTERM)
        if not self._leader_gone(leader, timeout_s):
            self.signal(signal.SIGKILL)
            killed = True
            if not self._leader_gone(leader, KILL_WAIT_S):
                log.error("process %d survived SIGKILL for %.0f s (uninterruptible sleep?)", self.pgid, KILL_WAIT_S)
        # the group got the SIGTERM together with the leader: stragglers get a short grace, then SIGKILL
        deadline = time.monotonic() + min(5.0, timeout_s)
        while self.members():
            if time.monotonic() >= deadline or killed:
                self.signal(signal.SIGKILL)
                killed = True
            if time.monotonic() >= deadline + KILL_WAIT_S:
                log.error("process group %d still has members after SIGKILL", self.pgid)
                break
            time.sleep(0.05)
        return killed

    def _leader_gone(self, leader: subprocess.Popen[bytes] | None, timeout_s: float) -> bool:
        if leader is not None:
            try:
                leader.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout_s
        while is_running(self.pgid, None):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True
