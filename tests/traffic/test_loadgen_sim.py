"""The load generator against the simulated SGLang (``elsa-tune sim serve``), slots read from its boot log."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from elsa_tune.runtime.sim.profile import list_profiles
from elsa_tune.runtime.startup_log import READY_LINE, build_report
from elsa_tune.traffic.loadgen import LoadGenerator
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.traffic.workload import synthetic

FLAGS = ["--enable-cache-report", "--max-running-requests", "4", "--moe-runner-backend", "cutlass"]


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    base_url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()


def _boot(tmp: Path) -> Running:
    names = list_profiles()
    if not names:
        pytest.skip("no simulation profile shipped")
    profile = "tiny-test" if "tiny-test" in names else names[0]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    log_path = tmp / "server.log"
    argv = [sys.executable, "-m", "elsa_tune", "sim", "serve", "--sim-profile", profile, "--sim-speedup", "50",
            "--sim-card-dir", str(tmp / "card"), "--model-path", "sim-model", "--port", str(port), *FLAGS]
    with log_path.open("wb") as handle:
        proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    running = Running(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and READY_LINE not in running.log() and proc.poll() is None:
        time.sleep(0.1)
    return running


def _shutdown(running: Running) -> None:
    if running.proc.poll() is None:
        os.killpg(running.proc.pid, signal.SIGTERM)
        try:
            running.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(running.proc.pid, signal.SIGKILL)
            running.proc.wait(15)


BS = 64


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    running = _boot(tmp_path_factory.mktemp("sim"))
    try:
        if running.proc.poll() is not None or READY_LINE not in running.log():
            pytest.fail(f"the simulated server did not start:\n{running.log()[-2000:]}")
        yield running
    finally:
        _shutdown(running)


def test_replay_against_the_simulated_server_within_its_slots(sim: Running) -> None:
    report = build_report(sim.log())
    assert report.max_running_requests == 4
    gen = LoadGenerator(sim.base_url, PromptSynth(BS), slots=report.max_running_requests)
    m = gen.measure(synthetic(16, 600, 32, 8, shared_prefix_tokens=256, block_size=BS, kind="code"), 1)
    assert m.requests_ok == 16 and m.errors.count == 0
    assert {r.output_tokens for r in m.records} == {32} and {r.output_tokens_source for r in m.records} == {"usage"}
    assert m.prompt_token_mismatches == 0
    assert m.max_concurrency == 4 and m.above_slots is False
    # the shared 256-token prefix is the only thing the server's cache can hit
    assert m.cached_token_ratio is not None and 0.2 < m.cached_token_ratio < 256 / 600
    assert m.output_throughput_tok_s > 0 and m.ttft_s.p50 is not None


def test_above_the_running_limit_is_flagged_against_the_simulated_server(sim: Running) -> None:
    gen = LoadGenerator(sim.base_url, PromptSynth(BS, seed=5), slots=4)
    workload = synthetic(16, 300, 16, 8, block_size=BS, allow_above_slots=True, tag="above")
    m = gen.measure(workload, 1)
    assert m.requests_ok == 16 and m.max_concurrency == 8 and m.above_slots is True
    assert "ABOVE THE RUNNING LIMIT" in m.describe()
