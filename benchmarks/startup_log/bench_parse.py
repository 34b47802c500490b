"""How fast a long SGLang log is explained: parse → BootReport (+adjustments) and classify.

A server that ran a night writes hundreds of thousands of "Decode batch" lines after its boot lines;
`elsa-tune log explain` and every stop's classification read the whole file. Target: 200k lines in
under 5 s on one loaded core.

    python benchmarks/startup_log/bench_parse.py [--lines 200000]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from elsa_tune.runtime.classify import classify, looks_failed
from elsa_tune.runtime.failure import FailureHints
from elsa_tune.runtime.startup_log import build_report
from elsa_tune.search_spaces.candidate import Candidate

LOGS = Path(__file__).resolve().parents[2] / "tests" / "runtime" / "logs"
DECODE = ("[2025-10-22 10:27:57 TP0] Decode batch. #running-req: 1, #token: 108, token usage: 0.00, accept len: 2.17, "
          "accept rate: 0.54, cuda graph: True, gen throughput (token/s): 0.39, #queue-req: 0, ")
DEATH = ("[2025-10-22 11:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
         "RuntimeError: Prefill out of memory. Try to lower your batch size.\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=200_000)
    args = parser.parse_args()
    boot = (LOGS / "hybrid_mamba_qwen35_tp2.log").read_text()
    text = boot + "The server is fired up and ready to roll!\n" + (DECODE + "\n") * args.lines + DEATH
    candidate = Candidate(flags={"max-running-requests": 128, "max-mamba-cache-size": 64})
    began = time.perf_counter()
    report = build_report(text, candidate)
    parsed = time.perf_counter()
    failed = looks_failed(text)
    failure = classify(text, FailureHints(exit_code=-9))
    done = time.perf_counter()
    total = text.count("\n")
    print(f"{total} lines, {len(text) / 2**20:.1f} MiB")
    print(f"build_report: {parsed - began:.2f} s ({total / (parsed - began):,.0f} lines/s), "
          f"{len(report.adjustments)} adjustments")
    print(f"looks_failed + classify: {done - parsed:.2f} s -> {failed}, {failure.kind.value}")


if __name__ == "__main__":
    main()
