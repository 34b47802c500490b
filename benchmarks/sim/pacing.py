"""Can the simulated server keep pace with the seeds' highest load on this machine?

Starts a real ``elsa-tune sim serve`` process, drives N concurrent streaming requests (default 12 streams,
seed 001's 2,654 tok/s greedy case) and compares what the server meant to deliver (its own intended step
times, from ``/server_info``'s ``simulated.pacing``) with what the clients received: the target vs achieved
token rate, and the timing error of deliveries (how late each step's tokens left the server) and of the
client-side inter-chunk gaps. ``--speedup`` runs simulated time faster to find the head-room.

    python benchmarks/sim/pacing.py --profile rtx5090-qwen3.6-35b-a3b-nvfp4 --config elsa-1.7 --streams 12 \
        --speedup 1 2 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

READY = "The server is fired up and ready to roll!"


@dataclass
class Row:
    speedup: float
    streams: int
    tokens: int
    wall_s: float
    target_tok_s: float
    achieved_tok_s: float
    late_p50_ms: float
    late_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    chunk_gap_err_ms: float
    cpu_s: float


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(profile: str, port: int, speedup: float, seed: int, card_dir: str,
                 extra: list[str]) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "elsa_tune", "sim", "serve", "--sim-profile", profile, "--sim-seed", str(seed),
            "--sim-speedup", str(speedup), "--sim-card-dir", card_dir, "--model-path", "bench",
            "--port", str(port), "--enable-metrics", *extra]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 600
    assert proc.stdout is not None
    for line in proc.stdout:
        if READY in line:
            # keep draining the log, or a full pipe would block the server's writes
            threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True).start()
            return proc
        if time.monotonic() > deadline:
            break
    stop(proc)
    raise SystemExit(f"server did not become ready (rc={proc.poll()})")


def stop(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


async def one_stream(client: httpx.AsyncClient, index: int, prompt_len: int, tokens: int) -> tuple[int, list[float]]:
    prompt = [(index * 7919 + i * 31) % 150_000 + 16 for i in range(prompt_len)]
    body = {"model": "bench", "prompt": prompt, "max_tokens": tokens, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    stamps: list[float] = []
    completion = 0
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                stamps.append(time.perf_counter())
            if chunk.get("usage"):
                completion = int(chunk["usage"]["completion_tokens"])
    return completion, stamps


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(port: int, streams: int, prompt_len: int, tokens: int, warm: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600, trust_env=False,
                                 limits=httpx.Limits(max_connections=streams + 4)) as client:
        # past the cold first pass: warm-up requests finish before the timed run
        await asyncio.gather(*[one_stream(client, 10_000 + i, 64, 8) for i in range(warm)])
        before = (await client.get("/server_info")).json()["simulated"]
        t0 = time.perf_counter()
        results = await asyncio.gather(*[one_stream(client, i, prompt_len, tokens) for i in range(streams)])
        wall = time.perf_counter() - t0
        after = (await client.get("/server_info")).json()["simulated"]
    return {"results": results, "wall": wall, "before": before, "after": after}


def run(profile: str, speedup: float, streams: int, prompt_len: int, tokens: int, seed: int,
        extra: list[str]) -> Row:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="elsa-sim-bench-") as card_dir:
        proc = start_server(profile, port, speedup, seed, card_dir, extra)
        try:
            cpu0 = _cpu(proc.pid)
            data = asyncio.run(measure(port, streams, prompt_len, tokens, warm=16))
            cpu = _cpu(proc.pid) - cpu0
        finally:
            stop(proc)
    received = sum(n for n, _ in data["results"])
    intended = data["after"]["pacing"]["intended_s"] - data["before"]["pacing"]["intended_s"]
    gaps = [b - a for _, s in data["results"] for a, b in itertools.pairwise(s)]
    pacing = data["after"]["pacing"]
    median_gap = statistics.median(gaps) if gaps else float("nan")
    return Row(speedup=speedup, streams=streams, tokens=received, wall_s=data["wall"],
               target_tok_s=received / intended if intended > 0 else float("nan"),
               achieved_tok_s=received / data["wall"], late_p50_ms=pacing["late_p50_ms"],
               late_p99_ms=pacing["late_p99_ms"], itl_p50_ms=percentile(gaps, 0.5) * 1e3,
               itl_p99_ms=percentile(gaps, 0.99) * 1e3,
               chunk_gap_err_ms=statistics.mean(abs(g - median_gap) for g in gaps) * 1e3 if gaps else float("nan"),
               cpu_s=cpu)


def truth_rate(profile: str, config: str, streams: int, prompt_tokens: int, tokens: int) -> float:
    from elsa_tune.runtime.sim.profile import load_profile
    from elsa_tune.runtime.sim.truth import TruthWorkload, truth

    prof = load_profile(profile)
    named = prof.config(config) if config else None
    workload = TruthWorkload(concurrency=streams, num_requests=streams, input_tokens=(prompt_tokens,),
                             output_tokens=(tokens,))
    result = truth(prof, dict(named.flags) if named else {}, dict(named.env) if named else {}, workload)
    return float(result.output_tokens_per_s or float("nan"))


def _cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="rtx5090-qwen3.6-35b-a3b-nvfp4")
    parser.add_argument("--streams", type=int, default=12)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=1024, help="completion tokens per stream")
    parser.add_argument("--speedup", type=float, nargs="+", default=[1.0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--config", default="elsa-1.7", help="the profile's named configuration (--sim-config)")
    parser.add_argument("--flags", default="", help="extra SGLang flags for the server, as one string")
    parser.add_argument("--noise", choices=("profile", "off"), default="off",
                        help="the server's noise (--sim-noise); 'off' makes the target the noiseless truth")
    args = parser.parse_args()
    extra = [*(["--sim-config", args.config] if args.config else []), "--sim-noise", args.noise,
             *args.flags.split()]
    rows = [run(args.profile, s, args.streams, args.prompt_tokens, args.tokens, args.seed, extra)
            for s in args.speedup]
    true_rate = truth_rate(args.profile, args.config, args.streams, args.prompt_tokens, args.tokens)
    print(f"simulated server pacing — profile {args.profile} ({args.config}), {args.streams} streams × "
          f"{args.tokens} tokens, noise {args.noise} (a simulation, not a measurement of real hardware)")
    print(f"noiseless truth of this workload (runtime/sim/truth.py): {true_rate:.0f} output tok/s; "
          "the target below is what the server itself meant to deliver (truth × noise × speedup)")
    head = (f"{'speedup':>7} {'tokens':>7} {'wall s':>7} {'target tok/s':>12} {'achieved':>9} {'error':>7} "
            f"{'late p50 ms':>11} {'late p99 ms':>11} {'ITL p50 ms':>10} {'ITL p99 ms':>10} {'server CPU':>10}")
    print(head)
    for r in rows:
        err = (r.achieved_tok_s - r.target_tok_s) / r.target_tok_s * 100
        print(f"{r.speedup:>7g} {r.tokens:>7} {r.wall_s:>7.2f} {r.target_tok_s:>12.0f} {r.achieved_tok_s:>9.0f} "
              f"{err:>6.1f}% {r.late_p50_ms:>11.2f} {r.late_p99_ms:>11.2f} {r.itl_p50_ms:>10.2f} "
              f"{r.itl_p99_ms:>10.2f} {r.cpu_s / r.wall_s * 100:>9.0f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
