"""The HTTP checks every runtime makes while booting and checking a server, whatever its family.

Shared by every ``Runtime`` implementation, so that a process and a container are judged the same way.
"""

from __future__ import annotations

import httpx

from elsa_tune.runtime.failure import FailureHints, FailureKind
from elsa_tune.runtime.family import RuntimeFamily
from elsa_tune.runtime.protocol import Health, HealthState


def health(client: httpx.Client, base_url: str, timeout_s: float) -> tuple[bool, str]:
    """``GET /health``: whether it answered 200 within ``timeout_s``, and what it answered ("ok" when it did)."""
    try:
        status = client.get(f"{base_url}/health", timeout=timeout_s).status_code
    except httpx.HTTPError as exc:
        return False, f"/health did not answer: {type(exc).__name__}"
    return (True, "ok") if status == 200 else (False, f"/health answered {status}")


def unhealthy(family: RuntimeFamily, log_text: str, detail: str) -> Health:
    """Alive but not answering: a hang when the family's log says so (watchdog), otherwise unclassified."""
    failure = family.classify(log_text, FailureHints(became_ready=True, timed_out=True))
    return Health(HealthState.UNHEALTHY, detail, failure if failure.kind is FailureKind.HANG else None)
