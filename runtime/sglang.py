"""``SGLANG``: the SGLang family (and its single-card forks) through the runtime-family seam.

Its startup log is read by ``runtime/startup_log.py``, its failures by ``runtime/classify.py`` and its flags
from ``python -m sglang.launch_server --help`` by ``runtime/flags.py``; ``/server_info`` (``/get_server_info``
before 0.5) is its info endpoint, and its ``/metrics`` series carry the ``sglang:`` prefix.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from elsa_tune.errors import RuntimeUnavailable, StudyError
from elsa_tune.runtime import classify as sglang_classify
from elsa_tune.runtime import flags as sglang_flags
from elsa_tune.runtime import startup_log
from elsa_tune.runtime.boot_report import BootReport
from elsa_tune.runtime.failure import Failure, FailureHints
from elsa_tune.runtime.family import Deployment, FamilyName, MetricNames, ReportSection
from elsa_tune.runtime.flags import FlagSet, read_command
from elsa_tune.search_spaces.candidate import Candidate

log = logging.getLogger(__name__)

_OWNED_FLAGS = ("host", "port")
_RECOGNISED = ("server_args=ServerArgs(", "server_args={", "sglang.launch_server", "sglang.srt.",
               startup_log.READY_LINE, "max_total_num_tokens=", "KV Cache is allocated")


class SGLangFamily:
    """SGLang 0.5.9–0.5.23 and its forks: ``python -m sglang.launch_server``."""

    name = FamilyName.SGLANG
    default_launch: tuple[str, ...] = ("python3", "-m", "sglang.launch_server")
    model_flag = "model-path"
    slots_flag = "max-running-requests"
    ready_line = startup_log.READY_LINE
    help_flag = "--help"
    help_env: Mapping[str, str] = {}
    metrics = MetricNames(
        prefix="sglang:", prompt_tokens="sglang:prompt_tokens_total",
        generation_tokens="sglang:generation_tokens_total", cached_prompt_tokens="sglang:cached_tokens_total",
        requests="sglang:num_requests_total", running="sglang:num_running_reqs", waiting="sglang:num_queue_reqs",
        kv_usage="sglang:token_usage", spec_draft_tokens=None, spec_accepted_tokens=None)

    deployment = Deployment(
        upstream_image="lmsysorg/sglang", container_launch=("python3", "-m", "sglang.launch_server"),
        config_use="python3 -m sglang.launch_server --config server-args.yaml (flags given after it override it)",
        service="sglang", display_name="SGLang", tag_per_version=True)

    def resolve_launch(self, launch: Sequence[str]) -> tuple[str, ...]:
        return tuple(launch)

    def installed_version(self, launch: Sequence[str]) -> str | None:
        """``sglang.__version__`` from the launch command's own interpreter (``python -m PACKAGE…`` launches)."""
        if len(launch) < 3 or launch[1] != "-m":
            return None
        package = launch[2].split(".")[0]
        try:
            done = subprocess.run([launch[0], "-c", f"import {package}; print({package}.__version__)"],
                                  capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeUnavailable(f"cannot ask {launch[0]} for the {package} version: {exc}",
                                     remedy="check the launch command (--launch) and its environment") from exc
        return done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else None

    def vocabulary_size(self, model_path: str | None) -> int | None:
        """``None``: a Hugging Face model folder's vocabulary is not read here (prompts use ids below 32,000)."""
        return None

    def argv(self, launch: Sequence[str], candidate: Candidate, host: str, port: int) -> list[str]:
        flags = {k: v for k, v in candidate.flags.items() if k not in _OWNED_FLAGS}
        dropped = sorted(set(candidate.flags) - set(flags))
        if dropped:
            log.warning("ignoring candidate flags %s: elsa-tune owns --host and --port", dropped)
        return [*launch, *Candidate(flags=flags).argv(), "--host", host, "--port", str(port)]

    def parse_help(self, text: str, source: str = "") -> FlagSet:
        return sglang_flags.parse_help(text, source)

    def read_flags(self, text: str) -> Candidate:
        """``--name value`` flags of an SGLang launch command (``python3 -m sglang.launch_server --page-size 32``)."""
        return Candidate(flags=read_command(text, canonical=str), label="log explain")

    def explain(self, report: BootReport) -> tuple[ReportSection, ...]:
        rows = (
            ("runtime version", _n(report.runtime_version)),
            ("KV pool (max_total_num_tokens)", _n(report.max_total_num_tokens)),
            ("running-request slots (effective)", _n(report.max_running_requests)),
            ("context length", _n(report.context_len)),
            ("chunked prefill / max prefill", f"{_n(report.chunked_prefill_size)} / {_n(report.max_prefill_tokens)}"),
            ("weights", _gb(report.weights_mem_gb)),
            ("KV cache", f"{_gb(report.kv_pool_gb)}, {_n(report.kv_pool_tokens)} tokens, dtype {_n(report.kv_dtype)}"),
            ("Mamba state", f"{_gb(report.mamba_pool_gb)}, {_n(report.mamba_cache_size)} slots"),
            ("CUDA graphs", _gb(report.cuda_graph_mem_gb)),
            ("GPU memory left after boot", _gb(report.available_gpu_mem_gb)),
            ("boot time", "—" if report.boot_seconds is None else f"{report.boot_seconds:.1f} s"),
        )
        return (ReportSection("Boot report (SGLang)", rows),)

    def boot_report(self, log_text: str, candidate: Candidate | None = None,
                    info: Mapping[str, Any] | None = None) -> BootReport:
        return startup_log.build_report(log_text, candidate, info)

    def server_info(self, client: httpx.Client, base_url: str, timeout_s: float) -> dict[str, Any] | None:
        for path in ("/server_info", "/get_server_info"):
            try:
                response = client.get(f"{base_url}{path}", timeout=timeout_s)
            except httpx.HTTPError as exc:
                log.debug("%s unavailable: %s", path, exc)
                continue
            if response.status_code == 200:
                try:
                    data = response.json()
                except ValueError:
                    return None
                return data if isinstance(data, dict) else None
        return None

    def classify(self, log_text: str, hints: FailureHints | None = None) -> Failure:
        return sglang_classify.classify(log_text, hints)

    def looks_failed(self, log_text: str) -> bool:
        return sglang_classify.looks_failed(log_text)

    def study_stopper(self, log_text: str) -> StudyError | None:
        return sglang_classify.study_stopper(log_text)

    def recognises(self, log_text: str) -> bool:
        return any(marker in log_text for marker in _RECOGNISED)


def _gb(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} GB"


def _n(value: Any) -> str:
    return "—" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


SGLANG = SGLangFamily()
