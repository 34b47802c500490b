"""``elsa-tune record``: synthesise a traffic trace from a Prometheus server's SGLang or llama.cpp series.

SGLang's series carry request counters and length histograms (``traffic.recording``); llama.cpp's carry token
counters only, so the mean prompt and output lengths are given (``traffic.token_recording``). ``--runtime``
chooses; without it, a Prometheus holding one family's series and not SGLang's is recorded as that family's.
"""

from __future__ import annotations

import argparse
import time

from elsa_tune.errors import TrafficError
from elsa_tune.output_path import OutputPath
from elsa_tune.runtime.family import FamilyName, family
from elsa_tune.traffic.prometheus import PrometheusClient, parse_duration, parse_time
from elsa_tune.traffic.recording import Recording, RecordWindow, record
from elsa_tune.traffic.token_recording import GivenLengths, TokenRecording, holds_series, record_tokens
from elsa_tune.traffic.trace import DEFAULT_BLOCK_SIZE, write_trace
from elsa_tune.tuner.argument_types import positive_float, positive_int

NAME = "record"
HELP = "record production traffic from Prometheus (SGLang or llama.cpp metrics) into a synthesised trace"
EXAMPLES = ("elsa-tune record --prometheus http://prom:9090 --since 14d --selector '{job=\"sglang\"}' -o "
            'prod.parquet',
            "elsa-tune record --prometheus http://prom:9090 --since 1d --runtime llamacpp --mean-input-tokens 800 "
            "--mean-output-tokens 250 -o prod.parquet")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus base URL, e.g. http://host:9090")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--since", default=None, metavar="DURATION",
                      help="record the last DURATION up to now or --end, e.g. 14d (default 14d)")
    when.add_argument("--start", default=None, metavar="TIME", help="window start: ISO-8601 (UTC) or Unix seconds")
    parser.add_argument("--end", default=None, metavar="TIME", help="window end (default: now)")
    parser.add_argument("--selector", default="", metavar="MATCHERS",
                        help="label matchers for the server's series, e.g. '{job=\"sglang\"}' (default: all series)")
    parser.add_argument("--runtime", choices=[name.value for name in FamilyName], default=None,
                        help="whose series to read (default: the family whose series Prometheus holds in the window, "
                             "SGLang when it holds both or neither)")
    parser.add_argument("--mean-input-tokens", type=positive_float, default=None, metavar="N",
                        help="mean prompt length of the requests, for a runtime whose series carry no lengths "
                             "(llamacpp, vllm; required there)")
    parser.add_argument("--mean-output-tokens", type=positive_float, default=None, metavar="N",
                        help="mean output length of the requests (llamacpp, vllm; required there): arrivals are the "
                             "generation-token rate divided by it")
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
    now = time.time()
    window = window_from(args, now)
    with PrometheusClient(args.prometheus, timeout_s=args.timeout) as client:
        runtime, notes = _runtime(args, client, window, now)
        recording: Recording | TokenRecording
        if runtime is FamilyName.SGLANG:
            _refuse_lengths(args)
            recording = record(client, window, seed=args.seed, scale=args.scale, block_size=args.block_size)
        else:
            lengths = _given_lengths(args, runtime, notes)
            recording = record_tokens(client, window, family(runtime).metrics, lengths, runtime=runtime.value,
                                      seed=args.seed, scale=args.scale, block_size=args.block_size, notes=notes)
    write_trace(recording.trace, args.output)
    print("\n".join(recording.report.lines()))
    print(f"wrote {len(recording.trace):,} synthesised requests to {args.output}")
    return 0


def _runtime(args: argparse.Namespace, client: PrometheusClient, window: RecordWindow,
             now: float) -> tuple[FamilyName, list[str]]:
    """The family whose series to record, and a note when it was detected rather than named."""
    if args.runtime:
        return FamilyName(args.runtime), []
    sglang = family(FamilyName.SGLANG).metrics.prefix
    if holds_series(client, window, sglang, now=now):
        return FamilyName.SGLANG, []
    for name in FamilyName:
        prefix = family(name).metrics.prefix
        if name is not FamilyName.SGLANG and holds_series(client, window, prefix, now=now):
            under = f" under {args.selector}" if args.selector else ""
            return name, [f"Prometheus holds {prefix} series and no {sglang} ones{under} in the window: recording "
                          f"{name.value}'s (--runtime chooses)"]
    return FamilyName.SGLANG, []   # neither: SGLang's recorder explains what is missing


def _given_lengths(args: argparse.Namespace, runtime: FamilyName, notes: list[str]) -> GivenLengths:
    """The mean lengths a family without length series needs; ``TrafficError`` with the remedy when not given."""
    if args.mean_input_tokens is None or args.mean_output_tokens is None:
        absent = " and ".join(flag for flag, value in (("--mean-input-tokens", args.mean_input_tokens),
                                                        ("--mean-output-tokens", args.mean_output_tokens))
                              if value is None)
        detected = f"{notes[0]}. " if notes else ""
        raise TrafficError(f"{detected}{family(runtime).metrics.missing}; so {absent} must be given",
                           remedy="pass --mean-input-tokens N --mean-output-tokens N, the mean prompt and output "
                                  "lengths in tokens of the requests this server serves (from the application's own "
                                  "logs, or from the usage.prompt_tokens and usage.completion_tokens of its "
                                  "responses); arrivals are derived as generation tokens divided by the output mean")
    return GivenLengths(mean_input_tokens=args.mean_input_tokens, mean_output_tokens=args.mean_output_tokens)


def _refuse_lengths(args: argparse.Namespace) -> None:
    """SGLang's series carry the lengths: given means would be silently ignored, so they are refused."""
    given = [flag for flag, value in (("--mean-input-tokens", args.mean_input_tokens),
                                      ("--mean-output-tokens", args.mean_output_tokens)) if value is not None]
    if given:
        others = ", ".join(name.value for name in FamilyName if name is not FamilyName.SGLANG)
        raise TrafficError(f"{' and '.join(given)} apply to runtimes whose series carry no request lengths; SGLang's "
                           "length histograms give them here",
                           remedy=f"drop {' and '.join(given)}, or name the server's runtime with --runtime "
                                  f"({others})")
