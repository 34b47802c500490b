"""``best/``: the winner, ready to deploy — launch script, Compose service, flags, and what clients must know.

* ``launch.sh``: the exact command (environment included) the study measured, executable, every word
  shell-quoted.
* ``docker-compose.yml``: one service with the image, the GPU pinned by UUID, ports, the model volume,
  shared memory and the command.
* ``server-args.yaml``: the flags and environment as data.
* ``client.json`` / ``client.md``: the numbers clients must be told — the REAL ``max_total_num_tokens``
  and effective running slots from the winner's boots, not the declared ``--context-length`` (seed 004).

Everything is derived from the ``Report`` (history), never from a live server.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from elsa_tune.reports import units
from elsa_tune.reports.model import Report
from elsa_tune.search_spaces.candidate import Candidate

SCHEMA_VERSION = 1
DEFAULT_LAUNCH = ("python3", "-m", "sglang.launch_server")
CONTAINER_LAUNCH = ("python3", "-m", "sglang.launch_server")
HF_CACHE = "${HOME}/.cache/huggingface:/root/.cache/huggingface"


@dataclass(frozen=True)
class DeployBundle:
    """The files of ``best/``, as text. ``files()`` maps file names to (content, executable)."""

    candidate: Candidate
    launch_sh: str
    compose_yaml: str
    server_args_yaml: str
    client_json: str
    client_md: str

    def files(self) -> dict[str, tuple[str, bool]]:
        return {"launch.sh": (self.launch_sh, True), "docker-compose.yml": (self.compose_yaml, False),
                "server-args.yaml": (self.server_args_yaml, False), "client.json": (self.client_json, False),
                "client.md": (self.client_md, False)}


def winner_of(report: Report) -> Candidate | None:
    """The configuration to deploy: the study's incumbent, else the baseline seen in the boots."""
    if report.study is not None:
        return report.study.incumbent
    if report.baseline is not None:
        return report.baseline.candidate
    return None


def build_bundle(report: Report) -> DeployBundle | None:
    """The deploy files for the report's winner, or ``None`` when history holds no configuration at all."""
    candidate = winner_of(report)
    if candidate is None:
        return None
    return DeployBundle(candidate=candidate, launch_sh=launch_script(report, candidate),
                        compose_yaml=compose_file(report, candidate),
                        server_args_yaml=server_args_file(report, candidate),
                        client_json=json.dumps(client_facts(report), indent=2, sort_keys=True) + "\n",
                        client_md=client_text(report))


def server_argv(report: Report, candidate: Candidate, *, host: str | None = None) -> list[str]:
    """The candidate's flags plus what a deployment needs and the study set outside the candidate."""
    argv: list[str] = candidate.argv()
    fp = report.fingerprint
    if "model-path" not in candidate.flags and fp is not None and fp.model_path:
        argv = ["--model-path", fp.model_path, *argv]
    study = report.study
    if "host" not in candidate.flags:
        argv += ["--host", host or (study.host if study else "0.0.0.0")]
    if "port" not in candidate.flags:
        argv += ["--port", str(_port(report, candidate))]
    return argv


def launch_script(report: Report, candidate: Candidate) -> str:
    fp = report.fingerprint
    command = list(fp.launch_command) if fp is not None and fp.launch_command else list(DEFAULT_LAUNCH)
    lines = ["#!/usr/bin/env bash",
             f"# The winner of elsa-tune study {_comment(report.study_name)}: {_comment(report.summary_line())}",
             f"# Measured on: {_comment(fp.describe()) if fp else 'unknown setup'}",
             "# Regenerate with: elsa-tune report RUN_DIR", "set -euo pipefail", ""]
    if fp is not None and fp.gpu_uuid:
        lines.append(f"export CUDA_VISIBLE_DEVICES={shlex.quote(fp.gpu_uuid)}")
    lines += [f"export {_env_name(k)}={shlex.quote(v)}" for k, v in candidate.env.items()]
    words = [shlex.quote(w) for w in command + server_argv(report, candidate)]
    body = _wrap(words)
    lines += ["", "exec " + body + ' "$@"', ""]
    return "\n".join(lines)


def compose_file(report: Report, candidate: Candidate) -> str:
    fp = report.fingerprint
    study = report.study
    port = _port(report, candidate)
    image = (study.image if study and study.image else None) or (fp.image_digest if fp else None)
    note = ""
    if image is None:
        version = fp.runtime_version if fp and fp.runtime == "sglang" and fp.runtime_version else None
        image = f"lmsysorg/sglang:v{version}" if version else "lmsysorg/sglang:latest"
        note = ("# The study ran outside a container: the image below is the upstream one for the measured version;\n"
                "# use your own build if the study ran a patched one.\n")
    in_container = list(fp.launch_command) if fp and fp.image_digest and fp.launch_command else list(CONTAINER_LAUNCH)
    model = _model_path(report, candidate)
    volumes = [f"{model}:{model}:ro"] if model and model.startswith("/") else [HF_CACHE]
    device: dict[str, Any] = {"driver": "nvidia", "capabilities": ["gpu"]}
    if fp is not None and fp.gpu_uuid:
        device["device_ids"] = [fp.gpu_uuid]
    else:
        device["count"] = 1
    service: dict[str, Any] = {
        "image": image,
        "restart": "unless-stopped",
        "ipc": "host",
        "shm_size": study.shm_size if study else "32g",
        "ports": [f"{port}:{port}"],
        "volumes": volumes,
        "environment": dict(candidate.env),
        "command": in_container + server_argv(report, candidate, host="0.0.0.0"),
        "deploy": {"resources": {"reservations": {"devices": [device]}}},
        "healthcheck": {"test": ["CMD-SHELL", f"curl -fsS http://localhost:{port}/health || exit 1"],
                        "interval": "30s", "timeout": "10s", "retries": 3, "start_period": "900s"},
    }
    header = (f"# elsa-tune winner of study {_comment(report.study_name)} — {_comment(report.summary_line())}\n"
              f"# Measured on: {_comment(fp.describe()) if fp else 'unknown setup'}\n" + note)
    return header + yaml.safe_dump({"services": {"sglang": service}}, sort_keys=False, allow_unicode=True)


def server_args_file(report: Report, candidate: Candidate) -> str:
    header = (f"# Flags of the winner of elsa-tune study {_comment(report.study_name)} (SGLang names, no dashes).\n"
              f"# {_comment(report.summary_line())}\n")
    data = {"label": candidate.label, "candidate_key": candidate.key(), "flags": dict(candidate.flags),
            "env": dict(candidate.env), "argv": candidate.argv()}
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def client_facts(report: Report) -> dict[str, Any]:
    c = report.client
    fp = report.fingerprint
    candidate = winner_of(report)
    port = _port(report, candidate) if candidate else None
    return {
        "schema_version": SCHEMA_VERSION,
        "study": report.study_name,
        "served_model": _model_path(report, candidate) if candidate else None,
        "port": port,
        "max_total_num_tokens": c.max_total_num_tokens if c else None,
        "max_request_tokens": c.max_request_tokens if c else None,
        "max_running_requests": c.max_running_requests if c else None,
        "context_len": c.context_len if c else None,
        "declared_context_length": c.declared_context_length if c else None,
        "declared_max_running_requests": c.declared_max_running_requests if c else None,
        "measured_on_boots": list(c.boot_ids) if c else [],
        "fingerprint": fp.to_dict() if fp else None,
        "note": ("A request longer than max_request_tokens (prompt + output) fails at runtime; truncate on the "
                 "client. More than max_running_requests concurrent requests queue."),
    }


def client_text(report: Report) -> str:
    c = report.client
    lines = [f"# What clients of `{report.study_name}` must be told", ""]
    if c is None:
        return "\n".join([*lines, "Unknown: no successful boot of the winner reported its pools. Do not guess.", ""])
    declared = c.declared_context_length
    lines += [f"- **Largest request (prompt + output): {_n(c.max_request_tokens)} tokens.** "
              + (f"The server was launched with `--context-length {declared}`, but only "
                 f"{_n(c.max_total_num_tokens)} tokens fit in the KV pool (`max_total_num_tokens`). A client "
                 "that believes the declared number sends requests that fail at runtime instead of truncating."
                 if declared and c.max_request_tokens and declared > c.max_request_tokens else ""),
              f"- **Concurrent requests served at once: {_n(c.max_running_requests)}.**"
              + (f" ({c.declared_max_running_requests} were requested; the runtime clamped it.)"
                 if c.declared_max_running_requests not in (None, c.max_running_requests) else "")
              + " More queue.",
              f"- `context_len` reported by the server: {_n(c.context_len)}.",
              f"- Read from the startup logs of boots {', '.join(c.boot_ids)}.", ""]
    if report.fingerprint is not None and units.simulated(report.fingerprint.runtime):
        lines += [f"_{units.SIMULATED_TIME}._", ""]
    return "\n".join(lines)


def _model_path(report: Report, candidate: Candidate) -> str | None:
    value = candidate.flags.get("model-path")
    if isinstance(value, str) and value:
        return value
    return report.fingerprint.model_path if report.fingerprint else None


def _port(report: Report, candidate: Candidate) -> int:
    value = candidate.flags.get("port")
    if isinstance(value, (int, str)) and str(value).isdigit():
        return int(value)
    return report.study.port if report.study else 30000


def _wrap(words: Sequence[str]) -> str:
    lines: list[str] = []
    current = ""
    for w in words:
        if current and (w.startswith("--") or len(current) + len(w) > 100):
            lines.append(current)
            current = "  " + w
        else:
            current = f"{current} {w}" if current else w
    lines.append(current)
    return " \\\n".join(lines)


def _env_name(name: str) -> str:
    if not name.replace("_", "a").isalnum() or name[:1].isdigit():
        raise ValueError(f"environment variable name {name!r} is not valid in a shell")
    return name


def _comment(text: str) -> str:
    return " ".join(str(text).split())


def _n(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"
