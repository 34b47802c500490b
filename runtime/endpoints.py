"""SGLang's HTTP endpoints as a runtime reads them while booting and checking a server.

Shared by every ``Runtime`` implementation, so that a process and a container are judged the same way.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from elsa_tune.runtime.classify import classify
from elsa_tune.runtime.failure import FailureHints, FailureKind
from elsa_tune.runtime.protocol import Health, HealthState

log = logging.getLogger(__name__)


def health(client: httpx.Client, base_url: str, timeout_s: float) -> tuple[bool, str]:
    """``GET /health``: whether it answered 200 within ``timeout_s``, and what it answered ("ok" when it did)."""
    try:
        status = client.get(f"{base_url}/health", timeout=timeout_s).status_code
    except httpx.HTTPError as exc:
        return False, f"/health did not answer: {type(exc).__name__}"
    return (True, "ok") if status == 200 else (False, f"/health answered {status}")


def server_info(client: httpx.Client, base_url: str, timeout_s: float) -> dict[str, Any] | None:
    """``/server_info`` (``/get_server_info`` on older SGLang), or ``None`` when neither answers a dict."""
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


def unhealthy(log_text: str, detail: str) -> Health:
    """Alive but not answering: a hang when the log says so (watchdog), otherwise unclassified."""
    failure = classify(log_text, FailureHints(became_ready=True, timed_out=True))
    return Health(HealthState.UNHEALTHY, detail, failure if failure.kind is FailureKind.HANG else None)
