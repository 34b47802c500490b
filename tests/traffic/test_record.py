"""``elsa-tune record`` against a real Prometheus holding backfilled SGLang-shaped series.

Tolerances: the rate curve is reproduced exactly at the step's resolution (the synthesis conditions
on the observed per-step counts); bucket shares of both length histograms within 0.01 absolute (the
multinomial error at ~40k requests is ~0.0025); means within 3 %; the trace's infinite-cache prefix
reuse within 0.01 of cached/prompt tokens; the pre-tuning report's numbers exactly.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_backfill import (
    OUTPUT_BOUNDS,
    PROMETHEUS,
    PROMPT_BOUNDS,
    PROMTOOL,
    Truth,
    free_port,
    generate,
    running_prometheus,
)

from elsa_tune.errors import TrafficError
from elsa_tune.traffic.prometheus import PrometheusClient
from elsa_tune.traffic.recording import Recording, RecordWindow, auto_step, record
from elsa_tune.traffic.summary import prefix_reuse
from elsa_tune.traffic.trace import read_trace
from elsa_tune.tuner.cli import main

pytestmark = pytest.mark.skipif(not (Path(PROMETHEUS).exists() and Path(PROMTOOL).exists()),
                                reason="Debian's prometheus package is not installed")


def _iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).isoformat()


def _record(url: str, truth: Truth, selector: str = '{job="sglang"}') -> Recording:
    with PrometheusClient(url) as client:
        return record(client, RecordWindow(start=truth.start, end=truth.end, step=truth.scrape_s, selector=selector),
                      seed=3)


def _assert_reproduces(recording: Recording, truth: Truth) -> None:
    trace, report = recording.trace, recording.report
    total = int(truth.arrivals.sum())
    assert len(trace) == total == report.requests_observed
    # the rate curve, step by step: arrivals in (t[k-1], t[k]] of the backfill land in the same step
    absolute = trace.arrivals() + truth.start
    per_step, _ = np.histogram(absolute, bins=np.concatenate([truth.times, [truth.end + truth.scrape_s]]))
    assert np.array_equal(per_step[:-1], truth.arrivals[1:])
    # length histograms and means
    for column, bounds, shares, mean in (("input_tokens", PROMPT_BOUNDS, truth.prompt_shares, truth.prompt_mean),
                                         ("output_tokens", OUTPUT_BOUNDS, truth.output_shares, truth.output_mean)):
        values = trace.column(column)
        got = np.bincount(np.searchsorted(np.asarray(bounds), values, side="left"), minlength=len(bounds)) / total
        assert np.abs(got - shares).max() < 0.01, column
        assert float(values.mean()) == pytest.approx(mean, rel=0.03), column
    # lengths follow the hours they were recorded in: the burst's longer prompts stay in the burst.
    # Both sides are samples of a heavy-tailed distribution: compare within four standard errors.
    inputs = trace.column("input_tokens").astype(float)

    def close(mask: np.ndarray[Any, Any], mean: float) -> bool:
        values = inputs[mask]
        return abs(values.mean() - mean) <= 4 * np.sqrt(2) * values.std() / np.sqrt(len(values))

    burst = (absolute > truth.burst[0] - truth.scrape_s) & (absolute <= truth.burst[1])
    assert close(burst, truth.prompt_mean_burst) and close(~burst, truth.prompt_mean_calm)
    assert truth.prompt_mean_burst > 2 * truth.prompt_mean_calm
    days = np.asarray([datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d") for t in absolute])
    for day, mean in truth.prompt_mean_by_day.items():
        assert (days == day).sum() < 100 or close(days == day, mean), day
    # prefix reuse constructed to hit cached/prompt
    assert report.prefix_hit_rate_observed == pytest.approx(truth.hit_rate, abs=0.002)
    assert prefix_reuse(trace) == pytest.approx(truth.hit_rate, abs=0.01)
    # what the seeds looked at before tuning
    assert report.busiest_days[0] == (truth.busiest_day, truth.day_counts[truth.busiest_day])
    ranked = sorted(((d, c) for d, c in truth.day_counts.items() if c), key=lambda kv: (-kv[1], kv[0]))
    assert [tuple(day) for day in report.busiest_days] == ranked[:5]
    assert report.queued_share == pytest.approx(truth.queued_share, abs=1e-9)
    assert report.kv_usage_peak == pytest.approx(truth.kv_peak)
    assert report.mamba_usage_peak == pytest.approx(truth.mamba_peak)
    assert report.running_max == 12
    # concurrency: what was in flight agrees with the trace's arrivals at the recorded latency
    assert report.latency_mean_s == pytest.approx(truth.latency_mean, rel=0.01)
    assert report.concurrency_mean_observed == pytest.approx(truth.concurrency_mean, rel=1e-9)
    assert report.concurrency_mean_implied == pytest.approx(truth.concurrency_mean, rel=0.05)
    meta = trace.metadata
    assert meta.synthesized and meta.source.startswith("prometheus:")
    assert json.loads(meta.extra["recording"])["requests_synthesized"] == total


def test_one_day_is_reproduced(one_day: tuple[str, Truth]) -> None:
    url, truth = one_day
    _assert_reproduces(_record(url, truth), truth)


def test_a_step_finer_than_the_scrapes_is_reported(one_day: tuple[str, Truth]) -> None:
    url, truth = one_day
    with PrometheusClient(url) as client:
        fine = record(client, RecordWindow(start=truth.end - 4 * 3600, end=truth.end, step=15.0,
                                           selector='{job="sglang"}'))
    assert any("finer than the scrape interval (~60 s)" in note for note in fine.report.notes)
    assert len(fine.trace) == truth.arrivals[truth.times > truth.end - 4 * 3600].sum()
    assert not any("scrape" in note for note in _record(url, truth).report.notes)


def test_the_selector_and_endpoint_filter_choose_the_traffic(one_day: tuple[str, Truth]) -> None:
    url, truth = one_day
    everything = _record(url, truth, selector="")
    # the decoy job adds one request per step; the /health endpoint adds nothing
    assert everything.report.requests_observed == truth.arrivals.sum() + len(truth.times) - 1


def test_cli_records_writes_and_shows(one_day: tuple[str, Truth], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    url, truth = one_day
    out = tmp_path / "prod.parquet"
    code = main(["record", "--prometheus", url, "--start", _iso(truth.start), "--end", _iso(truth.end),
                 "--selector", '{job="sglang"}', "-o", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "busiest    days:" in printed and "queued" in printed and "Mamba usage 100%" in printed
    assert len(read_trace(out)) == truth.arrivals.sum()
    assert main(["traffic", "show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "synthesised from aggregates" in shown and f"busiest days {truth.busiest_day}" in shown
    assert [p.name for p in tmp_path.iterdir()] == ["prod.parquet"]


WINDOW = object()  # stands for "--start/--end of the backfilled day"
DAY = 86400.0


@pytest.mark.parametrize(
    ("make_args", "message"),
    [
        (lambda t: ["--selector", '{job="nope"}', WINDOW], 'matches no SGLang request counters.*job="sglang"'),
        (lambda t: ["--selector", "{job=}", WINDOW], "bad_data"),
        (lambda t: ["--start", _iso(t.start - 8 * DAY), "--end", _iso(t.start - 7 * DAY)], "no SGLang request"),
        (lambda t: ["--start", _iso(t.end), "--end", _iso(t.start)], "empty or reversed"),
        (lambda t: ["--start", _iso(t.start), "--end", _iso(time.time() + 2 * DAY)], "in the future"),
        (lambda t: ["--since", "fortnight"], "not a duration"),
        (lambda t: ["--step", "1d", WINDOW], "a rate curve needs at least 10"),
        # the counters exist under the selector from the window's last scrape on: nothing grew between two points
        (lambda t: ["--selector", '{job="sglang"}', "--start", _iso(t.start - 600), "--end",
                    _iso(t.start + t.scrape_s / 2)], "did not grow"),
        (lambda t: ["--prometheus", f"http://127.0.0.1:{free_port()}", WINDOW], "cannot reach Prometheus"),
    ],
    ids=["wrong-selector", "malformed-selector", "empty-window", "reversed", "future", "bad-duration", "short",
         "no-growth", "down"],
)
def test_errors_are_explained_and_leave_no_file(one_day: tuple[str, Truth], tmp_path: Path,
                                                make_args: Callable[[Truth], list[object]], message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    url, truth = one_day
    out = tmp_path / "prod.parquet"
    out.write_bytes(b"an older trace")
    args: list[str] = []
    for item in make_args(truth):
        args += ["--start", _iso(truth.start), "--end", _iso(truth.end)] if item is WINDOW else [str(item)]
    if "--prometheus" not in args:
        args += ["--prometheus", url]
    assert main(["record", *args, "-o", str(out), "--timeout", "10"]) == 2
    err = capsys.readouterr().err
    assert "remedy:" in err
    assert re.search(message, err), err
    if message == "did not grow":   # the selector was right: the error must not send the user to another one
        assert "matches no" not in err and "--step" in err
    assert out.read_bytes() == b"an older trace"
    assert [p.name for p in tmp_path.iterdir()] == ["prod.parquet"]


def test_the_step_is_chosen_from_the_window() -> None:
    now = 2_000_000_000.0
    assert auto_step(180) == 5.0 and auto_step(3600) == 30.0 and auto_step(14 * DAY) == 60.0
    short = RecordWindow(start=now - 180, end=now).checked(now)
    assert short.step == 5.0 and (short.end - short.start) / short.step >= 30
    assert RecordWindow(start=now - 14 * DAY, end=now).checked(now).step == 60.0
    with pytest.raises(TrafficError, match=r"holds 3 steps of 60 s") as raised:
        RecordWindow(start=now - 180, end=now, step=60.0).checked(now)
    assert "--step 18s or less" in raised.value.remedy


@pytest.mark.slow
def test_two_weeks_are_reproduced_with_the_busiest_days(tmp_path: Path) -> None:
    truth = generate(tmp_path / "series.om", days=14, end=time.time() - 3600, scrape_s=300.0)
    with running_prometheus(tmp_path / "series.om", tmp_path) as url:
        recording = _record(url, truth)
    _assert_reproduces(recording, truth)
    assert len(recording.report.busiest_days) == 5


def test_scale_thins_the_arrivals_in_proportion(one_day: tuple[str, Truth]) -> None:
    url, truth = one_day
    with PrometheusClient(url) as client:
        window = RecordWindow(start=truth.start, end=truth.end, step=truth.scrape_s, selector='{job="sglang"}')
        half = record(client, window, seed=1, scale=0.5)
    total = truth.arrivals.sum()
    assert len(half.trace) == pytest.approx(total / 2, abs=4 * np.sqrt(total))
    assert half.trace.metadata.extra["scale"] == "0.5"
