"""The load generator against a real streaming HTTP server (``sse_stub``) on loopback."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sse_stub import Behaviour, StubServer

from elsa_tune.errors import MeasurementFailed
from elsa_tune.traffic.loadgen import LoadGenerator, LoadgenSettings, Timeouts
from elsa_tune.traffic.measurement import Outcome
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.traffic.trace import Trace, TraceMetadata, TraceRequest
from elsa_tune.traffic.workload import Workload, busiest_window, closed_loop, open_loop, synthetic

BS = 16
FAST = LoadgenSettings(timeouts=Timeouts(connect_s=5, first_token_s=5, stall_s=5, run_s=30))


@pytest.fixture(scope="module")
def server() -> Iterator[StubServer]:
    stub = StubServer().start()
    try:
        yield stub
    finally:
        stub.stop()


@pytest.fixture()
def stub(server: StubServer) -> StubServer:
    server.reset()
    server.plan = lambda body, n: Behaviour()
    return server


def _gen(stub: StubServer, slots: int | None = 8, settings: LoadgenSettings = FAST, seed: int = 0,
         kind: str = "streaming") -> LoadGenerator:
    settings = dataclasses.replace(settings, http_transport=kind)
    return LoadGenerator(stub.url, PromptSynth(BS, seed=seed), slots=slots, settings=settings)


# The behaviours that depend on the HTTP layer run over both transports: elsa-tune's and httpx's own.
@pytest.fixture(params=["streaming", "httpx"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _trace() -> Trace:
    # three sessions: each turn extends its session's previous prompt (Mooncake-style block hashes)
    reqs = []
    for i in range(12):
        session = i % 3
        n_in = 3 * BS + (i // 3) * BS + 5
        hashes = tuple(session * 1000 + j for j in range(-(-n_in // BS)))
        reqs.append(TraceRequest(arrival_s=i * 0.01, input_tokens=n_in, output_tokens=4 + i % 3, block_hashes=hashes,
                                 session=f"s{session}", temperature=0.5 if i % 2 else None))
    meta = TraceMetadata(schema_version=1, source="test", block_size=BS, start=None, end=None, synthesized=True)
    return Trace.from_requests(reqs, meta)


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_exact_lengths_and_request_fields_on_the_wire(stub: StubServer, kind: str) -> None:
    workload = closed_loop(_trace(), concurrency=4, n_requests=12)
    m = _gen(stub, kind=kind).measure(workload, 1)
    assert m.requests_ok == 12 and m.errors.count == 0
    by_len = sorted((len(r.body["prompt"]), r.body["max_tokens"]) for r in stub.received)
    assert by_len == sorted((s.input_tokens, s.output_tokens) for s in workload.requests)
    body = stub.received[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["model"] == "stub-model"
    assert {r.body.get("temperature") for r in stub.received} == {0.5, None}
    for rec in m.records:
        assert rec.output_tokens == rec.max_tokens and rec.output_tokens_source == "usage"
        assert rec.prompt_tokens_reported == rec.input_tokens
    assert m.prompt_token_mismatches == 0
    assert m.workload_id == workload.id and m.pass_index == 1
    assert m.model == "stub-model" and m.server_url == stub.url


def test_prefix_sharing_is_reproduced_exactly_on_the_wire(stub: StubServer) -> None:
    workload = closed_loop(_trace(), concurrency=1, n_requests=12)
    _gen(stub).measure(workload, 0)
    sent = [r.body["prompt"] for r in stub.received]
    specs = workload.requests
    for i in range(len(specs)):
        for j in range(i):
            shared_blocks = 0
            for a, b in zip(specs[i].block_hashes, specs[j].block_hashes, strict=False):
                if a != b:
                    break
                shared_blocks += 1
            full = min(specs[i].input_tokens, specs[j].input_tokens) // BS
            assert _common(sent[i], sent[j]) == min(shared_blocks, full) * BS


def test_same_pass_same_requests_fresh_pass_fresh_prompts(stub: StubServer) -> None:
    workload = closed_loop(_trace(), concurrency=3, n_requests=12)
    _gen(stub).measure(workload, 1)
    first = sorted(r.body["prompt"] for r in stub.received)
    stub.reset()                              # a fresh boot: empty prefix cache
    m1 = _gen(stub).measure(workload, 1)      # the other arm of an A/B: a new generator, same pass
    assert sorted(r.body["prompt"] for r in stub.received) == first
    received = len(stub.received)
    m2 = _gen(stub).measure(workload, 2)      # the next pass on the same boot
    second = sorted(r.body["prompt"] for r in stub.received[received:])
    assert not set(map(tuple, first)) & set(map(tuple, second))
    # pass 2 hits the cache exactly as much as pass 1 did on a cold cache: only the trace's own sharing
    assert m1.cached_token_ratio is not None and 0 < m1.cached_token_ratio < 0.7
    assert m2.cached_token_ratio == m1.cached_token_ratio
    # without fresh prompts the second pass is served from the prefix cache: the trap it avoids
    again = _gen(stub, settings=LoadgenSettings(timeouts=FAST.timeouts, fresh_prompts_per_pass=False))
    again.measure(workload, 2)
    warm = again.measure(workload, 3)
    assert warm.cached_token_ratio is not None and warm.cached_token_ratio > 0.9


def test_errors_are_recorded_per_request_and_summarised_apart(stub: StubServer, kind: str) -> None:
    def plan(body: dict[str, object], n: int) -> Behaviour:
        return {1: Behaviour(status=500), 2: Behaviour(disconnect_after=3), 3: Behaviour(error_in_stream_after=2),
                4: Behaviour(no_done=True)}.get(n % 10, Behaviour())

    stub.plan = plan
    workload = synthetic(20, 40, 8, 1, block_size=BS)
    m = _gen(stub, kind=kind).measure(workload, 0)
    by = {r.index: r for r in m.records}
    assert m.requests_ok == 12 and m.errors.count == 8
    assert m.errors.by_outcome == {"http_error": 2, "disconnected": 4, "server_error": 2}
    assert by[1].status_code == 500 and "injected failure" in by[1].error
    assert by[2].outcome is Outcome.DISCONNECTED and by[2].output_tokens == 3 and by[2].chunks == 3
    assert by[3].outcome is Outcome.SERVER_ERROR and "injected stream error" in by[3].error
    assert by[4].outcome is Outcome.DISCONNECTED and "DONE" in by[4].error
    assert m.output_tokens == 12 * 8                    # only successes count towards throughput
    assert m.errors.partial_output_tokens > 0
    assert m.ttft_s.n == 12


def test_timeouts_first_token_and_stall(stub: StubServer, kind: str) -> None:
    stub.plan = lambda body, n: {0: Behaviour(ttft_s=2.0), 1: Behaviour(stall_after=2, stall_s=2.0)}.get(n, Behaviour())
    settings = LoadgenSettings(timeouts=Timeouts(connect_s=2, first_token_s=0.4, stall_s=0.4, run_s=20),
                               max_error_fraction=0.9)
    m = _gen(stub, settings=settings, kind=kind).measure(synthetic(4, 40, 6, 1, block_size=BS), 0)
    by = {r.index: r for r in m.records}
    assert by[0].outcome is Outcome.TIMEOUT and by[0].timeout_phase == "first_token" and by[0].ttft_s is None
    assert by[1].outcome is Outcome.TIMEOUT and by[1].timeout_phase == "stall" and by[1].output_tokens == 2
    assert m.requests_ok == 2 and m.errors.by_timeout_phase == {"first_token": 1, "stall": 1}


def test_empty_or_failed_runs_raise_instead_of_reporting_zeros(stub: StubServer) -> None:
    stub.plan = lambda body, n: Behaviour(error_in_stream_after=0)
    with pytest.raises(MeasurementFailed, match="no successful output"):
        _gen(stub).measure(synthetic(4, 40, 6, 2, block_size=BS), 0)
    stub.plan = lambda body, n: Behaviour(status=503) if n % 4 else Behaviour()
    with pytest.raises(MeasurementFailed, match="HTTP 503"):
        _gen(stub).measure(synthetic(8, 40, 6, 2, block_size=BS), 0)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(MeasurementFailed, match="connect_error"):
        LoadGenerator(dead, PromptSynth(BS), slots=2, settings=FAST).measure(synthetic(2, 40, 6, 1, block_size=BS), 0)


def test_usage_missing_falls_back_to_chunk_counts(stub: StubServer) -> None:
    stub.plan = lambda body, n: Behaviour(include_usage=False, tokens_per_chunk=2)
    m = _gen(stub).measure(synthetic(2, 40, 10, 1, block_size=BS), 0)
    assert {r.output_tokens_source for r in m.records} == {"chunks"}
    assert {r.output_tokens for r in m.records} == {5}      # an undercount, and it says so
    assert m.cached_token_ratio is None


def test_concurrency_is_capped_at_the_slots(stub: StubServer) -> None:
    stub.plan = lambda body, n: Behaviour(ttft_s=0.05, itl_s=0.01)
    workload = synthetic(16, 40, 5, 8, block_size=BS)
    m = _gen(stub, slots=3).measure(workload, 0)
    assert stub.max_streams <= 3 and m.max_concurrency == 3 and m.concurrency_cap == 3
    assert m.above_slots is False and any("capped at the server's 3 slots" in n for n in m.notes)


def test_above_slots_only_when_the_workload_allows_it_and_then_flagged(stub: StubServer) -> None:
    stub.plan = lambda body, n: Behaviour(ttft_s=0.05, itl_s=0.01)
    workload = synthetic(16, 40, 5, 8, block_size=BS, allow_above_slots=True)
    m = _gen(stub, slots=3).measure(workload, 0)
    assert m.max_concurrency == 8 and m.above_slots is True and m.slots == 3
    assert "ABOVE THE RUNNING LIMIT" in m.describe()
    unknown = _gen(stub, slots=None).measure(synthetic(4, 40, 5, 2, block_size=BS), 0)
    assert unknown.above_slots is None and any("slots unknown" in n for n in unknown.notes)


def test_open_loop_sends_at_the_recorded_arrivals(stub: StubServer) -> None:
    reqs = [TraceRequest(arrival_s=t, input_tokens=40, output_tokens=3, block_hashes=(i, i + 100, i + 200))
            for i, t in enumerate([0.0, 0.1, 0.15, 0.4, 0.6, 0.9])]
    meta = TraceMetadata(schema_version=1, source="t", block_size=BS, start=None, end=None, synthesized=True)
    workload = open_loop(Trace.from_requests(reqs, meta), speed=1.0)
    m = _gen(stub).measure(workload, 0)
    arrived = sorted(r.at for r in stub.received)
    offsets = [a - arrived[0] for a in arrived]
    for got, want in zip(offsets, [0.0, 0.1, 0.15, 0.4, 0.6, 0.9], strict=True):
        assert got == pytest.approx(want, abs=0.05)
    assert all(r.queue_s is not None and r.queue_s < 0.05 for r in m.records)
    # a cap of one in flight makes later arrivals wait on the client, and the records say how long
    stub.plan = lambda body, n: Behaviour(ttft_s=0.15)
    capped = _gen(stub, slots=1).measure(workload, 1)
    assert max(r.queue_s or 0.0 for r in capped.records) > 0.1


def test_run_deadline_cuts_the_pass_and_is_reported(stub: StubServer) -> None:
    stub.plan = lambda body, n: Behaviour(ttft_s=5.0) if n == 9 else Behaviour()
    settings = LoadgenSettings(timeouts=Timeouts(connect_s=2, first_token_s=10, stall_s=10, run_s=1.0))
    t0 = time.perf_counter()
    m = _gen(stub, settings=settings).measure(synthetic(12, 40, 4, 1, block_size=BS), 0)
    assert time.perf_counter() - t0 < 4
    assert m.timed_out and m.requests_ok == 9 and m.requests_unsent == 2
    late = [r for r in m.records if not r.ok]
    assert len(late) == 1 and late[0].timeout_phase == "run_deadline"


def test_cancelling_a_run_closes_its_streams(stub: StubServer, kind: str) -> None:
    stub.plan = lambda body, n: Behaviour(ttft_s=0.01, itl_s=0.05)
    gen = _gen(stub, kind=kind)

    async def scenario() -> None:
        task = asyncio.create_task(gen.run(synthetic(6, 40, 200, 3, block_size=BS), 0))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    deadline = time.monotonic() + 5
    while stub._current and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stub._current == 0


def test_workload_and_prompt_block_sizes_must_agree(stub: StubServer) -> None:
    from elsa_tune.errors import ConfigError

    workload: Workload = synthetic(2, 40, 4, 1, block_size=32)
    with pytest.raises(ConfigError, match="block size"):
        _gen(stub).measure(workload, 0)


def test_busiest_window_of_the_real_mooncake_trace_hits_the_cache_exactly_as_its_hashes_say(
        stub: StubServer, shared_dir: Path) -> None:
    from elsa_tune.traffic.imports import import_trace

    trace = import_trace(shared_dir / "traces" / "mooncake_conversation_trace.jsonl", "mooncake").trace
    bs = trace.metadata.block_size
    workload = busiest_window(trace, duration_s=2.0, compress=30.0, max_requests=24)
    assert len(workload) == 24
    gen = LoadGenerator(stub.url, PromptSynth(bs), slots=1, settings=FAST)   # one at a time: a fixed cache order
    m = gen.measure(workload, 1)
    assert m.requests_ok == 24
    expected = 0
    specs = workload.requests
    for i, spec in enumerate(specs):
        best = 0
        for other in specs[:i]:
            shared = 0
            for a, b in zip(spec.block_hashes, other.block_hashes, strict=False):
                if a != b:
                    break
                shared += 1
            best = max(best, min(shared, spec.input_tokens // bs, other.input_tokens // bs))
        expected += best * bs
    cached = sum(r.cached_tokens or 0 for r in m.records)
    assert expected > 0 and cached == expected
    sent = sorted(len(r.body["prompt"]) for r in stub.received)
    assert sent == sorted(s.input_tokens for s in specs)


def test_kept_text_bootstraps_a_real_text_corpus(stub: StubServer, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from elsa_tune.traffic.prompts import CorpusTokens, TokenizerFile

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "t": 7}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    settings = dataclasses.replace(FAST, keep_text=True)
    m = _gen(stub, settings=settings).measure(synthetic(3, 40, 6, 1, block_size=BS, kind="code"), 0)
    assert [r.text for r in m.records] == [" t" * 6] * 3 and m.output_tokens == 18
    corpus = CorpusTokens.from_outputs(m.records, TokenizerFile(tmp_path))
    assert corpus.kinds == ("code",)
    assert set(PromptSynth(BS, corpus).prompt([1], BS + 3, unique_key=0, kind="code")) == {7}
    assert all(r.text is None for r in _gen(stub).measure(synthetic(2, 40, 3, 1, block_size=BS), 0).records)


def test_custom_transport_factory_serves_every_run(stub: StubServer) -> None:
    import httpx

    built: list[int] = []

    def factory(cap: int) -> httpx.AsyncBaseTransport:
        built.append(cap)
        return httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=cap))

    gen = LoadGenerator(stub.url, PromptSynth(BS), slots=2, settings=FAST, transport_factory=factory)
    for pass_index in (0, 1):
        assert gen.measure(synthetic(4, 40, 3, 4, block_size=BS), pass_index).requests_ok == 4
    assert built == [2, 2]


def test_a_corpus_without_the_workloads_regime_fails_before_sending(stub: StubServer) -> None:
    from elsa_tune.errors import TrafficError
    from elsa_tune.traffic.prompts import CorpusTokens

    gen = LoadGenerator(stub.url, PromptSynth(BS, CorpusTokens({"chat": [5, 6, 7]})), slots=2, settings=FAST)
    with pytest.raises(TrafficError, match="tool"):
        gen.measure(synthetic(4, 40, 3, 2, block_size=BS, kind="tool"), 0)
    assert stub.received == []
