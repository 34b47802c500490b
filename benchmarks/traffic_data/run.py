"""How fast the traffic-data paths are: imports, ``traffic show``, the breaker finder, recording two weeks.

    python benchmarks/traffic_data/run.py [--shared ../shared] [--agents 200] [--skip-prometheus]

Targets on the 2-core dev machine: importing either public trace (12k / 19k lines) in under 5 s;
summarising it in under 2 s; the breaker finder at over 100k prompt pieces per second (an import
analyses 500 prompts by default, so a log of 20k-token prompts costs under two minutes); recording two
weeks of SGLang series (backfilled into a real Prometheus, 5-minute scrapes, 60 s step: 20k points
per series, three pages) in under 30 s, not counting the backfill.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "traffic"))

from prometheus_backfill import generate, running_prometheus

from elsa_tune.traffic.breakers import find_breakers
from elsa_tune.traffic.imports import import_trace
from elsa_tune.traffic.prometheus import PrometheusClient
from elsa_tune.traffic.recording import RecordWindow, record
from elsa_tune.traffic.requestlog import pieces
from elsa_tune.traffic.summary import summarize


def timed(label: str, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    print(f"{label:<52} {time.perf_counter() - start:7.2f} s")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[3] / "shared")
    parser.add_argument("--agents", type=int, default=200, help="prompts for the breaker finder")
    parser.add_argument("--skip-prometheus", action="store_true")
    args = parser.parse_args()

    traces = args.shared / "traces"
    mooncake = timed("import mooncake conversation (12,031 lines)", import_trace,
                     traces / "mooncake_conversation_trace.jsonl", "mooncake").trace
    azure = timed("import azure 2023 conversation (19,366 lines)", import_trace,
                  traces / "azure_llm_2023_conv.csv", "azure").trace
    timed("summarise mooncake", summarize, mooncake)
    timed("summarise azure", summarize, azure)

    context = " ".join(f"Rule {i}: answer in the house style, cite section {i % 11}." for i in range(1500))
    prompts = [f"session: {uuid.uuid4()}\n{context}\nuser: question {i}" for i in range(args.agents)]
    total = sum(len(pieces(p)) for p in prompts)
    start = time.perf_counter()
    found = find_breakers(prompts)
    elapsed = time.perf_counter() - start
    print(f"{'breakers: ' + f'{args.agents:,} prompts, {total:,} pieces':<52} {elapsed:7.2f} s "
          f"({total / elapsed / 1e6:.2f} M pieces/s; found {[(b.pattern, b.requests) for b in found]})")

    if not args.skip_prometheus:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            truth = timed("generate 14 days of SGLang series (OpenMetrics)", generate, work / "series.om", days=14,
                          end=time.time() - 3600, scrape_s=300.0)
            start = time.perf_counter()
            with running_prometheus(work / "series.om", work) as url:
                print(f"{'backfill (promtool) + start Prometheus':<52} {time.perf_counter() - start:7.2f} s")
                with PrometheusClient(url) as client:
                    recording = timed("record 14 days at a 60 s step", record, client,
                                      RecordWindow(start=truth.start, end=truth.end, step=60.0,
                                                   selector='{job="sglang"}'))
            print("\n".join(recording.report.lines()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
