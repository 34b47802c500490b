"""``PlainSpeed``: the speed-up the simulated server serves a client that does not stamp its requests at.

A client that stamps (``traffic/sim_time.py``: send instants, receipts) measures the simulated system at any
speed-up: its readings are converted on the server's clock and carry none of the host's overhead. A client
that does not (``sglang.bench_serving``, curl, any OpenAI client) measures wall-clock latencies, which the
speed-up converts back to simulated time: its per-request host overhead (serialising, the loopback, parsing
the chunk, waiting for a busy core) is multiplied by the speed-up too. So such a client is served at a lower
speed-up, chosen so that its overhead stays a small share of the simulated latencies it measures::

    plain = clamp(TARGET_SHARE × latency_scale_s / overhead_s, min(SLOWEST, full), full)

- ``latency_scale_s``: the 10th percentile of the simulated TTFTs of the last ``WINDOW`` requests (the
  shortest latency a client reads that matters);
- ``overhead_s``: the wall seconds one request costs the host outside the simulation: the median of how late the
  server's own first-token write completed against its due instant (any client's: it is the host's), twice (the
  client does the mirror image: write the request, read the chunk), plus ``CLIENT_FLOOR_S`` (a Python HTTP
  client's own per-request work, which the server cannot see).

Below 1× the simulation runs in slow motion (a busy host, short latencies); never slower than ``SLOWEST``. Until
``MIN_SAMPLES`` of each have been measured the speed-up is ``min(1, full)``: an unknown overhead is not assumed
small.

The speed changes only between passes (``serving.Serving`` retimes its clock when idle, and a plain pass keeps
its speed across short idle gaps), and every change is a knot of the declared clock (``/sim/clock``);
``describe()`` is what ``/server_info`` declares besides the pace the next plain request gets.
"""

from __future__ import annotations

from collections import deque

#: Share of the latency scale a plain client's overhead may take, after the speed-up multiplies it.
TARGET_SHARE = 0.03
#: Wall seconds of a client's per-request work the server cannot see (json, SSE parsing, its event loop).
CLIENT_FLOOR_S = 0.001
#: Measurements kept (the most recent), of each kind.
WINDOW = 200
#: The slowest a plain client is served at (simulated seconds per wall second).
SLOWEST = 0.25
#: Measurements of each kind needed before a plain client is served faster than 1×.
MIN_SAMPLES = 10


class PlainSpeed:
    """Measures a plain client's host overhead and the simulated latencies served; proposes the speed-up."""

    def __init__(self, full: float) -> None:
        self.full = full
        self._overheads: deque[float] = deque(maxlen=WINDOW)
        self._ttfts: deque[float] = deque(maxlen=WINDOW)

    def observe_overhead(self, seconds: float) -> None:
        """A request's first token reached the socket ``seconds`` (wall) after its due instant."""
        self._overheads.append(max(0.0, seconds))

    def observe_ttft(self, sim_seconds: float) -> None:
        """The simulated TTFT of a request (any client)."""
        if sim_seconds > 0:
            self._ttfts.append(sim_seconds)

    @property
    def overhead_s(self) -> float:
        return 2 * _quantile(self._overheads, 0.5) + CLIENT_FLOOR_S

    @property
    def latency_scale_s(self) -> float | None:
        return _quantile(self._ttfts, 0.1) if self._ttfts else None

    def speedup(self) -> float:
        """The speed-up for the next pass of a client that does not stamp."""
        scale = self.latency_scale_s
        if scale is None or min(len(self._ttfts), len(self._overheads)) < MIN_SAMPLES:
            return min(1.0, self.full)
        return min(self.full, max(min(SLOWEST, self.full), TARGET_SHARE * scale / self.overhead_s))

    def describe(self) -> dict[str, float | None]:
        scale = self.latency_scale_s
        return {"plain_speedup": round(self.speedup(), 4), "plain_overhead_ms": round(self.overhead_s * 1e3, 3),
                "latency_scale_ms": None if scale is None else round(scale * 1e3, 3)}


def _quantile(values: deque[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
