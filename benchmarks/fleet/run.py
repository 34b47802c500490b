"""Search-phase throughput of one study, ``elsa-tune --gpu 0`` vs ``elsa-tune --gpu 0,1`` (simulated GPUs).

Each row is one whole study (``tune``, the default command) on the tiny simulated card with the numeric space of
``benchmarks/workers/tiny-space.yaml``; with several GPUs its search phase runs one worker per GPU
(``tuner/fleet/fleet_search.py``). Counted from the records, over the search phase's wall time (``study.json`` phases):
every boot of the search phase (with several GPUs this includes each worker's per-GPU baseline, the price of
comparing trials only within one GPU), the trial boots alone, and the A/B boots.

    python benchmarks/fleet/run.py                      # 1 and 2 GPUs, 240 s studies
    python benchmarks/fleet/run.py --gpus 1,2,4 --seconds 300 --keep /tmp/fleet-bench

Simulated GPUs on this machine's CPU: where its cores saturate, the table shows it (CPU seconds per boot).
Nothing here measures a real GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPACE = HERE.parent / "workers" / "tiny-space.yaml"


def run_one(n: int, args: argparse.Namespace, root: Path) -> dict[str, float]:
    out = root / f"gpus{n}" / "study"
    shutil.rmtree(out.parent, ignore_errors=True)
    out.parent.mkdir(parents=True)
    gpus = ",".join(str(i) for i in range(n))
    argv = [sys.executable, "-m", "elsa_tune", "--gpu", gpus, "--runtime", "sim", "--sim-profile", "tiny-test",
            "--space", str(SPACE), "--traffic", "demo", "--sim-speedup", str(args.speedup), "--budget",
            str(args.seconds), "--out", str(out), "--baseline-boots", "3", "--seed", "7", "--no-live", "-q"]
    env = {**os.environ, "ELSA_SIM_CARD_DIR": str(out.parent / "card")}      # the one-GPU study's own card
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=args.seconds + 600, check=False,
                          stdin=subprocess.DEVNULL, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit(f"{n} GPU(s): the study failed ({done.returncode}); see {out / 'study.log'}")
    study = json.loads((out / "study.json").read_text())
    span = next(p for p in study["phases"] if p["name"] == "search")
    started, ended = float(span["started_at"]), float(span["ended_at"])
    boots = trials = ab = 0
    folders = [out, *sorted(out.glob("*-gpu*"))]
    for folder in folders:
        for record in folder.glob("boots/*/boot.json"):
            data = json.loads(record.read_text())
            if not started <= float(data["started_at"]) <= ended:
                continue
            boots += 1
            tag = str(data.get("tag") or "")
            trials += tag.startswith("search:") and ":ab:" not in tag
            ab += tag.startswith("ab:") or ":ab:" in tag
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    all_boots = sum(1 for f in folders for _ in f.glob("boots/*/boot.json"))
    wall = max(1e-9, ended - started)
    return {"gpus": n, "search_s": wall, "boots": boots, "trials": trials, "ab": ab,
            "boots_per_hour": 3600.0 * boots / wall, "trials_per_hour": 3600.0 * trials / wall,
            "cpu_s_per_boot": cpu / max(1, all_boots)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", default="1,2", help="simulated GPU counts to run (default 1,2)")
    parser.add_argument("--seconds", type=float, default=240.0, help="each study's budget (default 240)")
    parser.add_argument("--speedup", type=float, default=20.0, help="simulated seconds per wall second (default 20)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="elsa-bench-fleet-"))
    rows = []
    started = time.monotonic()
    try:
        for n in (int(g) for g in args.gpus.split(",")):
            rows.append(run_one(n, args, root))
            r = rows[-1]
            print(f"  {n} GPU(s): {r['boots']} search-phase boots in {r['search_s']:.0f} s", file=sys.stderr)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    base = rows[0]["boots_per_hour"] / rows[0]["gpus"] if rows else 1.0
    print("| simulated GPUs | search phase s | boots (trials, A/B) | boots/hour | trial boots/hour "
          "| boots/hour vs 1 GPU × N | CPU s/boot |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        scaling = r["boots_per_hour"] / (base * r["gpus"]) if base else float("nan")
        print(f"| {r['gpus']} | {r['search_s']:.0f} | {r['boots']} ({r['trials']}, {r['ab']}) "
              f"| {r['boots_per_hour']:.0f} | {r['trials_per_hour']:.0f} | {scaling:.2f} | {r['cpu_s_per_boot']:.1f} |")
    print(f"({time.monotonic() - started:.0f} s in all)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
