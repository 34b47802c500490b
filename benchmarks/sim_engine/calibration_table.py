"""Print the simulator's numbers beside the seeds' tables (the rows ``tests/runtime/test_sim_calibration.py`` checks).

    python benchmarks/sim_engine/calibration_table.py

Memory rows come from the memory plan, speed rows from ``truth()`` (closed loop, noise-free). The test enforces
5 % on pools and slots and 10 % on speeds; this prints the actual deviations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elsa_tune.runtime.sim.memory import plan_memory
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.runtime.sim.truth import TruthWorkload, truth

Q36, Q38 = "rtx5090-qwen3.6-35b-a3b-nvfp4", "rtx5090-qwen3.8-27b-nvfp4"
NO_SLOTS = {"max-mamba-cache-size": None}


def launch(name: str, config: str, flags: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    base = load_profile(name).config(config)
    merged = dict(base.flags)
    for key, value in flags.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged, dict(base.env)


def kv(name: str, config: str, flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> float:
    f, e = launch(name, config, flags or {})
    return float(plan_memory(load_profile(name), f, {**e, **(env or {})}).kv_tokens)


def decode(name: str, config: str, c: int, regime: str = "chat", ctx: int = 1000, per_request: bool = False,
           flags: Mapping[str, Any] | None = None) -> float:
    f, e = launch(name, config, flags or {})
    t = truth(load_profile(name), f, e, TruthWorkload(concurrency=c, num_requests=2 * c, input_tokens=(ctx,),
                                                      output_tokens=(1024 if ctx <= 1000 else 512,), regimes=(regime,)))
    value = t.decode_tokens_per_s if per_request else t.output_tokens_per_s
    return float("nan") if value is None else value


def prefill(name: str, config: str, tokens: int) -> float:
    f, e = launch(name, config, {})
    t = truth(load_profile(name), f, e, TruthWorkload(num_requests=1, input_tokens=(tokens,), output_tokens=(1,)))
    return float("nan") if t.ttft_p50_s is None else tokens / t.ttft_p50_s


ROWS: list[tuple[str, str, float, Any]] = [
    ("000", "stock KV pool", 345_000, lambda: kv(Q36, "stock")),
    ("000", "stock + MTP KV pool", 181_000, lambda: kv(Q36, "stock-mtp")),
    ("000", "shared draft vocab KV pool", 244_000, lambda: kv(Q36, "stock-mtp", env={"ELSA_SHARE_DRAFT_VOCAB": "1"})),
    ("000", "bf16 state + ReplaySSM + pinned slots", 303_000, lambda: kv(Q36, "elsa-part-one",
                                                                          env={"ELSA_FP8_DRAFT": "0"})),
    ("000", "Elsa KV pool", 358_000, lambda: kv(Q36, "elsa-part-one")),
    ("001", "Elsa 1.7, 8 running", 411_000, lambda: kv(Q36, "elsa-1.7", {"max-running-requests": 8,
                                                                        "max-mamba-cache-size": 32})),
    ("001", "Elsa 1.7, 12 running", 355_000, lambda: kv(Q36, "elsa-1.7")),
    ("001", "Elsa 1.7, 16 running", 299_000, lambda: kv(Q36, "elsa-1.7", {"max-running-requests": 16,
                                                                         "max-mamba-cache-size": 64})),
    ("000", "stock decode, 1", 310, lambda: decode(Q36, "stock", 1)),
    ("000", "stock decode, 8", 1201, lambda: decode(Q36, "stock", 8)),
    ("000", "stock + MTP decode, 1", 528, lambda: decode(Q36, "stock-mtp", 1)),
    ("000", "Elsa decode, 1", 626, lambda: decode(Q36, "elsa-part-one", 1)),
    ("000", "Elsa decode, 4", 1343, lambda: decode(Q36, "elsa-part-one", 4)),
    ("000", "Elsa decode, 8", 1956, lambda: decode(Q36, "elsa-part-one", 8)),
    ("001", "Elsa 1.7 decode, 1", 681, lambda: decode(Q36, "elsa-1.7", 1)),
    ("001", "Elsa 1.7 decode, 4", 1414, lambda: decode(Q36, "elsa-1.7", 4)),
    ("001", "Elsa 1.7 decode, 8", 2085, lambda: decode(Q36, "elsa-1.7", 8)),
    ("001", "Elsa 1.7 decode, 12", 2654, lambda: decode(Q36, "elsa-1.7", 12)),
    ("000", "stock prefill 30K", 26_400, lambda: prefill(Q36, "stock", 30_000)),
    ("000", "stock prefill 120K", 11_200, lambda: prefill(Q36, "stock", 120_000)),
    ("000", "stock prefill 225K", 6_560, lambda: prefill(Q36, "stock", 225_000)),
    ("000", "Elsa prefill 30K", 25_800, lambda: prefill(Q36, "elsa-part-one", 30_000)),
    ("000", "Elsa prefill 120K", 11_100, lambda: prefill(Q36, "elsa-part-one", 120_000)),
    ("000", "Elsa prefill 225K", 6_530, lambda: prefill(Q36, "elsa-part-one", 225_000)),
    ("000", "Elsa decode at 30K", 381, lambda: decode(Q36, "elsa-part-one", 1, "document", 30_000, True)),
    ("000", "Elsa decode at 120K", 297, lambda: decode(Q36, "elsa-part-one", 1, "document", 120_000, True)),
    ("000", "Elsa decode at 225K", 256, lambda: decode(Q36, "elsa-part-one", 1, "document", 225_000, True)),
    ("004", "1 req / 8 slots KV", 134_016, lambda: kv(Q38, "tuned")),
    ("004", "2 req / 16 slots KV", 100_480, lambda: kv(Q38, "tuned", {"max-running-requests": 2,
                                                                       "max-mamba-cache-size": 16})),
    ("004", "4 req / 32 slots KV", 33_440, lambda: kv(Q38, "tuned", {"max-running-requests": 4,
                                                                      "max-mamba-cache-size": 32})),
    ("004", "Mamba ratio 0.3 KV", 143_008, lambda: kv(Q38, "tuned", {**NO_SLOTS, "mamba-full-memory-ratio": 0.3})),
    ("004", "Mamba ratio 0.9 KV", 94_112, lambda: kv(Q38, "tuned", NO_SLOTS)),
    ("004", "Mamba ratio 3.0 KV", 48_640, lambda: kv(Q38, "tuned", {**NO_SLOTS, "mamba-full-memory-ratio": 3.0})),
    ("004", "Mamba ratio 8.26 KV", 39_072, lambda: kv(Q38, "tuned", {**NO_SLOTS, "mamba-full-memory-ratio": 8.26})),
    ("004", "0.90 with MTP KV", 62_880, lambda: kv(Q38, "tuned-0.90")),
    ("004", "0.90 without MTP KV", 272_800, lambda: kv(Q38, "no-mtp-0.90")),
    ("004", "with MTP short (tool)", 165.0, lambda: decode(Q38, "tuned-0.90", 1, "tool", 1000, True)),
    ("004", "with MTP 63K (tool)", 83.0, lambda: decode(Q38, "tuned-0.90", 1, "tool", 62_000, True)),
    ("004", "without MTP short", 74.2, lambda: decode(Q38, "no-mtp-0.90", 1, "tool", 1000, True)),
    ("004", "without MTP 63K", 57.1, lambda: decode(Q38, "no-mtp-0.90", 1, "tool", 63_000, True)),
    ("004", "without MTP 128K", 45.7, lambda: decode(Q38, "no-mtp-0.90", 1, "tool", 128_000, True)),
    ("004", "without MTP 200K", 36.5, lambda: decode(Q38, "no-mtp-0.90", 1, "tool", 200_000, True)),
]


def main() -> None:
    print(f"{'seed':4} {'row':40} {'seed value':>11} {'simulated':>11} {'diff':>7}")
    for seed, row, want, compute in ROWS:
        got = compute()
        print(f"{seed:4} {row:40} {want:11,.1f} {got:11,.1f} {got / want - 1:+7.1%}")
    depth = {s: decode(Q38, "tuned", 1, "tool", 1000, True, {"speculative-num-steps": s,
                                                             "speculative-num-draft-tokens": s + 1})
             for s in (2, 3, 4, 5, 7, 9, 11)}
    print("004  speculative depth (tool, tok/s): " + ", ".join(f"{s}/1/{s + 1}={v:.1f}" for s, v in depth.items()))


if __name__ == "__main__":
    main()
