"""``best/``: the winner, ready to deploy — launch script, Compose service, server config, and what clients must know.

* ``launch.sh``: the command (environment included) the study measured, executable, every word shell-quoted;
  the address it serves on is a variable at the top (``BIND_HOST``, loopback unless the operator says otherwise).
* ``docker-compose.yml``: one service shaped like SGLang's own Compose example (``ipc: host``, ``ulimits``,
  ``HF_TOKEN`` from the environment, the Hugging Face cache), the image pinned by digest when the runtime reported
  one, the GPU pinned by UUID, the port published on the host's loopback address.
* ``server-args.yaml``: a flat config — dashed flag names to values — that the runtime's ``--config`` reads
  (``python -m sglang.launch_server --config server-args.yaml``, ``vllm serve --config server-args.yaml`` with the
  model under ``model:``); study, label, verdict and environment are comments.
* ``client.json`` / ``client.md``: the numbers clients must be told — the REAL ``max_total_num_tokens`` and
  effective running slots from the winner's boots, not the declared ``--context-length`` (it reserves nothing).

Float flags are written with :func:`deployable` (four significant digits, what a person types and SGLang parses
to the same number the study measured within 0.05%); the measured value is kept in a comment when they differ.
A study run on the simulated runtime stamps every file ``SIMULATED — do not deploy``. Everything is derived
from the ``Report`` (history), never from a live server.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from elsa_tune.reports import units
from elsa_tune.reports.model import ClientNumbers, Report
from elsa_tune.runtime.family import RuntimeFamily, of_runtime_name
from elsa_tune.runtime.host_memory import HOST_UUID_PREFIX
from elsa_tune.search_spaces.candidate import Candidate, FlagValue
from elsa_tune.search_spaces.flag_file import ENV_COMMENT

SCHEMA_VERSION = 2
HF_CACHE = "${HOME}/.cache/huggingface:/root/.cache/huggingface"
#: The address ``launch.sh`` serves on unless ``BIND_HOST`` says otherwise, and the host address the Compose
#: service publishes its port on: loopback, so that exposing the server is a decision, not a default.
DEPLOY_HOST = "127.0.0.1"
CONTAINER_HOST = "0.0.0.0"             # inside the container; the published port decides who reaches it
SIMULATED = "SIMULATED — do not deploy"
SIGNIFICANT_DIGITS = 4


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


def is_simulated(report: Report) -> bool:
    """Whether the study measured the simulated runtime (its numbers are no measurement of hardware)."""
    return report.simulated


def build_bundle(report: Report) -> DeployBundle | None:
    """The deploy files for the report's winner, or ``None`` when history holds no configuration at all."""
    measured = winner_of(report)
    if measured is None:
        return None
    candidate = deployable(measured)
    return DeployBundle(candidate=candidate, launch_sh=launch_script(report, candidate),
                        compose_yaml=compose_file(report, candidate),
                        server_args_yaml=server_args_file(report, candidate),
                        client_json=json.dumps(client_facts(report), indent=2, sort_keys=True) + "\n",
                        client_md=client_text(report))


def deployable(candidate: Candidate) -> Candidate:
    """The candidate with every float flag rounded to four significant digits (``1.8000227980835264`` → ``1.8``).

    A value on a space's step (``0.93``) is unchanged; a value a log-scale search drew continuously is what a
    person would type. The relative change is below 0.05%, far under any effect the gate can detect.
    """
    flags = {name: _round(value) for name, value in candidate.flags.items()}
    return Candidate(flags=flags, env=candidate.env, label=candidate.label)


def rounded_flags(measured: Candidate, deployed: Candidate) -> list[str]:
    """``--name measured → deployed`` for each float flag :func:`deployable` changed."""
    return [f"--{name} {value!r} → {deployed.flags[name]!r}" for name, value in measured.flags.items()
            if deployed.flags.get(name) != value]


def family_of(report: Report) -> RuntimeFamily:
    """The runtime family the study measured (from its fingerprint's runtime name)."""
    return of_runtime_name(report.fingerprint.runtime if report.fingerprint is not None else None)


def server_argv(report: Report, candidate: Candidate, *, host: str = DEPLOY_HOST,
                positional: bool = True) -> list[str]:
    """The candidate's flags plus what a deployment needs: the model, the bind address and the port.

    The model comes first: as the launch's positional argument where the family's launch takes one (``vllm serve
    MODEL``) and ``positional`` allows it, else under the family's model flag (what a config file holds)."""
    runtime = family_of(report)
    model = _model_path(report, candidate)
    model_flag = runtime.model_flag
    flags = dict(candidate.flags)
    flags.pop(model_flag, None)
    argv: list[str] = Candidate(flags=flags, env=candidate.env).argv()
    if model:
        argv = [model, *argv] if positional and runtime.deployment.model_positional else \
            [f"--{model_flag}", model, *argv]
    if "host" not in candidate.flags:
        argv += ["--host", host]
    if "port" not in candidate.flags:
        argv += ["--port", str(_port(report, candidate))]
    return argv


def launch_script(report: Report, candidate: Candidate) -> str:
    """``launch.sh``: exports, then ``exec`` of the measured launch command with the winner's flags."""
    fp = report.fingerprint
    command = list(fp.launch_command) if fp is not None and fp.launch_command else \
        list(family_of(report).default_launch)
    lines = ["#!/usr/bin/env bash", *_stamp(report, "# "),
             f"# The winner of elsa-tune study {_comment(report.study_name)}: {_comment(report.summary_line())}",
             f"# Measured on: {_comment(fp.describe()) if fp else 'unknown setup'}",
             *[f"# Rounded for deployment: {r}" for r in _rounded(report, candidate)],
             "# Regenerate with: elsa-tune report RUN_DIR", "set -euo pipefail", "",
             "# The address the server listens on: loopback by default; 0.0.0.0 serves every interface.",
             f'BIND_HOST="${{BIND_HOST:-{DEPLOY_HOST}}}"']
    if is_simulated(report):
        display = family_of(report).deployment.display_name
        lines.append(f"echo {shlex.quote(f'{SIMULATED}: this starts the simulated {display} of elsa-tune.')} >&2")
    if fp is not None and fp.gpu_uuid and not fp.gpu_uuid.startswith(HOST_UUID_PREFIX):
        lines.append(f"export CUDA_VISIBLE_DEVICES={shlex.quote(fp.gpu_uuid)}")
    lines += [f"export {_env_name(k)}={shlex.quote(v)}" for k, v in candidate.env.items()]
    argv = server_argv(report, candidate, host="\0")
    words = [shlex.quote(w) for w in command] + ['"$BIND_HOST"' if w == "\0" else shlex.quote(w) for w in argv]
    lines += ["", "exec " + _wrap(words) + ' "$@"', ""]
    return "\n".join(lines)


def image_of(report: Report) -> tuple[str, str]:
    """The container image to deploy and a comment on how it was chosen.

    The digest the runtime reported wins (the exact bytes measured), then the image the study was told to run,
    then the upstream image of the measured runtime version.
    """
    fp, study = report.fingerprint, report.study
    if fp is not None and fp.image_digest and "@sha256:" in fp.image_digest:
        return fp.image_digest, "the image the study measured, pinned by the digest the runtime reported"
    if study is not None and study.image:
        return study.image, "the image the study ran (no digest was reported: pin one before deploying)"
    deployment = family_of(report).deployment
    upstream = deployment.upstream_image
    if not deployment.tag_per_version:
        return upstream, ("the study ran outside a container: the upstream image of this runtime; pin the tag of "
                          "the build you measured before deploying")
    version = fp.runtime_version if fp is not None and fp.runtime_version else None
    name = deployment.display_name
    if version:
        return (f"{upstream}:v{version}", "the study ran outside a container: the upstream image of the "
                f"measured {name} version; use your own build if the study ran a patched one")
    return (f"{upstream}:latest", f"the runtime reported no version: pin the image of the {name} you "
            "measured before deploying")


def compose_file(report: Report, candidate: Candidate) -> str:
    """``docker-compose.yml``: one service (named for the runtime) in the shape of SGLang's own
    ``docker/compose.yaml``."""
    fp = report.fingerprint
    port = _port(report, candidate)
    image, why = image_of(report)
    deployment = family_of(report).deployment
    in_container = list(fp.launch_command) if fp and fp.image_digest and fp.launch_command else \
        list(deployment.container_launch)
    model = _model_path(report, candidate)
    volumes = [HF_CACHE, *([f"{model}:{model}:ro"] if model and model.startswith("/") else [])]
    device: dict[str, Any] = {"driver": "nvidia", "capabilities": ["gpu"]}
    if fp is not None and fp.gpu_uuid and not fp.gpu_uuid.startswith(HOST_UUID_PREFIX):
        device["device_ids"] = [fp.gpu_uuid]
    else:
        device["count"] = 1
    service: dict[str, Any] = {
        "image": image,
        "restart": "unless-stopped",
        "ipc": "host",
        "ulimits": {"memlock": -1, "stack": 67108864},
        "ports": [f"{DEPLOY_HOST}:{port}:{port}"],
        "volumes": volumes,
        "environment": {"HF_TOKEN": "${HF_TOKEN:-}", **candidate.env},
        "entrypoint": in_container,
        "command": server_argv(report, candidate, host=CONTAINER_HOST),
        "deploy": {"resources": {"reservations": {"devices": [device]}}},
        "healthcheck": {"test": ["CMD-SHELL", f"curl -fsS http://localhost:{port}/health || exit 1"],
                        "interval": "30s", "timeout": "10s", "retries": 3, "start_period": "900s"},
    }
    header = [*_stamp(report, "# "),
              f"# elsa-tune winner of study {_comment(report.study_name)} — {_comment(report.summary_line())}",
              f"# Measured on: {_comment(fp.describe()) if fp else 'unknown setup'}",
              f"# Image: {_comment(why)}.",
              f"# The port is published on {DEPLOY_HOST} only: write \"{port}:{port}\" to serve other hosts.",
              *[f"# Rounded for deployment: {r}" for r in _rounded(report, candidate)]]
    body = yaml.safe_dump({"services": {deployment.service: service}}, sort_keys=False, allow_unicode=True, width=1000)
    return "\n".join(header) + "\n" + body


def server_args_file(report: Report, candidate: Candidate) -> str:
    """``server-args.yaml``: the flat config SGLang's ``--config`` reads (dashed names; ``true`` for a switch)."""
    fp = report.fingerprint
    header = [*_stamp(report, "# "),
              f"# {family_of(report).deployment.display_name} server arguments of the winner of elsa-tune study "
              f"{_comment(report.study_name)}.",
              f"# Verdict: {_comment(report.summary_line())}",
              f"# Label: {_comment(candidate.label)} (candidate key {candidate.key()})",
              f"# Measured on: {_comment(fp.describe()) if fp else 'unknown setup'}",
              *[f"# Rounded for deployment: {r}" for r in _rounded(report, candidate)],
              *[f"{ENV_COMMENT}{_env_name(k)}={shlex.quote(v)}"
                for k, v in candidate.env.items()],
              f"# Use: {family_of(report).deployment.config_use}"]
    data = _config(server_argv(report, candidate, positional=False))
    body = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1000)
    return "\n".join(header) + "\n" + body


def client_facts(report: Report) -> dict[str, Any]:
    c = report.client
    fp = report.fingerprint
    candidate = winner_of(report)
    port = _port(report, candidate) if candidate else None
    return {
        "schema_version": SCHEMA_VERSION,
        "study": report.study_name,
        "simulated": is_simulated(report),
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
    """``client.md``: the largest request, the running slots, and a warning whenever a length the server
    advertises (its ``context_len`` or the declared ``--context-length``) exceeds what fits in the KV pool."""
    c = report.client
    lines = [*_stamp(report, "> **", "**"), f"# What clients of `{report.study_name}` must be told", ""]
    if c is None:
        return "\n".join([*lines, "Unknown: no successful boot of the winner reported its pools. Do not guess.", ""])
    lines += [f"- **Largest request (prompt + output): {_n(c.max_request_tokens)} tokens.**" + _context_warning(c),
              f"- **Concurrent requests served at once: {_n(c.max_running_requests)}.**"
              + (f" ({c.declared_max_running_requests} were requested; the runtime clamped it.)"
                 if c.declared_max_running_requests not in (None, c.max_running_requests) else "")
              + " More queue.",
              f"- `context_len` reported by the server: {_n(c.context_len)}.",
              f"- Read from the startup logs of boots {', '.join(c.boot_ids)}.", ""]
    if report.fingerprint is not None and units.simulated(report.fingerprint.runtime):
        lines += [f"_{units.SIMULATED_TIME}._", ""]
    return "\n".join(lines)


def _context_warning(c: ClientNumbers) -> str:
    pool = c.max_total_num_tokens
    if pool is None:
        return ""
    declared = c.declared_context_length
    if declared and declared > pool:
        return (f" The server was launched with `--context-length {declared:,}`, but only {pool:,} tokens fit in "
                "the KV pool (`max_total_num_tokens`). A client that believes the declared number sends requests "
                "that fail at runtime instead of truncating.")
    if c.context_len and c.context_len > pool:
        return (f" The server reports `context_len` {c.context_len:,} (from `/server_info` and the model's config), "
                f"but only {pool:,} tokens fit in the KV pool (`max_total_num_tokens`). A client that reads "
                "`context_len` sends requests that fail at runtime instead of truncating.")
    return ""


def _config(argv: Sequence[str]) -> dict[str, Any]:
    """``["--a", "1", "--b"]`` → ``{"a": 1, "b": True}``: numbers as YAML numbers, switches as ``true``."""
    data: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        name = argv[i].removeprefix("--")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            data[name] = _scalar(argv[i + 1])
            i += 2
        else:
            data[name] = True
            i += 1
    return data


def _scalar(word: str) -> Any:
    for kind in (int, float):
        try:
            return kind(word)
        except ValueError:
            continue
    return word


def _round(value: FlagValue) -> FlagValue:
    if isinstance(value, float) and value != 0 and value == value:
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    return value


def _rounded(report: Report, deployed: Candidate) -> list[str]:
    measured = winner_of(report)
    return rounded_flags(measured, deployed) if measured is not None else []


def _stamp(report: Report, prefix: str, suffix: str = "") -> list[str]:
    if not is_simulated(report):
        return []
    return [f"{prefix}{SIMULATED}: these numbers come from elsa-tune's simulated runtime, not from a GPU.{suffix}"]


def _model_path(report: Report, candidate: Candidate) -> str | None:
    value = candidate.flags.get(family_of(report).model_flag)
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

