"""``LLAMACPP``: llama.cpp's ``llama-server`` through the runtime-family seam.

Its flags come from ``llama-server --help`` (``runtime/llamacpp/flags.py``), its boot report from the ``-lv 4``
startup log plus ``/props`` and ``/slots`` (``startup_log.py``), its failures from the same log
(``classify.py``). Every launch gets ``--metrics`` (the ``/metrics`` endpoint is off by default) and ``-lv 4``
unless the candidate sets a verbosity (the default level prints none of the lines a boot report needs).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from elsa_tune.errors import StudyError
from elsa_tune.runtime.boot_report import BootReport
from elsa_tune.runtime.failure import Failure, FailureHints
from elsa_tune.runtime.family import Deployment, FamilyName, MetricNames, ReportSection
from elsa_tune.runtime.flags import FlagSet, read_command
from elsa_tune.runtime.llamacpp import classify as llamacpp_classify
from elsa_tune.runtime.llamacpp import flags as llamacpp_flags
from elsa_tune.runtime.llamacpp import startup_log
from elsa_tune.runtime.llamacpp.build import ENV_BINARY, cached_binary
from elsa_tune.runtime.llamacpp.log_lines import READY_LINE
from elsa_tune.search_spaces.candidate import Candidate, FlagValue

log = logging.getLogger(__name__)

_OWNED_FLAGS = ("host", "port")
#: Flags whose value is a file: a leading ``~`` is the user's home, as in a shell.
_PATH_FLAGS = frozenset({"model", "spec-draft-model", "model-draft", "lora", "mmproj"})
_VERSION = re.compile(r"version: (\S+) \((?:build \d+, commit )?(\w+)\)")
_VERBOSITY_FLAGS = ("log-verbosity", "log-verbose")
_REPORT_VERBOSITY = 4
#: Lines only llama-server (and llama.cpp's argument parser) writes.
_RECOGNISED = ("llama_server: initializing", "common_params_print_info:", "llama_context: n_ctx", "llama_kv_cache:",
               "llama_model_loader:", "srv    load_model:", "gguf_init_from_file", "error: invalid argument: ",
               "error while handling argument \"", "load_tensors:", "llama_init_from_model:")


class LlamaCppFamily:
    """llama.cpp's ``llama-server`` (built from commit 0c1e570 by ``runtime/llamacpp/build.py``)."""

    name = FamilyName.LLAMACPP
    default_launch: tuple[str, ...] = ("llama-server",)
    model_flag = "model"
    slots_flag = "parallel"
    ready_line = READY_LINE
    help_flag = "--help"
    help_env: Mapping[str, str] = {}
    metrics = MetricNames(
        prefix="llamacpp:", prompt_tokens="llamacpp:prompt_tokens_total",
        generation_tokens="llamacpp:tokens_predicted_total",
        cached_prompt_tokens="llamacpp:prompt_tokens_cached_total", requests=None,
        running="llamacpp:requests_processing", waiting="llamacpp:requests_deferred", kv_usage=None,
        spec_draft_tokens="llamacpp:spec_decode_num_draft_tokens_total",
        spec_accepted_tokens="llamacpp:spec_decode_num_accepted_tokens_total",
        missing="llama-server exports no request counter, no KV-usage gauge and no latency histograms: a workload "
                "recorded from /metrics recovers token rates, concurrency and draft acceptance, not the request "
                "rate, prompt or output length distributions, or latencies")

    deployment = Deployment(
        upstream_image="ghcr.io/ggml-org/llama.cpp:server-cuda", container_launch=("/app/llama-server",),
        config_use="llama-server reads no config file: launch.sh is the command; this file is the flag set that "
                   "`elsa-tune compare --a server-args.yaml` reads",
        service="llama-server", display_name="llama.cpp (llama-server)", tag_per_version=False)

    def resolve_launch(self, launch: Sequence[str]) -> tuple[str, ...]:
        """The bare ``llama-server`` runs the binary ``$ELSA_LLAMA_SERVER`` names, else the one on ``PATH``, else
        the build ``elsa-tune llamacpp setup`` cached (the CUDA build before the CPU one); any other launch as
        given."""
        if tuple(launch) != self.default_launch:
            return tuple(launch)
        named = os.environ.get(ENV_BINARY)
        if named:
            return (named,)
        if shutil.which(launch[0]):
            return tuple(launch)
        found = cached_binary()
        return (str(found),) if found is not None else tuple(launch)

    def installed_version(self, launch: Sequence[str]) -> str | None:
        """``<version> (<commit>)`` (``0.5.0-dev (0c1e570)``) from ``llama-server --version`` (bounded), or
        ``None`` when it cannot say."""
        try:
            done = subprocess.run([*launch, "--version"], capture_output=True, text=True, timeout=30, check=False,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
        match = _VERSION.search(done.stdout + done.stderr)
        return f"{match.group(1)} ({match.group(2)})" if match else None

    def vocabulary_size(self, model_path: str | None) -> int | None:
        """The length of the GGUF's ``tokenizer.ggml.tokens`` (read through its header; no tensor is loaded), or
        ``None`` when the file is missing or not a GGUF."""
        if not model_path:
            return None
        try:
            import gguf

            reader = gguf.GGUFReader(os.path.expanduser(model_path), "r")
            field = reader.fields.get("tokenizer.ggml.tokens")
        except (OSError, ValueError, ImportError) as exc:
            log.debug("cannot read the vocabulary of %s: %s", model_path, exc)
            return None
        return len(field.data) if field is not None else None

    def argv(self, launch: Sequence[str], candidate: Candidate, host: str, port: int) -> list[str]:
        """``launch``, the candidate's flags under their long names, ``--host``/``--port``, ``--metrics``, and
        ``-lv 4`` when the candidate sets no verbosity. A candidate's ``host``/``port`` are dropped (we own them);
        short spellings the family knows (``c``, ``np``, ``ngl``) are written as their long flag."""
        flags: dict[str, FlagValue] = {}
        for name, value in candidate.flags.items():
            canonical = llamacpp_flags.canonical(name)
            is_path = canonical in _PATH_FLAGS and isinstance(value, str)
            flags[canonical] = os.path.expanduser(value) if is_path and isinstance(value, str) else value
        owned = sorted(k for k in flags if k in _OWNED_FLAGS)
        if owned:
            log.warning("ignoring candidate flags %s: elsa-tune owns --host and --port", owned)
        kept = {k: v for k, v in flags.items() if k not in (*_OWNED_FLAGS, "metrics")}
        extra = ["--host", host, "--port", str(port), "--metrics"]
        if not any(kept.get(flag) not in (None, False) for flag in _VERBOSITY_FLAGS):
            extra += ["-lv", str(_REPORT_VERBOSITY)]
        elif _below_report_level(kept.get("log-verbosity")):
            log.warning("--log-verbosity %s hides the lines the boot report reads (it needs %d)",
                        kept["log-verbosity"], _REPORT_VERBOSITY)
        return [*launch, *Candidate(flags=kept).argv(), *extra]

    def parse_help(self, text: str, source: str = "") -> FlagSet:
        return llamacpp_flags.parse_help(text, source)

    def read_flags(self, text: str) -> Candidate:
        """llama-server launch flags (``-c 4096 -np 4 --flash-attn on``, or a whole command): single-dash spellings
        count as flags and known short spellings become their long name (``c`` → ``ctx-size``)."""
        return Candidate(flags=read_command(text, canonical=llamacpp_flags.canonical, single_dash=True),
                         label="log explain")

    def explain(self, report: BootReport) -> tuple[ReportSection, ...]:
        unified = {True: "one unified pool shared by all slots", False: "one share per slot", None: "—"}
        offload = ("—" if report.layers_offloaded is None
                   else f"{report.layers_offloaded}/{_n(report.layers_total)} layers on the GPU")
        rows = (
            ("runtime", f"llama-server {_n(report.runtime_version)}"),
            ("context per slot (n_ctx_seq)", _n(report.context_len)),
            ("slots (-np)", _n(report.max_running_requests)),
            ("context total (n_ctx)", _n(report.max_total_num_tokens)),
            ("KV cache", f"{_mib(report, 'kv', report.kv_pool_gb)}, {_n(report.kv_pool_tokens)} cells, "
                         f"type {_n(report.kv_dtype)}"),
            ("KV layout", unified[report.kv_unified]),
            ("weights", _mib(report, "model", report.weights_mem_gb)),
            ("offload", offload),
            ("speculative decoding", {True: "active", False: "off", None: "—"}[report.speculative]),
            ("boot time", "—" if report.boot_seconds is None else f"{report.boot_seconds:.2f} s"),
        )
        return (ReportSection("Boot report (llama.cpp)", rows),)

    def boot_report(self, log_text: str, candidate: Candidate | None = None,
                    info: Mapping[str, Any] | None = None) -> BootReport:
        return startup_log.build_report(log_text, candidate, info)

    def server_info(self, client: httpx.Client, base_url: str, timeout_s: float) -> dict[str, Any] | None:
        """``/props`` with ``/slots`` under ``"slots"``; ``None`` when neither answers with JSON."""
        merged: dict[str, Any] = {}
        for path in ("/props", "/slots"):
            try:
                response = client.get(f"{base_url}{path}", timeout=timeout_s)
            except httpx.HTTPError as exc:
                log.debug("%s unavailable: %s", path, exc)
                continue
            if response.status_code != 200:
                continue
            try:
                data = response.json()
            except ValueError:
                continue
            if path == "/props" and isinstance(data, dict):
                merged.update(data)
            elif path == "/slots" and isinstance(data, list):
                merged["slots"] = data
        return merged or None

    def classify(self, log_text: str, hints: FailureHints | None = None) -> Failure:
        return llamacpp_classify.classify(log_text, hints)

    def looks_failed(self, log_text: str) -> bool:
        return llamacpp_classify.looks_failed(log_text)

    def study_stopper(self, log_text: str) -> StudyError | None:
        return llamacpp_classify.study_stopper(log_text)

    def recognises(self, log_text: str) -> bool:
        return any(marker in log_text for marker in _RECOGNISED)


def _n(value: Any) -> str:
    return "—" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def _mib(report: BootReport, kind: str, gb: float | None) -> str:
    """The MiB llama.cpp printed for ``kind`` buffers (summed over devices), else ``gb`` in MiB."""
    printed = [b.mib for b in report.buffers if b.kind == kind]
    if printed:
        return f"{sum(printed):,.2f} MiB"
    return "—" if gb is None else f"{gb * 1024:,.2f} MiB"


def _below_report_level(value: FlagValue) -> bool:
    try:
        return value is not None and not isinstance(value, bool) and int(str(value)) < _REPORT_VERBOSITY
    except ValueError:
        return False


LLAMACPP = LlamaCppFamily()
