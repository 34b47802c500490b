"""One simulated server process (SGLang or vLLM), from its command line to its exit.

``serve(options)`` does what ``python -m sglang.launch_server`` (or ``vllm serve``) does, in simulated time: read
the arguments through the family's dialect (``dialect.py``: the engine's knobs, the memory plan), print the boot
log phase by phase while the card's usage grows, bind the HTTP port, warm up where the family does, say it is
ready, then serve until SIGTERM. A configuration the runtime refuses before any engine (vLLM's config builder)
prints its error and exits 1. A scheduler death (a boot crash of the plan or of ``--sim-fault``, the first
generation's OOM, a crash under load) prints the family's lines and ends the process with SIGKILL, exactly like
SGLang's ``kill_process_tree``: the parent sees -9.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shlex
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from elsa_tune.runtime.sim.answers import Answerer, Damage, Knowledge
from elsa_tune.runtime.sim.card import CardLease, default_card_dir
from elsa_tune.runtime.sim.dialect import BootWalk, Dialect, Reading, dialect
from elsa_tune.runtime.sim.faults import Crash, Faults, serve_oom_crash
from elsa_tune.runtime.sim.memory import MemoryPlan
from elsa_tune.runtime.sim.noise import NoiseSettings, ServingNoise
from elsa_tune.runtime.sim.profile import SimProfile, load_profile
from elsa_tune.runtime.sim.server import ServedModel, SimHttpServer
from elsa_tune.runtime.sim.serving import Serving
from elsa_tune.runtime.sim.source import BLOCK_TOKENS, crash_of, engine_source
from elsa_tune.runtime.sim.startup import (
    MambaPool,
    ServerLog,
    StartupFacts,
    runtime_line,
)

log = logging.getLogger(__name__)

GIB = 1024**3
_TORCH_DTYPES = {"auto": "torch.bfloat16", "bf16": "torch.bfloat16", "bfloat16": "torch.bfloat16",
                 "fp8_e4m3": "torch.float8_e4m3fn", "fp8_e5m2": "torch.float8_e5m2", "mxfp8": "torch.float8_e4m3fn",
                 "nvfp4": "torch.float4_e2m1fn_x2", "fp4_mx_block16": "torch.float4_e2m1fn_x2"}


@dataclass(frozen=True)
class SimOptions:
    """The command line of ``elsa-tune sim serve``: the sim's own knobs and the runtime's arguments as given.

    ``given`` holds the runtime family's arguments that were given, by parser destination; ``family`` names the
    dialect the server speaks (``sglang``, ``vllm``).
    """

    profile: str
    given: dict[str, Any]
    family: str = "sglang"
    seed: int = 0
    fault: str | None = None
    speedup: float = 1.0
    card_dir: str | None = None
    quiet: bool = False                  # no boot drift, run noise or cold first pass
    argv: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


def serve(options: SimOptions) -> int:
    """Run one simulated server to its end. Returns the exit code, or never returns (SIGKILL on a crash)."""
    profile = load_profile(options.profile)
    faults = Faults.from_sources(options.fault)
    speaks = dialect(options.family)
    reading = speaks.read(profile, options.given, options.env)
    plan = reading.plan
    out = speaks.log()
    if reading.refused is not None:
        speaks.refuse(out, reading)
        return 1
    card_dir = Path(options.card_dir) if options.card_dir else default_card_dir(profile.card.name)
    lease = CardLease(card_dir)
    speedup = max(options.speedup, 1e-6)
    boot_started = time.monotonic()

    def die(crash: Crash, serving: bool) -> NoReturn:
        out.crash(crash, serving=serving)
        _exit_killed(lease, faults)

    def sleep(seconds: float) -> None:
        time.sleep(seconds * faults.slow_boot / speedup)

    failure = reading.boot_failure
    plan_crash = crash_of(failure) if failure else None

    def crash_at(phase: str) -> Crash | None:
        fault = faults.boot_crash_at(phase, plan.mem_fraction_static, plan.total_gb)
        if fault:
            return fault
        if plan_crash and plan_crash.phase == phase:
            return plan_crash
        return None

    walk = speaks.boot(out, profile, reading, sleep, crash_at, lambda gb: lease.set_used(int(gb * GIB)))
    try:
        crash = walk.run()
        if crash and speaks.boot_exit_code is not None:
            out.crash(crash, serving=False)
            return speaks.boot_exit_code
        if crash:
            die(crash, serving=False)
        host, port = reading.host, reading.port
        try:
            if faults.port_taken:
                raise OSError("simulated: port taken")
            sock = _bind(host, port)
        except OSError:
            speaks.bind_failed(out, host, port)
            _release(lease, faults)
            return 1
        lease.set_used(plan.gpu_used_bytes)
        return asyncio.run(_serve_async(options, profile, reading, speaks, walk, faults, out, lease, sock,
                                        speedup, boot_started, die))
    finally:
        _release(lease, faults)


async def _serve_async(options: SimOptions, profile: SimProfile, reading: Reading, speaks: Dialect, walk: BootWalk,
                       faults: Faults, out: ServerLog, lease: CardLease, sock: socket.socket, speedup: float,
                       boot_started: float, die: Any) -> int:
    plan, args, host, port = reading.plan, reading.server_args, reading.host, reading.port
    metrics = speaks.metrics(reading)
    settings = NoiseSettings.quiet() if options.quiet else _noise_settings(profile)
    noise = ServingNoise(settings, profile.noise.seed * 1_000_003 + options.seed)
    source = engine_source(profile, plan, reading.knobs, options.env,
                           random.Random(f"elsa-sim-engine:{options.seed}"))
    serving = Serving(source, noise=noise, metrics=metrics, server_log=out, faults=faults, speedup=speedup,
                      decode_log_interval=int(args.get("decode_log_interval") or 40), hybrid=profile.model.is_hybrid,
                      on_crash=lambda crash: die(crash, True),
                      watchdog_timeout_s=float(args.get("watchdog_timeout") or 300.0),
                      draft_tokens=plan.spec.draft_tokens)
    damage = Damage.of(plan.quality_damage)
    endpoints = speaks.endpoints(profile)
    model = ServedModel(
        served_name=reading.served_name, model_path=reading.model, context_len=plan.context_len,
        max_total_num_tokens=plan.kv_tokens, max_running_requests=plan.max_running_requests,
        block_size=BLOCK_TOKENS, server_args=args,
        memory_usage={"weight": round(plan.weights_gb + plan.draft_weights_gb, 2), "kvcache": round(plan.kv_gb, 2),
                      "startup_available": round(plan.avail_after_load_gb, 2), "token_capacity": plan.kv_tokens,
                      "token_capacity_swa": None, "graph": {"decode": round(plan.cuda_graph_gb * 0.8, 2),
                                                            "prefill": round(plan.cuda_graph_gb * 0.2, 2)}},
        decode_graph_bs=_graph_bs(plan.cuda_graph_max_bs), speculative=plan.spec.on,
        enable_metrics=endpoints.metrics_on or bool(args.get("enable_metrics")),
        enable_cache_report=bool(args.get("enable_cache_report")),
        include_usage_default=bool(args.get("stream_response_default_include_usage")),
        damage=damage.wrong_share, cache_hit_damage=damage.cache_hit_share, host_hit_damage=damage.host_hit_share,
        damage_salt=damage.salt, answerer=Answerer(Knowledge.from_env(), profile.model.accuracy),
        image_max_tokens=profile.model.image_max_tokens if profile.model.is_vision else 0,
        image_workspace_gb=profile.model.image_workspace_gb, headroom_gb=plan.headroom_gb,
        seed=options.seed, version=endpoints.version, owner=endpoints.owner, routes=endpoints.routes,
        launch_command=shlex.join(options.argv) if options.argv else "",
        regimes=frozenset(profile.model.draft.acceptance) if profile.model.draft else frozenset())
    http = SimHttpServer(model, serving, metrics)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await asyncio.start_server(http.handle_connection, sock=sock, limit=1024 * 1024)
    loop_task = asyncio.create_task(serving.run())
    speaks.started(out, walk, host, port)
    try:
        warm = asyncio.create_task(_warmup(serving, out, faults, speedup) if speaks.warms_up
                                   else asyncio.sleep(0))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({warm, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not stop.is_set():
            http.ready = True
            http.startup_time = time.monotonic() - boot_started
            speaks.ready(out)
            if faults.crash_after_requests == 0:
                # "crash after 0 requests": the scheduler dies on its own shortly after readiness, a few real
                # seconds later so that a runtime's readiness check sees the server up first.
                loop.call_later(3.0, lambda: die(serve_oom_crash(), True))
            await stopping
    finally:
        for task in (warm, stopping):
            task.cancel()
        http.shutting_down = True
        out.raw("INFO:     Shutting down")
        server.close()
        loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await loop_task
        out.raw("INFO:     Finished server process [" + str(os.getpid()) + "]")
    return 0


async def _warmup(serving: Serving, out: ServerLog, faults: Faults, speedup: float) -> None:
    """SGLang's warm-up request (a short generate) before the ready line; a hung scheduler never finishes it."""
    await serving.warmup(_DEFAULT_WARMUP_S * faults.slow_boot / speedup)
    out.raw('INFO:     127.0.0.1:53470 - "GET /model_info HTTP/1.1" 200 OK')
    out.info(runtime_line("Prefill", [("#new-seq", 1), ("#new-token", 6), ("#cached-token", 0),
                                      ("token usage", 0.00), ("#running-req", 0), ("#queue-req", 0),
                                      ("#pending-token", 0), ("cuda graph", False),
                                      ("input throughput (token/s)", "0.00")]))


_DEFAULT_WARMUP_S = 0.5


def facts_from_plan(profile: SimProfile, plan: MemoryPlan, server_args: dict[str, Any]) -> StartupFacts:
    """What the boot log states, from the plan (the plan's resolved args win over the command line's)."""
    resolved = {**server_args, **plan.resolved_server_args}
    for key in ("host", "port", "model_path", "served_model_name"):
        if key in server_args:
            resolved[key] = server_args[key]
    model = profile.model
    mamba = None
    if model.is_hybrid and plan.mamba_slots > 0:
        state = plan.mamba_state_gb
        conv = state * 0.05
        inter = plan.mamba_intermediate_gb if plan.spec.on else None
        mamba = MambaPool(slots=plan.mamba_slots, conv_gb=conv, ssm_gb=state - conv,
                          intermediate_ssm_gb=inter * 0.9 if inter is not None else None,
                          intermediate_conv_gb=inter * 0.1 if inter is not None else None)
    kv_dtype = _TORCH_DTYPES.get(str(plan.kv_dtype), f"torch.{plan.kv_dtype}")
    return StartupFacts(
        server_args=resolved, total_gb=plan.total_gb, weights_gb=plan.weights_gb,
        model_class=model_class(model.name, model.is_hybrid), quant=_quant(model.name),
        kv_tokens=plan.kv_tokens, kv_dtype=kv_dtype, kv_gb=plan.kv_gb,
        avail_after_pools_gb=plan.avail_after_pools_gb, graph_gb=plan.cuda_graph_gb,
        available_gpu_mem_gb=plan.available_gpu_mem_gb, chunked_prefill_size=plan.chunked_prefill_size,
        max_prefill_tokens=plan.max_prefill_tokens, max_running_requests=plan.max_running_requests,
        context_len=plan.context_len, draft_weights_gb=plan.draft_weights_gb, draft_buffers_gb=plan.draft_buffers_gb,
        mamba=mamba, decode_graph_bs=_graph_bs(plan.cuda_graph_max_bs) if plan.cuda_graph_gb > 0 else (),
        prefill_graph_tokens=_graph_bs(plan.chunked_prefill_size) if plan.cuda_graph_gb > 0 else (),
        speculative=plan.spec.on, warnings=tuple(plan.warnings),
        phase_seconds=phase_seconds(plan))


def phase_seconds(plan: MemoryPlan) -> dict[str, float]:
    """Simulated seconds of each boot phase (weights, kv, graph) under ``plan``."""
    # Loading reads the checkpoint from disk (~1.6 GB/s); capture time grows with the captured batch sizes.
    return {"weights": 2.0 + (plan.weights_gb + plan.draft_weights_gb) / 1.6,
            "kv": 0.8 + plan.kv_gb * 0.05,
            "graph": 0.0 if plan.cuda_graph_gb <= 0 else 3.0 + 0.08 * plan.cuda_graph_max_bs * (
                2 if plan.spec.on else 1)}


def _graph_bs(max_bs: int) -> tuple[int, ...]:
    sizes = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512]
    chosen = tuple(s for s in sizes if s <= max_bs)
    return chosen if chosen and chosen[-1] == max_bs else (*chosen, max_bs) if max_bs > 0 else ()


def model_class(name: str, hybrid: bool) -> str:
    """The architecture class a runtime reports for a profile's model."""
    lowered = name.lower()
    if "qwen3.6" in lowered or "qwen3.8" in lowered or "qwen3.5" in lowered:
        return "Qwen3_5MoeForConditionalGeneration" if "a3b" in lowered else "Qwen3_5ForConditionalGeneration"
    return "Qwen3NextForCausalLM" if hybrid else "LlamaForCausalLM"


def _quant(name: str) -> str | None:
    lowered = name.lower()
    if "nvfp4" in lowered:
        return "modelopt_fp4"
    if "fp8" in lowered:
        return "fp8"
    return None


def _noise_settings(profile: SimProfile) -> NoiseSettings:
    n = profile.noise
    return NoiseSettings(boot_sigma=n.boot_sigma, run_sigma=n.run_sigma, first_pass_slowdown=n.first_pass_slowdown,
                         warm_requests=n.warm_requests, correlation_s=n.correlation_s)


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def _release(lease: CardLease, faults: Faults) -> None:
    if faults.gpu_not_released_s > 0:
        lease.hold(faults.gpu_not_released_s)
    else:
        lease.release()


def _exit_killed(lease: CardLease, faults: Faults) -> NoReturn:
    # kill_process_tree(os.getpid()) ends with SIGKILL on itself: the launcher's return code is -9.
    if faults.gpu_not_released_s > 0:
        lease.hold(faults.gpu_not_released_s)
    with contextlib.suppress(Exception):
        sys.stderr.flush()
        sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(137)   # unreachable: SIGKILL cannot be caught
