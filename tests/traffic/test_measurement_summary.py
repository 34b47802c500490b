from __future__ import annotations

import json

import pytest

from elsa_tune.errors import MeasurementFailed
from elsa_tune.traffic.measurement import Outcome, Percentiles, RequestRecord, RunMeasurement


def _ok(i: int, *, sent: float = 0.0, out: int = 100, ttft: float = 0.1, end: float = 1.1, cached: int | None = None,
        in_flight: int = 1) -> RequestRecord:
    return RequestRecord(index=i, kind="chat", input_tokens=200, max_tokens=out, scheduled_s=None, sent_s=sent,
                         outcome=Outcome.OK, ttft_s=ttft, end_s=end, output_tokens=out, output_tokens_source="usage",
                         chunks=out, itl_s=tuple([0.01] * (out - 1)), prompt_tokens_reported=200, cached_tokens=cached,
                         finish_reason="length", status_code=200, in_flight_at_send=in_flight)


def _failed(i: int, outcome: Outcome = Outcome.HTTP_ERROR, status: int | None = 500, partial: int = 0) -> RequestRecord:
    return RequestRecord(index=i, kind="chat", input_tokens=200, max_tokens=100, scheduled_s=None, sent_s=0.0,
                         outcome=outcome, status_code=status, error="boom", output_tokens=partial, end_s=0.05)


def _measure(records: list[RequestRecord], **kw: object) -> RunMeasurement:
    args: dict[str, object] = {"workload_id": "w", "pass_index": 1, "prompts_id": "p", "started_at": 0.0,
                               "ended_at": 2.0, "slots": 4, "concurrency_cap": 4}
    args.update(kw)
    return RunMeasurement.from_records(records, **args)  # type: ignore[arg-type]


def test_percentiles_of_nothing_are_none_not_zero() -> None:
    empty = Percentiles.of([])
    assert empty.n == 0 and empty.p50 is None and empty.p99 is None and empty.mean is None
    p = Percentiles.of([1.0, 2.0, 3.0, 4.0])
    assert p.p50 == 2.5 and p.max == 4.0


def test_throughput_is_output_over_the_window_and_errors_stay_apart() -> None:
    records = [_ok(0, sent=0.0, end=1.0), _ok(1, sent=0.5, end=2.0), _failed(2, partial=7)]
    m = _measure(records)
    assert m.window_s == 2.0
    assert m.output_tokens == 200 and m.output_throughput_tok_s == 100.0
    assert m.requests_ok == 2 and m.requests_total == 3
    assert m.errors.count == 1 and m.errors.by_status == {"500": 1} and m.errors.partial_output_tokens == 7
    assert m.ttft_s.n == 2 and m.itl_s.n == 198
    assert m.decode_tok_s.p50 == pytest.approx((99 / 0.9 + 99 / 1.4) / 2)   # median of the two per-request rates
    assert m.cached_token_ratio is None      # nobody reported cached tokens: unknown, not 0


def test_no_success_or_no_output_raises() -> None:
    with pytest.raises(MeasurementFailed, match="no successful output"):
        _measure([_failed(0), _failed(1, Outcome.DISCONNECTED, None)])
    zero = _ok(0, out=0)
    with pytest.raises(MeasurementFailed):
        _measure([zero])
    with pytest.raises(MeasurementFailed, match="no request"):
        _measure([])


def test_mostly_failed_raises_with_the_error_summary() -> None:
    records = [_ok(0), _failed(1), _failed(2), _failed(3, Outcome.TIMEOUT, None)]
    with pytest.raises(MeasurementFailed) as info:
        _measure(records)
    assert "3 of 4 requests failed" in info.value.message and "HTTP 500: 2" in info.value.message
    assert info.value.remedy
    # unsent requests count against the run too
    with pytest.raises(MeasurementFailed):
        _measure([_ok(0), _ok(1)], requests_unsent=3)
    assert _measure([_ok(0), _failed(1)]).requests_ok == 1     # half is not "mostly"


def test_above_slots_flag_and_unknown_slots() -> None:
    records = [_ok(i, in_flight=i + 1) for i in range(6)]
    assert _measure(records, slots=4).above_slots is True
    assert _measure(records, slots=6).above_slots is False
    assert _measure(records, slots=None).above_slots is None
    assert "ABOVE THE RUNNING LIMIT" in _measure(records, slots=4).describe()
    assert _measure(records).max_concurrency == 6


def test_cached_ratio_and_round_trip() -> None:
    m = _measure([_ok(0, cached=150), _ok(1, cached=50)], notes=("n1",))
    assert m.cached_token_ratio == pytest.approx(0.5)
    data = json.loads(json.dumps(m.to_dict()))
    again = RunMeasurement.from_dict(data)
    assert again == m
    assert again.records[0].outcome is Outcome.OK and again.schema_version == 1


def test_successes_per_content_regime() -> None:
    code = RequestRecord(index=9, kind="code", input_tokens=10, max_tokens=50, scheduled_s=None, sent_s=0.0,
                         outcome=Outcome.OK, ttft_s=0.2, end_s=0.7, output_tokens=50, chunks=10)
    m = _measure([_ok(0), _ok(1), code, _failed(2)])
    kinds = m.by_kind()
    assert set(kinds) == {"chat", "code"}
    assert kinds["chat"].requests_ok == 2 and kinds["chat"].output_tokens == 200
    assert kinds["code"].decode_tok_s.p50 == pytest.approx(49 / 0.5)
