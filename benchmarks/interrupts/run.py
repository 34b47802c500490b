"""SIGINT and SIGTERM at random moments of a finished study's rerun and of a running study (issue 31).

    .venv/bin/python benchmarks/interrupts/run.py --runs 50 [--budget 2h] [--jobs 2] [--seed 0] [--write]

A virtual study (``--gpu sim --virtual``, tiny-test profile, ``benchmarks/workers/tiny-space.yaml``, demo traffic)
is run once without interruption: the reference. Then each run, in a folder of its own (its own ledger beside it):

* even runs, a finished study's rerun: a copy of the reference is rerun and sent SIGINT or SIGTERM after a random
  0–4 s; every file of the folder and the ledger beside it must be byte-identical afterwards.
* odd runs, a running study: a fresh study is sent SIGINT or SIGTERM 1–3 times at random moments, rerun after each,
  then rerun to the end; its recommendation (the incumbent's flags, its status) must be the reference's, and the
  boots the console counts must be the boots its report counts.

``--write`` writes the result table to ``benchmarks/interrupts/last_run.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPACE = REPO / "benchmarks" / "workers" / "tiny-space.yaml"


def study_argv(budget: str, out: str) -> list[str]:
    return [sys.executable, "-m", "elsa_tune", "--gpu", "sim", "--sim-profile", "tiny-test", "--space", str(SPACE),
            "--traffic", "demo", "--virtual", "--no-live", "--budget", budget, "--out", out]


def snapshot(root: Path) -> dict[str, str]:
    seen: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            seen[os.path.relpath(os.path.join(folder, name), root)] = "dir"
        for name in files:
            path = Path(folder) / name
            seen[os.path.relpath(path, root)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return seen


def run_to_end(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=900, check=False)


def interrupted(argv: list[str], cwd: Path, after_s: float, sig: signal.Signals) -> tuple[int, str]:
    """Run ``argv``, send ``sig`` after ``after_s`` unless it ended first; its exit status and stdout."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        out, _ = proc.communicate(timeout=after_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def recommendation(run_dir: Path) -> tuple[str, dict[str, object]]:
    if not (run_dir / "study.json").exists():      # stopped before its first record
        return "none", {}
    study = json.loads((run_dir / "study.json").read_text())
    return str(study["status"]), dict(study["incumbent"]["flags"])


def _internal_error(run_dir: Path) -> str:
    """The last line of the last traceback the run folder's log holds (an internal error of any rerun), or ''."""
    log = run_dir / "study.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    if "Traceback" not in text:
        return ""
    block = text[text.rfind("Traceback"):].splitlines()
    last = next((line for line in block[1:] if line and not line.startswith((" ", "\t"))), block[-1])
    return last[:300]


def console_boots(stdout: str) -> int | None:
    found = re.search(r"^\s+(\d+) boots, \d+ decisions", stdout, re.MULTILINE)
    return int(found.group(1)) if found else None


def report_boots(run_dir: Path, cwd: Path) -> int:
    done = run_to_end([sys.executable, "-m", "elsa_tune", "report", "--json", "--no-plots", str(run_dir)], cwd)
    return int(json.loads(done.stdout)["boots"])


def finished_rerun(reference: Path, work: Path, rng: random.Random, budget: str) -> dict[str, object]:
    shutil.copytree(reference.parent, work)
    before = snapshot(work)
    sig = rng.choice([signal.SIGINT, signal.SIGTERM])
    after_s = rng.uniform(0.0, 4.0)
    code, _ = interrupted(study_argv(budget, "r"), work, after_s, sig)
    same = snapshot(work) == before
    return {"kind": "finished rerun", "signal": sig.name, "at_s": [round(after_s, 2)], "exit": code, "ok": same,
            "detail": "byte-identical" if same else "CHANGED"}


def running_study(work: Path, rng: random.Random, budget: str, ref: tuple[str, dict[str, object]],
                  ref_s: float) -> dict[str, object]:
    work.mkdir()
    moments: list[float] = []
    codes: list[int] = []
    signals: list[str] = []
    final: tuple[int, str] | None = None
    for _ in range(rng.randint(1, 3)):
        sig = rng.choice([signal.SIGINT, signal.SIGTERM])
        after_s = rng.uniform(0.5, ref_s)
        moments.append(round(after_s, 2))
        signals.append(sig.name)
        code, out = interrupted(study_argv(budget, "r"), work, after_s, sig)
        codes.append(code)
        if code == 0 or recommendation(work / "r")[0] == "finished":   # it finished before the signal came
            final = (code, out)
            break
    said = ""
    if final is None:
        done = run_to_end(study_argv(budget, "r"), work)
        codes.append(done.returncode)
        final = (done.returncode, done.stdout)
        said = done.stderr.strip().splitlines()[-1][:300] if done.returncode and done.stderr.strip() else ""
    got = recommendation(work / "r")
    said = said or _internal_error(work / "r")
    console = console_boots(final[1])
    report = report_boots(work / "r", work)
    same = got == ref
    # a signal after the study finished (while it printed its summary or exited) may leave no console count
    ok = same and got[0] == "finished" and (console == report or (final[0] != 0 and console is None))
    detail = ("same recommendation" if same else f"DIFFERENT: {got[0]} {got[1]}") + \
        f"; console {console} boots, report {report}" + (f"; the last run said: {said}" if said else "")
    return {"kind": "running study", "signal": "+".join(signals), "at_s": moments, "exit": codes, "ok": ok,
            "detail": detail}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--budget", default="2h")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", action="store_true", help="write benchmarks/interrupts/last_run.md")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="elsa-interrupts-"))
    try:
        start = time.monotonic()
        (root / "ref").mkdir()
        done = run_to_end(study_argv(args.budget, "r"), root / "ref")
        ref_s = time.monotonic() - start
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
        reference = root / "ref" / "r"
        ref = recommendation(reference)
        ref_console, ref_report = console_boots(done.stdout), report_boots(reference, root / "ref")
        print(f"reference: {ref[0]}, {len(ref[1])} flags, {ref_console} boots (report {ref_report}), "
              f"{ref_s:.1f} s wall")

        def one(i: int) -> dict[str, object]:
            rng = random.Random(args.seed * 1000 + i)
            work = root / f"run-{i:03d}"
            result = (finished_rerun(reference, work, rng, args.budget) if i % 2 == 0
                      else running_study(work, rng, args.budget, ref, ref_s))
            shutil.rmtree(work, ignore_errors=True)
            print(f"{i:3d} {'ok  ' if result['ok'] else 'FAIL'} {result['kind']}: {result['signal']} at "
                  f"{result['at_s']} s, exit {result['exit']}: {result['detail']}", flush=True)
            return {"run": i, **result}

        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(one, range(args.runs)))
        elapsed = time.monotonic() - start
    finally:
        shutil.rmtree(root, ignore_errors=True)
    finished = [r for r in results if r["kind"] == "finished rerun"]
    running = [r for r in results if r["kind"] == "running study"]
    summary = (f"{len(results)} runs in {elapsed / 60:.1f} min: finished-study reruns byte-identical "
               f"{sum(bool(r['ok']) for r in finished)}/{len(finished)}; running studies with the reference's "
               f"recommendation and console boots = report boots {sum(bool(r['ok']) for r in running)}/{len(running)}")
    print(summary)
    if args.write:
        lines = ["# Interrupts: last run", "",
                 f"`.venv/bin/python benchmarks/interrupts/run.py --runs {args.runs} --budget {args.budget} "
                 f"--jobs {args.jobs} --seed {args.seed} --write`", "",
                 f"Reference (uninterrupted, virtual, tiny-test, {args.budget}): {ref[0]}, {ref_console} boots "
                 f"(report {ref_report}), {ref_s:.1f} s wall.", "", summary, "",
                 "| run | kind | signal(s) | at (s) | exit(s) | result |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['run']} | {r['kind']} | {r['signal']} | {r['at_s']} | {r['exit']} | "
                  f"{'ok' if r['ok'] else 'FAIL'}: {r['detail']} |" for r in results]
        (Path(__file__).parent / "last_run.md").write_text("\n".join(lines) + "\n")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
