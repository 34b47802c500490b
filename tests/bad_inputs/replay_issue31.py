"""Replay every concrete case of issue 31 against the installed ``elsa-tune`` and print what each one did.

    .venv/bin/python tests/bad_inputs/replay_issue31.py [--bound 60] [--jobs 3] [--only REGEX] [--json FILE]

Each case runs in its own scratch folder, as the issue ran it: ``E=elsa-tune``, ``TS=benchmarks/workers/
tiny-space.yaml``, ``SIMV="--gpu sim --sim-profile tiny-test --space $TS --traffic demo --virtual --no-live"``. A
case is a set-up (not judged) and a command (judged, under a wall-clock bound). Per case the script prints the exit
code, whether a traceback was printed, whether the command ran past the bound, and the files created or changed
outside the paths the command owns (its ``--out`` when it legitimately writes one; none for a refusal).
A case is ``ok`` when it exits 0–5 without a traceback, a hang or a megabyte of output (a value printed whole) and
changes nothing it does not own; the summary
line counts the others. This is a diagnostic of the whole CLI (minutes), not part of the test suite.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TS = str(REPO / "benchmarks" / "workers" / "tiny-space.yaml")
E = f"{sys.executable} -m elsa_tune"
SIMV = f"--gpu sim --sim-profile tiny-test --space {TS} --traffic demo --virtual --no-live"
ENV = {"E": E, "TS": TS, "SIMV": SIMV}
FLAGS = ("model-path: tiny-hybrid\nmem-fraction-static: 0.6\nmax-running-requests: 2\nmax-mamba-cache-size: 24\n"
         "speculative-algorithm: EAGLE\nspeculative-eagle-topk: 1\nspeculative-num-steps: 2\n"
         "speculative-num-draft-tokens: 3\n")
COMPARE = "$E compare --gpu sim --virtual --sim-profile tiny-test --space $TS"
GOOD_MC = '{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}'


@dataclass(frozen=True)
class Case:
    """One case of the issue: a set-up, the judged command, and the paths the command may write."""

    group: str
    name: str
    command: str
    setup: str = ""
    owns: tuple[str, ...] = ()
    finished: bool = False          # the set-up copies a finished 8h study into ./r (a data-loss case)
    check: Callable[[Path, str], str] | None = field(default=None, compare=False)


def _py(code: str) -> str:
    return f"{sys.executable} -c {json.dumps(code)}"


def _write(name: str, text: str, mode: str = "w") -> str:
    return _py(f"open({name!r}, {mode!r}).write({text!r})")


def cases() -> list[Case]:
    out: list[Case] = []

    def add(group: str, name: str, command: str, setup: str = "", owns: tuple[str, ...] = (),
            finished: bool = False, check: Callable[[Path, str], str] | None = None) -> None:
        out.append(Case(group, name, command, setup, owns, finished, check))

    flags = _write("a.yaml", FLAGS) + "; sed 's/0.6/0.7/' a.yaml > b.yaml"
    # ---- data loss
    add("data loss", "1 Ctrl-C while rerunning a finished study", "timeout -s INT 5 $E $SIMV --budget 8h --out r",
        finished=True)
    add("data loss", "1 rerun of a finished study (no signal)", "$E $SIMV --budget 8h --out r", finished=True)
    add("data loss", "1 SIGTERM while rerunning a finished study", "timeout -s TERM 3 $E $SIMV --budget 8h --out r",
        finished=True)
    add("data loss", "2 another --space on the same --out",
        "$E --gpu sim --sim-profile tiny-test --space o.yaml --traffic demo --virtual --no-live --budget 1m --out r",
        setup="sed 's/name: tiny-distributed/name: other/' $TS > o.yaml", finished=True)
    add("data loss", "2 another --traffic on the same --out",
        "$E --gpu sim --sim-profile tiny-test --space $TS --traffic t.parquet --virtual --no-live --budget 1m --out r",
        setup=f"printf '%s\\n' '{GOOD_MC}' > t.jsonl; $E traffic import t.jsonl --format mooncake -o t.parquet",
        finished=True)
    add("data loss", "2 tune --out a comparison's folder", "$E $SIMV --budget 1m --out c",
        setup=f"{flags}; {COMPARE} --a a.yaml --b b.yaml --budget 20m --out c >/dev/null 2>&1")
    add("data loss", "2 compare --out a study's folder", f"{COMPARE} --a a.yaml --b b.yaml --budget 20m --out r",
        setup=flags, finished=True)
    add("data loss", "3 record -o a folder", "$E record --prometheus http://127.0.0.1:9 --since 1h -o d",
        setup="mkdir d")
    add("data loss", "3 record -o under /proc", "$E record --prometheus http://127.0.0.1:9 --since 1h -o /proc/x/t")
    add("data loss", "3 record -o a FIFO", "$E record --prometheus http://127.0.0.1:9 --since 1h -o f",
        setup="mkfifo f")
    add("data loss", "3 record -o a device node", "$E record --prometheus http://127.0.0.1:9 --since 1h -o n",
        setup="mknod n c 1 3")
    add("data loss", "3 traffic import -o a device node", "$E traffic import g.jsonl --format mooncake -o n",
        setup=f"mknod n c 1 3; printf '%s\\n' '{GOOD_MC}' > g.jsonl")
    add("data loss", "3 traffic import -o a FIFO", "$E traffic import g.jsonl --format mooncake -o f",
        setup=f"mkfifo f; printf '%s\\n' '{GOOD_MC}' > g.jsonl")
    add("data loss", "4 worker --ledger the space",
        "$E worker --study s --gpu 0 --runtime sim --sim-profile tiny-test --space s.yaml --traffic demo --out wk "
        "--budget 1m --ledger s.yaml", setup="cp $TS s.yaml")
    add("data loss", "4 --dry-run --log-file the space",
        "$E --gpu sim --sim-profile tiny-test --space s.yaml --traffic demo --dry-run --log-file s.yaml --out r",
        setup="cp $TS s.yaml")
    add("data loss", "5 study.db of another application", "$E $SIMV --budget 1m --out r",
        setup="mkdir r; " + _py("import sqlite3; c=sqlite3.connect('r/study.db'); "
                                "c.execute('create table notes(x)'); c.commit()"))

    # ---- exit 70
    x = "exit 70"
    add(x, "symlink loop --out", "$E $SIMV --budget 1m --out l", setup="ln -s l l")
    add(x, "symlink loop --log-file", "$E $SIMV --budget 1m --out r --log-file l", setup="ln -s l l")
    add(x, "symlink loop traffic import -o", "$E traffic import g.jsonl --format mooncake -o l",
        setup=f"ln -s l l; printf '%s\\n' '{GOOD_MC}' > g.jsonl")
    add(x, "symlink loop compare --a", f"{COMPARE} --a l --b b.yaml --out c", setup=f"{flags}; ln -s l l")
    add(x, "400-digit high: in a space", "$E space check s.yaml",
        setup=_write("s.yaml", Path(TS).read_text().replace("high: 4,", "high: " + "9" * 400 + ",")))
    add(x, "400-digit flag value", f"{COMPARE} --a a.yaml --b b.yaml --out c",
        setup=flags + "; " + _py("open('b.yaml','a').write('chunked-prefill-size: ' + '9'*400 + chr(10))"))
    add(x, "mem-fraction-static: 1e308", f"{COMPARE} --a a.yaml --b b.yaml --out c",
        setup=f"{flags}; sed -i 's/0.7/1e308/' b.yaml")
    add(x, "block_size 1e25 in a trace", "$E traffic show t.parquet", setup=_py(
        "import pyarrow as pa, pyarrow.parquet as pq; t=pa.table({'timestamp':[0.0],'input_length':[600],"
        "'output_length':[20],'hash_ids':[[1,2]]}); m={b'elsa_tune.schema_version':b'1',"
        "b'elsa_tune.block_size':b'1e25'}; pq.write_table(t.replace_schema_metadata(m),'t.parquet')"))
    add(x, "gate plan --sigma-boot 1e308", "$E gate plan --sigma-boot 1e308")
    add(x, "gate simulate --effect -1", "$E gate simulate --effect -1 --runs 5")
    add(x, "deep nesting in a space", "$E space check s.yaml", setup=_py("print('['*100000)") + " > s.yaml")
    add(x, "deep nesting in a ledger line", "$E ledger .", setup=_py("print('['*100000)") + " > ledger.jsonl")
    add(x, "deep nesting in a lease file", "ELSA_LEASE_DIR=L $E check --gpu sim --sim-profile tiny-test --space $TS",
        setup="mkdir L; " + _py("print('['*100000)") + " > L/x.lease.json")
    add(x, "ledger \"effect\": \"big\"", "$E ledger .", setup="LEDGER_EFFECT_BIG")
    add(x, "ledger \"boots\": 1e999", "$E ledger .", setup="LEDGER_BOOTS_INF")
    add(x, "study.json = []", "$E report r", setup="echo '[]' > r/study.json", finished=True)
    add(x, "boot.json = []", "$E report r", setup="echo '[]' > r/boots/0001-baseline/boot.json", finished=True)
    add(x, "study.json = [] then tune", "$E $SIMV --budget 8h --out r", setup="echo '[]' > r/study.json",
        finished=True)
    zero = _py("import pyarrow as pa, pyarrow.parquet as pq; from elsa_tune.traffic.trace import *; "
               "from elsa_tune.traffic.imports import import_trace; open('g.jsonl','w').write("
               f"{GOOD_MC!r}+chr(10)); t=import_trace('g.jsonl','mooncake').trace; write_trace(t,'one.parquet'); "
               "a=pq.read_table('one.parquet'); pq.write_table(a.slice(0,0),'z.parquet')")
    add(x, "zero-row trace in tune", "$E --gpu sim --sim-profile tiny-test --space $TS --traffic z.parquet --virtual "
        "--no-live --budget 1m --out r", setup=zero)
    add(x, "zero-row trace in check", "$E check --gpu sim --sim-profile tiny-test --space $TS --traffic z.parquet",
        setup=zero)
    add(x, "zero-row trace in compare", f"{COMPARE} --a a.yaml --b b.yaml --traffic z.parquet --out c",
        setup=f"{flags}; {zero}")
    add(x, "--looks 1,2", "$E $SIMV --budget 1m --out r --looks 1,2")
    add(x, "gate plan --passes 10**12", "$E gate plan --passes 1000000000000")
    add(x, "gate plan --alpha 1e-300", "$E gate plan --alpha 1e-300")
    add(x, "traffic show --bins 1000000000", "$E traffic show one.parquet --bins 1000000000", setup=zero)
    add(x, "step: 1e-300", "$E space check s.yaml", setup="sed 's/step: 0.05/step: 1e-300/' $TS > s.yaml")
    add(x, "--gpu ²", "$E --gpu ² --traffic demo --out r")
    add(x, "record --seed -1", "$E record --prometheus http://127.0.0.1:9 --since 1h --seed -1 -o o.parquet")
    add(x, "sim serve --port 99999",
        "timeout 20 $E sim serve --sim-profile tiny-test --model-path tiny-hybrid --port 99999")
    add(x, "NUL byte in a flag file", f"{COMPARE} --a a.yaml --b b.yaml --out c",
        setup=f"{flags}; printf 'page-size: 1\\0\\n' >> b.yaml")
    add(x, "unclosed quote in runtime.command", "$E space check s.yaml",
        setup="sed \"s/command: \\[python, -m, sglang.launch_server\\]/command: \\\"python -m 'sglang\\\"/\" "
              "$TS > s.yaml")
    add(x, "non-UTF-8 --out", "$E $SIMV --budget 1m --out $(printf 'r\\xff')", owns=("r\udcff",))
    add(x, "space list > /dev/full", "$E space list > /dev/full")
    add(x, "log explain /dev/zero", "$E log explain /dev/zero")
    add(x, "report when report.md is a folder", "$E report r",
        setup="rm r/report.md; mkdir r/report.md", finished=True, owns=("r",))
    add(x, "record --prometheus 'http://[::1'", "$E record --prometheus 'http://[::1' --since 1h -o o.parquet")

    # ---- hangs
    h = "hang"
    bomb = "[&a [x,x,x,x,x,x,x,x,x], " + ", ".join(
        f"&{b} [{','.join(['*' + a] * 9)}]" for a, b in zip("abcdefg", "bcdefgh", strict=True)) + "]"
    add(h, "anchor bomb in a space's name:", "$E space check s.yaml",
        setup=_write("s.yaml", Path(TS).read_text().replace("name: tiny-distributed", "name: " + bomb)))
    add(h, "anchor bomb as a flag file key", f"{COMPARE} --a a.yaml --b b.yaml --out c",
        setup=flags + "; " + _write("b.yaml", "? " + bomb + "\n: 1\n", mode="a"))
    add(h, "50 MB space", "$E space check s.yaml",
        setup="cp $TS s.yaml; " + _py("f=open('s.yaml','a'); f.write('# ' + 'x'*50_000_000 + chr(10))"))
    add(h, "FIFO to compare --b", f"{COMPARE} --a a.yaml --b f --out c", setup=f"{flags}; mkfifo f")
    add(h, "FIFO to traffic show", "$E traffic show f", setup="mkfifo f")
    add(h, "FIFO to log explain", "$E log explain f", setup="mkfifo f")
    add(h, "FIFO as ledger.jsonl", "$E ledger .", setup="mkfifo ledger.jsonl")
    add(h, "space check --runtime-python that never exits", "$E space check $TS --runtime-python ./py",
        setup="printf '#!/bin/sh\\nsleep 1000\\n' > py; chmod +x py")
    add(h, "record against a one-byte-a-second server",
        "$E record --prometheus http://127.0.0.1:$(cat port) --since 1h -o o.parquet --timeout 5",
        setup="SLOW_SERVER")
    add(h, "record --step 0.001s --since 1d",
        "$E record --prometheus http://127.0.0.1:$(cat port) --since 1d --step 0.001s -o o.parquet --timeout 5",
        setup="EMPTY_SERVER")
    add(h, "sim truth num_requests 1e8",
        "$E sim truth --sim-profile tiny-test --workload '{\"num_requests\": 100000000}'")

    # ---- refused only after creating output
    a = "after output"
    add(a, "corrupt ledger.jsonl beside --out", "$E $SIMV --budget 1m --out r", setup="echo '{not json' > ledger.jsonl",
        owns=("r",))   # a corrupt line is skipped with a warning (by design): the study runs
    add(a, "ledger.jsonl a folder beside --out", "$E $SIMV --budget 1m --out r", setup="mkdir ledger.jsonl")
    add(a, "worker --gpu 0,1 missing --traffic",
        "$E worker --study s --gpu 0,1 --runtime sim --sim-profile tiny-test --space $TS --traffic nope.parquet "
        "--out wk --budget 1m")
    add(a, "damaged --storage SQLite",
        "$E worker --study s --gpu 0 --runtime sim --sim-profile tiny-test --space $TS --traffic demo --out wk "
        "--budget 1m --storage sqlite:///$PWD/db.sqlite", setup="head -c 3000 /dev/urandom > db.sqlite")

    # ---- exit 0 or a misleading message
    m = "exit 0 / misleading"
    add(m, "choices: [two, 2] for an integer flag", "$E space check s.yaml",
        setup="sed 's/max-running-requests: {type: int, low: 1, high: 3, baseline: 2}/"
              "max-running-requests: {type: categorical, choices: [two, 2], baseline: 2}/' $TS > s.yaml")
    add(m, "choices: [.nan, ...] in a study",
        "$E --gpu sim --sim-profile tiny-test --space s.yaml --traffic demo --virtual --no-live --budget 2h --out r",
        setup="sed 's/mem-fraction-static: {type: float, low: 0.5, high: 0.7, step: 0.05, baseline: 0.6}/"
              "mem-fraction-static: {type: categorical, choices: [.nan, 0.6], baseline: 0.6}/' $TS > s.yaml",
        owns=("r",))
    add(m, "sim truth negative lengths",
        "$E sim truth --sim-profile tiny-test --workload '{\"num_requests\": 10, \"input_tokens\": [-5], "
        "\"output_tokens\": [-5]}'", check=_no_nan)
    add(m, "ELSA_TUNE_BOOT_TIMEOUT_S=-1", "ELSA_TUNE_BOOT_TIMEOUT_S=-1 $E $SIMV --budget 1m --out r",
        check=_not_blamed_on_baseline)
    add(m, "--sim-speedup 1e300", "$E $SIMV --budget 1m --out r --sim-speedup 1e300", check=_not_blamed_on_baseline)
    return out


def _no_nan(folder: Path, output: str) -> str:
    return "prints NaN" if "NaN" in output else ""


def _not_blamed_on_baseline(folder: Path, output: str) -> str:
    return "blamed on the baseline" if "baseline" in output and ("boot_timeout" in output or "failed" in output) \
        else ""


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its type and, for a regular file, a digest of its bytes."""
    seen: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as handle:
                    seen[rel] = hashlib.sha256(handle.read()).hexdigest()
            else:
                seen[rel] = stat.filemode(st.st_mode)
    return seen


def _serve(kind: str, folder: Path) -> subprocess.Popen[bytes]:
    """A fake Prometheus in a child process; its port is written to ``folder/port``."""
    code = f"""
import json, time, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({{"status": "success", "data": {{"resultType": "matrix", "result": []}}}}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        if {kind!r} == "slow":
            for b in body:
                self.wfile.write(bytes([b])); self.wfile.flush(); time.sleep(1)
        else:
            self.wfile.write(body)
    def log_message(self, *a): pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
open("port", "w").write(str(s.server_port))
s.serve_forever()
"""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=folder)
    for _ in range(100):
        if (folder / "port").exists() and (folder / "port").read_text():
            break
        time.sleep(0.05)
    return proc


def _ledger_line(template: Path, **change: object) -> str:
    line = json.loads((template.parent / "ledger.jsonl").read_text().splitlines()[0])
    line.update(change)
    return json.dumps(line) + "\n"


def run_case(case: Case, template: Path, bound: float) -> dict[str, object]:
    folder = Path(tempfile.mkdtemp(prefix="i31-"))
    env = {**os.environ, **ENV}
    server = None
    try:
        if case.finished:
            shutil.copytree(template, folder / "r", symlinks=True)
            shutil.copy(template.parent / "ledger.jsonl", folder / "ledger.jsonl")
        if case.setup == "LEDGER_EFFECT_BIG":
            (folder / "ledger.jsonl").write_text(_ledger_line(template, effect="big"))
        elif case.setup == "LEDGER_BOOTS_INF":
            (folder / "ledger.jsonl").write_text(_ledger_line(template).replace('"boots": 1', '"boots": 1e999', 1)
                                                 .replace('"boots": 2', '"boots": 1e999', 1))
        elif case.setup in ("SLOW_SERVER", "EMPTY_SERVER"):
            server = _serve("slow" if case.setup == "SLOW_SERVER" else "empty", folder)
        elif case.setup:
            subprocess.run(["bash", "-c", case.setup], cwd=folder, env=env, check=False, timeout=300,
                           capture_output=True)
        before = snapshot(folder)
        start = time.monotonic()
        proc = subprocess.Popen(["bash", "-c", case.command], cwd=folder, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        hang = False
        try:
            output_bytes, _ = proc.communicate(timeout=bound)
        except subprocess.TimeoutExpired:
            hang = True
            os.killpg(proc.pid, signal.SIGKILL)
            output_bytes, _ = proc.communicate()
        seconds = time.monotonic() - start
        output = output_bytes.decode(errors="replace")
        after = snapshot(folder)
        ignore = {"port"}
        changed = sorted(p for p in set(before) | set(after)
                         if before.get(p) != after.get(p) and p not in ignore
                         and not any(p == o or p.startswith(o + "/") for o in case.owns))
        code = proc.returncode
        problems = []
        if hang:
            problems.append("hang")
        elif code not in range(0, 6) and not (case.command.startswith("timeout -s") and code == 124):
            problems.append(f"exit {code}")
        if "Traceback" in output:
            problems.append("traceback")
        if len(output_bytes) > 1_000_000:    # a value printed whole: an alias bomb expanded into a message
            problems.append(f"printed {len(output_bytes) / 1e6:.0f} MB")
        if changed:
            problems.append("changed " + ",".join(changed[:4]) + (" …" if len(changed) > 4 else ""))
        if case.check:
            extra = case.check(folder, output)
            if extra:
                problems.append(extra)
        if case.group.startswith("exit 0") and not hang and code == 0 and not problems:
            problems.append("exit 0")
        last = [ln for ln in output.strip().splitlines() if ln.strip()]
        return {"group": case.group, "name": case.name, "exit": None if hang else code,
                "traceback": "Traceback" in output,
                "hang": hang, "changed": changed, "seconds": round(seconds, 1), "ok": not problems,
                "problems": problems, "said": (last[-1] if last else "")[:160]}
    finally:
        if server is not None:
            server.kill()
            server.wait()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bound", type=float, default=60.0, help="seconds before a command counts as a hang")
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--only", default="", help="run only cases whose name matches this regular expression")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    chosen = [c for c in cases() if re.search(args.only, c.name)]
    base = Path(tempfile.mkdtemp(prefix="i31-template-"))
    try:
        template = base / "r"
        if any(c.finished or c.setup.startswith("LEDGER") for c in chosen):
            subprocess.run(["bash", "-c", "$E $SIMV --budget 8h --out r"], cwd=base, env={**os.environ, **ENV},
                           check=True, capture_output=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda c: run_case(c, template, args.bound), chosen))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for r in results:
        mark = "ok  " if r["ok"] else "FAIL"
        print(f"{mark} [{r['group']}] {r['name']}: exit={r['exit']} traceback={'yes' if r['traceback'] else 'no'} "
              f"hang={'yes' if r['hang'] else 'no'} changed={len(r['changed'])} ({r['seconds']} s)"
              + (f"  <- {'; '.join(r['problems'])}" if r["problems"] else ""))
        if not r["ok"]:
            print(f"       said: {r['said']}")
    bad = [r for r in results if not r["ok"]]
    print(f"\n{len(results)} cases: {len(results) - len(bad)} ok, {len(bad)} open")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
