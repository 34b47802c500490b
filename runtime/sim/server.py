"""The simulated SGLang's HTTP server: SGLang's endpoints on a small asyncio HTTP/1.1 server.

Serves ``/health`` (= ``/health_generate``), ``/ready``, ``/server_info`` (and the deprecated
``/get_server_info``), ``/model_info``, ``/v1/models``, ``/metrics`` (only with ``--enable-metrics``),
``/flush_cache``, streaming and non-streaming ``/v1/completions`` and ``/v1/chat/completions`` (tool calls
included) and the native ``/generate``, with SGLang's response shapes and error texts, and the
sim-only ``/sim/clock`` (the simulated clock's knots, ``serving.SimClock``) and ``/sim/ack`` (a client's receipt).
A model with ``routes`` serves only those (the simulated vLLM: ``/health``, ``/version``, ``/v1/models``, the
OpenAI endpoints, ``/metrics`` and ``/reset_prefix_cache``) plus the sim-only ones; the rest answer 404.
Streams are SSE over chunked transfer encoding, ending with ``data: [DONE]`` (plumbing in ``http.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.sim.answers import Answerer, HostTier, image_tokens
from elsa_tune.runtime.sim.faults import Crash
from elsa_tune.runtime.sim.http import (
    HttpError,
    Request,
    chunk,
    error_body,
    read_request,
    require_post,
    send,
    send_json,
    write_event,
)
from elsa_tune.runtime.sim.metrics import SglangMetrics
from elsa_tune.runtime.sim.serving import Job, JobRejected, JobSpec, Serving
from elsa_tune.runtime.sim.tokens import Completion, block_hashes, chat_token_ids, text_token_ids
from elsa_tune.runtime.sim.vllm_metrics import VllmMetrics

log = logging.getLogger(__name__)

#: Header a client on this host sets to its ``time.monotonic()`` at send time (``traffic/sim_time.py``).
SENT_AT_HEADER = "x-elsa-sent-at"
SIM_AT_HEADER = "x-elsa-sim-at"
ACK_HEADER = "x-elsa-ack"
#: Sim-only: ``full`` asks for the full speed-up without stamping (a client that times deadlines, not latencies).
PACE_HEADER = "x-elsa-pace"
#: Sim-only headers of a closed-loop client: "I send my next request when this one ends" / "this is that request".
FOLLOW_UP_HEADER = "x-elsa-follow-up"
FOLLOWS_HEADER = "x-elsa-follows"


@dataclass(frozen=True)
class ServedModel:
    """What the endpoints report about the model and the boot."""

    served_name: str
    model_path: str
    context_len: int
    max_total_num_tokens: int
    max_running_requests: int
    block_size: int
    server_args: Mapping[str, Any]
    memory_usage: Mapping[str, Any]
    decode_graph_bs: tuple[int, ...]
    speculative: bool
    enable_metrics: bool
    enable_cache_report: bool
    include_usage_default: bool
    damage: float
    damage_salt: str
    seed: int
    launch_command: str
    version: str = "0.5.23"
    regimes: frozenset[str] = frozenset()     # content regimes the profile's draft acceptance knows
    cache_hit_damage: float = 0.0
    host_hit_damage: float = 0.0              # answers restored from the host tier (answers.py)
    answerer: Answerer | None = None          # what the model says (answers.py); None: tokens.py's default
    image_max_tokens: int = 0                 # tokens of the largest image; 0: the model has no vision
    image_workspace_gb: float = 0.0           # vision-encoder temporaries of the largest image
    headroom_gb: float = float("inf")         # memory outside the pools once serving (MemoryPlan.headroom_gb)
    owner: str = "sglang"                     # ``owned_by`` of /v1/models
    routes: frozenset[str] | None = None      # the endpoints the runtime serves (None: SGLang's, all of them)


class SimHttpServer:
    """Routes requests to handlers; one instance per simulated server process."""

    def __init__(self, model: ServedModel, serving: Serving, metrics: SglangMetrics | VllmMetrics) -> None:
        self.model = model
        self.serving = serving
        self.metrics = metrics
        self.ready = False
        self.shutting_down = False
        self.started_at = time.time()
        self.startup_time = 0.0
        self._ids = itertools.count()
        self.host_tier = HostTier() if model.host_hit_damage else None
        self._routes: dict[str, Callable[[Request, asyncio.StreamWriter], Awaitable[int]]] = {
            "/health": self._health, "/health_generate": self._health, "/ready": self._health,
            "/server_info": self._server_info, "/get_server_info": self._server_info,
            "/model_info": self._model_info, "/v1/models": self._models, "/metrics": self._metrics,
            "/flush_cache": self._flush_cache, "/v1/completions": self._completions,
            "/v1/chat/completions": self._chat_completions, "/generate": self._native_generate,
            "/sim/clock": self._sim_clock, "/sim/ack": self._sim_ack, "/version": self._version,
            "/reset_prefix_cache": self._flush_cache,
        }
        if model.routes is not None:
            self._routes = {path: handler for path, handler in self._routes.items()
                            if path in model.routes or path.startswith("/sim/")}

    # ---- connection handling ------------------------------------------------------------------------------

    async def handle_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await read_request(reader)
                if request is None:
                    break
                status = await self._dispatch(request, writer)
                if request.headers.get("connection", "").lower() == "close" or status < 0:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        except asyncio.CancelledError:
            pass   # the server is shutting down; this connection task is the top of its own stack
        finally:
            with contextlib.suppress(ConnectionError, RuntimeError):
                writer.close()

    async def _dispatch(self, request: Request, writer: asyncio.StreamWriter) -> int:
        handler = self._routes.get(request.path)
        endpoint = request.path if handler else "other"
        m = self.metrics
        with m.lock:
            m.http_requests.inc({"endpoint": endpoint, "method": request.method})
        try:
            if handler is None or (handler == self._metrics and not self.model.enable_metrics):
                status = await send_json(writer, 404, {"detail": "Not Found"})
            else:
                status = await handler(request, writer)
        except HttpError as exc:
            status = await send_json(writer, exc.status, error_body(exc.message, exc.err_type, exc.status))
        except json.JSONDecodeError as exc:
            status = await send_json(writer, 400, error_body(f"Invalid JSON body: {exc}", "BadRequestError", 400))
        with m.lock:
            m.http_responses.inc({"endpoint": endpoint, "method": request.method, "status_code": str(abs(status))})
        return status

    # ---- simple endpoints ---------------------------------------------------------------------------------

    async def _health(self, request: Request, writer: asyncio.StreamWriter) -> int:
        if not self.ready or self.shutting_down:
            return await send(writer, 503, b"", "text/plain; charset=utf-8")
        return await send(writer, 200, b"", "text/plain; charset=utf-8")

    async def _models(self, request: Request, writer: asyncio.StreamWriter) -> int:
        md = self.model
        card = {"id": md.served_name, "object": "model", "created": int(self.started_at), "owned_by": md.owner,
                "root": md.served_name, "parent": None, "max_model_len": md.context_len}
        return await send_json(writer, 200, {"object": "list", "data": [card]})

    async def _version(self, request: Request, writer: asyncio.StreamWriter) -> int:
        return await send_json(writer, 200, {"version": self.model.version})

    async def _model_info(self, request: Request, writer: asyncio.StreamWriter) -> int:
        return await send_json(writer, 200, {"model_path": self.model.model_path,
                                              "tokenizer_path": self.model.model_path, "is_generation": True,
                                              "preferred_sampling_params": None, "weight_version": "default",
                                              "has_image_understanding": False, "has_audio_understanding": False,
                                              "model_type": "simulated", "architectures": ["Simulated"]})

    async def _server_info(self, request: Request, writer: asyncio.StreamWriter) -> int:
        return await send_json(writer, 200, self.server_info())

    def server_info(self) -> dict[str, Any]:
        md = self.model
        internal: dict[str, Any] = {**md.server_args, "world_size": 1,
                                    "effective_max_running_requests_per_dp": md.max_running_requests,
                                    "last_gen_throughput": self.serving.last_gen_throughput,
                                    "memory_usage": dict(md.memory_usage), "disaggregation_mode": "null",
                                    "decode_cuda_graph_bs": list(md.decode_graph_bs),
                                    "decode_cuda_graph_memory_gb": md.memory_usage.get("graph", {}).get("decode", 0.0)}
        if md.speculative:
            internal["avg_spec_accept_length"] = self.serving.avg_spec_accept_length
        return {**md.server_args, "launch_command": md.launch_command, "status": "ready" if self.ready else "starting",
                "max_total_num_tokens": md.max_total_num_tokens,
                "max_req_input_len": max_request_input(md.context_len, md.max_total_num_tokens),
                "startup_time": self.startup_time, "kv_events": None, "version": md.version, "frontend": "python",
                "internal_states": [internal],
                "simulated": {"sim_time_s": self.serving.sim_time_s,
                              "clock": {**self.serving.clock.describe(), **self.serving.plain.describe(),
                                        "plain_speedup": self.serving.plain_pace(time.monotonic())},
                              "pacing": self.serving.pacing.summary(),
                              "finished_requests": self.serving.finished_requests}}

    async def _sim_clock(self, request: Request, writer: asyncio.StreamWriter) -> int:
        """Sim-only: the simulated clock's knots since monotonic wall time ``since`` (``serving.SimClock``)."""
        try:
            since = float((request.query.get("since") or ["0"])[0] or 0)
        except ValueError as exc:
            raise HttpError(400, "since must be a number (time.monotonic() seconds)") from exc
        self.serving.clock_read(time.monotonic())
        return await send_json(writer, 200, self.serving.clock.describe(since))

    async def _sim_ack(self, request: Request, writer: asyncio.StreamWriter) -> int:
        """Sim-only: a client has received the first token, or the end, of the request it tagged ``key``."""
        key = (request.query.get("key") or [""])[0]
        return await send_json(writer, 200, {"acknowledged": self.serving.ack(key)})

    async def _metrics(self, request: Request, writer: asyncio.StreamWriter) -> int:
        body = self.metrics.render().encode()
        return await send(writer, 200, body, "text/plain; version=0.0.4; charset=utf-8")

    async def _flush_cache(self, request: Request, writer: asyncio.StreamWriter) -> int:
        timeout = float((request.query.get("timeout") or ["0"])[0] or 0)
        deadline = time.monotonic() + max(0.0, timeout)
        while self.serving.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.serving.flush_cache():
            if self.host_tier is not None:
                self.host_tier.clear()
            return await send(writer, 200, b"Cache flushed.\nPlease check backend logs for more details. "
                               b"(When there are running or waiting requests, the operation will not be performed.)\n",
                               "text/plain; charset=utf-8")
        return await send(writer, 400, b"Cache not flushed. Please check backend logs for more details. "
                           b"(When there are running or waiting requests, the operation will not be performed.)\n",
                           "text/plain; charset=utf-8")

    # ---- generation ---------------------------------------------------------------------------------------

    def _admit_images(self, images: Sequence[int]) -> None:
        """Images need the vision encoder's temporaries outside the pools; a largest-size image that does not
        fit kills the scheduler (a maximum-size image in a ~29K-token request can need 144 MiB more than
        the pools leave)."""
        md = self.model
        if not md.image_max_tokens:
            raise HttpError(400, "The model does not support image input.")
        need = sum(md.image_workspace_gb * t / md.image_max_tokens for t in images)
        if need > md.headroom_gb:
            self.serving.on_crash(Crash(FailureKind.OOM_UNDER_LOAD, "serve", (
                "Scheduler hit an exception: Traceback (most recent call last):",
                f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need * 1024:.2f} MiB. GPU 0 has "
                f"{max(0.0, md.headroom_gb) * 1024:.2f} MiB free (vision encoder, {sum(images)} image tokens).")))

    async def _completions(self, request: Request, writer: asyncio.StreamWriter) -> int:
        require_post(request)
        body = request.json()
        prompt = body.get("prompt")
        text: str | None = None
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            ids, text = _prompt_ids(prompt[0])
        elif isinstance(prompt, str):
            ids, text = text_token_ids(prompt), prompt
        else:
            raise HttpError(400, "prompt must be a string, a list of token ids, or a one-element list of either")
        return await self._generate(request, writer, body, ids, text, chat=False)

    async def _chat_completions(self, request: Request, writer: asyncio.StreamWriter) -> int:
        require_post(request)
        body = request.json()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HttpError(400, "messages must be a non-empty list")
        pairs = [(str(m.get("role", "user")), _content_text(m.get("content"))) for m in messages]
        ids = chat_token_ids(pairs)
        images = [image_tokens(part, self.model.image_max_tokens) for m in messages
                  if isinstance(m.get("content"), list) for part in m["content"]
                  if isinstance(part, dict) and part.get("type") == "image_url"]
        if images:
            self._admit_images(images)
            ids.extend(_IMAGE_PAD_ID for _ in range(sum(images)))
        tools = body.get("tools") if body.get("tool_choice") != "none" else None
        return await self._generate(request, writer, body, ids, pairs[-1][1], chat=True,
                                    tools=tools if isinstance(tools, list) else ())

    async def _generate(self, request: Request, writer: asyncio.StreamWriter, body: Mapping[str, Any],
                        ids: list[int], text: str | None, *, chat: bool,
                        tools: Sequence[Mapping[str, Any]] = ()) -> int:
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        default = self.model.context_len - len(ids) if chat else 16
        temperature = body.get("temperature")
        job = self._admit(request, body, ids, text, max_tokens=int(max_tokens) if max_tokens is not None else default,
                          temperature=float(temperature) if temperature is not None else 1.0,
                          ignore_eos=bool(body.get("ignore_eos")), stream=bool(body.get("stream")), tools=tools)
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage", self.model.include_usage_default))
        try:
            if job.streaming:
                return await self._stream(writer, job, chat=chat, include_usage=include_usage)
            await _until_done(job)
            if job.error is not None:
                raise HttpError(400, job.error)
            return await send_json(writer, 200, self._final_body(job, chat=chat))
        except (ConnectionError, asyncio.CancelledError):
            self.serving.abort(job.spec.rid)
            raise

    async def _native_generate(self, request: Request, writer: asyncio.StreamWriter) -> int:
        """SGLang's native ``/generate``: ``text`` or ``input_ids``, ``sampling_params``, cumulative streaming."""
        require_post(request)
        body = request.json()
        if isinstance(body.get("input_ids"), list):
            ids, text = [int(t) for t in body["input_ids"]], None
        elif isinstance(body.get("text"), str):
            ids, text = text_token_ids(body["text"]), body["text"]
        else:
            raise HttpError(400, "Either text or input_ids should be provided.")
        params = body.get("sampling_params") or {}
        temperature = params.get("temperature")
        job = self._admit(request, params, ids, text, max_tokens=int(params.get("max_new_tokens") or 128),
                          temperature=float(temperature) if temperature is not None else 1.0,
                          ignore_eos=bool(params.get("ignore_eos")), stream=bool(body.get("stream")))
        try:
            if not job.streaming:
                await _until_done(job)
                if job.error is not None:
                    raise HttpError(400, job.error)
                return await send_json(writer, 200, self._native_body(job))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                         b"server: uvicorn\r\ntransfer-encoding: chunked\r\n\r\n")
            first = True
            while True:
                n, done = await job.deliveries.get()
                if n and not done:
                    write_event(writer, self._native_body(job, final=False))
                    await writer.drain()
                    if first:
                        self.serving.first_token_written(job, time.monotonic())
                        first = False
                if done:
                    break
            write_event(writer, {"error": error_body(job.error, "BadRequestError", 400)} if job.error
                         else self._native_body(job))
            writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
            return 200
        except (ConnectionError, asyncio.CancelledError):
            self.serving.abort(job.spec.rid)
            raise

    def _native_body(self, job: Job, final: bool = True) -> dict[str, Any]:
        reason: dict[str, Any] | None = None
        if final:
            reason = ({"type": "length", "length": job.generated} if job.finish_reason == "length" else
                      {"type": "stop", "matched": 151645})
        meta: dict[str, Any] = {"id": job.spec.rid, "finish_reason": reason, "prompt_tokens": job.spec.input_tokens,
                                "completion_tokens": job.generated, "cached_tokens": job.cached_tokens,
                                "weight_version": "default",
                                "e2e_latency": (job.last_token_at or job.arrival_sim) - job.arrival_sim}
        if self.model.speculative and self.serving.spec_forwards:
            meta["spec_accept_length"] = self.serving.avg_spec_accept_length
        return {"text": job.completion.text(job.generated), "output_ids": [], "meta_info": meta}

    def _admit(self, request: Request, body: Mapping[str, Any], ids: list[int], text: str | None, *,
               max_tokens: int, temperature: float, ignore_eos: bool, stream: bool,
               tools: Sequence[Mapping[str, Any]] = ()) -> Job:
        """Validate like SGLang's tokenizer manager, decide the completion, and queue the job."""
        if not self.ready:
            raise HttpError(503, "The server is not ready yet.", "ServiceUnavailableError")
        md = self.model
        if len(ids) >= md.context_len:
            raise HttpError(400, f"The input ({len(ids)} tokens) is longer than the model's context length "
                                 f"({md.context_len} tokens).")
        if max_tokens + len(ids) > md.context_len:
            raise HttpError(400, f"Requested token count exceeds the model's maximum context length of "
                                 f"{md.context_len} tokens. You requested a total of {max_tokens + len(ids)} tokens: "
                                 f"{len(ids)} tokens from the input messages and {max_tokens} tokens for the "
                                 "completion. Please reduce the number of tokens in the input messages or the "
                                 "completion to fit within the limit.")
        limit = max_request_input(md.context_len, md.max_total_num_tokens)
        if len(ids) >= limit:
            raise HttpError(400, f"Input length ({len(ids)} tokens) exceeds the maximum allowed length ({limit} "
                                 "tokens). Use a shorter input or enable --allow-auto-truncate.")
        n = next(self._ids)
        completion = Completion.for_prompt(ids, text, damage=md.damage, damage_salt=md.damage_salt,
                                           stream_salt=0 if temperature == 0 else hash((md.seed, n)) & 0xFFFFFFFF,
                                           tools=tools, answerer=md.answerer)
        if ignore_eos and completion.tool_call is None:
            out, reason = max_tokens, "length"
        else:
            full = completion.natural_length(1 << 30)
            out = min(full, max_tokens)
            natural = "tool_calls" if completion.tool_call is not None else "stop"
            reason = natural if full <= max_tokens else "length"
        regime = _regime(request, body)
        if temperature > 0 and f"{regime}-sampled" in md.regimes:
            regime = f"{regime}-sampled"
        spec = JobSpec(rid=uuid.uuid4().hex, input_tokens=len(ids),
                       block_hashes=tuple(block_hashes(ids, md.block_size)), output_tokens=max(1, out), regime=regime)
        job = Job(spec=spec, completion=completion, finish_reason=reason, streaming=stream, created=time.monotonic(),
                  cache_hit_damage=md.cache_hit_damage, damage_salt=md.damage_salt, host_hit_damage=md.host_hit_damage,
                  follow_up=FOLLOW_UP_HEADER in request.headers, follows=FOLLOWS_HEADER in request.headers,
                  sent_at=_stamp(request, SENT_AT_HEADER), sim_at=_stamp(request, SIM_AT_HEADER),
                  ack_key=request.headers.get(ACK_HEADER), received_at=request.received_at,
                  full_pace=request.headers.get(PACE_HEADER) == "full")
        if self.host_tier is not None:
            job.host_restorable_tokens = self.host_tier.observe(spec.block_hashes) * md.block_size
        try:
            self.serving.submit(job)
        except JobRejected as exc:
            raise HttpError(400, str(exc)) from exc
        return job

    async def _stream(self, writer: asyncio.StreamWriter, job: Job, *, chat: bool, include_usage: bool) -> int:
        created = int(time.time())
        rid = job.spec.rid
        obj = "chat.completion.chunk" if chat else "text_completion"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                     b"cache-control: no-cache\r\nserver: uvicorn\r\ntransfer-encoding: chunked\r\n\r\n")
        if chat:
            first = {"id": rid, "object": obj, "created": created, "model": self.model.served_name,
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None, "matched_stop": None}], "usage": None}
            write_event(writer, first)
        sent = 0
        call = job.completion.tool_call if chat else None
        while True:
            n, done = await job.deliveries.get()
            # Drain what is already there: a slow reader gets the tokens in fewer, larger chunks, like SGLang.
            while not done and not job.deliveries.empty():
                more, done = job.deliveries.get_nowait()
                n += more
            if n:
                piece = "".join(job.completion.pieces(sent, n))
                sent += n
                last = done or sent >= job.spec.output_tokens
                reason = job.finish_reason if last else None
                delta: dict[str, Any] = {"content": piece}
                if call is not None:
                    fn: dict[str, Any] = {"arguments": piece}
                    tool: dict[str, Any] = {"index": 0, "function": fn}
                    if sent == n:
                        fn["name"] = call.name
                        tool.update(id=f"call_{rid[:24]}", type="function")
                    delta = {"content": None, "tool_calls": [tool]}
                choice: dict[str, Any] = ({"index": 0, "delta": delta, "logprobs": None,
                                           "finish_reason": reason, "matched_stop": None} if chat else
                                          {"index": 0, "text": piece, "logprobs": None, "finish_reason": reason,
                                           "matched_stop": None})
                write_event(writer, {"id": rid, "object": obj, "created": created,
                                      "model": self.model.served_name, "choices": [choice], "usage": None})
                await writer.drain()
                if sent == n:
                    self.serving.first_token_written(job, time.monotonic())
            if done:
                break
        if job.error is not None:
            write_event(writer, {"error": error_body(job.error, "BadRequestError", 400)})
        elif include_usage:
            write_event(writer, {"id": rid, "object": obj, "created": created, "model": self.model.served_name,
                                  "choices": [], "usage": self._usage(job)})
        writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        return 200

    def _usage(self, job: Job) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": job.spec.input_tokens, "total_tokens":
                                 job.spec.input_tokens + job.generated, "completion_tokens": job.generated,
                                 "prompt_tokens_details": None, "reasoning_tokens": 0}
        if self.model.enable_cache_report:
            usage["prompt_tokens_details"] = {"cached_tokens": job.cached_tokens}
        return usage

    def _final_body(self, job: Job, *, chat: bool) -> dict[str, Any]:
        text = job.completion.text(job.generated)
        call = job.completion.tool_call
        if chat:
            calls = None if call is None else [{"id": f"call_{job.spec.rid[:24]}", "index": 0, "type": "function",
                                                "function": {"name": call.name, "arguments": text}}]
            message = {"role": "assistant", "content": None if calls else text, "reasoning_content": None,
                       "tool_calls": calls}
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                                      "finish_reason": job.finish_reason, "matched_stop": None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": job.finish_reason,
                      "matched_stop": None}
            obj = "text_completion"
        return {"id": job.spec.rid, "object": obj, "created": int(time.time()), "model": self.model.served_name,
                "choices": [choice], "usage": self._usage(job)}


_IMAGE_PAD_ID = 151_655   # Qwen-VL's <|image_pad|>: one per image token


def _regime(request: Request, body: Mapping[str, Any]) -> str:
    """The content regime speculative acceptance depends on: the sim-only header ``x-sim-regime`` (real SGLang
    ignores it) or body field ``regime``, else ``tool`` when the request offers tools, else ``chat``."""
    explicit = request.headers.get("x-sim-regime") or body.get("regime")
    if explicit:
        return str(explicit)
    return "tool" if body.get("tools") else "chat"


async def _until_done(job: Job) -> None:
    while True:
        _, done = await job.deliveries.get()
        if done:
            return


def _stamp(request: Request, header: str) -> float | None:
    """A sim-only clock header (``x-elsa-sent-at``: the client's ``time.monotonic()`` at send time;
    ``x-elsa-sim-at``: the simulated instant it sent at; real SGLang ignores both), or ``None``."""
    raw = request.headers.get(header)
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def max_request_input(context_len: int, kv_tokens: int) -> int:
    """SGLang's ``max_req_input_len``: ``min(context_len - 1, kv_tokens - 1) - 5`` (``managers/tp_worker.py``)."""
    return min(context_len - 1, kv_tokens - 1) - 5


def _prompt_ids(prompt: str | list[int]) -> tuple[list[int], str | None]:
    if isinstance(prompt, str):
        return text_token_ids(prompt), prompt
    return [int(t) for t in prompt], None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""
