"""A real ``llama-server`` for tests: found, booted on a free loopback port, and always stopped.

``server_binary()`` is ``$ELSA_LLAMA_SERVER`` or the CPU build in the cache (``python -m
elsa_tune.runtime.llamacpp.build``, run by ``.ci/run``); it skips the test when neither exists.
``running_llama_server(model, *flags)`` starts the server in its own process group with its log in a file,
waits for ``/health`` (failing with the log's tail when the server exits or the wait times out), yields a
``LlamaServer`` and stops the whole group in ``finally``.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from elsa_tune.runtime.llamacpp.build import Build, default_cache
from elsa_tune.runtime.ports import free_port
from elsa_tune.runtime.process_group import ProcessGroup


def server_binary() -> Path:
    """The ``llama-server`` to test against; skips the test when there is none."""
    named = os.environ.get("ELSA_LLAMA_SERVER")
    if named:
        path = Path(named)
        if not path.is_file():
            pytest.skip(f"ELSA_LLAMA_SERVER={named} is not a file")
        return path
    built = Build(default_cache(), cuda=False).binary
    if not built.is_file():
        pytest.skip(f"no llama-server: set ELSA_LLAMA_SERVER or build one (python -m "
                    f"elsa_tune.runtime.llamacpp.build puts it at {built})")
    return built


@dataclass(frozen=True)
class LlamaServer:
    base_url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 60.0) -> Any:
        reply = httpx.post(self.base_url + path, json=body, timeout=timeout_s, trust_env=False)
        reply.raise_for_status()
        return reply.json()

    def get(self, path: str, timeout_s: float = 10.0) -> str:
        reply = httpx.get(self.base_url + path, timeout=timeout_s, trust_env=False)
        reply.raise_for_status()
        return reply.text


def _tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def running_llama_server(model: Path, *flags: str, log_dir: Path, context: int = 2048, slots: int = 2,
                         boot_timeout_s: float = 30.0) -> Iterator[LlamaServer]:
    """``llama-server -m model -c context -np slots -lv 4 *flags`` on 127.0.0.1, stopped when the block ends."""
    binary = server_binary()
    port = free_port()
    log_path = log_dir / f"llama-server-{port}.log"
    argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", str(context),
            "-np", str(slots), "-lv", "4", *flags]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   start_new_session=True)
    try:
        server = LlamaServer(base_url=f"http://127.0.0.1:{port}", log_path=log_path)
        deadline = time.monotonic() + boot_timeout_s
        while True:
            if process.poll() is not None:
                raise AssertionError(f"llama-server exited {process.returncode} while booting: {' '.join(argv)}\n"
                                     f"{_tail(log_path)}")
            try:
                if httpx.get(server.base_url + "/health", timeout=1.0, trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"llama-server not healthy after {boot_timeout_s:g} s: {' '.join(argv)}\n"
                                     f"{_tail(log_path)}")
            time.sleep(0.05)
        yield server
    finally:
        ProcessGroup(process.pid).stop(10.0, leader=process)
