"""Local TCP ports for servers elsa-tune starts: a free one to pass as ``--port``, and a busy check."""

from __future__ import annotations

import errno
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the kernel's choice); a race remains, so callers retry."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when binding ``host:port`` fails because something already holds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False
