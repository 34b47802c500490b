"""The live view in a real pseudo-terminal, read back through a terminal emulator (pyte): log lines stay above
the view, the title is drawn once, the time left is floored, and long names are cut with "…", never wrapped."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import textwrap

import pyte

from elsa_tune.tuner.console import time_left

COLUMNS, LINES = 120, 50
LONG = "mamba-track-interval-64-" + "with-a-name-longer-than-the-terminal-" * 4

CHILD = textwrap.dedent(f"""
    import logging, time
    from elsa_tune.tuner.console import StudyView, setup_logging
    setup_logging(None, 0, console=True)
    log = logging.getLogger("elsa_tune.study")
    with StudyView(live=True) as view:
        view.update(study="demo", phase="screening", candidate={LONG!r}, time_left_s=3000.0,
                    decisions=("decision 1 " + {LONG!r} + ": no",))
        for i in range(6):
            log.info("LOGLINE-%d boot finished", i)
            time.sleep(0.35)
            view.update(boots=i + 1)
""")


def _run_in_pty() -> pyte.Screen:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_ID", "GITHUB_ACTIONS", "JENKINS_URL")}
    env.update(TERM="xterm-256color", COLUMNS=str(COLUMNS), LINES=str(LINES))
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=slave, stdout=slave, stderr=slave, env=env,
                            close_fds=True)
    os.close(slave)
    output = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:              # EIO: the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    proc.wait(timeout=60)
    os.close(master)
    assert proc.returncode == 0, output.decode(errors="replace")[-2000:]
    screen = pyte.Screen(COLUMNS, LINES)
    pyte.ByteStream(screen).feed(output)
    return screen


def test_the_live_view_keeps_log_lines_above_it() -> None:
    lines = [line.rstrip() for line in _run_in_pty().display]
    text = "\n".join(lines)
    for i in range(6):
        assert sum(f"LOGLINE-{i} boot finished" in line for line in lines) == 1, text
    assert sum("elsa-tune study demo" in line for line in lines) == 1, text
    assert "50 min" in text and "1 h" not in text
    last_log = max(i for i, line in enumerate(lines) if "LOGLINE-" in line)
    title = next(i for i, line in enumerate(lines) if "elsa-tune study demo" in line)
    assert last_log < title                                      # the log scrolls above the view
    named = [line for line in lines if "mamba-track-interval-64" in line]
    assert len(named) == 2 and all(line.rstrip(" │").endswith("…") for line in named), text
    assert all(len(line) <= COLUMNS for line in lines)
    assert not any(line.strip(" │").startswith("with-a-name") for line in lines)   # no wrapped continuation


def test_time_left_is_floored() -> None:
    assert time_left(3000) == "50 min" and time_left(3599) == "59 min"
    assert time_left(3660) == "1 h 01 min" and time_left(59) == "0 min" and time_left(-5) == "0 min"
