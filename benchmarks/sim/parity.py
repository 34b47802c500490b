"""Does a client measure the simulated system, not the host, at the speed-ups studies use?

Boots ``elsa-tune sim serve`` (``--sim-config stock --sim-noise off``) at each ``--speedup``, drives it with
elsa-tune's load generator (which stamps its sends, acknowledges its first tokens and ends, and converts its own
wall-clock readings on the server's declared clock, ``traffic/sim_time.py``) and, when ``--sglang-python``
names a Python with SGLang 0.5.23, with ``python -m sglang.bench_serving`` (which knows nothing of the
simulator: the server serves it at the plain speed-up it declares, ``runtime/sim/plain_speed.py``; it is given
``--rate`` × that speed-up, and its wall-clock figures are converted here on the clock the server declares over
its pass, ``/sim/clock``: less the delivery lag, times the pass's simulated seconds per wall second; never with a
latency the server measured). Workloads: 2,000-token prompts, 200-token outputs; an open loop (Poisson arrivals
at ``--rate`` requests per simulated second; bench_serving's with at most 8 in flight, as the issue measured
it) and a closed loop of 8. Each row stands beside the simulator's truth (``runtime/sim/truth.py``: the same
engine on a simulated clock, no HTTP, no host) for the same arrivals: the open loop's schedule, the closed
loop's, or bench_serving's own draws (reproduced, ``bench_arrivals``) with its cap of 8 in flight.

    python benchmarks/sim/parity.py --speedup 1 10 40 --sglang-python ~/.cache/elsa-tune/sglang-0.5.23/bin/python
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from elsa_tune.runtime.sim.engine import SimRequest
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.runtime.sim.truth import Truth, TruthWorkload, truth
from elsa_tune.traffic.loadgen import LoadGenerator
from elsa_tune.traffic.measurement import RunMeasurement
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.traffic.sim_time import SimTime
from elsa_tune.traffic.workload import ReplayMode, RequestSpec, Workload, synthetic

READY = "The server is fired up and ready to roll!"
PROFILE = "rtx5090-qwen3.6-35b-a3b-nvfp4"
CONFIG = "stock"
BLOCK = 64
STREAMS = 8


@dataclass(frozen=True)
class Row:
    speedup: float
    client: str
    loop: str
    tok_s: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    truth: Truth
    effective_speedup: float
    wall_s: float
    note: str = ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(speedup: float, card_dir: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    argv = [sys.executable, "-m", "elsa_tune", "sim", "serve", "--sim-profile", PROFILE, "--sim-config", CONFIG,
            "--sim-noise", "off", "--sim-speedup", str(speedup), "--sim-card-dir", card_dir, "--model-path", "parity",
            "--port", str(port), "--enable-metrics"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = proc.stdout
    assert out is not None
    for line in out:
        if READY in line:
            threading.Thread(target=drain, args=(out,), daemon=True).start()
            return proc, f"http://127.0.0.1:{port}"
    out.close()
    raise SystemExit(f"the simulated server did not start (rc={proc.poll()})")


def drain(out: IO[str]) -> None:
    """Read the server's log to its end (so that it never blocks on a full pipe), then close it."""
    with out:
        for _ in out:
            pass


def stop(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    time.sleep(0.2)   # the drain thread reaches the log's end and closes it


def poisson(n: int, rate: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def open_loop(n: int, rate: float, speedup: float, seed: int) -> Workload:
    """``n`` requests at Poisson arrivals (simulated seconds), scheduled ``speedup`` times faster in wall time."""
    base = synthetic(n, 2000, 200, STREAMS, block_size=BLOCK, tag=f"parity-{seed}")
    specs = tuple(RequestSpec(index=s.index, arrival_s=a / speedup, input_tokens=s.input_tokens,
                              output_tokens=s.output_tokens, block_hashes=s.block_hashes)
                  for s, a in zip(base.requests, poisson(n, rate, seed), strict=True))
    return Workload(ReplayMode.OPEN_LOOP, specs, BLOCK, source="parity")


def truth_of(arrivals: list[float] | None, n: int, max_in_flight: int = 0) -> Truth:
    profile = load_profile(PROFILE)
    flags = {**profile.base_flags, **profile.configs[CONFIG].flags}
    if arrivals is None:
        work = TruthWorkload(concurrency=STREAMS, num_requests=n, input_tokens=(2000,), output_tokens=(200,),
                             block_size=BLOCK)
    else:
        work = TruthWorkload(requests=tuple(SimRequest(rid=f"r{i}", input_tokens=2000, output_tokens=200, arrival_s=a)
                                            for i, a in enumerate(arrivals)), block_size=BLOCK,
                             max_in_flight=max_in_flight)
    return truth(profile, flags, {}, work)


def run_elsa(url: str, workload: Workload) -> RunMeasurement:
    gen = LoadGenerator(url, PromptSynth(BLOCK, seed=7), slots=None)
    return gen.measure(workload, pass_index=0)


@dataclass(frozen=True)
class BenchRun:
    """One ``sglang.bench_serving`` pass, its wall-clock figures converted on the declared clock."""

    tok_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    effective_speedup: float      # simulated seconds per wall second over the pass (the declared knots)
    plain_speedup: float          # what the server declared it would serve a client that does not stamp at
    arrivals: list[float]         # bench_serving's own Poisson send schedule, in simulated seconds
    wall_s: float
    note: str


def bench_arrivals(n: int, rate: float, seed: int, vocab: int) -> list[float]:
    """bench_serving's send schedule (wall seconds from the first), drawn as it draws it: ``np.random.seed(seed)``,
    then ``random-ids``'s input lengths, output lengths and offsets, then one exponential interval per request
    (``sglang/benchmark/serving.py`` ``get_request``, ``datasets/random.py``, sglang 0.5.23)."""
    import numpy as np

    draws = np.random.RandomState(seed)
    draws.randint(2000, 2001, size=n)
    draws.randint(200, 201, size=n)
    draws.randint(0, vocab, size=n)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += float(draws.exponential(1.0 / rate))
    return out


def pass_start(clock: SimTime, began: float, plain: float) -> float | None:
    """Where the server retimed its clock to the plain speed-up after ``began``: the pass's first request."""
    knots = [k for k in clock.knots if k[0] >= began]
    for (w0, s0), (w1, s1) in itertools.pairwise(knots):
        if w1 > w0 and abs((s1 - s0) / (w1 - w0) - plain) < 0.01 * plain:
            return w0
    return None


def run_bench_serving(python: str, url: str, n: int, rate: float, tokenizer: Path,
                      workdir: Path) -> BenchRun | str:
    """Drive the server with bench_serving at ``rate`` requests per simulated second: its wall-clock rate is
    ``rate`` × the plain speed-up the server declares; its wall figures are converted with the clock's mapping
    over the pass (``/sim/clock`` knots, less the delivery lag), never with server-side latencies."""
    declared = httpx.get(url + "/server_info", timeout=10).json()["simulated"]["clock"]
    plain = float(declared["plain_speedup"])
    out = workdir / f"bench-{time.monotonic_ns()}.jsonl"
    cmd = [python, "-m", "sglang.bench_serving", "--backend", "sglang-oai", "--base-url", url, "--model", "parity",
           "--tokenizer", str(tokenizer), "--dataset-name", "random-ids", "--random-input-len", "2000",
           "--random-output-len", "200", "--random-range-ratio", "1.0", "--num-prompts", str(n),
           "--max-concurrency", str(STREAMS), "--request-rate", str(rate * plain), "--warmup-requests", "0",
           "--disable-tqdm", "--output-file", str(out), "--seed", "1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    began = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
    ended = time.monotonic()
    if done.returncode != 0 or not out.exists():
        return f"FAILED: {(done.stdout + done.stderr)[-300:]}"
    result = json.loads(out.read_text().strip().splitlines()[-1])
    clock = SimTime.of_clock(httpx.get(url + "/sim/clock", params={"since": began}, timeout=10).json())
    if clock is None:
        return "FAILED: the server declared no clock"
    duration = float(result["duration"])
    start = pass_start(clock, began, plain) or ended - duration
    speed = clock.mean_rate(start, start + duration)   # bench_serving's own window: first send to last chunk
    lag = clock.lag_s

    def sim_s(wall_ms: float) -> float:
        return (wall_ms / 1e3 - lag) * speed

    vocab = json.loads((tokenizer / "tokenizer.json").read_text())["model"]["vocab"]
    arrivals = [a * plain for a in bench_arrivals(n, rate * plain, 1, len(vocab))]
    return BenchRun(result["total_output_tokens"] / max(1e-9, (duration - lag) * speed),
                    sim_s(result["median_ttft_ms"]), sim_s(result["p99_ttft_ms"]), speed, plain, arrivals,
                    ended - began, f"{result['completed']}/{n}; its wall figures less the {lag * 1e3:g} ms lag "
                                   f"× {speed:.2f} (the declared clock over its pass; plain speed-up {plain:.2f})")


def train_tokenizer(directory: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    words = [f"w{i} hi token stream bench{i % 97} data{i % 13}" for i in range(5000)]
    tok.train_from_iterator(words, trainers.BpeTrainer(vocab_size=2000, special_tokens=["<unk>", "<s>", "</s>"]))
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20, "unk_token": "<unk>",
        "bos_token": "<s>", "eos_token": "</s>"}))
    return directory


def ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1e3:,.0f}"


def pct(value: float | None, ref: float | None) -> str:
    return "" if value is None or not ref else f" ({(value / ref - 1) * 100:+.1f}%)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speedup", type=float, nargs="+", default=[1.0, 10.0, 40.0])
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--rate", type=float, default=2.0, help="open loop: requests per simulated second")
    parser.add_argument("--sglang-python", default=os.environ.get("ELSA_SGLANG_PYTHON"),
                        help="a Python with sglang 0.5.23 for sglang.bench_serving (default $ELSA_SGLANG_PYTHON)")
    args = parser.parse_args()
    arrivals = poisson(args.requests, args.rate, seed=1)
    truths = {"open": truth_of(arrivals, args.requests), "closed": truth_of(None, args.requests)}
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="elsa-parity-") as tmp:
        tokenizer = train_tokenizer(Path(tmp) / "tokenizer") if args.sglang_python else None
        for s in args.speedup:
            proc, url = start_server(s, str(Path(tmp) / "card"))
            try:
                for loop, work in (("open", open_loop(args.requests, args.rate, s, seed=1)),
                                   ("closed", synthetic(args.requests, 2000, 200, STREAMS, block_size=BLOCK,
                                                        tag=f"parity-closed-{s:g}"))):
                    began = time.monotonic()
                    m = run_elsa(url, work)
                    wall = time.monotonic() - began
                    note = ("stamped: its own readings on the declared clock" if m.simulated
                            else "WALL TIME: the server declared no clock")
                    rows.append(Row(s, "elsa-tune loadgen", loop, m.output_throughput_tok_s, m.ttft_s.p50,
                                    m.ttft_s.p99, truths[loop], m.window_s / wall, wall,
                                    f"{m.requests_ok}/{m.requests_total}; {note}"))
                if args.sglang_python and tokenizer is not None:
                    bench = run_bench_serving(args.sglang_python, url, args.requests, args.rate, tokenizer, Path(tmp))
                    if isinstance(bench, str):
                        rows.append(Row(s, "sglang.bench_serving", "open*", None, None, None, truths["open"], 0.0,
                                        0.0, bench))
                    else:
                        rows.append(Row(s, "sglang.bench_serving", "open*", bench.tok_s, bench.ttft_p50_s,
                                        bench.ttft_p99_s, truth_of(bench.arrivals, args.requests, STREAMS),
                                        bench.effective_speedup, bench.wall_s, bench.note))
            finally:
                stop(proc)
    print(f"{PROFILE} --sim-config {CONFIG} --sim-noise off; 2,000-token prompts, 200-token outputs, "
          f"{args.requests} requests, at most {STREAMS} in flight; open loop at {args.rate:g} req/s (simulated)")
    print("| speed-up | client | loop | effective speed-up | wall s | output tok/s (truth) | TTFT p50 ms (truth) "
          "| TTFT p99 ms (truth) | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        t = r.truth
        print(f"| {r.speedup:g} | {r.client} | {r.loop} | {r.effective_speedup:.2f}× | {r.wall_s:.1f} | "
              f"{'—' if r.tok_s is None else f'{r.tok_s:,.1f}'}{pct(r.tok_s, t.output_tokens_per_s)} "
              f"({(t.output_tokens_per_s or 0):,.1f}) | {ms(r.ttft_p50_ms)}{pct(r.ttft_p50_ms, t.ttft_p50_s)} "
              f"({ms(t.ttft_p50_s)}) | {ms(r.ttft_p99_ms)}{pct(r.ttft_p99_ms, t.ttft_p99_s)} ({ms(t.ttft_p99_s)}) "
              f"| {r.note} |")
    print("open*: sglang.bench_serving's own Poisson draws at the same rate, at most 8 in flight (its semaphore); its "
          "truth is the same engine on those arrivals (its draws reproduced, bench_arrivals), a request held by the "
          "cap sent when a slot frees.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
