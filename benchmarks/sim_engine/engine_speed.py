"""How fast the simulated SGLang's scheduling core runs on this machine, and how fast it must run.

The real-time server (``elsa-tune sim serve``) paces ``engine.step()`` against the simulated step durations, so
the engine must compute a step much faster than the step lasts. This prints, for the seeds' heaviest load
(Elsa 1.7, 12 concurrent streams, ~2,654 tok/s), the simulated step time, the wall time the engine needs per
step, and the headroom between them; and the wall time of ``truth()`` on a few workloads.

    python benchmarks/sim_engine/engine_speed.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from elsa_tune.runtime.sim.engine import Engine, SimRequest
from elsa_tune.runtime.sim.memory import plan_memory
from elsa_tune.runtime.sim.performance import PerformanceModel
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.runtime.sim.truth import TruthWorkload, truth

PROFILE = "rtx5090-qwen3.6-35b-a3b-nvfp4"


def engine_rate(concurrency: int, output_tokens: int) -> dict[str, float]:
    profile = load_profile(PROFILE)
    config = profile.config("elsa-1.7")
    plan = plan_memory(profile, config.flags, config.env)
    engine = Engine(profile, plan, PerformanceModel(profile, plan, config.flags, config.env), random.Random(0),
                    block_size=64)
    for i in range(concurrency):
        engine.submit(SimRequest(f"r{i}", 1000, output_tokens, block_hashes=tuple(range(i * 100, i * 100 + 15))))
    wall: list[float] = []
    simulated = 0.0
    tokens = 0
    while True:
        start = time.perf_counter()
        step = engine.step()
        wall.append(time.perf_counter() - start)
        if step is None:
            break
        simulated += step.duration_s
        tokens += sum(step.emitted.values())
    wall_total = sum(wall)
    return {"steps": len(wall) - 1, "simulated_s": simulated, "wall_s": wall_total,
            "simulated_tok_s": tokens / simulated, "engine_only_tok_s": tokens / wall_total,
            "step_wall_p50_us": statistics.median(wall) * 1e6, "step_wall_max_us": max(wall) * 1e6,
            "headroom_x": simulated / wall_total}


def truth_seconds(workload: TruthWorkload) -> float:
    profile = load_profile(PROFILE)
    config = profile.config("elsa-1.7")
    start = time.perf_counter()
    truth(profile, config.flags, config.env, workload)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for concurrency in (1, 12):
        runs = [engine_rate(concurrency, 1024) for _ in range(args.repeat)]
        best = max(runs, key=lambda r: r["headroom_x"])
        print(f"engine, {concurrency:2d} streams x 1024 tokens: " + ", ".join(
            f"{k}={v:,.1f}" for k, v in best.items()))
    for name, workload in (("closed loop C=12, 48 requests", TruthWorkload(concurrency=12, num_requests=48)),
                           ("one 225K-token prompt", TruthWorkload(num_requests=1, input_tokens=(225_000,),
                                                                   output_tokens=(16,)))):
        seconds = min(truth_seconds(workload) for _ in range(args.repeat))
        print(f"truth, {name}: {seconds * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
