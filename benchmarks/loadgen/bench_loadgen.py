"""How fast can elsa-tune's load generator go, and how true is its TTFT? Side by side with SGLang's client.

For each load point (streams x tokens/s per stream) it starts ``fast_server.py`` in its own process,
then runs, one after the other against the same server:

* elsa-tune's ``LoadGenerator`` (closed loop, ``streams`` in flight), in this process;
* ``python -m sglang.bench_serving --backend sglang-oai --dataset-name random-ids`` from the SGLang venv
  (``--sglang-python``), with a tiny tokenizer trained here so it runs offline.

It prints, per client: the throughput the client reports, the throughput the server stamped, the
offered load (streams x tokens / (TTFT + tokens / rate): the most the server's schedule can deliver),
the client's TTFT p50 against the server's stamped TTFT p50 (the timing error), ITL p50, and the
client's CPU seconds per million tokens (for bench_serving counted from its first request, so its
imports are not charged). A client that keeps up reports what the server stamped, with a small
TTFT error; one that does not falls below the offered load and its TTFT error grows.
``random-ids`` is used because ``random`` downloads ShareGPT from the Hugging Face hub (offline here).

    python benchmarks/loadgen/bench_loadgen.py                  # default sweep, about two minutes
    python benchmarks/loadgen/bench_loadgen.py --points 12x221 12x2212 120x221 64x0 --seconds 4
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from elsa_tune.traffic.loadgen import LoadGenerator, LoadgenSettings, Timeouts
from elsa_tune.traffic.prompts import PromptSynth, RandomTokens, TokenSpace
from elsa_tune.traffic.workload import synthetic

HERE = Path(__file__).resolve().parent
SEEDS_PEAK_TOK_S = 2654.0          # seed 001: 12 greedy requests on one RTX 5090


@dataclass
class Row:
    point: str
    client: str
    offered: float | None
    client_tok_s: float | None
    server_tok_s: float | None
    ttft_client_ms: float | None
    ttft_server_ms: float | None
    itl_ms: float | None
    cpu_s_per_mtok: float | None
    ok: str


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


class Server:
    def __init__(self, tok_s: float, ttft_ms: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, str(HERE / "fast_server.py"), "--port", str(self.port),
                                      "--tokens-per-s", str(tok_s), "--ttft-ms", str(ttft_ms)],
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening" not in line:
            self.stop()
            raise RuntimeError(f"fast_server did not start: {line!r}")

    def reset(self) -> None:
        httpx.post(self.url + "/reset", timeout=10)

    def stats(self) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(self.url + "/stats", timeout=30).json()
        return data

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def server_numbers(stats: dict[str, Any]) -> tuple[float | None, float | None]:
    span = (stats["last_end"] or 0) - (stats["first_recv"] or 0)
    tok_s = stats["tokens"] / span if span > 0 else None
    ttft = statistics.median(stats["ttft_s"]) * 1000 if stats["ttft_s"] else None
    return tok_s, ttft


def run_elsa(server: Server, streams: int, n_requests: int, out_len: int, transport: str) -> Row:
    workload = synthetic(n_requests, 64, out_len, streams, block_size=64, tag="bench")
    gen = LoadGenerator(server.url, PromptSynth(64, RandomTokens(TokenSpace(100, 1000))), slots=streams,
                        settings=LoadgenSettings(timeouts=Timeouts(run_s=300), model="fast", http_transport=transport))
    warm = synthetic(streams, 64, 8, streams, block_size=64, tag="warm")
    gen.measure(warm, 0)
    server.reset()
    before = resource.getrusage(resource.RUSAGE_SELF)
    m = gen.measure(workload, 1)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    s_tok, s_ttft = server_numbers(server.stats())
    name = "elsa-tune" if transport == "streaming" else "elsa-tune (httpx default transport)"
    return Row("", name, None, m.output_throughput_tok_s, s_tok,
               None if m.ttft_s.p50 is None else m.ttft_s.p50 * 1000, s_ttft,
               None if m.itl_s.p50 is None else m.itl_s.p50 * 1000, cpu / m.output_tokens * 1e6,
               f"{m.requests_ok}/{m.requests_total}")


def run_sglang(server: Server, streams: int, n_requests: int, out_len: int, python: str, tokenizer: Path,
               workdir: Path) -> Row:
    out = workdir / f"sglang-{streams}-{time.monotonic_ns()}.jsonl"
    server.reset()
    cmd = [python, "-m", "sglang.bench_serving", "--backend", "sglang-oai", "--base-url", server.url,
           "--model", "fast", "--tokenizer", str(tokenizer), "--dataset-name", "random-ids",
           "--random-input-len", "64", "--random-output-len", str(out_len), "--random-range-ratio", "1.0",
           "--num-prompts", str(n_requests), "--max-concurrency", str(streams), "--request-rate", "inf",
           # no warm-up request: it would open the server's measurement window a second before the run
           "--warmup-requests", "0", "--disable-tqdm", "--output-file", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    log = (workdir / "sglang.log").open("w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    # The client's CPU from its first request on (its imports of torch & co. are not load generation).
    cpu_at_start: float | None = None
    deadline = time.monotonic() + 900
    while proc.poll() is None and time.monotonic() < deadline:
        if cpu_at_start is None and server.stats()["requests"] > 0:
            cpu_at_start = _proc_cpu(proc.pid)
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    log.close()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 or not out.exists():
        tail = (workdir / "sglang.log").read_text()[-1500:]
        return Row("", "sglang.bench_serving", None, None, None, None, None, None, None, f"FAILED: {tail}")
    result = json.loads(out.read_text().strip().splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime) - (cpu_at_start or 0.0)
    s_tok, s_ttft = server_numbers(server.stats())
    if cpu_at_start is None:
        cpu = float("nan")
    return Row("", "sglang.bench_serving", None, result["output_throughput"], s_tok, result["median_ttft_ms"], s_ttft,
               result["median_itl_ms"], cpu / max(1, result["total_output_tokens"]) * 1e6,
               f"{result['completed']}/{n_requests}")


def _proc_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fmt(v: float | None, spec: str = ",.0f") -> str:
    return "—" if v is None else format(v, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", nargs="+", default=["12x221", "12x2212", "120x221", "64x0"],
                        help="STREAMSxTOKENS_PER_S per stream (0 = unthrottled server)")
    parser.add_argument("--out-len", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=4.0, help="target length of each run")
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--sglang-python", default=os.environ.get("ELSA_SGLANG_PYTHON", "/opt/sglang-venv/bin/python"))
    parser.add_argument("--skip-sglang", action="store_true")
    parser.add_argument("--with-httpx-transport", action="store_true",
                        help="also run elsa-tune's generator over httpx's default transport (httpcore + h11)")
    args = parser.parse_args()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        tokenizer = train_tokenizer(workdir / "tokenizer")
        for point in args.points:
            streams_s, rate_s = point.split("x")
            streams, rate = int(streams_s), float(rate_s)
            per_request_s = (args.out_len / rate if rate else 0.05) + args.ttft_ms / 1000
            # whole rounds, so the run does not end with a tail of fewer streams than asked
            n_requests = streams * max(2, round(args.seconds / per_request_s))
            # what the server can deliver: each stream idles for the TTFT before its tokens
            offered = streams * args.out_len / per_request_s if rate else None
            server = Server(rate, args.ttft_ms)
            try:
                found = [run_elsa(server, streams, n_requests, args.out_len, "streaming")]
                if args.with_httpx_transport:
                    found.append(run_elsa(server, streams, n_requests, args.out_len, "httpx"))
                if not args.skip_sglang and Path(args.sglang_python).exists():
                    found.append(run_sglang(server, streams, n_requests, args.out_len, args.sglang_python,
                                            tokenizer, workdir))
            finally:
                server.stop()
            for row in found:
                row.point, row.offered = f"{streams} x {fmt(rate)} tok/s ({n_requests} req)", offered
                rows.append(row)
                print(f"{row.point:<28} {row.client:<22} client {fmt(row.client_tok_s)} tok/s, "
                      f"server {fmt(row.server_tok_s)} tok/s, ok {row.ok[:200]}", file=sys.stderr, flush=True)
    head = ("| load point | client | offered tok/s | client tok/s | server tok/s | TTFT p50 client | "
            "TTFT p50 server | TTFT error | ITL p50 | client CPU s / M tok | ok |")
    print(head)
    print("|" + "---|" * 11)
    for r in rows:
        err = None if r.ttft_client_ms is None or r.ttft_server_ms is None else r.ttft_client_ms - r.ttft_server_ms
        print(f"| {r.point} | {r.client} | {fmt(r.offered)} | {fmt(r.client_tok_s)} | {fmt(r.server_tok_s)} | "
              f"{fmt(r.ttft_client_ms, '.2f')} ms | {fmt(r.ttft_server_ms, '.2f')} ms | {fmt(err, '+.2f')} ms | "
              f"{fmt(r.itl_ms, '.3f')} ms | {fmt(r.cpu_s_per_mtok, '.1f')} | {r.ok[:60]} |")
    print(f"\nseeds' peak: {SEEDS_PEAK_TOK_S:,.0f} tok/s over 12 streams; goal >= {10 * SEEDS_PEAK_TOK_S:,.0f} tok/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
