"""``VLLM``: vLLM's OpenAI-compatible server (``vllm serve``) through the runtime-family seam.

Its flags come from ``vllm serve --help=all`` (``runtime/vllm/flags.py``; checked in depth by vLLM's own parser
and engine config), its boot report from the startup log plus ``vllm:cache_config_info`` on ``/metrics``
(``startup_log.py``), its failures from the same log (``classify.py``). vLLM 0.33 prints no line once its HTTP
server listens, so readiness is ``/health`` alone (``ready_line`` is ``None``).

The model is named by the flag ``model`` (``Candidate.flags["model"]``, the key a ``--config`` YAML uses too):
when the launch command ends in ``serve`` (``vllm serve``, ``python -m vllm.entrypoints.cli.main serve``) it is
written as ``serve``'s positional argument, as vLLM asks (``--model`` after ``serve`` prints a deprecation
warning); after any other launch (a fork's ``python -m vllm.entrypoints.openai.api_server``) as ``--model``.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from elsa_tune.errors import StudyError
from elsa_tune.runtime.boot_report import BootReport
from elsa_tune.runtime.failure import Failure, FailureHints
from elsa_tune.runtime.family import Deployment, FamilyName, MetricNames, ReportSection
from elsa_tune.runtime.flags import FlagSet, read_command
from elsa_tune.runtime.vllm import classify as vllm_classify
from elsa_tune.runtime.vllm import flags as vllm_flags
from elsa_tune.runtime.vllm import startup_log
from elsa_tune.search_spaces.candidate import Candidate, FlagValue

log = logging.getLogger(__name__)

_OWNED_FLAGS = ("host", "port")
_VERSION = re.compile(r"^\s*(\d+\.\d+[\w.+-]*)\s*$", re.MULTILINE)
#: Lines only vLLM writes.
_RECOGNISED = re.compile(r"vLLM (?:API )?server version |non-default args: \{|LLM engine \(v[\w.+-]+\) with config:"
                         r"|KV cache size: [\d,]+ tokens|# (?:GPU|cuda) blocks: \d+|\[kv_cache_utils\.py:\d+\]"
                         r"|EngineCore_DP\d+ pid=|vllm serve: error:|usage: vllm |\[--max-num-seqs MAX_NUM_SEQS\]"
                         r"|Available KV cache memory: ")
#: The label names of ``vllm:cache_config_info`` the boot report reads.
_CACHE_INFO = re.compile(r'^vllm:cache_config_info\{(?P<labels>[^}]*)\}', re.MULTILINE)
_LABEL = re.compile(r'(?P<key>\w+)="(?P<value>(?:[^"\\]|\\.)*)"')


class VllmFamily:
    """vLLM 0.5–0.33 (V0 and V1 logs) and its forks: ``vllm serve``."""

    name = FamilyName.VLLM
    default_launch: tuple[str, ...] = ("vllm", "serve")
    model_flag = "model"
    slots_flag = "max-num-seqs"
    ready_line: str | None = None
    help_flag = "--help=all"
    help_env: Mapping[str, str] = vllm_flags.HELP_ENV
    metrics = MetricNames(
        prefix="vllm:", prompt_tokens="vllm:prompt_tokens_total", generation_tokens="vllm:generation_tokens_total",
        cached_prompt_tokens="vllm:prefix_cache_hits_total", requests="vllm:request_success_total",
        running="vllm:num_requests_running", waiting="vllm:num_requests_waiting", kv_usage="vllm:kv_cache_usage_perc",
        spec_draft_tokens="vllm:spec_decode_num_draft_tokens_total",
        spec_accepted_tokens="vllm:spec_decode_num_accepted_tokens_total",
        renamed={"vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
                 "vllm:gpu_prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
                 "vllm:gpu_prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
                 "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds"},
        prompt_includes_cached=True,
        missing="elsa-tune reads vLLM's token counters and gauges, not its request-length histograms: a workload "
                "recorded from /metrics recovers token rates, concurrency, prefix reuse and draft acceptance, not the "
                "prompt or output length distributions")

    deployment = Deployment(
        upstream_image="vllm/vllm-openai", container_launch=("vllm", "serve"),
        config_use="vllm serve --config server-args.yaml (flags given after it override it; the model is its "
                   "`model:` key)",
        service="vllm", display_name="vLLM", tag_per_version=True, model_positional=True)

    def resolve_launch(self, launch: Sequence[str]) -> tuple[str, ...]:
        return tuple(launch)

    def installed_version(self, launch: Sequence[str]) -> str | None:
        """``vllm --version`` of the launch command's program (``vllm serve`` → ``vllm --version``; ``python -m
        MODULE serve`` → ``python -c 'import vllm; print(vllm.__version__)'``), bounded, with the help's environment
        (the version is the same on every device); ``None`` when it cannot say."""
        if len(launch) >= 3 and launch[1] == "-m":
            argv = [launch[0], "-c", "import vllm; print(vllm.__version__)"]
        else:
            argv = [launch[0], "--version"]
        try:   # vLLM needs a device type to start at all: on a machine without a GPU, the help's
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False,
                                  stdin=subprocess.DEVNULL, env={**os.environ, **self.help_env})
        except (OSError, subprocess.TimeoutExpired):
            return None
        found = _VERSION.findall(done.stdout)
        return found[-1] if done.returncode == 0 and found else None

    def vocabulary_size(self, model_path: str | None) -> int | None:
        """``None``: a Hugging Face model folder's vocabulary is not read here (prompts use ids below 32,000)."""
        return None

    def argv(self, launch: Sequence[str], candidate: Candidate, host: str, port: int) -> list[str]:
        """``launch``, the model (positional after ``serve``, else ``--model``), the candidate's other flags under
        vLLM's names, then ``--host`` and ``--port`` (a candidate's are dropped: we own them)."""
        flags: dict[str, FlagValue] = {vllm_flags.canonical(k): v for k, v in candidate.flags.items()}
        owned = sorted(k for k in flags if k in _OWNED_FLAGS)
        if owned:
            log.warning("ignoring candidate flags %s: elsa-tune owns --host and --port", owned)
        kept = {k: v for k, v in flags.items() if k not in _OWNED_FLAGS}
        head = list(launch)
        model = kept.get(self.model_flag)
        if head and head[-1] == "serve" and isinstance(model, str):
            del kept[self.model_flag]
            head.append(model)
        return [*head, *Candidate(flags=kept).argv(), "--host", host, "--port", str(port)]

    def parse_help(self, text: str, source: str = "") -> FlagSet:
        return vllm_flags.parse_help(text, source)

    def read_flags(self, text: str) -> Candidate:
        """``vllm serve MODEL --max-num-seqs 8 -tp 2`` (or flags alone): the model after ``serve`` is ``model``;
        short spellings and ``_`` names become vLLM's long dashed names (``tp`` → ``tensor-parallel-size``)."""
        return Candidate(flags=read_command(text, canonical=vllm_flags.canonical, single_dash=True,
                                            positional_after="serve", positional_flag=self.model_flag),
                         label="log explain")

    def explain(self, report: BootReport) -> tuple[ReportSection, ...]:
        """The capacity (KV tokens, the printed maximum concurrency, the KV memory), the scheduler's limits, then
        the flags vLLM printed as received (``non-default args``)."""
        concurrency = ("—" if report.max_concurrency is None else
                       f"{report.max_concurrency:.2f}x at {_n(report.context_len)} tokens per request")
        slots = (_n(report.max_running_requests) if report.max_running_requests is not None
                 else "vLLM's default (the log does not print it)")
        rows = (
            ("runtime", f"vLLM {_n(report.runtime_version)}"),
            ("KV cache", f"{_n(report.max_total_num_tokens)} tokens, dtype {_n(report.kv_dtype)}"),
            ("maximum concurrency", concurrency),
            ("available KV cache memory", _gib(report.kv_pool_gb)),
            ("context (max_model_len)", _n(report.context_len)),
            ("max-num-seqs", slots),
            ("max-num-batched-tokens", _n(report.chunked_prefill_size)),
            ("weights", _gib(report.weights_mem_gb)),
            ("CUDA graphs", _gib(report.cuda_graph_mem_gb)),
            ("boot time", "—" if report.boot_seconds is None else f"{report.boot_seconds:.2f} s"),
        )
        received = tuple((f"--{vllm_flags.canonical(key)}", _received(value))
                         for key, value in report.server_args.items() if key != "model_tag")
        sections = [ReportSection("Boot report (vLLM)", rows)]
        if received:
            sections.append(ReportSection("Flags vLLM received (non-default args)", received))
        return tuple(sections)

    def boot_report(self, log_text: str, candidate: Candidate | None = None,
                    info: Mapping[str, Any] | None = None) -> BootReport:
        return startup_log.build_report(log_text, candidate, info)

    def server_info(self, client: httpx.Client, base_url: str, timeout_s: float) -> dict[str, Any] | None:
        """The labels of ``vllm:cache_config_info`` on ``/metrics`` under ``"cache_config"``, and the model's
        ``max_model_len`` from ``/v1/models``; ``None`` when neither answers."""
        merged: dict[str, Any] = {}
        try:
            response = client.get(f"{base_url}/metrics", timeout=timeout_s)
            if response.status_code == 200:
                labels = cache_config_info(response.text)
                if labels:
                    merged["cache_config"] = labels
        except httpx.HTTPError as exc:
            log.debug("/metrics unavailable: %s", exc)
        try:
            response = client.get(f"{base_url}/v1/models", timeout=timeout_s)
            if response.status_code == 200:
                data = response.json().get("data") or []
                if data and isinstance(data[0], dict) and "max_model_len" in data[0]:
                    merged["max_model_len"] = data[0]["max_model_len"]
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.debug("/v1/models unavailable: %s", exc)
        return merged or None

    def classify(self, log_text: str, hints: FailureHints | None = None) -> Failure:
        return vllm_classify.classify(log_text, hints)

    def looks_failed(self, log_text: str) -> bool:
        return vllm_classify.looks_failed(log_text)

    def study_stopper(self, log_text: str) -> StudyError | None:
        return vllm_classify.study_stopper(log_text)

    def recognises(self, log_text: str) -> bool:
        return _RECOGNISED.search(log_text) is not None


def _n(value: Any) -> str:
    return "—" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def _gib(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} GiB"


def _received(value: Any) -> str:
    return "(on)" if value is True else "(off)" if value is False else str(value)


def cache_config_info(exposition: str) -> dict[str, str]:
    """The labels of the first ``vllm:cache_config_info`` sample in a Prometheus text exposition (``{}`` if none)."""
    match = _CACHE_INFO.search(exposition)
    if match is None:
        return {}
    return {m["key"]: m["value"] for m in _LABEL.finditer(match["labels"])}


VLLM = VllmFamily()
