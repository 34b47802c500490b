"""Fault matrix: faults injected into simulated SGLang boots, and the kind the runtime classified each as.

Every fault goes through ``runtime/sim/faults.py``'s own API (``SimulatedSGLang(faults=…)``, i.e. ``--sim-fault``)
into a real boot of the simulated server (tiny profile, sped up), and ``Runtime.start`` / ``check`` / ``stop``
report what they saw. A row per fault: injections, how many were classified as the injected ``FailureKind``,
and the classified kinds. Nothing here measures a real GPU.

    python benchmarks/faults/run.py                   # 10 injections per fault (150 boots), 3 SIGKILLs
    python benchmarks/faults/run.py --repeats 2       # a short run

Faults and the kind expected:

    weights_oom, no_room_for_kv, mamba_pool_too_small, cuda_graph_failed, host_oom_killed, technique_crash,
    unknown                     BootFailed with that kind (boot OOM, graph capture, host OOM kill, …)
    port_taken                  BootFailed PORT_IN_USE
    slow_boot=1000 (10 s timeout) BootFailed BOOT_TIMEOUT
    an unknown flag             BootFailed BAD_FLAG
    crash_after_requests=1      ready; after one request ``check`` finds it dead with OOM_UNDER_LOAD
    hang_after_requests=1       ready; the probe client's no-token timer fires while ``check`` says HEALTHY: HANG
    gpu_not_released=30         ``stop`` reports the GPU memory not released within its timeout
    max-running-requests 64     the profile's Mamba slots cap it: the boot report shows a silent clamp
    mixed chunk with EAGLE      accepted and silently ignored: the boot report shows it

Then ``--kills N``: a whole study (``elsa-tune --gpu sim``, tiny profile) is SIGKILLed N times, each at a random
point 0–8 s after that run finished a boot of its own, and rerun with the same command until it finishes; every
finished boot (``boots/*/boot.json``) seen before a kill must still be there, unchanged, at the end, and none
booted twice. The killed tuner's orphaned server is
left to the next run's preflight (the lease reaper) to stop.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from elsa_tune.errors import BootFailed
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.protocol import HealthState
from elsa_tune.runtime.sim.faults import BOOT_CRASH_KIND
from elsa_tune.runtime.sim.runtime import SimulatedSGLang
from elsa_tune.search_spaces.candidate import Candidate

PROFILE = "tiny-test"


def _boot_fault(fault: str, root: Path, *, candidate: Candidate | None = None, boot_timeout_s: float = 60.0) -> str:
    runtime = SimulatedSGLang(PROFILE, card_dir=root / "card", speedup=50.0, faults=fault or None,
                              boot_timeout_s=boot_timeout_s, stop_timeout_s=5.0)
    try:
        server = runtime.start(candidate or Candidate(label=fault or "flag"), root / "boot")
    except BootFailed as exc:
        return exc.failure.kind.value
    runtime.stop(server)
    return "booted"


def _serve_oom(root: Path) -> str:
    runtime = SimulatedSGLang(PROFILE, card_dir=root / "card", speedup=50.0, faults="crash_after_requests=1",
                              boot_timeout_s=60.0, stop_timeout_s=5.0)
    server = runtime.start(Candidate(label="oom-under-load"), root / "boot")
    try:
        for _ in range(3):
            try:
                httpx.post(f"{server.base_url}/generate", json={"text": "hello", "sampling_params":
                                                                {"max_new_tokens": 4}}, timeout=20, trust_env=False)
            except httpx.HTTPError:
                break
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            health = runtime.check(server)
            if health.state is HealthState.DEAD:
                return health.failure.kind.value if health.failure else "dead-unclassified"
            time.sleep(0.2)
        return "still-alive"
    finally:
        runtime.stop(server)


def _hang(root: Path) -> str:
    import asyncio

    from elsa_tune.probes.client import ChatRequest, ProbeClient

    runtime = SimulatedSGLang(PROFILE, card_dir=root / "card", speedup=50.0, faults="hang_after_requests=1",
                              boot_timeout_s=60.0, stop_timeout_s=5.0)
    server = runtime.start(Candidate(label="hang"), root / "boot")

    async def ask() -> list[bool]:
        client = ProbeClient(server.base_url, first_token_s=3.0, hang_s=3.0)
        async with httpx.AsyncClient(trust_env=False) as http:
            return [(await client.chat(http, ChatRequest(messages=[{"role": "user", "content": "hi"}],
                                                         max_tokens=8))).hung for _ in range(2)]

    try:
        hung = any(asyncio.run(ask()))
        healthy = runtime.check(server).state is HealthState.HEALTHY
        return FailureKind.HANG.value if hung and healthy else f"hung={hung} healthy={healthy}"
    finally:
        runtime.stop(server)


def _adjusted(flags: dict[str, object], reason: str) -> Callable[[Path], str]:
    def inject(root: Path) -> str:
        runtime = SimulatedSGLang(PROFILE, card_dir=root / "card", speedup=50.0, boot_timeout_s=60.0,
                                  stop_timeout_s=5.0)
        server = runtime.start(Candidate(flags=flags, label=reason), root / "boot")  # type: ignore[arg-type]
        try:
            for adj in server.report.adjustments:
                if adj.flag == "max-running-requests" and adj.effective is not None \
                        and int(adj.effective) < int(adj.requested):
                    return "silent_clamp"
                if adj.flag == "enable-mixed-chunk" and adj.effective in (False, None):
                    return "ignored_flag"
            return "no adjustment"
        finally:
            runtime.stop(server)
    return inject


_SPEC = {"speculative-algorithm": "EAGLE", "speculative-num-steps": 2, "speculative-eagle-topk": 1,
         "speculative-num-draft-tokens": 3}


def _not_released(root: Path) -> str:
    runtime = SimulatedSGLang(PROFILE, card_dir=root / "card", speedup=50.0, faults="gpu_not_released=30",
                              boot_timeout_s=60.0, stop_timeout_s=5.0, memory_release_timeout_s=2.0)
    server = runtime.start(Candidate(label="not-released"), root / "boot")
    done = runtime.stop(server)
    return "released" if done.gpu_memory_released else "memory_not_released"


FAULTS: dict[str, tuple[str, Callable[[Path], str]]] = {
    **{name: (kind.value, lambda root, name=name: _boot_fault(name, root))  # type: ignore[misc]
       for name, kind in BOOT_CRASH_KIND.items()},
    "port_taken": (FailureKind.PORT_IN_USE.value, lambda root: _boot_fault("port_taken", root)),
    "slow_boot=1000": (FailureKind.BOOT_TIMEOUT.value,
                     lambda root: _boot_fault("slow_boot=1000", root, boot_timeout_s=10.0)),
    "unknown flag": (FailureKind.BAD_FLAG.value, lambda root: _boot_fault(
        "", root, candidate=Candidate(flags={"enable-warp-drive": True}, label="bad-flag"))),
    "crash_after_requests=1": (FailureKind.OOM_UNDER_LOAD.value, _serve_oom),
    "hang_after_requests=1": (FailureKind.HANG.value, _hang),
    "gpu_not_released=30": ("memory_not_released", _not_released),
    "max-running-requests 64": ("silent_clamp", _adjusted({"max-running-requests": 64}, "clamp")),
    "mixed chunk with EAGLE": ("ignored_flag", _adjusted({**_SPEC, "enable-mixed-chunk": True}, "ignored")),
}


def kill_and_resume(kills: int, seed: int, budget: str) -> dict[str, int]:
    """SIGKILL a study ``kills`` times at random points, then let the same command finish it."""
    import hashlib
    import os
    import random
    import signal
    import subprocess

    root = Path(tempfile.mkdtemp(prefix="fault-kill-"))
    run_dir, card = root / "run", root / "card"
    env = {**os.environ, "ELSA_SIM_CARD_DIR": str(card), "ELSA_LEASE_DIR": str(root / "leases"),
           "ELSA_TUNE_BASELINE_BOOTS": "3"}
    argv = [sys.executable, "-m", "elsa_tune", "--gpu", "sim", "--sim-profile", PROFILE, "--space",
            str(Path(__file__).resolve().parents[1] / "workers" / "tiny-space.yaml"), "--traffic", "demo",
            "--budget", budget, "--out", str(run_dir), "--no-live", "--sim-speedup", "20", "--seed", str(seed), "-q"]

    def finished() -> dict[str, str]:
        return {p.parent.name: hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted((run_dir / "boots").glob("*/boot.json"))}

    rng = random.Random(seed)
    seen: dict[str, str] = {}
    lost = 0
    try:
        for i in range(kills):
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # a random point after this run has finished a boot of its own (or 120 s): the kill always lands
            # mid-study, with something to lose, however fast this machine boots
            target, deadline = len(finished()) + 1, time.monotonic() + 120.0
            while len(finished()) < target and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)
            time.sleep(rng.uniform(0.0, 8.0))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            now = finished()
            lost += sum(1 for k, v in seen.items() if now.get(k) != v)
            seen = {**seen, **now}
            print(f"kill {i + 1}: {len(now)} finished boots", file=sys.stderr, flush=True)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800, check=False)
        final = finished()
        lost += sum(1 for k, v in seen.items() if final.get(k) != v)
        tags = []
        for name in final:
            import json

            tags.append(json.loads((run_dir / "boots" / name / "boot.json").read_text()).get("tag"))
        tagged = [t for t in tags if t]
        return {"kills": kills, "exit": done.returncode, "finished_before_last_kill": len(seen),
                "finished_at_end": len(final), "lost": lost, "booted_twice": len(tagged) - len(set(tagged))}
    finally:
        _stop_strays(card)
        shutil.rmtree(root, ignore_errors=True)


def _stop_strays(card: Path) -> None:
    """Whatever simulated server of this run's card is still up when the benchmark ends, by pid."""
    import contextlib
    import os
    import signal

    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "sim serve" in cmdline and str(card) in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10, help="injections per fault (default 10)")
    parser.add_argument("--only", default="", help="comma-separated fault names (default: all)")
    parser.add_argument("--md", type=Path, default=None, help="also write the table here")
    parser.add_argument("--kills", type=int, default=3, help="SIGKILLs of a whole study before it resumes (0: none)")
    parser.add_argument("--kill-rounds", type=int, default=1, help="studies killed and resumed (default 1)")
    parser.add_argument("--kill-budget", default="150s", help="each killed study's --budget (default 150s)")
    args = parser.parse_args()
    names = [n for n in FAULTS if not args.only or n in args.only.split(",")]
    rows = []
    total = right = 0
    began = time.monotonic()
    for name in names:
        expected, inject = FAULTS[name]
        seen: collections.Counter[str] = collections.Counter()
        for i in range(args.repeats):
            root = Path(tempfile.mkdtemp(prefix="fault-"))
            try:
                seen[inject(root)] += 1
            except Exception as exc:   # a benchmark row, not a crash of the table
                seen[f"error {type(exc).__name__}"] += 1
            finally:
                shutil.rmtree(root, ignore_errors=True)
            print(f"{name} #{i + 1}: {seen.most_common()}", file=sys.stderr, flush=True)
        rows.append((name, expected, args.repeats, seen[expected], dict(seen)))
        total += args.repeats
        right += seen[expected]
    lines = ["| fault injected | expected kind | injections | classified right | classified as |",
             "|---|---|---|---|---|"]
    lines += [f"| {n} | {e} | {k} | {r} | {', '.join(f'{a}: {b}' for a, b in s.items())} |"
              for n, e, k, r, s in rows]
    lines.append(f"\n{right}/{total} classified as the injected kind ({100 * right / max(total, 1):.1f}%), "
                 f"{time.monotonic() - began:.0f} s")
    for round_ in range(args.kill_rounds if args.kills else 0):
        result = kill_and_resume(args.kills, 11 + round_, args.kill_budget)
        if round_ == 0:
            lines += ["", "| study | SIGKILLs | finished boots before the last kill | at the end | lost | "
                          "booted twice | final exit |", "|---|---|---|---|---|---|---|"]
        lines.append(f"| {round_ + 1} | {result['kills']} | {result['finished_before_last_kill']} | "
                     f"{result['finished_at_end']} | {result['lost']} | {result['booted_twice']} | {result['exit']} |")
    table = "\n".join(lines)
    print(table)
    if args.md:
        args.md.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
