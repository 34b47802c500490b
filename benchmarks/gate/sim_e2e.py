"""The A/B gate end to end against the simulated runtime, on techniques whose true effect the simulator knows.

    python benchmarks/gate/sim_e2e.py                       # all cases, ~10-25 minutes (real boots, real time)
    python benchmarks/gate/sim_e2e.py --case noop --case fp8-draft

Every boot is a real ``elsa-tune sim serve`` process started by ``SimulatedSGLang`` (process group, startup
log, readiness, stop), measured by the real load generator over HTTP: one warm-up pass, then the policy's
measured passes, of an identical closed-loop workload (single stream, 512-token prompts, 128 output tokens).
The simulator's own noise applies (boot drift 10%, run noise 3%, cold first pass) plus whatever this shared
machine adds. Beside each verdict the script prints the noiseless truth (``runtime/sim/truth.py``) of both
arms, so the gate is scored against what the configuration is really worth in the simulator.

Cases (profile rtx5090-qwen3.6-35b-a3b-nvfp4, seed 000's techniques):

- ``elsa``: stock SGLang → Elsa part one (MTP 5/1/6 and the memory fixes): a large true speed gain.
- ``kernels``: ``ELSA_KERNELS=1`` on stock: a true gain of a few percent (hard at 10% boot noise).
- ``noop``: ``ELSA_SPLIT_DECODE_GRAPH=1`` on stock: "changed nothing in an A/B test" (seed 000), true 0%.
- ``fp8-draft``: ``ELSA_FP8_DRAFT=1`` on Elsa without it, judged as a *memory* technique: same speed, a
  bigger KV pool (seed 000: 303K → 358K); non-inferiority margin 10% at this noise.

The boot sampler here is a demonstration; the study's own sampler replaces it. There is no quality probe in
this loop, so the quality guardrail is off; every other guardrail is on.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from elsa_tune.errors import MeasurementFailed
from elsa_tune.history.records import Arm, Covariates
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.runtime.sim.profile import load_profile
from elsa_tune.runtime.sim.runtime import SimulatedSGLang
from elsa_tune.runtime.sim.truth import TruthWorkload, truth
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.traffic.loadgen import LoadGenerator
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.traffic.workload import Workload, synthetic
from elsa_tune.tuner.ab.boot_sample import BootSample, PassMeasurement
from elsa_tune.tuner.ab.gate import GatePolicy, GuardrailPolicy, run_ab

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "runtime" / "sim" / "profiles" / "rtx5090-qwen3.6-35b-a3b-nvfp4.yaml"
STOCK = {"mem-fraction-static": 0.88, "moe-runner-backend": "cutlass"}
ELSA_FLAGS = {**STOCK, "speculative-algorithm": "EAGLE", "speculative-num-steps": 5, "speculative-eagle-topk": 1,
              "speculative-num-draft-tokens": 6, "mamba-ssm-dtype": "bfloat16", "enable-linear-replayssm-spec": True,
              "mamba-radix-cache-strategy": "extra_buffer_lazy", "max-running-requests": 8,
              "max-mamba-cache-size": 32}
ELSA_ENV = {"ELSA_SHARE_DRAFT_VOCAB": "1", "ELSA_CPU_TOKENIZER": "1", "ELSA_FP8_DRAFT": "1", "ELSA_KERNELS": "1",
            "ELSA_HOT_VOCAB_HEAD": "1", "ELSA_DRAFT_PREFILL_WINDOW": "4096",
            "SGLANG_ENABLE_FLASHINFER_FUSED_MOE_FINALIZE": "1"}
ELSA_NO_FP8 = {k: v for k, v in ELSA_ENV.items() if k != "ELSA_FP8_DRAFT"}


@dataclass(frozen=True)
class Case:
    name: str
    incumbent: Candidate
    candidate: Candidate
    kind: str = "speed"


CASES = {
    "elsa": Case("elsa", Candidate(STOCK, label="stock"), Candidate(ELSA_FLAGS, ELSA_ENV, label="elsa-part-one")),
    "kernels": Case("kernels", Candidate(STOCK, label="stock"),
                    Candidate(STOCK, {"ELSA_KERNELS": "1"}, label="elsa-kernels")),
    "noop": Case("noop", Candidate(STOCK, label="stock"),
                 Candidate(STOCK, {"ELSA_SPLIT_DECODE_GRAPH": "1"}, label="split-decode-graph")),
    "fp8-draft": Case("fp8-draft", Candidate(ELSA_FLAGS, ELSA_NO_FP8, label="elsa-no-fp8-draft"),
                      Candidate(ELSA_FLAGS, ELSA_ENV, label="elsa-fp8-draft"), kind="memory"),
}


class SimBootSampler:
    """Boots one arm's candidate on the simulated runtime and replays the workload: warm-up + measured passes."""

    def __init__(self, runtime: SimulatedSGLang, arms: Mapping[Arm, Candidate], workload: Workload, *,
                 passes: int, boot_root: Path) -> None:
        self.runtime = runtime
        self.arms = arms
        self.workload = workload
        self.passes = passes
        self.boot_root = boot_root
        self.prompts = PromptSynth(workload.block_size)

    def boot(self, arm: Arm, block: int, position: int) -> BootSample:
        candidate = self.arms[arm]
        boot_dir = self.boot_root / f"block{block:02d}-{position}-{arm.letter}"
        boot_dir.mkdir(parents=True)
        started = time.time()
        server = self.runtime.start(candidate, boot_dir)   # BootFailed propagates: the gate records it
        measured: list[PassMeasurement] = []
        try:
            loadgen = LoadGenerator(server.base_url, self.prompts, slots=server.report.max_running_requests)
            for i in range(self.passes):
                try:
                    m = loadgen.measure(self.workload, i)
                except MeasurementFailed as exc:
                    return BootSample(arm=arm, block=block, position=position, passes=tuple(measured),
                                      candidate_key=candidate.key(), failed=Failure(
                                          kind=FailureKind.UNKNOWN_CRASH, phase="serve", summary=exc.message,
                                          remedy=exc.remedy))
                measured.append(PassMeasurement(output_throughput_tok_s=m.output_throughput_tok_s,
                                                ttft_p50_s=m.ttft_s.p50, ttft_p99_s=m.ttft_s.p99, warmup=i == 0))
        finally:
            self.runtime.stop(server)
        return BootSample(arm=arm, block=block, position=position, passes=tuple(measured),
                          kv_pool_tokens=server.report.max_total_num_tokens, quality_passed=None,
                          covariates=Covariates(started_at=started), candidate_key=candidate.key())


def true_ratio(case: Case, workload: TruthWorkload) -> tuple[float | None, float | None]:
    """(true throughput ratio, true KV pool ratio) candidate/incumbent from the noiseless simulator."""
    profile = load_profile(PROFILE)
    a = truth(profile, dict(case.incumbent.flags), dict(case.incumbent.env), workload)
    b = truth(profile, dict(case.candidate.flags), dict(case.candidate.env), workload)
    speed = (b.output_tokens_per_s / a.output_tokens_per_s
             if a.output_tokens_per_s and b.output_tokens_per_s else None)
    kv = b.kv_pool_tokens / a.kv_pool_tokens if a.kv_pool_tokens else None
    return speed, kv


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the A/B gate end to end against the simulated runtime")
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="run only these (repeatable)")
    parser.add_argument("--speedup", type=float, default=5.0, help="simulated seconds per wall second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(message)s")
    workload = synthetic(4, 512, 128, 1, tag="gate-e2e")
    truth_workload = TruthWorkload(concurrency=1, num_requests=4, input_tokens=(512,), output_tokens=(128,))
    base = GatePolicy(guardrails=GuardrailPolicy(require_quality=False))
    print("| case | kind | true speed ratio | true KV ratio | verdict | measured ratio (90% CI) | boot σ A/B | boots "
          "| order | reason |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.case or list(CASES):
        case = CASES[name]
        policy = replace(base, kind=case.kind, non_inferiority_margin=0.10) if case.kind == "memory" else base
        speed, kv = true_ratio(case, truth_workload)
        with tempfile.TemporaryDirectory(prefix="elsa-gate-e2e-") as tmp:
            runtime = SimulatedSGLang(PROFILE, card_dir=Path(tmp) / "card", seed=args.seed * 1000, speedup=args.speedup)
            sampler = SimBootSampler(runtime, {Arm.INCUMBENT: case.incumbent, Arm.CANDIDATE: case.candidate},
                                     workload, passes=policy.warmup_passes + policy.measured_passes,
                                     boot_root=Path(tmp) / "boots")
            started = time.monotonic()
            result = run_ab(sampler, policy, rng_seed=args.seed,
                            context={"runtime": "simulated sglang 0.5.23", "profile": PROFILE.stem})
            elapsed = time.monotonic() - started
        v = result.verdict
        for look in v.extra.get("looks", []):
            print(f"<!-- {name}: look {look['look']} after {look['boots']} boots: {look['decision']}: "
                  f"{look['reason']} -->", flush=True)
        measured = (f"{v.effect:.3f} ({v.ci_low:.3f}–{v.ci_high:.3f})" if v.effect and v.ci_low and v.ci_high
                    else "n/a")
        stats = v.statistics
        sd = (f"{stats.sd_incumbent:.1%} / {stats.sd_candidate:.1%}"
              if stats is not None and stats.sd_incumbent is not None and stats.sd_candidate is not None else "n/a")
        print(f"| {name} | {case.kind} | {speed:.3f} | {kv:.3f} | {v.decision.value.upper()} | {measured} | {sd} | "
              f"{result.boots} ({elapsed:.0f} s) | {result.schedule.letters()} | {v.reason} |"
              if speed and kv else f"| {name} | {case.kind} | n/a | n/a | {v.decision.value} | | | | | {v.reason} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
