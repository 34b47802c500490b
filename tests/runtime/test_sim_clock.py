"""The simulated server's clock and what clients read on it: a client's timings are the simulated system's.

Unit tests of ``SimClock`` (server) and ``SimTime`` (client), the idle pool accounting SGLang 0.5.23 reports
(evictable radix-cache tokens are not used), then one boot of ``elsa-tune sim serve`` at a high speed-up driven
by the load generator, its measurement against the simulator's truth for the same closed loop.
"""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import httpx
import pytest
from test_sim_server_http import boot, shutdown

from elsa_tune.runtime.sim import server as sim_server
from elsa_tune.runtime.sim.engine import Engine, SimRequest
from elsa_tune.runtime.sim.memory import plan_memory
from elsa_tune.runtime.sim.performance import PerformanceModel
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.runtime.sim.serving import SimClock
from elsa_tune.runtime.sim.truth import TruthWorkload, truth
from elsa_tune.traffic import sim_time
from elsa_tune.traffic.loadgen import LoadGenerator
from elsa_tune.traffic.measurement import Outcome, RequestRecord
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.traffic.sim_time import SimTime
from elsa_tune.traffic.workload import synthetic

PROFILE = "tiny-test"


def test_clock_runs_at_the_speedup_and_stands_still_where_the_host_was_late() -> None:
    clock = SimClock(40.0, 0.05, wall0=100.0)
    clock.move(100.0, 0.0)
    clock.move(100.1, 4.0, since=0.0)           # on the line: no knot
    assert clock.knots == [(100.0, 0.0)]
    assert clock.sim_at(100.2) == pytest.approx(8.0)
    clock.move(100.13, 4.0, since=4.0)          # late by 30 ms: the clock stands still at 4.0 from 100.1
    assert clock.knots[-2:] == [(pytest.approx(100.1), 4.0), (100.13, 4.0)]
    assert clock.wall_at(5.0) == pytest.approx(100.155)
    declared = clock.describe(since=100.12)
    assert declared["speedup"] == 40.0 and declared["lag_s"] == 0.05
    knots = SimTime.of_clock(declared)
    assert knots is not None and knots.sim(100.12) == pytest.approx(4.0)   # inside the pause
    full = SimTime.of_clock(clock.describe(since=0.0))
    assert full is not None
    assert full.sim(100.05) == pytest.approx(2.0) and full.sim(100.14) == pytest.approx(4.4)


def test_a_clients_readings_convert_to_simulated_time() -> None:
    clock = SimTime(10.0, 0.05, ((0.0, 0.0), (1.0, 10.0), (1.5, 10.0)))   # stood still from 1.0 to 1.5
    # sent at wall 0.2 (sim 2.0), first chunk at wall 0.35 (its instant: 0.30 → 3.0), end at wall 1.6 (1.55 → 10.5)
    rec = RequestRecord(index=0, kind="chat", input_tokens=8, max_tokens=4, scheduled_s=None, sent_s=0.2,
                        outcome=Outcome.OK, ttft_s=0.15, end_s=1.6, output_tokens=4, chunks=2, itl_s=(0.1,))
    out = clock.record(rec, t0=0.0, origin=0.0)
    assert out.sent_s == pytest.approx(2.0)
    assert out.ttft_s == pytest.approx(1.0)
    assert out.end_s == pytest.approx(10.5)
    assert out.itl_s == (pytest.approx(1.0),)
    named = clock.record(rec, t0=0.0, origin=0.0, sent_sim=1.5)   # the client named its simulated send instant
    assert named.sent_s == 1.5 and named.ttft_s == pytest.approx(1.5)
    # a reaction: 2 ms of the client's own handling after what it received at wall 1.0 (sim instant 0.95)
    assert clock.send_stamp(1.002, 1.0) == pytest.approx(0.95 + 0.0002)
    assert SimTime.of_server_info({"simulated": {"clock": {"speedup": 40, "lag_s": 0.05}}}) == SimTime(40.0, 0.05)
    assert SimTime.of_server_info({"version": "0.5.23"}) is None   # a real SGLang declares no clock


def test_the_client_and_the_server_agree_on_the_protocols_headers() -> None:
    assert sim_time.SENT_AT_HEADER == sim_server.SENT_AT_HEADER
    assert sim_time.SIM_AT_HEADER == sim_server.SIM_AT_HEADER
    assert sim_time.ACK_HEADER == sim_server.ACK_HEADER
    assert sim_time.FOLLOW_UP_HEADER == sim_server.FOLLOW_UP_HEADER
    assert sim_time.FOLLOWS_HEADER == sim_server.FOLLOWS_HEADER


def test_an_idle_pool_with_a_warm_radix_cache_is_not_used() -> None:
    """SGLang 0.5.23: ``num_used = max_total_num_tokens − (available + evictable)``."""
    profile = load_profile(PROFILE)
    flags = dict(profile.base_flags)
    plan = plan_memory(profile, flags, {})
    engine = Engine(profile, plan, PerformanceModel(profile, plan, flags, {}), random.Random(0), block_size=64)
    for i in range(3):
        engine.submit(SimRequest(rid=f"r{i}", input_tokens=640, output_tokens=8,
                                 block_hashes=tuple(range(i * 100, i * 100 + 10))))
    busy = [step for step in iter(engine.step, None)]
    assert max(step.used_tokens for step in busy) >= 3 * 640
    idle = engine.pool_state()
    assert idle.kind == "idle" and idle.running == 0
    assert idle.evictable_tokens == 3 * 640          # the prompts stay in the tree, unlocked
    assert idle.used_tokens == 0 and idle.token_usage == 0.0


def test_the_load_generator_measures_the_simulated_system_at_a_high_speedup(tmp_path: Path) -> None:
    running = boot(tmp_path, PROFILE, seed=3, flags=["--enable-metrics", "--sim-noise", "off"])
    try:
        work = synthetic(12, 1024, 32, 4, block_size=64, tag="clock-parity")
        started = time.monotonic()
        m = LoadGenerator(running.base_url, PromptSynth(64), slots=None).measure(work, 0)
        wall = time.monotonic() - started
        time.sleep(0.3)
        metrics = httpx.get(running.base_url + "/metrics", timeout=10).text
    finally:
        shutdown(running)
    profile = load_profile(PROFILE)
    expected = truth(profile, dict(profile.base_flags), {}, TruthWorkload(
        concurrency=4, num_requests=12, input_tokens=(1024,), output_tokens=(32,), block_size=64))
    assert m.simulated and any("simulated time" in note for note in m.notes)
    assert expected.output_tokens_per_s and expected.ttft_p50_s
    measured = (m.output_throughput_tok_s, m.ttft_s.p50, m.window_s, wall)
    assert m.output_throughput_tok_s == pytest.approx(expected.output_tokens_per_s, rel=0.10), measured
    assert m.ttft_s.p50 == pytest.approx(expected.ttft_p50_s, rel=0.10), measured
    assert m.window_s > wall              # sped up, and its figures are simulated ones, not wall-clock ones
    usage = re.search(r"^sglang:token_usage\{[^}]*\} (\S+)$", metrics, re.M)
    evictable = re.search(r"^sglang:kv_evictable_tokens\{[^}]*\} (\S+)$", metrics, re.M)
    assert usage is not None and float(usage.group(1)) == 0.0      # idle, the warm radix cache is not "used"
    assert evictable is not None and float(evictable.group(1)) > 0
