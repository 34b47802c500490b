"""A small client for Prometheus's HTTP API: instant and range queries, paged by time, errors with remedies.

Prometheus refuses a range query that would return more than 11,000 points per series, so
``query_range`` splits the window into pages of at most ``MAX_POINTS`` steps and stitches them. Every
failure becomes a ``TrafficError`` naming what to do: the server is down, the query (usually the
selector) is malformed, the answer is not Prometheus's.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import numpy as np

from elsa_tune.errors import TrafficError

log = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 256 << 20   # the largest answer read: a page of MAX_POINTS steps of a few series is megabytes
MAX_POINTS = 10_000
"""Points per series per page: below Prometheus's hard limit of 11,000."""

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
_SELECTOR = re.compile(r'^\s*\{?\s*(.*?)\s*\}?\s*$', re.DOTALL)


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus-style duration such as ``14d``, ``1h30m`` or ``15s`` (bare numbers are seconds)."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        parts = _DURATION.findall(value)
        if not parts or "".join(n + u for n, u in parts) != value:
            raise TrafficError(f"{text!r} is not a duration",
                               remedy="write durations like 14d, 36h, 90m, 15s or 1h30m") from None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds <= 0:
        raise TrafficError(f"duration {text!r} must be positive", remedy="write durations like 14d, 36h or 15s")
    return seconds


def parse_time(text: str) -> float:
    """Unix seconds from an ISO-8601 time (UTC unless it says otherwise) or a Unix timestamp."""
    value = text.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise TrafficError(f"{text!r} is not a time",
                           remedy="use ISO-8601 such as 2026-11-01T00:00:00Z, or Unix seconds") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def selector_matchers(selector: str) -> str:
    """The label matchers inside a selector, without braces: ``'{job="sglang"}'`` → ``'job="sglang"'``."""
    match = _SELECTOR.match(selector or "")
    inner = match.group(1) if match else selector
    return inner.strip().rstrip(",")


def with_matchers(metric: str, *matchers: str) -> str:
    """``metric{a,b}`` from matcher strings, skipping empty ones."""
    inner = ",".join(m for m in matchers if m)
    return f"{metric}{{{inner}}}" if inner else metric


@dataclass(frozen=True)
class Series:
    """One time series of a range query on a regular grid; NaN where the series had no value."""

    labels: Mapping[str, str]
    values: np.ndarray[Any, np.dtype[np.float64]]


@dataclass(frozen=True)
class Grid:
    """The evaluation times of a range query: ``start + k * step`` for ``k < points``."""

    start: float
    step: float
    points: int

    @property
    def times(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        return self.start + self.step * np.arange(self.points, dtype=np.float64)

    @classmethod
    def spanning(cls, start: float, end: float, step: float) -> Grid:
        return cls(start=start, step=step, points=math.floor((end - start) / step + 1e-9) + 1)


class PrometheusClient:
    """Queries one Prometheus server. Use as a context manager, or call ``close()``."""

    def __init__(self, url: str, *, timeout_s: float = 60.0, transport: httpx.BaseTransport | None = None) -> None:
        if not re.match(r"^https?://", url):
            raise TrafficError(f"{url!r} is not an http(s) URL", remedy="pass --prometheus http://host:9090")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        try:
            self._http = httpx.Client(base_url=self.url, timeout=timeout_s, transport=transport)
        except (httpx.InvalidURL, ValueError) as exc:     # 'http://[::1': an unclosed IPv6 address, a bad port
            raise TrafficError(f"{url!r} is not a URL httpx can use: {exc}",
                               remedy="pass --prometheus http://host:9090") from exc

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def query(self, promql: str, at: float) -> list[tuple[Mapping[str, str], float]]:
        """An instant query at ``at``: (labels, value) per series of the resulting vector."""
        data = self._get("/api/v1/query", {"query": promql, "time": f"{at:.3f}"})
        if data.get("resultType") != "vector":
            raise TrafficError(f"Prometheus answered {data.get('resultType')!r} to an instant query, not a vector",
                               remedy=f"check that {self.url} is a Prometheus server")
        try:
            return [(dict(item["metric"]), _value(item["value"][1])) for item in data.get("result", [])]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise self._malformed("/api/v1/query", exc) from exc

    def samples(self, selector: str, range_s: float, at: float) -> list[tuple[Mapping[str, str], np.ndarray[Any, Any]]]:
        """The raw sample times of each series of ``selector`` in ``(at - range_s, at]`` (a range-vector query)."""
        data = self._get("/api/v1/query", {"query": f"{selector}[{round(range_s)}s]", "time": f"{at:.3f}"})
        if data.get("resultType") != "matrix":
            raise TrafficError(f"Prometheus answered {data.get('resultType')!r} to a range-vector query, not a matrix",
                               remedy=f"check that {self.url} is a Prometheus server")
        try:
            return [(dict(item["metric"]), np.asarray([_value(t) for t, _ in item["values"]]))
                    for item in data.get("result", [])]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise self._malformed("/api/v1/query", exc) from exc

    def query_range(self, promql: str, grid: Grid) -> list[Series]:
        """A range query over ``grid``, in pages of at most ``MAX_POINTS`` steps; series keyed by their labels."""
        found: dict[tuple[tuple[str, str], ...], np.ndarray[Any, np.dtype[np.float64]]] = {}
        for first in range(0, grid.points, MAX_POINTS):
            last = min(grid.points, first + MAX_POINTS) - 1
            params = {"query": promql, "start": f"{grid.start + first * grid.step:.3f}",
                      "end": f"{grid.start + last * grid.step:.3f}", "step": f"{grid.step:g}"}
            data = self._get("/api/v1/query_range", params)
            try:
                for item in data.get("result", []):
                    key = tuple(sorted((str(k), str(v)) for k, v in item["metric"].items()))
                    values = found.setdefault(key, np.full(grid.points, np.nan))
                    for stamp, text in item["values"]:
                        index = round((_value(stamp) - grid.start) / grid.step)
                        if 0 <= index < grid.points:
                            values[index] = _value(text)
            except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError) as exc:
                raise self._malformed("/api/v1/query_range", exc) from exc
        return [Series(labels=dict(key), values=values) for key, values in found.items()]

    def _malformed(self, path: str, exc: Exception) -> TrafficError:
        return TrafficError(f"{self.url}{path} answered a result that is not Prometheus's shape "
                            f"({type(exc).__name__}: {exc})",
                            remedy="check that the --prometheus URL points at Prometheus (e.g. http://host:9090), "
                                   "or at a proxy that passes its answers through unchanged")

    def _fetch(self, path: str, params: Mapping[str, str]) -> tuple[int, bytes]:
        """The status and body of one GET, read within ``timeout_s`` in all (not per read: a server that sends a
        byte a second is cut off) and at most ``MAX_ANSWER_BYTES`` long."""
        deadline = time.monotonic() + self.timeout_s
        with self._http.stream("GET", path, params=params) as response:
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise TrafficError(f"{self.url}{path} answered more than {MAX_ANSWER_BYTES >> 20} MiB",
                                       remedy="query a shorter window or a coarser --step, or check that the URL "
                                              "is Prometheus")
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout(f"the answer took more than {self.timeout_s:g} s in all")
            return response.status_code, b"".join(chunks)

    def _get(self, path: str, params: Mapping[str, str]) -> Mapping[str, Any]:
        try:
            status, body = self._fetch(path, params)
        except httpx.TimeoutException as exc:
            raise TrafficError(f"Prometheus at {self.url} did not answer in time: {exc}",
                               remedy="query a shorter window or a coarser --step, or check the server's load") from exc
        except httpx.HTTPError as exc:
            raise TrafficError(f"cannot reach Prometheus at {self.url}: {exc}",
                               remedy="check the --prometheus URL and that Prometheus is running "
                                      "(curl URL/-/ready)") from exc
        text = body.decode("utf-8", errors="replace")
        try:
            payload = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise TrafficError(f"{self.url}{path} answered HTTP {status} with something that is "
                               "not Prometheus JSON", remedy="check that the --prometheus URL points at Prometheus "
                               "(e.g. http://host:9090), not at another service") from exc
        if not isinstance(payload, dict) or payload.get("status") != "success":
            error = payload.get("error", text[:200]) if isinstance(payload, dict) else text[:200]
            kind = payload.get("errorType", "") if isinstance(payload, dict) else ""
            remedy = ("check the --selector: it must be label matchers such as '{job=\"sglang\"}'"
                      if kind == "bad_data" else "check the Prometheus server's log")
            raise TrafficError(f"Prometheus rejected the query {params.get('query', '')!r}: {kind} {error}",
                               remedy=remedy)
        data = payload.get("data")
        if not isinstance(data, dict):
            raise TrafficError(f"{self.url}{path}: no data in Prometheus's answer", remedy="check the server's log")
        for warning in payload.get("warnings", []) or []:
            log.warning("Prometheus: %s", warning)
        return data


def _value(text: Any) -> float:
    """A sample value or time as Prometheus writes it (a string); ±Inf and NaN are no sample."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise TypeError(f"{text!r} is not a sample value")
    value = float(text)
    return value if math.isfinite(value) else float("nan")


def counter_increments(series: list[Series]) -> np.ndarray[Any, np.dtype[np.float64]]:
    """Per-step increments summed over counter series, with resets handled and gaps bridged.

    Element ``k`` is how much the counters grew between grid points ``k - 1`` and ``k`` (element 0 is 0).
    A drop is a reset: the increment is the new value. A missing point contributes nothing, and the
    next present point is compared with the last known one.
    """
    if not series:
        return np.zeros(0)
    total = np.zeros(len(series[0].values))
    for one in series:
        values = one.values
        present = np.flatnonzero(~np.isnan(values))
        if len(present) < 2:
            continue
        v = values[present]
        steps = np.diff(v)
        steps = np.where(steps < 0, v[1:], steps)
        np.add.at(total, present[1:], steps)
    return total
