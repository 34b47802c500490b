"""``record`` from a live ``llama-server`` scraped by a live Prometheus: what the tool recovers against what was sent.

The tiny model serves on two slots; three clients send at least six requests each, and go on until the load has
lasted ``MIN_LOAD_S`` (fixed output lengths, prompts that share a prefix), so a third request waits while two run
over many scrapes however fast the host serves. Prometheus scrapes every second on loopback. Exact:
the token totals (generation, prompt = processed + cached, cached) against the responses' usage and timings,
and the requests derived from them with the means of what was sent. Concurrency: two slots at most, a request
waiting at some scrape, and the mean in flight within half a request of the clients' own count at the grid.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llamacpp_server import LlamaServer, running_llama_server, server_binary
from prometheus_backfill import PROMETHEUS, serving_prometheus

from elsa_tune.runtime.llamacpp.family import LLAMACPP
from elsa_tune.runtime.llamacpp.model import ModelKind, write_model
from elsa_tune.traffic.prometheus import PrometheusClient
from elsa_tune.traffic.recording import RecordWindow
from elsa_tune.traffic.token_recording import GivenLengths, record_tokens

NAMES = LLAMACPP.metrics
CLIENTS = 3
PER_CLIENT = 6
SLOTS = 2
MAX_TOKENS = 384
SCRAPE_S = 1.0
WAIT_S = 30.0
MIN_WINDOW_S = 15.0
MIN_LOAD_S = 8.0   # eight scrapes at least under load: a waiting request is in most of them on any host


def _sent(server: LlamaServer, client: int, out: list[dict[str, Any]], lock: threading.Lock, until: float) -> None:
    i = 0
    while i < PER_CLIENT or time.time() < until:
        prompt = f"the sky look blue at noon and red at sunset, said river {client} to the hill {i}"
        began = time.time()
        reply = server.post("/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                                                "ignore_eos": True}, timeout_s=WAIT_S)
        with lock:
            out.append({"began": began, "ended": time.time(), "usage": reply["usage"], "timings": reply["timings"]})
        i += 1


def _latest(prom: PrometheusClient, name: str | None) -> float | None:
    assert name is not None
    rows = prom.query(f'{name}{{job="llama"}}', time.time())
    return rows[0][1] if rows else None


def _until(what: str, condition: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {WAIT_S:g} s")
        time.sleep(0.2)


@pytest.mark.llamacpp
def test_a_workload_recorded_from_a_live_llama_server_matches_what_was_sent(tmp_path: Path) -> None:
    server_binary()   # skips with the reason when there is no llama-server
    if not shutil.which(PROMETHEUS) and not Path(PROMETHEUS).exists():
        pytest.skip("Debian's prometheus package is not installed")
    model = write_model(ModelKind.TINY, tmp_path / "tiny.gguf").path
    sent: list[dict[str, Any]] = []
    with running_llama_server(model, "--metrics", "-t", "2", log_dir=tmp_path, slots=SLOTS) as server:
        target = server.base_url.removeprefix("http://")
        config = (f"global:\n  scrape_interval: {SCRAPE_S:g}s\n  scrape_timeout: {SCRAPE_S:g}s\n"
                  f"scrape_configs:\n  - job_name: llama\n    static_configs:\n      - targets: ['{target}']\n")
        (tmp_path / "prom").mkdir()
        with serving_prometheus(tmp_path / "prom", config, timeout_s=WAIT_S) as url, PrometheusClient(url) as prom:
            _until("Prometheus scraped llama-server's /metrics", lambda: _latest(prom, NAMES.generation_tokens) == 0)
            start = time.time()
            time.sleep(2 * SCRAPE_S)   # idle scrapes before the load
            lock = threading.Lock()
            until = time.time() + MIN_LOAD_S
            clients = [threading.Thread(target=_sent, args=(server, c, sent, lock, until)) for c in range(CLIENTS)]
            for thread in clients:
                thread.start()
            for thread in clients:
                thread.join(timeout=6 * WAIT_S)
            assert not any(t.is_alive() for t in clients), "a client did not finish"
            assert len(sent) >= CLIENTS * PER_CLIENT
            generated = sum(r["usage"]["completion_tokens"] for r in sent)
            _until("Prometheus saw every generated token",
                   lambda: _latest(prom, NAMES.generation_tokens) == generated)
            # idle scrapes after it, and a window long enough for a rate curve (the load may take less)
            time.sleep(max(2 * SCRAPE_S, start + MIN_WINDOW_S - time.time()))
            end = time.time()
            prompt_tokens = [r["usage"]["prompt_tokens"] for r in sent]
            lengths = GivenLengths(mean_input_tokens=float(np.mean(prompt_tokens)),
                                   mean_output_tokens=generated / len(sent))
            recording = record_tokens(prom, RecordWindow(start=start, end=end, step=SCRAPE_S, selector='{job="llama"}'),
                                      NAMES, lengths, runtime="llamacpp", now=end)
    report = recording.report
    assert all(r["usage"]["completion_tokens"] == MAX_TOKENS for r in sent)
    assert report.generation_tokens == generated
    assert report.prompt_tokens == sum(prompt_tokens)   # processed + reused from the cache
    assert report.cached_prompt_tokens == sum(r["timings"]["cache_n"] for r in sent) > 0
    assert report.prefix_hit_rate_observed == pytest.approx(report.cached_prompt_tokens / sum(prompt_tokens))
    assert report.requests_observed == pytest.approx(len(sent)) and report.requests_from_prompt == pytest.approx(
        len(sent))
    assert abs(report.lengths_disagreement) < 1e-9 and "agree with the series" in report.assumed[1]
    steps = (end - start) / SCRAPE_S   # each rounds its share of a request at random: the total moves by ~√steps/2
    assert abs(len(recording.trace) - len(sent)) <= 2 * np.sqrt(steps)
    # concurrency: two slots, a third request waiting, the mean in flight as the clients saw it at the grid
    assert report.running_max == SLOTS and report.queue_max is not None and report.queue_max >= 1
    grid = RecordWindow(start=start, end=end, step=SCRAPE_S).checked(end)
    times = np.arange(grid.start, grid.end + SCRAPE_S / 2, SCRAPE_S) - SCRAPE_S / 2
    in_flight = np.asarray([sum(r["began"] <= t < r["ended"] for r in sent) for t in times], dtype=float)
    assert report.concurrency_mean_observed == pytest.approx(float(in_flight.mean()), abs=0.5)
    # what the series cannot say
    assert report.draft_acceptance is None
    assert report.not_recovered[0] == NAMES.missing + "."
    assert any("no speculative decoding ran" in s for s in report.not_recovered)
    assert any("not a measured latency" in s for s in report.not_recovered)

