"""Print the simulator's numbers beside the seeds' tables (the rows ``tests/runtime/test_sim_calibration.py`` checks),
and each row as a fit that left it out predicts it.

    python benchmarks/sim_engine/calibration_table.py [--no-loo]

Memory rows come from the memory plan, speed rows from ``truth()`` (closed loop, noise-free). The test enforces
5 % on pools and slots and 10 % on speeds; this prints the actual deviations.

Leave-one-out: the profiles' fitted constants are grouped in ``FAMILIES``, each with the seed rows it was fitted
to. For every row of a family, its constants are refitted (least squares on log ratios, from the profile's values)
to the family's other rows and the left-out row is computed with them: the "left out" column. A row is "—" when
it belongs to no family (geometry, not a fit) or when the other rows do not determine the family's constants
(fewer rows than constants, or a constant they do not depend on): such a row is its constants' only evidence.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from elsa_tune.runtime.sim.memory import plan_memory
from elsa_tune.runtime.sim.profile import SimProfile
from elsa_tune.runtime.sim.profile import load_profile as _load_profile
from elsa_tune.runtime.sim.truth import TruthWorkload, truth

#: Profiles with refitted constants, by name, while a leave-one-out fit runs (see ``load_profile``).
_REFIT: dict[str, SimProfile] = {}


@functools.cache
def _loaded(name: str) -> SimProfile:
    return _load_profile(name)


def load_profile(name: str) -> SimProfile:
    return _REFIT.get(name) or _loaded(name)

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


@dataclass(frozen=True)
class Family:
    """Constants of one profile's model (``ModelProfile`` fields; ``kv_bytes_per_token.fp8_e4m3`` style for a
    mapping's entry) and the seed rows they were fitted to."""

    profile: str
    constants: tuple[str, ...]
    rows: tuple[str, ...]


FAMILIES = (
    Family(Q36, ("prefill_s_per_token", "prefill_s_per_token_ctx", "prefill_chunk_overhead_s"),
           ("stock prefill 30K", "stock prefill 120K", "stock prefill 225K", "Elsa prefill 30K", "Elsa prefill 120K",
            "Elsa prefill 225K")),
    Family(Q36, ("decode_bytes_per_step", "decode_fixed_s", "attention_read_efficiency", "batch_compute_s_per_token"),
           ("stock decode, 1", "stock decode, 8", "Elsa decode, 1", "Elsa decode, 4", "Elsa decode, 8",
            "Elsa 1.7 decode, 1", "Elsa 1.7 decode, 4", "Elsa 1.7 decode, 8", "Elsa 1.7 decode, 12",
            "Elsa decode at 30K", "Elsa decode at 120K", "Elsa decode at 225K")),
    Family(Q38, ("kv_bytes_per_token.fp8_e4m3",),
           ("1 req / 8 slots KV", "2 req / 16 slots KV", "4 req / 32 slots KV", "Mamba ratio 0.3 KV",
            "Mamba ratio 0.9 KV", "Mamba ratio 3.0 KV", "Mamba ratio 8.26 KV", "0.90 with MTP KV")),
    Family(Q38, ("decode_bytes_per_step", "attention_read_efficiency"),
           ("without MTP short", "without MTP 63K", "without MTP 128K", "without MTP 200K")),
    Family(Q38, ("verify_attention_factor",), ("with MTP short (tool)", "with MTP 63K (tool)")),
)


def _with_constants(profile: SimProfile, constants: Sequence[str], values: Sequence[float]) -> SimProfile:
    model = profile.model
    for name, value in zip(constants, values, strict=True):
        field_name, _, key = name.partition(".")
        if key:
            table = dict(getattr(model, field_name))
            table[key] = type(table[key])(value)
            model = dataclasses.replace(model, **{field_name: table})
        else:
            model = dataclasses.replace(model, **{field_name: float(value)})
    return dataclasses.replace(profile, model=model)


def _constant(profile: SimProfile, name: str) -> float:
    field_name, _, key = name.partition(".")
    value = getattr(profile.model, field_name)
    return float(value[key] if key else value)


def left_out(family: Family, by_row: Mapping[str, tuple[float, Callable[[], float]]]) -> dict[str, float | None]:
    """Each row of ``family`` computed with constants fitted to the family's other rows (``None``: undetermined)."""
    base = _loaded(family.profile)
    start = np.log([_constant(base, c) for c in family.constants])

    def predict(logs: np.ndarray[Any, Any], rows: Sequence[str]) -> np.ndarray[Any, Any]:
        _REFIT[family.profile] = _with_constants(base, family.constants, np.exp(logs).tolist())
        try:
            return np.array([math.log(by_row[r][1]() / by_row[r][0]) for r in rows])
        finally:
            _REFIT.pop(family.profile, None)

    out: dict[str, float | None] = {}
    for row in family.rows:
        others = [r for r in family.rows if r != row]
        if len(others) < len(family.constants):
            out[row] = None
            continue
        # a constant the other rows do not move is theirs to leave alone, and the row its only evidence
        at_start = predict(start, others)
        moved = [np.abs(predict(start + np.eye(len(start))[i] * 0.1, others) - at_start).max() > 1e-3
                 for i in range(len(start))]
        if not all(moved):
            out[row] = None
            continue
        # in log ratios to the profile's constants, a few Gauss-Newton steps from them (they are near the optimum)
        fit = least_squares(lambda x, o=others: predict(start + x, o), np.zeros(len(start)), diff_step=1e-3,
                            max_nfev=6)
        out[row] = float(math.exp(predict(start + fit.x, [row])[0]) * by_row[row][0])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-loo", action="store_true", help="skip the leave-one-out fits (minutes)")
    args = parser.parse_args()
    by_row = {row: (want, compute) for _, row, want, compute in ROWS}
    loo: dict[str, float | None] = {}
    if not args.no_loo:
        for family in FAMILIES:
            loo.update(left_out(family, by_row))
    print(f"{'seed':4} {'row':40} {'seed value':>11} {'simulated':>11} {'diff':>7} {'left out':>11} {'diff':>7}")
    for seed, row, want, compute in ROWS:
        got = compute()
        held = loo.get(row)
        out = "—" if held is None else f"{held:11,.1f} {held / want - 1:+7.1%}"
        print(f"{seed:4} {row:40} {want:11,.1f} {got:11,.1f} {got / want - 1:+7.1%} {out:>19}")
    depth = {s: decode(Q38, "tuned", 1, "tool", 1000, True, {"speculative-num-steps": s,
                                                             "speculative-num-draft-tokens": s + 1})
             for s in (2, 3, 4, 5, 7, 9, 11)}
    print("004  speculative depth (tool, tok/s): " + ", ".join(f"{s}/1/{s + 1}={v:.1f}" for s, v in depth.items()))


if __name__ == "__main__":
    main()
