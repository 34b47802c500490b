"""The simulated server as a process: SGLang's endpoints, SSE format, metrics, errors, log, determinism."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from elsa_tune.runtime.sim.launch import facts_from_plan
from elsa_tune.runtime.sim.memory import plan_memory
from elsa_tune.runtime.sim.profile import list_profiles, load_profile
from elsa_tune.runtime.startup_log import READY_LINE, build_report
from elsa_tune.search_spaces.candidate import Candidate

SPEEDUP = 50.0
FLAGS = ["--enable-metrics", "--enable-cache-report", "--max-running-requests", "4", "--moe-runner-backend", "cutlass"]


def pick_profile() -> str:
    names = list_profiles()
    for preferred in ("tiny-test", "rtx5090-qwen3.6-35b-a3b-nvfp4"):
        if preferred in names:
            return preferred
    if not names:
        pytest.skip("no simulation profile shipped yet")
    return names[0]


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    base_url: str
    log_path: Path
    profile: str

    def log(self) -> str:
        return self.log_path.read_text()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def boot(tmp: Path, profile: str, seed: int, flags: list[str], fault: str | None = None,
         timeout_s: float = 90.0) -> Running:
    port = free_port()
    log_path = tmp / f"server-{seed}-{port}.log"
    argv = [sys.executable, "-m", "elsa_tune", "sim", "serve", "--sim-profile", profile, "--sim-seed", str(seed),
            "--sim-speedup", str(SPEEDUP), "--sim-card-dir", str(tmp / "card"), "--model-path", "sim-model",
            "--port", str(port), *flags]
    if fault:
        argv += ["--sim-fault", fault]
    handle = log_path.open("wb")
    proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    handle.close()
    running = Running(proc, f"http://127.0.0.1:{port}", log_path, profile)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if READY_LINE in running.log() or proc.poll() is not None:
            break
        time.sleep(0.1)
    return running


def shutdown(running: Running) -> int:
    if running.proc.poll() is None:
        os.killpg(running.proc.pid, signal.SIGTERM)
    try:
        return running.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(running.proc.pid, signal.SIGKILL)
        return running.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    running = boot(tmp_path_factory.mktemp("sim-http"), pick_profile(), seed=3, flags=FLAGS)
    assert READY_LINE in running.log(), running.log()[-3000:]
    yield running
    assert shutdown(running) == 0


def sse_events(text: str) -> list[str]:
    assert text.endswith("\n\n")
    return [block.removeprefix("data: ") for block in text.strip().split("\n\n")]


def complete(server: Running, body: dict[str, object], path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=60, trust_env=False)


def test_health_models_and_server_info(server: Running) -> None:
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
    assert httpx.get(server.base_url + "/health_generate", timeout=10).status_code == 200
    models = httpx.get(server.base_url + "/v1/models", timeout=10).json()
    info = httpx.get(server.base_url + "/server_info", timeout=10).json()
    assert models["data"][0]["id"] == "sim-model"
    assert models["data"][0]["max_model_len"] == info["context_length"]
    assert info["max_total_num_tokens"] > 0 and info["version"] == "0.5.23"
    state = info["internal_states"][0]
    assert 0 < state["effective_max_running_requests_per_dp"] <= 4
    assert state["memory_usage"]["token_capacity"] == info["max_total_num_tokens"]
    assert info["enable_metrics"] is True and info["model_path"] == "sim-model"
    if info.get("speculative_algorithm"):
        assert "avg_spec_accept_length" in state


def test_streaming_completion_with_token_ids_is_sglang_sse(server: Running) -> None:
    body = {"model": "sim-model", "prompt": list(range(100, 400)), "max_tokens": 24, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    response = complete(server, body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text_chunks = [c for c in chunks if c["choices"]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in text_chunks[:-1])
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    assert usage["prompt_tokens"] == 300 and usage["completion_tokens"] == 24
    assert usage["total_tokens"] == 324 and "cached_tokens" in usage["prompt_tokens_details"]
    text = "".join(c["choices"][0]["text"] for c in text_chunks)
    assert text.startswith("The answer is")


def test_no_usage_chunk_unless_asked(server: Running) -> None:
    body = {"prompt": list(range(5, 50)), "max_tokens": 4, "ignore_eos": True, "stream": True}
    chunks = [json.loads(e) for e in sse_events(complete(server, body).text)[:-1]]
    assert all(c["choices"] for c in chunks) and all(c["usage"] is None for c in chunks)


def test_chat_completion_streaming_and_not(server: Running) -> None:
    messages = [{"role": "user", "content": "What is 12 + 30?"}]
    plain = complete(server, {"messages": messages, "max_tokens": 10, "temperature": 0}, "/v1/chat/completions")
    assert plain.status_code == 200
    data = plain.json()
    assert data["object"] == "chat.completion"
    assert data["choices"][0]["message"]["content"].startswith("The answer is 42.")
    streamed = complete(server, {"messages": messages, "max_tokens": 10, "temperature": 0, "stream": True},
                        "/v1/chat/completions")
    chunks = [json.loads(e) for e in sse_events(streamed.text)[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
        data["choices"][0]["message"]["content"]


def test_a_shared_prefix_is_reported_as_cached(server: Running) -> None:
    prefix = list(range(1000, 1512))
    first = complete(server, {"prompt": [*prefix, 1, 2, 3], "max_tokens": 2, "ignore_eos": True}).json()
    second = complete(server, {"prompt": [*prefix, 7, 8, 9], "max_tokens": 2, "ignore_eos": True}).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] < 256
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 256


def test_too_long_requests_get_400_with_sglangs_message(server: Running) -> None:
    info = httpx.get(server.base_url + "/server_info", timeout=10).json()
    n = info["context_length"]
    response = complete(server, {"prompt": [5] * n, "max_tokens": 1})
    assert response.status_code == 400
    assert response.json()["message"] == (f"The input ({n} tokens) is longer than the model's context length "
                                          f"({n} tokens).")
    response = complete(server, {"prompt": [5] * 10, "max_tokens": n})
    assert response.status_code == 400
    assert "Requested token count exceeds the model's maximum context length" in response.json()["message"]
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200


def test_metrics_have_sglangs_names(server: Running) -> None:
    complete(server, {"prompt": list(range(60)), "max_tokens": 3, "ignore_eos": True, "stream": True})
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    for name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total",
                 "sglang:time_to_first_token_seconds_bucket", "sglang:e2e_request_latency_seconds_bucket",
                 "sglang:inter_token_latency_seconds_bucket", "sglang:num_running_reqs", "sglang:token_usage",
                 "sglang:cached_tokens_total", "sglang:max_total_num_tokens", "sglang:http_requests_total"):
        assert name in text, name
    assert 'is_streaming="true"' in text


def test_flush_cache(server: Running) -> None:
    response = httpx.post(server.base_url + "/flush_cache", timeout=10)
    assert response.status_code == 200 and response.text.startswith("Cache flushed.")


def test_boot_log_reads_back_as_the_plan(server: Running) -> None:
    profile = load_profile(server.profile)
    flags = {"enable-metrics": True, "enable-cache-report": True, "max-running-requests": 4,
             "moe-runner-backend": "cutlass", "model-path": "sim-model"}
    plan = plan_memory(profile, flags, {})
    report = build_report(server.log(), Candidate(flags={"max-running-requests": 4}))
    assert report.max_total_num_tokens == plan.kv_tokens
    assert report.max_running_requests == plan.max_running_requests
    assert report.context_len == plan.context_len
    assert report.chunked_prefill_size == plan.chunked_prefill_size
    assert report.kv_pool_tokens == plan.kv_tokens
    assert report.available_gpu_mem_gb == pytest.approx(plan.available_gpu_mem_gb, abs=0.006)
    assert report.weights_mem_gb == pytest.approx(plan.weights_gb, abs=0.006)
    if profile.model.is_hybrid:
        assert report.mamba_cache_size == plan.mamba_slots
    facts = facts_from_plan(profile, plan, {})
    assert report.server_args["mem_fraction_static"] == facts.server_args["mem_fraction_static"]
    if plan.max_running_requests != 4:
        assert any(a.flag == "max-running-requests" for a in report.adjustments)


def test_greedy_outputs_are_identical_across_boots(server: Running, tmp_path: Path) -> None:
    prompts = [list(range(i * 50, i * 50 + 80)) for i in range(4)]

    def outputs(target: Running) -> list[str]:
        results: list[str] = [""] * len(prompts)

        def one(i: int) -> None:
            body = {"prompt": prompts[i], "max_tokens": 40, "temperature": 0}
            results[i] = complete(target, body).json()["choices"][0]["text"]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        return results

    other = boot(tmp_path, server.profile, seed=11, flags=FLAGS)
    try:
        assert READY_LINE in other.log(), other.log()[-2000:]
        assert outputs(other) == outputs(server)
    finally:
        shutdown(other)


@pytest.mark.slow
def test_port_taken_fails_like_uvicorn(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "elsa_tune", "sim", "serve", "--sim-profile", pick_profile(),
                               "--sim-speedup", "100", "--sim-card-dir", str(tmp_path), "--model-path", "m",
                               "--moe-runner-backend", "cutlass", "--port", str(port)],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert (f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
            "address already in use") in done.stderr


@pytest.mark.slow
def test_speculative_acceptance_depends_on_the_content_regime(tmp_path: Path) -> None:
    running = boot(tmp_path, "rtx5090-qwen3.6-35b-a3b-nvfp4", seed=2, flags=["--sim-config", "elsa-1.7"])
    try:
        assert READY_LINE in running.log(), running.log()[-2000:]

        def accept_after(regime: str) -> float:
            for i in range(4):
                httpx.post(running.base_url + "/v1/completions", headers={"x-sim-regime": regime}, timeout=60,
                           json={"prompt": list(range(i * 10, i * 10 + 40)), "max_tokens": 200, "ignore_eos": True,
                                 "temperature": 0}, trust_env=False)
            info = httpx.get(running.base_url + "/server_info", timeout=10).json()
            return float(info["internal_states"][0]["avg_spec_accept_length"])

        document = accept_after("document")
        assert 1.5 < document < 3.5
        assert accept_after("tool") > document   # cumulative since start, like SGLang's
    finally:
        shutdown(running)


WEATHER = {"type": "function", "function": {"name": "get_forecast", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}}


def test_tool_calls_stream_and_parse(server: Running) -> None:
    messages = [{"role": "user", "content": "What will the weather be in Lisbon for the next 3 days? Use the tool."}]
    body = {"messages": messages, "max_tokens": 64, "temperature": 0, "tools": [WEATHER]}
    plain = complete(server, body, "/v1/chat/completions").json()
    call = plain["choices"][0]["message"]["tool_calls"][0]
    assert plain["choices"][0]["finish_reason"] == "tool_calls"
    assert call["function"]["name"] == "get_forecast"
    assert json.loads(call["function"]["arguments"]) == {"city": "Lisbon", "days": 3}
    chunks = [json.loads(e) for e in sse_events(complete(server, {**body, "stream": True},
                                                          "/v1/chat/completions").text)[:-1]]
    parts = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if c["choices"][0]["delta"].get("tool_calls")]
    assert parts[0]["function"]["name"] == "get_forecast" and parts[0]["type"] == "function"
    assert "".join(p["function"]["arguments"] for p in parts) == call["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_needle_is_retrieved_from_a_long_prompt(server: Running) -> None:
    filler = "The ferry carried two hundred lanterns near the old pier. " * 200
    prompt = f"{filler}The access code for vault cobalt is 5512093. {filler}\n\nWhat is the access code for vault " \
             "cobalt? Reply with the number only."
    reply = complete(server, {"messages": [{"role": "user", "content": prompt}], "max_tokens": 12,
                              "temperature": 0}, "/v1/chat/completions").json()
    assert "5512093" in reply["choices"][0]["message"]["content"]


@pytest.mark.slow
def test_host_cache_race_spoils_answers_restored_from_the_host_tier(tmp_path: Path) -> None:
    # seeds 001/002: with the host-cache read race every answer restored from host memory is wrong
    running = boot(tmp_path, "rtx5090-qwen3.6-35b-a3b-nvfp4", seed=4,
                   flags=["--moe-runner-backend", "cutlass", "--enable-hierarchical-cache"])
    try:
        assert READY_LINE in running.log(), running.log()[-2000:]
        filler = "A beekeeper sorted a crate of maps as the wind turned. " * 100
        prompt = f"{filler}The access code for vault ember is 7301844.\n\nWhat is the access code for vault ember?"
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 8, "temperature": 0}

        def ask() -> str:
            return str(complete(running, body, "/v1/chat/completions").json()["choices"][0]["message"]["content"])

        assert "7301844" in ask()      # cold
        assert "7301844" in ask()      # a GPU prefix-cache hit is fine
        pool = httpx.get(running.base_url + "/server_info", timeout=10).json()["max_total_num_tokens"]
        for i in range(3):             # push the prefix out of the GPU pool into the host tier
            big = {"prompt": [1000 + i] * (pool // 2 - 64), "max_tokens": 1}
            assert complete(running, big).status_code == 200
        assert "7301844" not in ask()  # restored from host memory: wrong
    finally:
        shutdown(running)


def test_native_generate_streams_cumulative_text(server: Running) -> None:
    body = {"input_ids": list(range(40, 90)), "sampling_params": {"max_new_tokens": 12, "temperature": 0,
                                                                   "ignore_eos": True}}
    plain = httpx.post(server.base_url + "/generate", json=body, timeout=30, trust_env=False).json()
    assert plain["meta_info"]["completion_tokens"] == 12 and plain["meta_info"]["prompt_tokens"] == 50
    assert plain["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    streamed = httpx.post(server.base_url + "/generate", json={**body, "stream": True}, timeout=30, trust_env=False)
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    texts = [json.loads(e)["text"] for e in events[:-1]]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert texts[-1] == plain["text"]


def test_flush_cache_refuses_while_requests_run(server: Running) -> None:
    body = {"prompt": list(range(2000, 2100)), "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.Client(trust_env=False, timeout=60) as client, \
            client.stream("POST", server.base_url + "/v1/completions", json=body) as resp:
        lines = resp.iter_lines()
        next(lines)   # the request is running
        refused = client.post(server.base_url + "/flush_cache")
        assert refused.status_code == 400 and refused.text.startswith("Cache not flushed.")
        for _ in lines:
            pass
    assert httpx.post(server.base_url + "/flush_cache", timeout=10).status_code == 200
