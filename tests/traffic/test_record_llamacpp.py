"""``elsa-tune record`` of llama-server's series, against a real Prometheus holding six backfilled hours of them.

Exact: the token totals, rates and gauges (the step is the scrape interval, so every scrape is a grid point), the
draft acceptance, and each step's synthesised requests (the step's generation tokens ÷ the given mean output
length, rounded down or up). Within 0.01: the trace's prefix reuse against cached ÷ all prompt tokens.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from llamacpp_backfill import ACCEPTED_PER_DRAFT, HIT_RATE, SLOTS, LlamaTruth
from prometheus_backfill import PROMETHEUS, PROMTOOL, Truth

from elsa_tune.runtime.llamacpp.family import LLAMACPP
from elsa_tune.traffic.prometheus import PrometheusClient
from elsa_tune.traffic.recording import RecordWindow
from elsa_tune.traffic.summary import prefix_reuse
from elsa_tune.traffic.token_recording import GivenLengths, TokenRecording, holds_series, record_tokens
from elsa_tune.traffic.trace import read_trace
from elsa_tune.tuner.cli import main

pytestmark = pytest.mark.skipif(not (Path(PROMETHEUS).exists() and Path(PROMTOOL).exists()),
                                reason="Debian's prometheus package is not installed")
NAMES = LLAMACPP.metrics


def _iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).isoformat()


def _window(truth: LlamaTruth, selector: str = '{job="llama"}') -> RecordWindow:
    return RecordWindow(start=truth.start, end=truth.end, step=truth.scrape_s, selector=selector)


def _record(url: str, truth: LlamaTruth, input_mean: float | None = None) -> TokenRecording:
    lengths = GivenLengths(mean_input_tokens=input_mean or truth.prompt_mean, mean_output_tokens=truth.output_mean)
    with PrometheusClient(url) as client:
        return record_tokens(client, _window(truth), NAMES, lengths, runtime="llamacpp", seed=4)


def test_token_rates_gauges_and_acceptance_are_recovered(llamacpp_hours: tuple[str, LlamaTruth]) -> None:
    url, truth = llamacpp_hours
    recording = _record(url, truth)
    report, trace = recording.report, recording.trace
    span = truth.end - truth.start
    prompt = truth.processed + truth.cached
    assert report.generation_tokens == truth.generated.sum()
    assert report.prompt_tokens == prompt.sum() and report.cached_prompt_tokens == truth.cached.sum()
    assert report.generation_tokens_per_s == pytest.approx(truth.generated.sum() / span)
    assert report.prompt_tokens_per_s == pytest.approx(prompt.sum() / span)
    assert report.generation_tokens_per_s_peak == pytest.approx(truth.generated.max() / truth.scrape_s)
    assert report.prefix_hit_rate_observed == pytest.approx(HIT_RATE, abs=0.002)
    assert prefix_reuse(trace) == pytest.approx(report.prefix_hit_rate_observed, abs=0.01)
    assert report.draft_acceptance == pytest.approx(truth.accepted.sum() / truth.drafted.sum())
    assert report.draft_acceptance == pytest.approx(ACCEPTED_PER_DRAFT, abs=0.01)
    assert report.running_max == SLOTS and report.queue_max == truth.deferred.max()
    assert report.running_mean == pytest.approx(truth.running.mean())
    assert report.queued_share == pytest.approx(float((truth.deferred > 0).mean()))
    assert report.concurrency_mean_observed == pytest.approx((truth.running + truth.deferred).mean())
    # arrivals: each step's generation tokens ÷ the mean output length, rounded down or up
    expected = truth.generated / truth.output_mean
    absolute = trace.arrivals() + truth.start
    per_step, _ = np.histogram(absolute, bins=np.concatenate([truth.times - truth.scrape_s, [truth.end]]))
    assert np.all((per_step == np.floor(expected)) | (per_step == np.ceil(expected)))
    assert report.requests_observed == pytest.approx(truth.arrivals.sum(), rel=1e-9)
    assert len(trace) == report.requests_synthesized
    # the burst is the busiest hour, one scrape late (generation tokens count at completion)
    burst_hour = datetime.fromtimestamp(truth.burst[0] + 1800, UTC).strftime("%Y-%m-%dT%H:00Z")
    assert report.busiest_hour is not None and abs(
        datetime.fromisoformat(report.busiest_hour[0].replace("Z", "+00:00")).timestamp()
        - datetime.fromisoformat(burst_hour.replace("Z", "+00:00")).timestamp()) <= 3600
    # lengths around the given means
    assert trace.column("input_tokens").mean() == pytest.approx(truth.prompt_mean, rel=0.1)
    assert trace.column("output_tokens").mean() == pytest.approx(truth.output_mean, rel=0.1)
    meta = trace.metadata
    assert meta.synthesized and "--mean-output-tokens" in meta.extra["provenance"]
    assert json.loads(meta.extra["recording"])["not_recovered"][0] == NAMES.missing + "."


def test_the_report_says_what_was_recovered_assumed_and_not(llamacpp_hours: tuple[str, LlamaTruth]) -> None:
    url, truth = llamacpp_hours
    report = _record(url, truth).report
    assert abs(report.lengths_disagreement) < 0.02
    assert report.prompt_mean_implied == pytest.approx(truth.prompt_mean, rel=0.02)
    recovered = " ".join(report.recovered)
    assert NAMES.generation_tokens in recovered and NAMES.running in recovered and NAMES.waiting in recovered
    assert "Draft acceptance: 65%" in recovered and "Prefix-cache hits: 60%" in recovered
    assumed = " ".join(report.assumed)
    assert "the given means agree with the series" in assumed and "exponential around the given means" in assumed
    assert report.not_recovered[0] == NAMES.missing + "."
    assert any("not a measured latency" in s for s in report.not_recovered)
    assert all(s.endswith(".") for s in (*report.recovered, *report.assumed, *report.not_recovered))
    lines = "\n".join(report.lines())
    assert re.search(rf"^unknown +{re.escape(NAMES.missing)}", lines, re.MULTILINE)
    assert re.search(r"^recovered +Prompt and generation token rates", lines, re.MULTILINE)


def test_a_wrong_mean_is_reported_as_a_disagreement(llamacpp_hours: tuple[str, LlamaTruth]) -> None:
    url, truth = llamacpp_hours
    report = _record(url, truth, input_mean=2 * truth.prompt_mean).report
    assert report.lengths_disagreement == pytest.approx(-0.5, abs=0.02)
    assert "(-50%)" in report.assumed[1] and "disagree" in report.assumed[1]


def test_series_are_detected_by_their_prefix(llamacpp_hours: tuple[str, LlamaTruth],
                                             one_day: tuple[str, Truth]) -> None:
    url, truth = llamacpp_hours
    sglang = "sglang:"
    with PrometheusClient(url) as client:
        assert holds_series(client, _window(truth), NAMES.prefix)
        assert not holds_series(client, _window(truth), sglang)
        assert not holds_series(client, _window(truth, '{job="nope"}'), NAMES.prefix)
    sglang_url, day = one_day
    with PrometheusClient(sglang_url) as client:
        window = RecordWindow(start=day.start, end=day.end, step=day.scrape_s)
        assert holds_series(client, window, sglang) and not holds_series(client, window, NAMES.prefix)


def _cli(url: str, truth: LlamaTruth, out: Path, *extra: str) -> int:
    return main(["record", "--prometheus", url, "--start", _iso(truth.start), "--end", _iso(truth.end),
                 "--selector", '{job="llama"}', "--step", f"{truth.scrape_s:g}s", *extra, "-o", str(out)])


def test_cli_detects_llamacpp_and_records(llamacpp_hours: tuple[str, LlamaTruth], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    url, truth = llamacpp_hours
    out = tmp_path / "prod.parquet"
    assert _cli(url, truth, out, "--mean-input-tokens", "700", "--mean-output-tokens", "200") == 0
    printed = capsys.readouterr().out
    assert f"Prometheus holds {NAMES.prefix} series and no sglang: ones under" in printed
    assert "recording llamacpp's" in printed and f"unknown    {NAMES.missing}." in printed
    assert len(read_trace(out)) > 1000
    assert main(["traffic", "show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert f"unknown: {NAMES.missing}." in shown
    assert f"arrivals from {NAMES.generation_tokens} ÷ 200 tokens" in shown


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ((), r"holds PREFIX series.*--mean-input-tokens and --mean-output-tokens must be given"),
        (("--runtime", "llamacpp", "--mean-input-tokens", "700"), r"no request counter.*--mean-output-tokens must"),
        (("--runtime", "sglang"), "no SGLang request counters"),
        (("--mean-input-tokens", "0.5", "--mean-output-tokens", "200"), "at least 1"),
    ],
    ids=["detected-without-means", "one-mean", "named-sglang", "mean-below-one"],
)
def test_cli_refusals_name_the_remedy(llamacpp_hours: tuple[str, LlamaTruth], tmp_path: Path,
                                      extra: tuple[str, ...], message: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    url, truth = llamacpp_hours
    out = tmp_path / "prod.parquet"
    assert _cli(url, truth, out, *extra) == 2
    err = capsys.readouterr().err
    assert "remedy:" in err and "Traceback" not in err
    assert re.search(message.replace("PREFIX", re.escape(NAMES.prefix)), err, re.DOTALL), err
    assert not out.exists()


def test_cli_refuses_means_for_sglang(one_day: tuple[str, Truth], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    url, day = one_day
    code = main(["record", "--prometheus", url, "--start", _iso(day.start), "--end", _iso(day.end),
                 "--mean-output-tokens", "200", "-o", str(tmp_path / "t.parquet")])
    assert code == 2
    err = capsys.readouterr().err
    assert "--mean-output-tokens apply to runtimes whose series carry no request lengths" in err and "remedy:" in err


def test_a_selector_matching_nothing_names_the_jobs_found(llamacpp_hours: tuple[str, LlamaTruth]) -> None:
    url, truth = llamacpp_hours
    from elsa_tune.errors import TrafficError

    with PrometheusClient(url) as client, pytest.raises(TrafficError, match='job="llama"') as raised:
        record_tokens(client, _window(truth, '{job="nope"}'), NAMES, GivenLengths(700, 200), runtime="llamacpp")
    assert "--selector" in raised.value.remedy
