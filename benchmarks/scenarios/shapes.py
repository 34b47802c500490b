"""Traffic shapes for generated scenarios: Parquet traces in elsa-tune's own format, one per shape.

A technique's worth depends on the traffic (a draft head pays on decode-heavy tool calls and costs on cold long
prompts; a prefix cache pays only when prompts share prefixes), so each scenario names one shape:

- ``demo``: the bundled Mooncake window (``--traffic demo``), no file written;
- ``decode-heavy``: short prompts, long answers (tool calls and code);
- ``cold-long``: long prompts that share nothing, short answers (documents);
- ``prefix-reuse``: a few long shared system prompts / conversation prefixes, each reused by many requests;
- ``concurrency``: many short chat requests arriving in bursts (the scenario's space also raises the slots).

``write_shape`` draws the requests from a seeded generator, so a shape and a seed always give the same file.
"""

from __future__ import annotations

import random
from pathlib import Path

from elsa_tune.traffic.trace import DEFAULT_BLOCK_SIZE, Trace, TraceMetadata, TraceRequest, expected_blocks, write_trace

SHAPES = ("demo", "decode-heavy", "cold-long", "prefix-reuse", "concurrency")
REQUESTS = 240


def write_shape(shape: str, path: Path, seed: int, requests: int = REQUESTS) -> str:
    """Write ``requests`` requests of ``shape`` to ``path`` (``demo``: nothing) and return what ``--traffic`` takes."""
    if shape == "demo":
        return "demo"
    if shape not in SHAPES:
        raise ValueError(f"unknown traffic shape {shape!r}; use one of {', '.join(SHAPES)}")
    rng = random.Random(f"{shape}:{seed}")
    make = {"decode-heavy": _decode_heavy, "cold-long": _cold_long, "prefix-reuse": _prefix_reuse,
            "concurrency": _concurrency}[shape]
    drawn = make(rng)[:requests]
    meta = TraceMetadata(schema_version=1, source=f"scenario shape {shape} (seed {seed})",
                         block_size=DEFAULT_BLOCK_SIZE, start=None, end=None, synthesized=True,
                         notes=f"synthetic {shape} traffic drawn by benchmarks/scenarios/shapes.py")
    write_trace(Trace.from_requests(drawn, meta), path)
    return str(path)


class _Blocks:
    """Fresh block ids for unique prompt content, and shared ones for prefixes reused across requests."""

    def __init__(self, rng: random.Random) -> None:
        self.next = rng.randrange(1 << 40)

    def fresh(self, count: int) -> tuple[int, ...]:
        start, self.next = self.next, self.next + count
        return tuple(range(start, start + count))


def _request(arrival: float, inp: int, out: int, hashes: tuple[int, ...], kind: str,
             session: str | None = None) -> TraceRequest:
    assert len(hashes) == expected_blocks(inp, DEFAULT_BLOCK_SIZE)
    return TraceRequest(arrival_s=round(arrival, 3), input_tokens=inp, output_tokens=out, block_hashes=hashes,
                        session=session, kind=kind)


def _poisson(rng: random.Random, rate: float) -> list[float]:
    t, out = 0.0, []
    for _ in range(REQUESTS):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def _decode_heavy(rng: random.Random) -> list[TraceRequest]:
    blocks = _Blocks(rng)
    out = []
    for t in _poisson(rng, 2.0):
        inp = int(rng.lognormvariate(6.8, 0.5)) + 64          # ~900 tokens
        gen = int(rng.lognormvariate(6.6, 0.4)) + 128         # ~800 tokens
        out.append(_request(t, inp, gen, blocks.fresh(expected_blocks(inp, DEFAULT_BLOCK_SIZE)),
                            rng.choice(("tool", "code", "tool", "chat"))))
    return out


def _cold_long(rng: random.Random) -> list[TraceRequest]:
    blocks = _Blocks(rng)
    out = []
    for t in _poisson(rng, 0.5):
        inp = int(rng.uniform(12_000, 40_000))
        gen = int(rng.uniform(48, 256))
        out.append(_request(t, inp, gen, blocks.fresh(expected_blocks(inp, DEFAULT_BLOCK_SIZE)),
                            rng.choice(("document", "document", "prose"))))
    return out


def _prefix_reuse(rng: random.Random) -> list[TraceRequest]:
    blocks = _Blocks(rng)
    prefixes = [blocks.fresh(rng.randint(8, 24)) for _ in range(4)]     # 4K–12K-token shared prefixes
    out = []
    for i, t in enumerate(_poisson(rng, 3.0)):
        prefix = prefixes[rng.randrange(len(prefixes))]
        tail = rng.randint(1, 3)
        inp = (len(prefix) + tail) * DEFAULT_BLOCK_SIZE - rng.randint(0, DEFAULT_BLOCK_SIZE - 1)
        gen = int(rng.uniform(64, 400))
        out.append(_request(t, inp, gen, prefix + blocks.fresh(tail), rng.choice(("chat", "tool")),
                            session=f"s{i % 16}"))
    return out


def _concurrency(rng: random.Random) -> list[TraceRequest]:
    blocks = _Blocks(rng)
    out: list[TraceRequest] = []
    t = 0.0
    while len(out) < REQUESTS:
        t += rng.expovariate(0.5)
        for _ in range(rng.randint(8, 24)):                    # bursts of clients at once
            if len(out) >= REQUESTS:
                break
            inp = int(rng.uniform(200, 2_000))
            gen = int(rng.uniform(64, 300))
            out.append(_request(t + rng.uniform(0, 0.5), inp, gen,
                                blocks.fresh(expected_blocks(inp, DEFAULT_BLOCK_SIZE)), "chat"))
    out.sort(key=lambda r: r.arrival_s)
    return out
