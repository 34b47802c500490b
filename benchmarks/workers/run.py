"""Search throughput with 1, 2 and 4 simulated GPUs: boots per hour of ``elsa-tune worker --gpu 0,…,N-1``.

Each simulated GPU is its own simulated card folder; each GPU's worker is its own process, booting its own
simulated SGLang servers (tiny profile, sped up). All workers of a run share one study (SQLite in the run
folder by default, or ``--storage postgresql://…``). A run lasts ``--seconds`` of worker budget; boots are
counted from the records the workers wrote (every phase, and the search alone), over the run's wall time.

    python benchmarks/workers/run.py                    # 1, 2, 4 GPUs, 120 s each
    python benchmarks/workers/run.py --gpus 1,2 --seconds 60 --storage postgresql+psycopg2://…

The simulator's boots are mostly simulated waiting (boot phases, decode at ``--speedup``), so workers overlap
even on a small machine; where the machine's cores saturate, the table shows it (CPU seconds per boot).
Nothing here measures a real GPU.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_one(n: int, args: argparse.Namespace, root: Path) -> dict[str, float]:
    out = root / f"gpus{n}"
    shutil.rmtree(out, ignore_errors=True)
    storage = args.storage or f"sqlite:///{out.resolve() / 'study.db'}"
    study = f"bench-{n}-{int(time.time())}"
    argv = [sys.executable, "-m", "elsa_tune", "worker", "--study", study, "--gpu", ",".join(str(i) for i in range(n)),
            "--out", str(out), "--storage", storage, "--runtime", "sim", "--sim-profile", "tiny-test",
            "--space", str(HERE / "tiny-space.yaml"), "--traffic", "demo", "--sim-speedup", str(args.speedup),
            "--budget", str(args.seconds), "--max-trials", "100000", "--baseline-boots", "3", "--seed", "7",
            "--no-promote", "--heartbeat", "2", "--grace", "10"]
    out.mkdir(parents=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=args.seconds + 600, check=False,
                          stdin=subprocess.DEVNULL)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit(f"{n} GPU(s): the workers failed ({done.returncode}); logs in {out / 'logs'}")
    boots = search = 0
    for record in out.glob("*-gpu*/boots/*/boot.json"):
        boots += 1
        data = json.loads(record.read_text())
        search += str(data.get("tag") or "").startswith("search:")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"gpus": n, "wall_s": wall, "boots": boots, "search_boots": search,
            "boots_per_hour": 3600.0 * boots / wall, "search_boots_per_hour": 3600.0 * search / wall,
            "cpu_s_per_boot": cpu / max(1, boots)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", default="1,2,4", help="simulated GPU counts to run (default 1,2,4)")
    parser.add_argument("--seconds", type=float, default=120.0, help="each run's worker budget (default 120)")
    parser.add_argument("--speedup", type=float, default=20.0, help="simulated seconds per wall second (default 20)")
    parser.add_argument("--storage", default=None, help="a shared database URL (default: SQLite per run)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="elsa-bench-workers-"))
    rows = []
    try:
        for n in (int(g) for g in args.gpus.split(",")):
            rows.append(run_one(n, args, root))
            r = rows[-1]
            print(f"  {n} GPU(s): {r['boots']} boots in {r['wall_s']:.0f} s", file=sys.stderr)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    base = rows[0]["boots_per_hour"] / rows[0]["gpus"] if rows else 1.0
    print("| simulated GPUs | wall s | boots (search) | boots/hour | search boots/hour | scaling vs 1 GPU × N "
          "| CPU s/boot |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        scaling = r["boots_per_hour"] / (base * r["gpus"]) if base else float("nan")
        print(f"| {r['gpus']} | {r['wall_s']:.0f} | {r['boots']} ({r['search_boots']}) | {r['boots_per_hour']:.0f} "
              f"| {r['search_boots_per_hour']:.0f} | {scaling:.2f} | {r['cpu_s_per_boot']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
