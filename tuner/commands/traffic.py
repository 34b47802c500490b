"""``elsa-tune traffic import|show``: bring traffic someone else recorded into the trace format, and look at it."""

from __future__ import annotations

import argparse
import json
import sys

from elsa_tune.output_path import OutputPath
from elsa_tune.traffic.imports import FORMATS, import_trace
from elsa_tune.traffic.summary import render_text, summarize
from elsa_tune.traffic.trace import read_trace, write_trace
from elsa_tune.tuner.argument_types import nonnegative_int, positive_float, positive_int

NAME = "traffic"
HELP = "import public traces or request logs into a trace, and show what a trace looks like"
EXAMPLES = ('elsa-tune traffic import mooncake_trace.jsonl --format mooncake -o prod.parquet',
            'elsa-tune traffic show prod.parquet --json')


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="traffic_command", metavar="ACTION", required=True)

    imp = sub.add_parser("import", help="convert a Mooncake/Azure trace or an OpenAI-style JSONL request log",
                         description="Convert a public trace or a request log into elsa-tune's Parquet trace.")
    imp.add_argument("file", help="the trace or log to import")
    imp.add_argument("--format", required=True, choices=FORMATS, dest="fmt",
                     help="mooncake (JSONL, 512-token hash_ids), azure (2023 CSV), openai-jsonl (request logs)")
    imp.add_argument("-o", "--output", required=True, help="the Parquet trace to write")
    imp.add_argument("--skip-bad", action="store_true",
                     help="leave malformed lines out and list them, instead of stopping at the first")
    imp.add_argument("--kind", default="chat",
                     help="content regime for traces that do not say (mooncake, azure; default: chat)")
    imp.add_argument("--block-size", type=positive_int, default=None,
                     help="tokens per prefix block for azure and openai-jsonl (default 512; mooncake is 512)")
    imp.add_argument("--breakers-sample", type=nonnegative_int, default=500, metavar="N",
                     help="openai-jsonl: analyse the first N prompts for prefix-cache breakers (0: skip; default 500)")
    imp.set_defaults(func=run_import)

    show = sub.add_parser("show", help="requests, rate over time, lengths, prefix reuse, busiest window, breakers",
                          description="Summarise a trace: rate, lengths, prefix reuse, sessions, busiest window.")
    show.add_argument("file", help="a Parquet trace")
    show.add_argument("--json", action="store_true", help="print the versioned summary record as JSON")
    show.add_argument("--window", type=positive_float, default=None,
                      help="busiest-window length in seconds (default: a day, an hour or a minute by span)")
    show.add_argument("--bins", type=positive_int, default=60, help="bins of the rate curve (default 60)")
    show.set_defaults(func=run_show)


def run_import(args: argparse.Namespace) -> int:
    OutputPath(args.output, "-o").check([args.file])
    result = import_trace(args.file, args.fmt, skip_bad=args.skip_bad, kind=args.kind, block_size=args.block_size,
                          breakers_sample=args.breakers_sample)
    write_trace(result.trace, args.output)
    print(f"imported {len(result.trace):,} requests from {result.lines:,} lines of {args.file} → {args.output}")
    if result.skipped:
        print(f"skipped {len(result.skipped):,} malformed lines:", file=sys.stderr)
        for line in result.skipped[:20]:
            print(f"  {line}", file=sys.stderr)
        if len(result.skipped) > 20:
            print(f"  ... and {len(result.skipped) - 20:,} more", file=sys.stderr)
    return 0


def run_show(args: argparse.Namespace) -> int:
    summary = summarize(read_trace(args.file), bins=args.bins, window_s=args.window)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2, allow_nan=False))
    else:
        print(render_text(summary))
    return 0
