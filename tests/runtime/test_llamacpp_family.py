"""``LLAMACPP`` through the runtime-family seam: launch argv, info endpoints, metric names, recognition."""

from __future__ import annotations

import json

import httpx
import pytest

from elsa_tune.runtime.family import FamilyName, family
from elsa_tune.runtime.llamacpp.family import LLAMACPP
from elsa_tune.search_spaces.candidate import Candidate


def test_family_lookup_and_constants() -> None:
    assert family("llamacpp") is LLAMACPP and LLAMACPP.name is FamilyName.LLAMACPP
    assert LLAMACPP.default_launch == ("llama-server",) and LLAMACPP.model_flag == "model"
    assert LLAMACPP.ready_line == "listening on http://"


def test_argv_long_names_owned_host_port_metrics_and_verbosity() -> None:
    candidate = Candidate(flags={"model": "m.gguf", "c": 4096, "np": 4, "flash-attn": "on", "no-kv-unified": True,
                                 "port": 1, "host": "0.0.0.0", "kv-unified": False})
    argv = LLAMACPP.argv(("/opt/llama-server",), candidate, "127.0.0.1", 30000)
    assert argv[0] == "/opt/llama-server"
    assert argv[-7:] == ["--host", "127.0.0.1", "--port", "30000", "--metrics", "-lv", "4"]
    body = argv[1:-7]
    assert body.count("--ctx-size") == 1 and body[body.index("--ctx-size") + 1] == "4096"
    assert body[body.index("--parallel") + 1] == "4" and "--no-kv-unified" in body and "--kv-unified" not in body
    assert "0.0.0.0" not in argv and "1" not in body


def test_argv_keeps_a_requested_verbosity_and_metrics_once() -> None:
    argv = LLAMACPP.argv(("llama-server",), Candidate(flags={"log-verbosity": 5, "metrics": True}), "h", 1)
    assert argv.count("--metrics") == 1 and "-lv" not in argv and argv[argv.index("--log-verbosity") + 1] == "5"


def test_metric_names_are_the_llamacpp_series() -> None:
    metrics = LLAMACPP.metrics
    assert metrics.prefix == "llamacpp:" and metrics.requests is None and metrics.kv_usage is None
    named = [metrics.prompt_tokens, metrics.generation_tokens, metrics.cached_prompt_tokens, metrics.running,
             metrics.waiting, metrics.spec_draft_tokens, metrics.spec_accepted_tokens]
    assert all(n is not None and n.startswith("llamacpp:") for n in named)
    assert "no request counter" in metrics.missing


def test_server_info_merges_props_and_slots() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/props":
            return httpx.Response(200, json={"total_slots": 2, "build_info": "b0-0c1e570"})
        if request.url.path == "/slots":
            return httpx.Response(200, content=json.dumps([{"id": 0, "n_ctx": 2048, "speculative": True}]))
        return httpx.Response(404)

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        info = LLAMACPP.server_info(client, "http://x", 1.0)
    assert info == {"total_slots": 2, "build_info": "b0-0c1e570",
                    "slots": [{"id": 0, "n_ctx": 2048, "speculative": True}]}


def test_server_info_is_none_when_nothing_answers() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with httpx.Client(transport=httpx.MockTransport(refuse)) as client:
        assert LLAMACPP.server_info(client, "http://x", 1.0) is None


@pytest.mark.parametrize("text", ["", "[2026-04-14 16:09:08 TP0] max_total_num_tokens=327310", "hello"])
def test_does_not_recognise_other_text(text: str) -> None:
    assert not LLAMACPP.recognises(text)
