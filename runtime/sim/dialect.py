"""``Dialect``: how the one simulated engine speaks a runtime family (its flags, boot log, endpoints, metrics).

The simulator has one engine (memory plan, performance, scheduling) written in one vocabulary of knobs. A dialect
reads a family's command line into those knobs (``read``), prints the family's boot log and deaths (``log``,
``boot``, ``started``, ``ready``), and exports the family's metric names (``metrics``) and endpoints
(``endpoints``). ``dialect(name)`` picks one by family name (``sglang``, ``vllm``); nothing else in the simulator
asks which family it serves.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TextIO

from elsa_tune.errors import ConfigError
from elsa_tune.runtime import sglang_flags
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.family import RuntimeFamily
from elsa_tune.runtime.family import family as family_of
from elsa_tune.runtime.sim import vllm_flags
from elsa_tune.runtime.sim.faults import Crash
from elsa_tune.runtime.sim.memory import MemoryPlan, SimCrash, plan_memory
from elsa_tune.runtime.sim.metrics import SglangMetrics
from elsa_tune.runtime.sim.profile import SimProfile
from elsa_tune.runtime.sim.startup import READY_LINE, Boot, ServerLog, uvicorn_bind_failed, uvicorn_started
from elsa_tune.runtime.sim.vllm_log import VllmBoot, VllmServerLog, bind_failed
from elsa_tune.runtime.sim.vllm_metrics import VllmMetrics
from elsa_tune.runtime.sim.vocabulary import EngineConfigError, VllmConfig, resolve
from elsa_tune.search_spaces.candidate import FlagValue

GIB = 1024**3
VLLM_ROUTES = frozenset({"/health", "/version", "/v1/models", "/v1/completions", "/v1/chat/completions", "/metrics",
                         "/reset_prefix_cache"})


@dataclass(frozen=True)
class Reading:
    """One launch read through a dialect: what was given, the engine's knobs, the plan, and a refusal if any.

    ``flags`` are the given flags in the family's own names (``Candidate`` style); ``knobs`` what the engine reads;
    ``refused`` the text of an error the runtime raises before any engine starts (vLLM's config builder), and
    ``refusal`` a boot crash the family adds to the plan's (vLLM: the KV cache cannot hold one ``max_model_len``).
    """

    flags: Mapping[str, FlagValue]
    knobs: Mapping[str, FlagValue]
    server_args: Mapping[str, Any]
    plan: MemoryPlan
    model: str
    served_name: str
    host: str
    port: int
    config: VllmConfig | None = None
    refused: str | None = None
    refusal: SimCrash | None = None
    non_default: Mapping[str, Any] = field(default_factory=dict)

    @property
    def boot_failure(self) -> SimCrash | None:
        return self.plan.boot_failure or self.refusal


@dataclass(frozen=True)
class Endpoints:
    """What the HTTP server reports as this family: version, ``owned_by``, routes, whether ``/metrics`` is on."""

    version: str
    owner: str
    routes: frozenset[str] | None
    metrics_on: bool


class BootWalk(Protocol):
    seconds: dict[str, float]

    def run(self) -> Crash | None: ...


class Dialect(Protocol):
    """How the simulated engine speaks one runtime family."""

    @property
    def name(self) -> str: ...

    @property
    def model_flag(self) -> str: ...

    @property
    def warms_up(self) -> bool:
        """Whether the server sends itself a generation before it is ready (SGLang's warm-up)."""
        ...

    @property
    def boot_exit_code(self) -> int | None:
        """The exit status of a server whose engine dies while booting (``None``: it SIGKILLs itself, -9)."""
        ...

    def family(self) -> RuntimeFamily: ...

    def parser(self, prog: str | None = None, *, add_help: bool = True) -> argparse.ArgumentParser: ...

    def add_arguments(self, parser: argparse.ArgumentParser, *, require_model: bool = True) -> None: ...

    def flag_shapes(self) -> dict[str, Any]:
        """Every flag name the simulated runtime takes (aliases included, no dashes) → its shape (``takes_value``,
        ``kind``, ``choices``), for checking a space or a flag file before any boot."""
        ...

    def given(self, namespace: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
        """The runtime's arguments that were given, by their parser destination."""
        ...

    def read(self, profile: SimProfile, given: Mapping[str, Any], env: Mapping[str, str]) -> Reading: ...

    def usage_error(self, message: str) -> str:
        """What the runtime prints when its parser refuses a command line (exit 2)."""
        ...

    def log(self, stream: TextIO | None = None, *, pid: int | None = None) -> ServerLog: ...

    def boot(self, log: ServerLog, profile: SimProfile, reading: Reading, sleep: Callable[[float], None],
             crash_at: Callable[[str], Crash | None], on_memory: Callable[[float], None]) -> BootWalk: ...

    def refuse(self, log: ServerLog, reading: Reading) -> None:
        """Print ``reading.refused`` as the runtime does when it refuses a configuration before any engine."""
        ...

    def started(self, log: ServerLog, walk: BootWalk, host: str, port: int) -> None: ...

    def bind_failed(self, log: ServerLog, host: str, port: int) -> None: ...

    def ready(self, log: ServerLog) -> None: ...

    def metrics(self, reading: Reading) -> SglangMetrics | VllmMetrics: ...

    def endpoints(self, profile: SimProfile) -> Endpoints: ...


class SGLangDialect:
    """SGLang 0.5.23: its flags are the engine's knobs, its log is ``startup.py``'s, its metrics ``sglang:``."""

    name = "sglang"
    model_flag = "model-path"
    warms_up = True
    boot_exit_code: int | None = None   # kill_process_tree: SIGKILL

    def family(self) -> RuntimeFamily:
        return family_of("sglang")

    def parser(self, prog: str | None = None, *, add_help: bool = True) -> argparse.ArgumentParser:
        built = argparse.ArgumentParser(prog=prog or "sglang.launch_server", add_help=add_help)
        self.add_arguments(built, require_model=False)
        return built

    def add_arguments(self, parser: argparse.ArgumentParser, *, require_model: bool = True) -> None:
        sglang_flags.add_sglang_arguments(parser, require_model=require_model)

    def flag_shapes(self) -> dict[str, Any]:
        return {name[2:]: spec for spec in sglang_flags.sglang_flags() for name in spec.names}

    def given(self, namespace: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
        values = vars(namespace) if isinstance(namespace, argparse.Namespace) else dict(namespace)
        known = {spec.dest for spec in sglang_flags.sglang_flags()}
        return {k: v for k, v in values.items() if k in known}

    def read(self, profile: SimProfile, given: Mapping[str, Any], env: Mapping[str, str]) -> Reading:
        from elsa_tune.runtime.sim.launch import facts_from_plan

        flags = sglang_flags.requested_flags(given)
        plan = plan_memory(profile, flags, env)
        args = dict(facts_from_plan(profile, plan, sglang_flags.resolve_defaults(given)).server_args)
        model = str(args.get("model_path") or profile.model.served_name)
        return Reading(flags=flags, knobs=flags, server_args=args, plan=plan, model=model,
                       served_name=str(args.get("served_model_name") or model),
                       host=str(args.get("host") or "127.0.0.1"), port=int(args.get("port") or 30000))

    def usage_error(self, message: str) -> str:
        return f"usage: launch_server.py [-h] --model-path MODEL_PATH ...\nlaunch_server.py: error: {message}\n"

    def log(self, stream: TextIO | None = None, *, pid: int | None = None) -> ServerLog:
        return ServerLog(stream, millis=False if stream is not None else None)

    def boot(self, log: ServerLog, profile: SimProfile, reading: Reading, sleep: Callable[[float], None],
             crash_at: Callable[[str], Crash | None], on_memory: Callable[[float], None]) -> BootWalk:
        from elsa_tune.runtime.sim.launch import facts_from_plan

        return Boot(log, facts_from_plan(profile, reading.plan, dict(reading.server_args)), sleep, crash_at,
                    on_memory)

    def refuse(self, log: ServerLog, reading: Reading) -> None:
        log.info(str(reading.refused))

    def started(self, log: ServerLog, walk: BootWalk, host: str, port: int) -> None:
        uvicorn_started(log, host, port)

    def bind_failed(self, log: ServerLog, host: str, port: int) -> None:
        uvicorn_bind_failed(log, host, port)

    def ready(self, log: ServerLog) -> None:
        log.info(READY_LINE)

    def metrics(self, reading: Reading) -> SglangMetrics | VllmMetrics:
        plan = reading.plan
        metrics = SglangMetrics(reading.served_name)
        metrics.set_gauges({"max_total_num_tokens": plan.kv_tokens, "context_len": plan.context_len,
                            "page_size": plan.page_size, "num_pages": plan.kv_tokens // max(1, plan.page_size),
                            "weight_memory_usage_gb": plan.weights_gb, "kv_cache_memory_usage_gb": plan.kv_gb,
                            "startup_available_gpu_memory_gb": plan.available_gpu_mem_gb})
        for phase, gb in (("decode", plan.cuda_graph_gb * 0.8), ("prefill", plan.cuda_graph_gb * 0.2)):
            metrics.graph_memory.set({**metrics.sched, "phase": phase}, round(gb, 2))
        if plan.spec.on:
            metrics.set_gauges({"spec_num_steps": plan.spec.steps, "spec_num_draft_tokens": plan.spec.draft_tokens})
        return metrics

    def endpoints(self, profile: SimProfile) -> Endpoints:
        return Endpoints(version=profile.runtime_version, owner="sglang", routes=None, metrics_on=False)


class VllmDialect:
    """vLLM 0.33.0 (V1 engine): ``vllm serve``'s flags through ``vocabulary.resolve``, its V1 boot log, ``vllm:``
    metrics, no warm-up generation and no ready line of its own (readiness is ``/health``)."""

    name = "vllm"
    model_flag = "model"
    warms_up = False
    boot_exit_code: int | None = 1     # the API server raises "Engine core initialization failed" and exits 1

    def family(self) -> RuntimeFamily:
        return family_of("vllm")

    def parser(self, prog: str | None = None, *, add_help: bool = True) -> argparse.ArgumentParser:
        return vllm_flags.parser(prog or "vllm serve", add_help=add_help)

    def add_arguments(self, parser: argparse.ArgumentParser, *, require_model: bool = True) -> None:
        vllm_flags.add_vllm_arguments(parser)

    def flag_shapes(self) -> dict[str, Any]:
        return dict(vllm_flags.flag_shapes())

    def given(self, namespace: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
        return vllm_flags.given_args(namespace)

    def read(self, profile: SimProfile, given: Mapping[str, Any], env: Mapping[str, str]) -> Reading:
        flags = vllm_flags.requested_flags(given)
        model = str(given.get("model") or profile.model.served_name)
        served = given.get("served_model_name")
        served_name = str(served[0] if isinstance(served, list) and served else served or model)
        host, port = str(given.get("host") or "127.0.0.1"), int(given.get("port") or 8000)
        non_default = vllm_flags.non_default_args(given)
        try:
            config = resolve(profile, given)
        except EngineConfigError as exc:
            plan = plan_memory(profile, {}, env)
            return Reading(flags=flags, knobs={}, server_args=dict(given), plan=plan, model=model,
                           served_name=served_name, host=host, port=port, refused=exc.text,
                           non_default=non_default)
        knobs = dict(config.knobs)
        plan = plan_memory(profile, knobs, env)
        needed = config.max_num_seqs * plan.slots_per_request
        if profile.model.is_hybrid and plan.boots and 0 < needed < plan.mamba_slots:
            # vLLM keeps the linear-attention states of the running sequences in its KV budget, where SGLang sizes
            # a separate pool by a ratio: a pool larger than max_num_seqs requests' states is KV cache in vLLM
            knobs["max-mamba-cache-size"] = needed
            plan = plan_memory(profile, knobs, env)
        if config.auto_len and plan.boots and plan.kv_tokens < plan.context_len:
            fitted = max(config.block_size, plan.kv_tokens // config.block_size * config.block_size)
            knobs["context-length"] = fitted
            plan = plan_memory(profile, knobs, env)
        refusal = None
        free = profile.card.memory_gb - profile.card.context_overhead_gb
        requested = config.gpu_memory_utilization * profile.card.memory_gb
        if config.kv_cache_memory_bytes is None and requested > free:
            refusal = SimCrash(FailureKind.GPU_BUSY, "boot", (
                f"ValueError: Free memory on device cuda:0 ({free:.2f}/{profile.card.memory_gb:.2f} GiB) on startup "
                f"is less than desired GPU memory utilization ({config.gpu_memory_utilization}, {requested:.2f} GiB). "
                "Decrease GPU memory utilization or reduce GPU memory used by other processes.",))
        elif plan.boots and plan.kv_gb > 0 and plan.kv_tokens < plan.context_len and not config.auto_len:
            needed_gb = plan.context_len * plan.kv_bytes_per_token / GIB
            estimated = plan.kv_tokens // config.block_size * config.block_size
            refusal = SimCrash(FailureKind.NO_ROOM_FOR_KV, "boot", (
                f"ValueError: To serve at least one request with the model's max seq len ({plan.context_len}), "
                f"({needed_gb:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
                f"({plan.kv_gb:.2f} GiB). Based on the available memory, the estimated maximum model length is "
                f"{estimated}. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU "
                "backend) or decreasing `max_model_len` when initializing the engine. See https://docs.vllm.ai/en/"
                "latest/configuration/conserving_memory/ for more details.",))
        elif plan.boots and plan.first_generation_oom and config.capture_sizes:
            # vLLM captures its graphs after the KV cache is allocated: what the first generation would not find,
            # the capture does not find either
            refusal = SimCrash(FailureKind.CUDA_GRAPH_FAILED, "boot", (
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB. GPU 0 has a total "
                f"capacity of {profile.card.memory_gb:.2f} GiB of which 112.00 MiB is free. (during CUDA graph "
                "capture, capture_end)",))
        args = {**given, "model": model, "max_model_len": plan.context_len, "max_num_seqs": config.max_num_seqs,
                "max_num_batched_tokens": config.max_num_batched_tokens, "block_size": config.block_size,
                "gpu_memory_utilization": config.gpu_memory_utilization,
                "enable_prefix_caching": config.prefix_caching, "enable_chunked_prefill": config.chunked_prefill,
                "kv_cache_dtype": config.kv_cache_dtype, "enforce_eager": config.enforce_eager}
        return Reading(flags=flags, knobs=knobs, server_args=args, plan=plan, model=model, served_name=served_name,
                       host=host, port=port, config=replace(config, knobs=knobs), refusal=refusal,
                       non_default=non_default)

    def usage_error(self, message: str) -> str:
        return f"usage: vllm serve [-h] [model_tag] [options]\nvllm: error: {message}\n"

    def log(self, stream: TextIO | None = None, *, pid: int | None = None) -> ServerLog:
        return VllmServerLog(stream, pid=pid if pid is not None else (4242 if stream is not None else os.getpid()))

    def boot(self, log: ServerLog, profile: SimProfile, reading: Reading, sleep: Callable[[float], None],
             crash_at: Callable[[str], Crash | None], on_memory: Callable[[float], None]) -> BootWalk:
        from elsa_tune.runtime.sim.launch import model_class, phase_seconds

        assert isinstance(log, VllmServerLog) and reading.config is not None
        return VllmBoot(log, reading.config, reading.plan, reading.model, reading.served_name, reading.non_default,
                        model_class(profile.model.name, profile.model.is_hybrid), sleep, crash_at, on_memory,
                        phase_seconds(reading.plan))

    def refuse(self, log: ServerLog, reading: Reading) -> None:
        assert isinstance(log, VllmServerLog)
        log.line(f"non-default args: {dict(reading.non_default)!r}", where="startup.py:96")
        log.uvicorn("Traceback (most recent call last):")
        log.uvicorn('  File "/usr/local/lib/python3.12/site-packages/vllm/engine/arg_utils.py", line 1986, in '
                    "create_engine_config")
        for line in str(reading.refused).split("\n"):
            log.uvicorn(line)

    def started(self, log: ServerLog, walk: BootWalk, host: str, port: int) -> None:
        assert isinstance(walk, VllmBoot)
        walk.serving(host, port)

    def bind_failed(self, log: ServerLog, host: str, port: int) -> None:
        assert isinstance(log, VllmServerLog)
        bind_failed(log, host, port)

    def ready(self, log: ServerLog) -> None:
        return None   # vLLM 0.33.0 prints no ready line of its own: "Application startup complete." came before

    def metrics(self, reading: Reading) -> SglangMetrics | VllmMetrics:
        plan, config = reading.plan, reading.config
        metrics = VllmMetrics(reading.served_name, plan.context_len)
        if config is not None:
            blocks = plan.kv_tokens // max(1, config.block_size)
            metrics.set_cache_config({
                "block_size": config.block_size, "cache_dtype": config.kv_cache_dtype,
                "enable_prefix_caching": config.prefix_caching,
                "gpu_memory_utilization": config.gpu_memory_utilization, "num_gpu_blocks": blocks,
                "kv_cache_size_tokens": plan.kv_tokens,
                "kv_cache_max_concurrency": f"{plan.kv_tokens / max(1, plan.context_len):.2f}"})
        return metrics

    def endpoints(self, profile: SimProfile) -> Endpoints:
        return Endpoints(version=vllm_flags.VLLM_VERSION, owner="vllm", routes=VLLM_ROUTES, metrics_on=True)


SGLANG_DIALECT = SGLangDialect()
VLLM_DIALECT = VllmDialect()
_DIALECTS: dict[str, Dialect] = {"sglang": SGLANG_DIALECT, "vllm": VLLM_DIALECT}


def dialect(name: str) -> Dialect:
    """The dialect of family ``name`` (``sglang``, ``vllm``); ``ConfigError`` for a family the simulator lacks."""
    try:
        return _DIALECTS[name]
    except KeyError:
        raise ConfigError(f"the simulator does not speak the {name!r} runtime family",
                          remedy=f"use one of: {', '.join(_DIALECTS)}") from None
