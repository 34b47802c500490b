"""The Prometheus client against a real Prometheus: paging past the 11,000-point limit, errors, parsing."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_backfill import PROMETHEUS, PROMTOOL, Truth, free_port

from elsa_tune.errors import TrafficError
from elsa_tune.traffic.prometheus import (
    MAX_POINTS,
    Grid,
    PrometheusClient,
    Series,
    counter_increments,
    parse_duration,
    parse_time,
    selector_matchers,
    with_matchers,
)

pytestmark = pytest.mark.skipif(not (Path(PROMETHEUS).exists() and Path(PROMTOOL).exists()),
                                reason="Debian's prometheus package is not installed")


def test_range_queries_page_past_the_point_limit(one_day: tuple[str, Truth]) -> None:
    url, truth = one_day
    grid = Grid.spanning(truth.start, truth.end, 5.0)  # 17,280 points: two pages
    assert grid.points > MAX_POINTS
    with PrometheusClient(url) as client:
        series = client.query_range(with_matchers("sglang:http_requests_total", 'job="sglang"',
                                                  'endpoint="/v1/chat/completions"'), grid)
    assert len(series) == 1
    increments = counter_increments(series)
    assert increments.sum() == truth.arrivals.sum()  # including across the counter reset
    # every scrape's increment lands in the 5 s step that contains it
    at_scrapes = increments[np.round((truth.times - grid.start) / grid.step).astype(int)]
    assert np.array_equal(at_scrapes, truth.arrivals)


def test_instant_query_and_api_errors(one_day: tuple[str, Truth]) -> None:
    url, truth = one_day
    with PrometheusClient(url) as client:
        assert client.query("vector(1)", truth.end) == [({}, 1.0)]
        with pytest.raises(TrafficError, match="bad_data") as info:
            client.query('sglang:num_requests_total{job=}', truth.end)
        assert "--selector" in info.value.remedy


def test_down_and_wrong_servers_are_explained(one_day: tuple[str, Truth]) -> None:
    url, _ = one_day
    with PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout_s=5) as client, \
            pytest.raises(TrafficError, match="cannot reach Prometheus") as info:
        client.query("vector(1)", time.time())
    assert "running" in info.value.remedy
    with PrometheusClient(url + "/graph") as client, pytest.raises(TrafficError):
        client.query("vector(1)", time.time())
    with pytest.raises(TrafficError, match="not an http"):
        PrometheusClient("localhost:9090")


def test_counter_increments_bridge_gaps_and_resets() -> None:
    nan = float("nan")
    a = Series({"i": "a"}, np.array([5.0, 7.0, nan, 10.0, 2.0, 4.0]))
    b = Series({"i": "b"}, np.array([nan, 0.0, 1.0, 1.0, 1.0, 3.0]))
    assert counter_increments([a, b]).tolist() == [0.0, 2.0, 1.0, 3.0, 2.0, 4.0]


def test_durations_times_and_selectors() -> None:
    assert parse_duration("14d") == 14 * 86400 and parse_duration("1h30m") == 5400 and parse_duration("15") == 15
    for bad in ("fortnight", "-5s", "0s", "5x"):
        with pytest.raises(TrafficError):
            parse_duration(bad)
    assert parse_time("2026-11-01T00:00:00Z") == parse_time("1793491200") == 1793491200.0
    with pytest.raises(TrafficError, match="not a time"):
        parse_time("last tuesday")
    assert selector_matchers('{job="sglang"}') == 'job="sglang"' == selector_matchers(' job="sglang", ')
    assert with_matchers("m", "", 'a="1"') == 'm{a="1"}' and with_matchers("m") == "m"
