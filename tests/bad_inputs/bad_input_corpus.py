"""The corpus of bad inputs: files a new user might hand elsa-tune, and the argument lists that hand them over.

``write_files(root)`` writes every file of the corpus under ``root``; ``CASES`` are argument lists in which
``{d}`` stands for ``root``. Each case is a mistake: the command must refuse it with one paragraph and a remedy,
an exit status of 1–5, and change no file.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
TS = str(REPO / "benchmarks" / "workers" / "tiny-space.yaml")
SIM = ("--gpu", "sim", "--sim-profile", "tiny-test", "--space", TS, "--traffic", "demo", "--budget", "1m")

GOOD_MOONCAKE = {"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
SPACE = (REPO / "benchmarks" / "workers" / "tiny-space.yaml").read_text()
#: a flag file of the tiny simulated card (``elsa-tune compare``), as ``best/server-args.yaml`` is written
FLAGS = ("model-path: tiny-hybrid\nmem-fraction-static: 0.6\nmax-running-requests: 2\nmax-mamba-cache-size: 24\n"
         "speculative-algorithm: EAGLE\nspeculative-eagle-topk: 1\nspeculative-num-steps: 2\n"
         "speculative-num-draft-tokens: 3\n")
#: an alias bomb as one flow value: nine aliases a level, eight levels (43 million leaves once expanded)
BOMB = "[&a [x,x,x,x,x,x,x,x,x], " + ", ".join(
    f"&{b} [{','.join(['*' + a] * 9)}]" for a, b in zip("abcdefg", "bcdefgh", strict=True)) + "]"
COMPARE = ("compare", "--gpu", "sim", "--virtual", "--sim-profile", "tiny-test", "--space", TS)


@dataclass(frozen=True)
class Case:
    """One bad input: its name and the argument list (``{d}`` is the corpus folder)."""

    name: str
    argv: tuple[str, ...]

    def args(self, root: Path) -> list[str]:
        return [a.replace("{d}", str(root)) for a in self.argv]


def _jsonl(*records: object) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def _mooncake(**change: object) -> str:
    return _jsonl({**GOOD_MOONCAKE, **change})


FILES: dict[str, str | bytes] = {
    "good.jsonl": _jsonl(GOOD_MOONCAKE, {**GOOD_MOONCAKE, "timestamp": 1000}),
    "self.jsonl": _jsonl(GOOD_MOONCAKE),
    "binary.dat": bytes(range(256)) * 40,
    "empty.txt": "",
    "text.log": "hello\nthis is not a server log\n",
    "mc-huge-output.jsonl": _mooncake(output_length=3_000_000_000),
    "mc-huge-input.jsonl": _mooncake(input_length=3_000_000_000, hash_ids=[]),
    "mc-nan-ts.jsonl": '{"timestamp": NaN, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}\n',
    "mc-inf-ts.jsonl": '{"timestamp": Infinity, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}\n',
    "mc-neg-ts.jsonl": _mooncake(timestamp=-5),
    "mc-nan-len.jsonl": '{"timestamp": 0, "input_length": NaN, "output_length": 20, "hash_ids": [1, 2]}\n',
    "mc-float-len.jsonl": _mooncake(input_length=600.5),
    "mc-zero-out.jsonl": _mooncake(output_length=0),
    "mc-bool-len.jsonl": _mooncake(output_length=True),
    "mc-str-len.jsonl": _mooncake(output_length="20"),
    "mc-hashes.jsonl": _mooncake(hash_ids=[1]),
    "mc-hash-str.jsonl": _mooncake(hash_ids=["a", "b"]),
    "mc-array.jsonl": _jsonl([1, 2, 3]),
    "mc-not-json.jsonl": "{timestamp: 0\n",
    "mc-not-utf8.jsonl": b"\xff\xfe{\"timestamp\": 0}\n",
    "mc-deep.jsonl": "[" * 100_000 + "\n",
    "az-huge.csv": AZURE_HEADER + "2023-11-16 18:15:46.6805900,99999999999,10\n",
    "az-header.csv": "time,in,out\n2023-11-16 18:15:46,10,10\n",
    "az-date.csv": AZURE_HEADER + "yesterday,10,10\n",
    "az-neg.csv": AZURE_HEADER + "2023-11-16 18:15:46,-10,10\n",
    "az-float.csv": AZURE_HEADER + "2023-11-16 18:15:46,1.5,10\n",
    "az-short.csv": AZURE_HEADER + "2023-11-16 18:15:46,10\n",
    "az-only-header.csv": AZURE_HEADER,
    "oa-inf-time.jsonl": '{"created": Infinity, "messages": [{"role": "user", "content": "hi"}]}\n',
    "oa-nan-time.jsonl": '{"created": NaN, "messages": [{"role": "user", "content": "hi"}]}\n',
    "oa-no-body.jsonl": _jsonl({"created": 1700000000}),
    "oa-bad-prompt.jsonl": _jsonl({"created": 1700000000, "prompt": {"a": 1}}),
    "oa-bad-message.jsonl": _jsonl({"created": 1700000000, "messages": ["hi"]}),
    "oa-huge-usage.jsonl": _jsonl({"created": 1700000000, "messages": [{"role": "user", "content": "hi"}],
                                   "usage": {"prompt_tokens": 1e300}}),
    "oa-no-time.jsonl": _jsonl({"messages": [{"role": "user", "content": "hi"}]}),
    "space-ok.yaml": SPACE,
    "space-broken.yaml": "name: [x\n",
    "space-inf.yaml": SPACE.replace("high: 0.7,", "high: .inf,"),
    "space-nan.yaml": SPACE.replace("low: 0.5,", "low: .nan,"),
    "space-huge-rule.yaml": SPACE + "rules:\n  - rule: \"'a' * 999999999999 == 'b'\"\n",
    "space-pow-rule.yaml": SPACE + "rules:\n  - rule: \"mem-fraction-static ** 99999999 > 1\"\n",
    "space-unknown-flag.yaml": SPACE.replace("max-running-requests: {type", "max-running-requestz: {type"),
    "space-low-high.yaml": SPACE.replace("low: 1, high: 4", "low: 4, high: 1"),
    "space-list.yaml": "- 1\n- 2\n",
    "space-empty.yaml": "",
    "space-binary.yaml": b"\x00\x01\x02\xff" * 100,
    "workload-bad.json": '{"requests": "many"}',
    "ledger/ledger.jsonl": "{not json\n",
    "run-empty/placeholder": "",
    "afile": "a file, not a folder\n",
    "flags-a.yaml": FLAGS,
    "flags-b.yaml": FLAGS.replace("0.6", "0.7"),
    "flags-unknown.yaml": FLAGS + "enable-mixed-chunks: true\n",
    "flags-underscore.yaml": FLAGS + "chunked_prefill_size: 4096\n",
    "flags-dashes.yaml": FLAGS + "--page-size: 16\n",
    "flags-switch-value.yaml": FLAGS + "enable-metrics: 3\n",
    "flags-needs-value.yaml": FLAGS + "chunked-prefill-size: true\n",
    "flags-float-int.yaml": FLAGS + "chunked-prefill-size: 2.5\n",
    "flags-choice.yaml": FLAGS + "kv-cache-dtype: fp8\n",
    "flags-null.yaml": FLAGS + "page-size:\n",
    "flags-nan.yaml": FLAGS + "schedule-conservativeness: .nan\n",
    "flags-list.yaml": FLAGS + "cuda-graph-bs: [1, 2]\n",
    "flags-dup.yaml": FLAGS + "mem-fraction-static: 0.7\n",
    "flags-other-model.yaml": FLAGS.replace("tiny-hybrid", "other-model"),
    "flags-no-model.yaml": FLAGS.replace("model-path: tiny-hybrid\n", ""),
    "flags-no-model-b.yaml": FLAGS.replace("model-path: tiny-hybrid\n", "").replace("0.6", "0.7"),
    "flags-only-host.yaml": "host: 0.0.0.0\nport: 30000\n",
    "flags-env.yaml": "# Environment (not a flag; export it first): X='unclosed\n" + FLAGS,
    # issue 31: numbers past the finite-number rule, documents past the loader's bounds, values of the wrong type
    "space-huge-int.yaml": SPACE.replace("high: 4,", "high: " + "9" * 400 + ","),
    "space-deep.yaml": "[" * 100_000 + "\n",
    "space-deep-value.yaml": SPACE.replace("description: ", "description: " + "[" * 40 + "1" + "]" * 40 + " #"),
    "space-bomb.yaml": SPACE.replace("name: tiny-distributed", "name: " + BOMB),
    "space-big.yaml": SPACE + "# " + "x" * (1 << 20) + "\n",
    "space-unclosed-quote.yaml": SPACE.replace("command: [python, -m, sglang.launch_server]",
                                               "command: \"python -m 'sglang\""),
    "space-choices-int.yaml": SPACE.replace("max-running-requests: {type: int, low: 1, high: 3, baseline: 2}",
                                            "max-running-requests: {type: categorical, choices: [two, 2], "
                                            "baseline: 2}"),
    "space-float-for-int.yaml": SPACE.replace("max-running-requests: {type: int, low: 1, high: 3, baseline: 2}",
                                              "max-running-requests: {type: float, low: 1.5, high: 3, baseline: 2}"),
    "space-choices-nan.yaml": SPACE.replace("mem-fraction-static: {type: float, low: 0.5, high: 0.7, step: 0.05, "
                                            "baseline: 0.6}", "mem-fraction-static: {type: categorical, choices: "
                                            "[.nan, 0.6], baseline: 0.6}"),
    "space-tiny-step.yaml": SPACE.replace("step: 0.05", "step: 1e-300"),
    "flags-bomb.yaml": FLAGS + "? " + BOMB + "\n: 1\n",
    "flags-huge-int.yaml": FLAGS + "chunked-prefill-size: " + "9" * 400 + "\n",
    "flags-1e308.yaml": FLAGS.replace("0.6", "1e308"),
    "flags-nul.yaml": FLAGS + "page-size: 1\0\n",
    "flags-deep.yaml": FLAGS + "page-size: " + "[" * 100_000 + "\n",
    "workload-huge.json": '{"num_requests": 100000000}',
    "workload-negative.json": '{"num_requests": 10, "input_tokens": [-5], "output_tokens": [-5]}',
    "workload-list.json": "[]",
    "report-md-folder/study.json": "{}\n",
    "report-md-folder/report.md/keep": "",
    # a --runtime-python that starts a sleeping grandchild (holding the output pipes) and never exits
    "never-exits.sh": "#!/bin/sh\nsleep 1000 &\nsleep 1000\n",
}
#: the files of ``FILES`` written as executable programs
EXECUTABLES = ("never-exits.sh",)


def write_files(root: Path) -> None:
    """Every file of the corpus under ``root`` (Parquet ones written with pyarrow)."""
    for name, content in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    (root / "folder").mkdir(exist_ok=True)
    for program in EXECUTABLES:
        (root / program).chmod(0o755)
    for fifo in ("fifo", "fifo-ledger/ledger.jsonl"):     # special files: an input that would block, never end
        (root / fifo).parent.mkdir(parents=True, exist_ok=True)
        if not (root / fifo).exists():
            os.mkfifo(root / fifo)
    table = pa.table({"x": [1, 2]})
    pq.write_table(table, root / "not-a-trace.parquet")
    meta = {b"elsa_tune.schema_version": b"\xff\xfe", b"elsa_tune.block_size": b"512"}
    pq.write_table(table.replace_schema_metadata(meta), root / "meta-not-utf8.parquet")
    from elsa_tune.traffic.imports import import_trace
    from elsa_tune.traffic.trace import write_trace

    one = import_trace(root / "self.jsonl", "mooncake").trace
    write_trace(one, root / "one-row.parquet")
    write_trace(import_trace(root / "good.jsonl", "mooncake").trace, root / "good.parquet")
    pq.write_table(pq.read_table(root / "one-row.parquet").slice(0, 0), root / "zero-rows.parquet")


def _cases() -> list[Case]:
    cases: list[Case] = []

    def add(name: str, *argv: str) -> None:
        cases.append(Case(name, tuple(argv)))

    # traffic import: the cases, then every way a source line can be wrong
    add("import onto a folder", "traffic", "import", "{d}/good.jsonl", "--format", "mooncake", "-o", "{d}/folder")
    add("import into /proc", "traffic", "import", "{d}/good.jsonl", "--format", "mooncake", "-o", "/proc/x/t.parquet")
    add("import onto its input", "traffic", "import", "{d}/self.jsonl", "--format", "mooncake", "-o", "{d}/self.jsonl")
    add("import onto its input by another path", "traffic", "import", "{d}/self.jsonl", "--format", "mooncake", "-o",
        "{d}/folder/../self.jsonl")
    add("import under a file", "traffic", "import", "{d}/good.jsonl", "--format", "mooncake", "-o",
        "{d}/afile/t.parquet")
    add("import a missing file", "traffic", "import", "{d}/nope.jsonl", "--format", "mooncake", "-o", "{d}/o.parquet")
    add("import a folder", "traffic", "import", "{d}/folder", "--format", "azure", "-o", "{d}/o.parquet")
    add("import unknown format", "traffic", "import", "{d}/good.jsonl", "--format", "sharegpt", "-o", "{d}/o.parquet")
    for size in ("0", "-5", "x", "1.5"):
        add(f"import block size {size}", "traffic", "import", "{d}/az-float.csv", "--format", "azure", "-o",
            "{d}/o.parquet", "--block-size", size)
    add("import breakers sample -1", "traffic", "import", "{d}/oa-no-time.jsonl", "--format", "openai-jsonl", "-o",
        "{d}/o.parquet", "--breakers-sample", "-1")
    for name in sorted(FILES):
        fmt = ("mooncake" if name.startswith("mc-") else "azure" if name.startswith("az-")
               else "openai-jsonl" if name.startswith("oa-") else None)
        if fmt:
            add(f"import {name}", "traffic", "import", f"{{d}}/{name}", "--format", fmt, "-o", "{d}/o.parquet")
            if "header" not in name and "only" not in name:
                add(f"import {name} --skip-bad", "traffic", "import", f"{{d}}/{name}", "--format", fmt, "-o",
                    "{d}/o.parquet", "--skip-bad")
    for name in ("binary.dat", "empty.txt", "text.log", "space-list.yaml"):
        for fmt in ("mooncake", "azure", "openai-jsonl"):
            add(f"import {name} as {fmt}", "traffic", "import", f"{{d}}/{name}", "--format", fmt, "-o",
                "{d}/o.parquet")

    # traffic show
    for bins in ("0", "-3", "x"):
        add(f"show --bins {bins}", "traffic", "show", "{d}/good.parquet", "--bins", bins)
    for window in ("0", "nan", "inf", "-1"):
        add(f"show --window {window}", "traffic", "show", "{d}/good.parquet", "--window", window)
    for name in ("binary.dat", "empty.txt", "good.jsonl", "not-a-trace.parquet", "meta-not-utf8.parquet", "folder",
                 "nope.parquet"):
        add(f"show {name}", "traffic", "show", f"{{d}}/{name}")
        add(f"show {name} --json", "traffic", "show", f"{{d}}/{name}", "--json")

    # log explain
    for name in ("binary.dat", "empty.txt", "text.log", "folder", "nope.log", "good.parquet"):
        add(f"log explain {name}", "log", "explain", f"{{d}}/{name}")
    add("log explain bad --flags", "log", "explain", "{d}/text.log", "--flags", "--a 'b")

    # gate
    for flag, values in (("--sigma-boot", ("nan", "inf", "-1", "x")), ("--sigma-run", ("nan", "-0.1")),
                         ("--passes", ("0", "-3", "1.5")), ("--alpha", ("nan", "0", "0.7", "-1")),
                         ("--looks", ("", "a", "8,4", "0", "1,1")), ("--min-effect", ("0", "nan"))):
        for value in values:
            add(f"gate plan {flag} {value!r}", "gate", "plan", flag, value)
    for runs in ("0", "-1"):
        add(f"gate simulate --runs {runs}", "gate", "simulate", "--runs", runs)
    add("gate simulate --effect nan", "gate", "simulate", "--effect", "nan")

    # space
    for name in ("space-broken.yaml", "space-inf.yaml", "space-nan.yaml", "space-huge-rule.yaml",
                 "space-pow-rule.yaml", "space-unknown-flag.yaml", "space-low-high.yaml", "space-list.yaml",
                 "space-empty.yaml", "space-binary.yaml", "nope.yaml", "folder"):
        add(f"space check {name}", "space", "check", f"{{d}}/{name}")
        if name != "space-unknown-flag.yaml":   # show prints the space as written; check holds it to the runtime
            add(f"space show {name}", "space", "show", f"{{d}}/{name}")
    add("space show unknown name", "space", "show", "generic-sglng")

    # leases
    add("leases --dir a file", "leases", "--dir", "{d}/afile")
    add("leases --dir missing", "leases", "--dir", "{d}/no-leases")
    for value in ("nan", "-1", "inf"):
        add(f"leases --stop-timeout {value}", "leases", "--stop-timeout", value)

    # the study
    add("study --out a file", *SIM, "--out", "{d}/afile")
    add("study --out in /proc", *SIM, "--out", "/proc/x")
    add("study --out under a file", *SIM, "--out", "{d}/afile/run")
    add("study --log-file a folder", *SIM, "--out", "{d}/run", "--log-file", "{d}/folder")
    add("study --log-file onto its traffic", "--gpu", "sim", "--sim-profile", "tiny-test", "--space", TS, "--traffic",
        "{d}/good.parquet", "--out", "{d}/run", "--log-file", "{d}/good.parquet")
    add("study --log-file onto its space", "--gpu", "sim", "--sim-profile", "tiny-test", "--space",
        "{d}/space-ok.yaml", "--traffic", "demo", "--out", "{d}/run", "--log-file", "{d}/space-ok.yaml")
    add("study --out onto its traffic", "--gpu", "sim", "--sim-profile", "tiny-test", "--space", TS, "--traffic",
        "{d}/good.parquet", "--out", "{d}/good.parquet")
    for value in ("nan", "0", "-1", "inf"):
        add(f"study --sim-speedup {value}", *SIM, "--out", "{d}/run", "--sim-speedup", value)
    add("study --pass-seconds 0", *SIM, "--out", "{d}/run", "--pass-seconds", "0")
    add("study --baseline-boots 0", *SIM, "--out", "{d}/run", "--baseline-boots", "0")
    add("study unknown profile", "--gpu", "sim", "--sim-profile", "nope", "--space", TS, "--traffic", "demo",
        "--out", "{d}/run")
    for traffic in ("nope.parquet", "folder", "binary.dat", "good.jsonl", "meta-not-utf8.parquet"):
        add(f"study --traffic {traffic}", "--gpu", "sim", "--sim-profile", "tiny-test", "--space", TS, "--traffic",
            f"{{d}}/{traffic}", "--out", "{d}/run")
    for space in ("space-inf.yaml", "space-huge-rule.yaml", "nope.yaml", "space-binary.yaml"):
        add(f"study --space {space}", "--gpu", "sim", "--sim-profile", "tiny-test", "--space", f"{{d}}/{space}",
            "--traffic", "demo", "--out", "{d}/run")
    for budget in ("soon", "-1h", "0s"):
        add(f"study --budget {budget}", "--gpu", "sim", "--sim-profile", "tiny-test", "--space", TS, "--traffic",
            "demo", "--budget", budget, "--out", "{d}/run")
    add("study --gpu 0,0", "--gpu", "0,0", "--traffic", "demo", "--out", "{d}/run")
    add("study --resume without a study", *SIM, "--out", "{d}/run-empty", "--resume")
    add("study unknown option", *SIM, "--out", "{d}/run", "--bugdet", "1m")

    # workers
    worker = ("worker", "--study", "s", "--gpu", "0", "--runtime", "sim", "--sim-profile", "tiny-test", "--space", TS,
              "--traffic", "demo", "--out", "{d}/wk")
    for url in ("notadb://x/y", "postgresql://user@:::/db", "sqlite:////proc/x/db", "sqlite:///{d}/afile/db",
                "mysql://x/y"):
        add(f"worker --storage {url}", *worker, "--storage", url)
    add("worker --heartbeat 0", *worker, "--heartbeat", "0")
    add("worker --grace -1", *worker, "--grace", "-1")
    add("worker --out a file", *worker[:-2], "--out", "{d}/afile")
    add("worker unknown profile", *[a if a != "tiny-test" else "nope" for a in worker])

    # sim
    add("sim truth binary workload", "sim", "truth", "--sim-profile", "tiny-test", "--workload", "{d}/binary.dat")
    add("sim truth bad workload", "sim", "truth", "--sim-profile", "tiny-test", "--workload", "{d}/workload-bad.json")
    add("sim truth missing workload", "sim", "truth", "--sim-profile", "tiny-test", "--workload", "{d}/nope.json")
    add("sim truth unknown profile", "sim", "truth", "--sim-profile", "nope", "--workload", "{d}/workload-bad.json")

    # record (nothing listens on port 9 of this host)
    record = ("record", "--prometheus", "http://127.0.0.1:9", "--since", "1h")
    add("record -o a folder", *record, "-o", "{d}/folder")
    add("record -o in /proc", *record, "-o", "/proc/x/t.parquet")
    for flag, value in (("--scale", "0"), ("--scale", "nan"), ("--block-size", "0"), ("--timeout", "-1"),
                        ("--step", "never"), ("--since", "forever"), ("--runtime", "vllm"),
                        ("--mean-input-tokens", "0"), ("--mean-output-tokens", "nan")):
        add(f"record {flag} {value}", *record, flag, value, "-o", "{d}/o.parquet")
    add("record unreachable Prometheus", *record, "-o", "{d}/o.parquet", "--timeout", "2")
    add("record not a URL", "record", "--prometheus", "not a url", "-o", "{d}/o.parquet")

    # report, ledger (a corrupt ledger line is skipped with a warning by design: the rest of the ledger still counts)
    for target in ("folder", "nope", "afile", "binary.dat"):
        add(f"report {target}", "report", f"{{d}}/{target}")
    add("ledger a missing folder", "ledger", "{d}/nope")

    # compare: every flag file checked, every argument refused before the run folder exists
    add("compare without --b", "compare", "--a", "{d}/flags-a.yaml", "--gpu", "sim", "--virtual", "--sim-profile",
        "tiny-test")
    add("compare a file with itself", *COMPARE, "--a", "{d}/flags-a.yaml", "--b", "{d}/flags-a.yaml", "--out",
        "{d}/cmp")
    add("compare --a and --b the same file by another path", *COMPARE, "--a", "{d}/flags-a.yaml", "--b",
        "{d}/folder/../flags-a.yaml", "--out", "{d}/cmp")
    for name in ("nope.yaml", "folder", "binary.dat", "empty.txt", "space-broken.yaml", "space-list.yaml",
                 "space-ok.yaml", "good.parquet", "flags-unknown.yaml", "flags-underscore.yaml", "flags-dashes.yaml",
                 "flags-switch-value.yaml", "flags-needs-value.yaml", "flags-float-int.yaml", "flags-choice.yaml",
                 "flags-null.yaml", "flags-nan.yaml", "flags-list.yaml", "flags-dup.yaml", "flags-other-model.yaml",
                 "flags-only-host.yaml", "flags-env.yaml"):
        add(f"compare --b {name}", *COMPARE, "--a", "{d}/flags-a.yaml", "--b", f"{{d}}/{name}", "--out", "{d}/cmp")
    add("compare --a flags-unknown.yaml", *COMPARE, "--a", "{d}/flags-unknown.yaml", "--b", "{d}/flags-b.yaml",
        "--out", "{d}/cmp")
    add("compare with no model anywhere", "compare", "--gpu", "sim", "--virtual", "--sim-profile", "tiny-test",
        "--a", "{d}/flags-no-model.yaml", "--b", "{d}/flags-no-model-b.yaml", "--out", "{d}/cmp")
    add("compare --model another model", *COMPARE, "--a", "{d}/flags-a.yaml", "--b", "{d}/flags-b.yaml", "--model",
        "other-model", "--out", "{d}/cmp")
    pair = (*COMPARE, "--a", "{d}/flags-a.yaml", "--b", "{d}/flags-b.yaml")
    add("compare --out a file", *pair, "--out", "{d}/afile")
    add("compare --out onto its input", *pair, "--out", "{d}/flags-a.yaml")
    add("compare --out in /proc", *pair, "--out", "/proc/x")
    add("compare --log-file a folder", *pair, "--out", "{d}/cmp", "--log-file", "{d}/folder")
    for flag, value in (("--looks", "8,4"), ("--looks", "0"), ("--looks", "a"), ("--min-effect", "0"),
                        ("--min-effect", "nan"), ("--baseline-boots", "0"), ("--baseline-boots", "2"),
                        ("--budget", "soon"), ("--sim-speedup", "0"), ("--pass-seconds", "-1")):
        add(f"compare {flag} {value}", *pair, "--out", "{d}/cmp", flag, value)
    add("compare unknown profile", "compare", "--gpu", "sim", "--virtual", "--sim-profile", "nope", "--space", TS,
        "--a", "{d}/flags-a.yaml", "--b", "{d}/flags-b.yaml", "--out", "{d}/cmp")
    add("compare --virtual on a GPU", "compare", "--gpu", "0", "--virtual", "--a", "{d}/flags-a.yaml", "--b",
        "{d}/flags-b.yaml", "--out", "{d}/cmp")
    add("compare --traffic missing", *pair, "--traffic", "{d}/nope.parquet", "--out", "{d}/cmp")

    # check
    add("check unknown profile", "check", "--gpu", "sim", "--sim-profile", "nope", "--space", TS)
    add("check missing space", "check", "--gpu", "sim", "--sim-profile", "tiny-test", "--space", "{d}/nope.yaml")
    add("no such command", "frobnicate")

    # issue 31: every case it names that a command line can carry
    for name in ("space-huge-int.yaml", "space-deep.yaml", "space-deep-value.yaml", "space-bomb.yaml",
                 "space-big.yaml", "space-unclosed-quote.yaml", "space-choices-int.yaml", "space-float-for-int.yaml",
                 "space-choices-nan.yaml", "space-tiny-step.yaml", "fifo"):
        add(f"space check {name}", "space", "check", f"{{d}}/{name}")
    add("space check /dev/zero", "space", "check", "/dev/zero")
    add("space check --runtime-python that never exits", "space", "check", TS, "--runtime-python",
        "{d}/never-exits.sh", "--help-timeout", "2")
    for name in ("flags-bomb.yaml", "flags-huge-int.yaml", "flags-1e308.yaml", "flags-nul.yaml", "flags-deep.yaml",
                 "fifo"):
        add(f"compare --b {name}", *COMPARE, "--a", "{d}/flags-a.yaml", "--b", f"{{d}}/{name}", "--out", "{d}/cmp")
    add("compare --b /dev/zero", *COMPARE, "--a", "{d}/flags-a.yaml", "--b", "/dev/zero", "--out", "{d}/cmp")
    add("compare --traffic zero-rows.parquet", *pair, "--traffic", "{d}/zero-rows.parquet", "--out", "{d}/cmp")
    for flag, value in (("--sigma-boot", "1e308"), ("--passes", "1000000000000"), ("--alpha", "1e-300"),
                        ("--sigma-run", "9" * 400)):
        add(f"gate plan {flag} {value[:12]}", "gate", "plan", flag, value)
    add("gate simulate --effect -1", "gate", "simulate", "--effect", "-1")
    add("gate simulate --runs 10**12", "gate", "simulate", "--runs", "1000000000000")
    add("study --traffic zero-rows.parquet", "--gpu", "sim", "--sim-profile", "tiny-test", "--space", TS,
        "--traffic", "{d}/zero-rows.parquet", "--out", "{d}/run")
    add("check --traffic zero-rows.parquet", "check", "--gpu", "sim", "--sim-profile", "tiny-test", "--space", TS,
        "--traffic", "{d}/zero-rows.parquet")
    add("study --traffic fifo", "--gpu", "sim", "--sim-profile", "tiny-test", "--space", TS, "--traffic", "{d}/fifo",
        "--out", "{d}/run")
    add("study --gpu ²", "--gpu", "²", "--traffic", "demo", "--out", "{d}/run")
    add("study --sim-speedup 1e300", *SIM, "--out", "{d}/run", "--sim-speedup", "1e300")
    add("study --seed 10**400", *SIM, "--out", "{d}/run", "--seed", "1" + "0" * 400)
    add("study --out not UTF-8", *SIM, "--out", "{d}/r\udcff")
    add("study --log-file a FIFO", *SIM, "--out", "{d}/run", "--log-file", "{d}/fifo")
    add("log explain fifo", "log", "explain", "{d}/fifo")
    add("log explain /dev/zero", "log", "explain", "/dev/zero")
    add("show fifo", "traffic", "show", "{d}/fifo")
    add("show /dev/zero", "traffic", "show", "/dev/zero")
    add("import fifo", "traffic", "import", "{d}/fifo", "--format", "mooncake", "-o", "{d}/o.parquet")
    add("import onto a FIFO", "traffic", "import", "{d}/good.jsonl", "--format", "mooncake", "-o", "{d}/fifo")
    add("ledger a FIFO", "ledger", "{d}/fifo-ledger")
    add("report where report.md is a folder", "report", "{d}/report-md-folder")
    add("record -o a FIFO", *record, "-o", "{d}/fifo")
    add("record -o /dev/null", *record, "-o", "/dev/null")
    add("record an unclosed IPv6 URL", "record", "--prometheus", "http://[::1", "--since", "1h", "-o",
        "{d}/o.parquet")
    add("record --seed -1", *record, "--seed", "-1", "-o", "{d}/o.parquet")
    add("sim serve --port 99999", "sim", "serve", "--sim-profile", "tiny-test", "--model-path", "tiny-hybrid",
        "--port", "99999")
    for name in ("workload-huge.json", "workload-negative.json", "workload-list.json"):
        add(f"sim truth {name}", "sim", "truth", "--sim-profile", "tiny-test", "--workload", f"{{d}}/{name}")
    add("worker --ledger its space", *worker, "--ledger", "{d}/space-ok.yaml")
    add("worker --ledger a FIFO", *worker, "--ledger", "{d}/fifo")
    return cases


CASES = _cases()


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` with a digest of its bytes: what a refused command must not change."""
    seen: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            seen[os.path.relpath(os.path.join(folder, name), root)] = "dir"
        for name in files:
            path = os.path.join(folder, name)
            mode = os.lstat(path).st_mode
            seen[os.path.relpath(path, root)] = (hashlib.sha256(Path(path).read_bytes()).hexdigest()
                                                 if stat.S_ISREG(mode) else stat.filemode(mode))
    return seen
