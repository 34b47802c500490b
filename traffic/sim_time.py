"""``SimTime``: the simulated server's clock as a client on its host reads it, and records converted into it.

The simulated SGLang (``elsa-tune sim serve``) runs its simulated system up to ``speedup`` times faster than the
wall clock and ``lag_s`` wall seconds behind it, slowing its clock rather than falling behind when its host is
busy (``runtime/sim/serving.py``, ``SimClock``); it places a request stamped with the client's
``time.monotonic()`` send instant (header ``x-elsa-sent-at``) at that instant of its simulation. A client that
stamps its requests and converts its own readings with ``SimTime`` measures the simulated system: a send at
wall *t* happened at simulated ``sim(t)``, something received at wall *t* left the simulation at
``sim(t − lag_s)``, where ``sim`` interpolates the knots the server declares at ``/sim/clock``; a send that
reacts to something received (a closed loop's next request) is stamped as the client's own handling time after
it, unscaled (``send_stamp``): the client is not sped up. Nothing here
reads a latency or a rate the server measured: only the clock it runs on.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elsa_tune.traffic.measurement import RequestRecord

#: The request header carrying the client's ``time.monotonic()`` at send time (real SGLang ignores it).
SENT_AT_HEADER = "x-elsa-sent-at"
#: The simulated instant a request on the client's own schedule is sent at (an open loop's arrival, a run's
#: start), on the clock the server declared; the server places it there unless its scheduler is already past it.
SIM_AT_HEADER = "x-elsa-sim-at"
#: A key the client will acknowledge the first token and the end of this request with (``ACK_PATH?key=``): the
#: simulated clock stands still until it has, so the client's readings carry no host delivery latency.
ACK_HEADER = "x-elsa-ack"
ACK_PATH = "/sim/ack"
#: A closed loop's headers: "I send my next request when this one ends" and "this is that request"; the simulated
#: server waits for such a follow-up before it moves on, as SGLang's scheduler would already have it.
FOLLOW_UP_HEADER = "x-elsa-follow-up"
FOLLOWS_HEADER = "x-elsa-follows"
#: The simulated server's clock endpoint (sim-only).
CLOCK_PATH = "/sim/clock"


@dataclass(frozen=True)
class SimTime:
    """The declared clock of one simulated server: ``speedup`` simulated seconds per wall second for a client
    that stamps, deliveries ``lag_s`` wall seconds after their simulated instant, ``knots`` ``(monotonic wall,
    simulated)`` where the host made it run slower or the server changed its pace (empty: a straight line from
    (0, 0)), and ``rate``, the slope past the last knot (``None``: ``speedup``; lower while the server serves a
    client that does not stamp, ``runtime/sim/plain_speed.py``)."""

    speedup: float
    lag_s: float
    knots: tuple[tuple[float, float], ...] = ()
    rate: float | None = None

    @classmethod
    def of_clock(cls, clock: Mapping[str, Any]) -> SimTime | None:
        """The clock of a ``/server_info`` ``simulated.clock`` or a ``/sim/clock`` body; ``None`` if malformed."""
        try:
            speedup, lag = float(clock["speedup"]), float(clock["lag_s"])
            rate = float(clock["rate"]) if clock.get("rate") is not None else None
            knots = tuple((float(w), float(s)) for w, s in clock.get("knots") or ())
        except (KeyError, TypeError, ValueError):
            return None
        return cls(speedup, lag, knots, rate) if speedup > 0 and (rate is None or rate > 0) and lag >= 0 else None

    @classmethod
    def of_server_info(cls, info: Mapping[str, Any]) -> SimTime | None:
        """The clock a ``/server_info`` body declares, or ``None`` for a real (or older simulated) server."""
        simulated = info.get("simulated")
        clock = simulated.get("clock") if isinstance(simulated, Mapping) else None
        return cls.of_clock(clock) if isinstance(clock, Mapping) else None

    def sim(self, wall: float) -> float:
        """The simulated instant of monotonic wall time ``wall``."""
        knots = self.knots or ((0.0, 0.0),)
        i = bisect.bisect_right(knots, (wall, float("inf")))
        if i == 0:
            return knots[0][1] + (wall - knots[0][0]) * self.speedup
        if i == len(knots):
            return knots[-1][1] + (wall - knots[-1][0]) * (self.rate or self.speedup)
        (w0, s0), (w1, s1) = knots[i - 1], knots[i]
        return s0 + (wall - w0) * (s1 - s0) / (w1 - w0) if w1 > w0 else s1

    def send_stamp(self, sent: float, trigger: float | None) -> float:
        """The wall instant, on the server's clock, of a send at wall ``sent`` reacting to something received
        at wall ``trigger``: in the simulation it happened the client's own (real, not sped-up) handling time
        after that thing left the simulation, ``trigger − lag_s`` plus ``(sent − trigger) / speedup``."""
        if trigger is None or trigger > sent:
            return sent
        return trigger - self.lag_s + (sent - trigger) / self.speedup

    def record(self, rec: RequestRecord, t0: float, origin: float, sent_sim: float | None = None) -> RequestRecord:
        """``rec`` (wall seconds from the run's start ``t0``, a ``time.perf_counter()`` = ``time.monotonic()``
        instant) in simulated seconds from ``origin``, the simulated instant of the run's start. ``sent_sim`` is
        the simulated instant the request was sent at when the client named it (``SIM_AT_HEADER``)."""
        sent = t0 + rec.sent_s
        at = self.sim(sent) if sent_sim is None else sent_sim

        def received(offset: float) -> float:   # an instant something arrived, ``offset`` after the send
            return max(0.0, self.sim(sent + offset - self.lag_s) - at)

        chunk_gaps: list[float] = []
        if rec.ttft_s is not None:
            chunk = sent + rec.ttft_s
            for gap in rec.itl_s:
                chunk_gaps.append(max(0.0, self.sim(chunk + gap) - self.sim(chunk)))
                chunk += gap
        return dataclasses.replace(
            rec, sent_s=at - origin,
            scheduled_s=None if rec.scheduled_s is None else rec.scheduled_s * self.speedup,
            ttft_s=None if rec.ttft_s is None else received(rec.ttft_s),
            end_s=None if rec.end_s is None else at - origin + received(rec.end_s - rec.sent_s),
            itl_s=tuple(chunk_gaps))

    def with_knots(self, knots: Sequence[tuple[float, float]], rate: float | None = None) -> SimTime:
        return SimTime(self.speedup, self.lag_s, tuple(knots), rate)

    def mean_rate(self, start: float, end: float) -> float:
        """Simulated seconds per wall second between monotonic wall instants ``start`` and ``end``."""
        return (self.sim(end) - self.sim(start)) / (end - start) if end > start else self.rate or self.speedup

    def describe(self) -> str:
        return (f"simulated time: the client's own wall-clock readings on the simulated server's clock (up to "
                f"{self.speedup:g}× wall time, {self.lag_s * 1e3:g} ms delivery lag"
                + (f", {len(self.knots)} knots where its host slowed it)" if len(self.knots) > 2 else ")"))
