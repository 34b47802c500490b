"""A client that does not stamp its requests is served at a speed-up its host overhead allows, on a declared clock.

Unit tests of ``PlainSpeed`` (the adaptive speed-up) and ``SimClock.retime`` (a pace change is a knot of the
declared clock), then one boot of ``elsa-tune sim serve`` at 50×: a plain streaming client (no elsa headers, like
``sglang.bench_serving``) measures a TTFT in wall time that, converted with the declared clock, is the truth's.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest

from elsa_tune.probes.client import FULL_PACE
from elsa_tune.runtime.sim.engine import SimRequest
from elsa_tune.runtime.sim.plain_speed import CLIENT_FLOOR_S, MIN_SAMPLES, SLOWEST, TARGET_SHARE, PlainSpeed
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.runtime.sim.serving import SimClock
from elsa_tune.runtime.sim.truth import TruthWorkload, truth
from elsa_tune.traffic.sim_time import SimTime

sys.path.insert(0, str(Path(__file__).parent))
from test_sim_server_http import SPEEDUP, boot, shutdown


def test_a_plain_client_gets_one_times_until_measured_then_what_its_overhead_allows() -> None:
    plain = PlainSpeed(full=40.0)
    assert plain.speedup() == 1.0 and plain.describe()["latency_scale_ms"] is None
    for _ in range(50):
        plain.observe_ttft(0.5)                      # half a simulated second: long latencies
    assert plain.speedup() == 1.0                    # an overhead not yet measured is not assumed small
    for _ in range(MIN_SAMPLES):
        plain.observe_overhead(0.0005)               # a quiet host: half a millisecond late at the socket
    assert plain.overhead_s == pytest.approx(2 * 0.0005 + CLIENT_FLOOR_S)
    assert plain.speedup() == pytest.approx(TARGET_SHARE * 0.5 / (2 * 0.0005 + CLIENT_FLOOR_S))
    for _ in range(50):
        plain.observe_overhead(0.004)                # a busy host: 4 ms late
    assert plain.speedup() == pytest.approx(TARGET_SHARE * 0.5 / (2 * 0.004 + CLIENT_FLOOR_S))
    for _ in range(100):
        plain.observe_overhead(0.0125)               # 2.6 ms for 15 ms of share: slow motion
    assert plain.speedup() == pytest.approx(TARGET_SHARE * 0.5 / (2 * 0.0125 + CLIENT_FLOOR_S))
    assert plain.speedup() < 1.0
    for _ in range(200):
        plain.observe_overhead(0.05)                 # far too slow: never slower than SLOWEST
    assert plain.speedup() == SLOWEST
    fast = PlainSpeed(full=4.0)
    for _ in range(MIN_SAMPLES):
        fast.observe_ttft(30.0)
        fast.observe_overhead(0.001)
    assert fast.speedup() == 4.0                     # never above the declared speed-up
    assert PlainSpeed(full=0.5).speedup() == 0.5     # a slowed-down server stays slowed down


def test_a_pace_change_is_a_knot_and_the_declared_clock_converts_across_it() -> None:
    clock = SimClock(40.0, 0.05, wall0=100.0)
    clock.move(100.0, 0.0)
    clock.retime(101.0, 2.0)
    assert clock.sim_at(101.0) == pytest.approx(40.0) and clock.sim_at(102.0) == pytest.approx(42.0)
    assert clock.wall_at(44.0) == pytest.approx(103.0)
    declared = clock.describe(since=0.0)
    assert declared["speedup"] == 40.0 and declared["rate"] == 2.0
    seen = SimTime.of_clock(declared)
    assert seen is not None and seen.rate == 2.0
    assert seen.sim(100.5) == pytest.approx(20.0) and seen.sim(103.0) == pytest.approx(44.0)
    assert seen.mean_rate(101.0, 103.0) == pytest.approx(2.0)
    assert seen.mean_rate(100.0, 102.0) == pytest.approx(21.0)
    clock.retime(104.0, 40.0)
    assert clock.sim_at(105.0) == pytest.approx(46.0 + 40.0)


def test_a_plain_client_reads_the_truths_ttft_at_a_high_speedup(tmp_path: Path) -> None:
    running = boot(tmp_path, "tiny-test", seed=5, flags=["--sim-noise", "off"])
    try:
        url = running.base_url
        declared = httpx.get(url + "/server_info", timeout=10).json()["simulated"]["clock"]
        assert declared["speedup"] == SPEEDUP and declared["plain_speedup"] == 1.0   # nothing measured yet
        body = {"model": "sim-model", "prompt": list(range(100, 4196)), "max_tokens": 32, "stream": True,
                "ignore_eos": True}
        with httpx.Client(timeout=30) as client:
            assert client.get(url + "/health").status_code == 200      # the connection is open before the clock
            began = time.monotonic()
            with client.stream("POST", url + "/v1/completions", json=body) as resp:
                assert resp.status_code == 200
                first = None
                for line in resp.iter_lines():
                    if first is None and line.startswith("data: {"):
                        first = time.monotonic()
        assert first is not None
        during = SimTime.of_clock(httpx.get(url + "/server_info", timeout=10).json()["simulated"]["clock"])
        probe = {"model": "sim-model", "prompt": "hello", "max_tokens": 4}   # a probe asks for the full pace
        assert httpx.post(url + "/v1/completions", json=probe, headers=FULL_PACE, timeout=30).status_code == 200
        probed = SimTime.of_clock(httpx.get(url + "/server_info", timeout=10).json()["simulated"]["clock"])
        after = SimTime.of_clock(httpx.get(url + "/sim/clock", params={"since": began}, timeout=10).json())
    finally:
        shutdown(running)
    assert during is not None and during.rate == 1.0            # the pass ran at the plain speed-up
    assert probed is not None and probed.rate == SPEEDUP
    assert after is not None and after.rate == SPEEDUP          # a clock read on an idle server restores it
    assert after.mean_rate(first - 0.02, first) == pytest.approx(1.0)    # its knots say so too
    profile = load_profile("tiny-test")
    expected = truth(profile, dict(profile.base_flags), {}, TruthWorkload(
        requests=(SimRequest(rid="a", input_tokens=4096, output_tokens=32, arrival_s=0.0),), block_size=64))
    assert expected.ttft_p50_s is not None
    measured = (first - began - after.lag_s) * 1.0              # wall, less the lag, on the plain line
    assert measured == pytest.approx(expected.ttft_p50_s, rel=0.15), (measured, expected.ttft_p50_s)
