"""``elsa-tune record``: synthesise a traffic trace from a Prometheus server's SGLang series."""

from __future__ import annotations

import argparse
import time

from elsa_tune.errors import TrafficError
from elsa_tune.output_path import OutputPath
from elsa_tune.traffic.prometheus import PrometheusClient, parse_duration, parse_time
from elsa_tune.traffic.recording import RecordWindow, record
from elsa_tune.traffic.trace import DEFAULT_BLOCK_SIZE, write_trace
from elsa_tune.tuner.argument_types import positive_float, positive_int

NAME = "record"
HELP = "record production traffic from Prometheus (SGLang metrics) into a synthesised trace"
EXAMPLES = ("elsa-tune record --prometheus http://prom:9090 --since 14d --selector '{job=\"sglang\"}' -o "
            'prod.parquet',)


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus base URL, e.g. http://host:9090")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--since", default=None, metavar="DURATION",
                      help="record the last DURATION up to now or --end, e.g. 14d (default 14d)")
    when.add_argument("--start", default=None, metavar="TIME", help="window start: ISO-8601 (UTC) or Unix seconds")
    parser.add_argument("--end", default=None, metavar="TIME", help="window end (default: now)")
    parser.add_argument("--selector", default="", metavar="MATCHERS",
                        help="label matchers for SGLang's series, e.g. '{job=\"sglang\"}' (default: all series)")
    parser.add_argument("--step", default=None, metavar="DURATION",
                        help="resolution of the rate curve, at least the scrape interval (default: from the window's "
                             "length, 5s for minutes up to 60s for days)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthesis (default 0)")
    parser.add_argument("--scale", type=positive_float, default=1.0,
                        help="keep this share of the requests, e.g. 0.1 for a tenth (default 1)")
    parser.add_argument("--block-size", type=positive_int, default=DEFAULT_BLOCK_SIZE,
                        help=f"tokens per prefix block (default {DEFAULT_BLOCK_SIZE})")
    parser.add_argument("--timeout", type=positive_float, default=60.0,
                        help="seconds per Prometheus query (default 60)")
    parser.add_argument("-o", "--output", required=True, help="the Parquet trace to write")
    parser.set_defaults(func=run)


def window_from(args: argparse.Namespace, now: float) -> RecordWindow:
    """The window the arguments name; ``TrafficError`` for unreadable times and durations."""
    end = parse_time(args.end) if args.end else now
    start = parse_time(args.start) if args.start else end - parse_duration(args.since or "14d")
    if end > now + 60:
        raise TrafficError(f"--end {args.end} is in the future", remedy="record a window that has already happened")
    return RecordWindow(start=start, end=end, step=parse_duration(args.step) if args.step else None,
                        selector=args.selector)


def run(args: argparse.Namespace) -> int:
    OutputPath(args.output, "-o").check()   # before the first query: a refused output costs no Prometheus time
    window = window_from(args, time.time())
    with PrometheusClient(args.prometheus, timeout_s=args.timeout) as client:
        recording = record(client, window, seed=args.seed, scale=args.scale, block_size=args.block_size)
    write_trace(recording.trace, args.output)
    print("\n".join(recording.report.lines()))
    print(f"wrote {len(recording.trace):,} synthesised requests to {args.output}")
    return 0
