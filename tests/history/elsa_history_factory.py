"""A realistic study history written through the store API (shared by the history and reports tests).

Shaped like seed 004: a hybrid GDN model on an RTX 5090, a baseline measured three times, techniques
that crash, are silently ignored or lose at long context, a numeric search whose 4-slot candidate OOMs
under load, a kept page size, and a confirmation of the winner against the baseline.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna

from elsa_tune.history.decision import DecisionRecord
from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.history.ledger import LedgerEntry
from elsa_tune.history.records import Arm, BootOutcome, BootRecord, Covariates, Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.history.study_record import NoiseRecord, PhaseSpan, StudyRecord, StudyStatus
from elsa_tune.history.verdict import Decision, GuardrailResult, Verdict
from elsa_tune.probes.protocol import ProbeResult, ProbeStatus
from elsa_tune.runtime.boot_report import Adjustment, BootReport
from elsa_tune.runtime.failure import Failure, FailureKind
from elsa_tune.runtime.gpu import GpuState
from elsa_tune.search_spaces.candidate import Candidate

STUDY = "qwen-5090"
T0 = 1_795_910_400.0   # 2026-11-29 00:00 UTC
XSS = "<script>alert(1)</script>"
CRASH = "AttributeError: 'HybridLinearKVPool' object has no attribute 'layer_num'"
MiB = 1024 * 1024

BASELINE = Candidate(flags={"model-path": "/models/qwen", "mem-fraction-static": 0.9, "max-running-requests": 1,
                            "max-mamba-cache-size": 8, "page-size": 16, "context-length": 159776,
                            "attention-backend": "flashinfer"},
                     env={"SGLANG_ENABLE_SPEC_V2": "1"}, label="baseline")
WINNER = BASELINE.merged(flags={"page-size": 32, "max-running-requests": 2, "max-mamba-cache-size": 16},
                         label="winner")


def gpu_state() -> GpuState:
    return GpuState(index=0, uuid="GPU-1234abcd-5678-90ef-aaaa-bbbbccccdddd", name="NVIDIA GeForce RTX 5090",
                    driver="620.70", cuda_driver="13.1", memory_total=32 * 1024 * MiB, power_limit_w=600.0,
                    power_default_limit_w=575.0, temperature_c=51.0, sm_clock_mhz=2407, mem_clock_mhz=14001,
                    max_sm_clock_mhz=3090, persistence_mode=True)


def fingerprint(model_dir: Path, *, driver: str = "620.70") -> Fingerprint:
    fp = Fingerprint.build(runtime="sglang", runtime_version="0.5.23", launch_command=("python", "-m",
                           "sglang.launch_server"), model_path=model_dir, gpu=gpu_state(),
                           image_digest="lmsysorg/sglang@sha256:0123456789abcdef")
    if driver != fp.driver:
        fp = Fingerprint.from_dict({**fp.to_dict(), "driver": driver})
    return fp


def passes(values: list[float], workload: str = "chat") -> tuple[dict[str, object], ...]:
    return tuple({"workload_id": workload, "pass_index": i, "output_throughput_tok_s": v, "requests_ok": 40,
                  "requests_total": 40, "ttft_s": {"p50": 0.42 + 0.01 * i, "p99": 1.3}} for i, v in enumerate(values))


def boot_report(slots: int, kv_tokens: int, *, adjustments: tuple[Adjustment, ...] = ()) -> BootReport:
    return BootReport(runtime_version="0.5.23", max_total_num_tokens=kv_tokens, max_running_requests=slots,
                      context_len=159776, chunked_prefill_size=2048, available_gpu_mem_gb=0.68, weights_mem_gb=18.59,
                      kv_pool_tokens=kv_tokens, kv_pool_gb=3.88, mamba_cache_size=slots * 8, mamba_pool_gb=1.94,
                      boot_seconds=95.0, server_args={"max_running_requests": slots, "enable_mixed_chunk": False},
                      adjustments=adjustments)


class HistoryBuilder:
    """Writes boots, trials and decisions through ``StudyStore`` in the order the tuner would."""

    def __init__(self, root: Path) -> None:
        self.root = root
        model_dir = root / "models" / "qwen"
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "config.json").write_text(json.dumps({"model_type": "qwen3_next", "layers": 48}))
        self.run_dir = root / "runs" / STUDY
        stored = self.run_dir / "study.json"
        self.fp = (Fingerprint.from_dict(json.loads(stored.read_text())["fingerprint"]) if stored.exists()
                   else fingerprint(model_dir))
        self.store = StudyStore(self.run_dir, name=STUDY, heartbeat_interval=None)
        self.clock = T0
        self.decision_number = 0

    def boot(self, candidate: Candidate, phase: Phase, arm: Arm, outcome: BootOutcome, *, values: list[float] = (),
             report: BootReport | None = None, failure: Failure | None = None, technique: str | None = None,
             min_free_mib: int | None = 700, log_lines: tuple[str, ...] = (), trial: int | None = None,
             probes: tuple[ProbeResult, ...] = ()) -> BootRecord:
        slot = self.store.new_boot(candidate.label or arm.value)
        slot.log_path.write_text("\n".join(("[2026-11-29 01:00:00] server_args=ServerArgs(...)", *log_lines)) + "\n")
        started = self.clock
        self.clock += 240.0
        record = BootRecord(study=STUDY, boot_id=slot.boot_id, boot_number=slot.number, phase=phase, arm=arm,
                            candidate=candidate, fingerprint=self.fp, started_at=started, ended_at=self.clock,
                            outcome=outcome, trial_number=trial, technique=technique, report=report, failure=failure,
                            covariates=Covariates.from_gpu_state(gpu_state()),
                            min_free_gpu_bytes=min_free_mib * MiB if min_free_mib is not None else None,
                            probes=probes, measurements=passes(list(values)), log_path=slot.log_relpath)
        self.store.record_boot(record)
        return record

    def decide(self, phase: Phase, technique: str, flags: dict[str, object], *, verdict: Verdict | None = None,
               failure: Failure | None = None, ignored: tuple[Adjustment, ...] = (), incumbent: list[str] = (),
               candidate: list[str] = (), skipped: str = "") -> DecisionRecord:
        self.decision_number += 1
        record = DecisionRecord(study=STUDY, number=self.decision_number, phase=phase, technique=technique,
                                flags_delta=flags, verdict=verdict, failure=failure, ignored=ignored, skipped=skipped,
                                boots_incumbent=tuple(incumbent), boots_candidate=tuple(candidate),
                                decided_at=self.clock)
        self.store.record_decision(record)
        return record


def verdict(decision: Decision, effect: float, low: float, high: float, n: int,
            by_workload: dict[str, float] | None = None) -> Verdict:
    return Verdict(decision=decision, reason="gate", effect=effect, ci_low=low, ci_high=high, p_value=0.03,
                   boots_incumbent=n, boots_candidate=n, mde=1.06,
                   guardrails=(GuardrailResult("ttft_p50", True, 0.97, 0.9, 1.05, 1.10),),
                   by_workload=by_workload or {})


_TEMPLATES: dict[str, HistoryBuilder] = {}


def shared_template(base: Path) -> HistoryBuilder:
    """One built history per test session (keyed by pytest's base temp dir), shared by every test folder."""
    key = str(base)
    if key not in _TEMPLATES:
        _TEMPLATES[key] = build_history(base / "history-template")
    return _TEMPLATES[key]


def copy_history(template: HistoryBuilder, root: Path) -> HistoryBuilder:
    """A private copy of a built history (building one costs seconds on a loaded machine)."""
    shutil.copytree(template.root, root, dirs_exist_ok=True)
    return HistoryBuilder(root)


def build_history(root: Path) -> HistoryBuilder:
    """A complete, finished study with its ledger. Returns the builder (``run_dir``, ``store``, ``fp``)."""
    h = HistoryBuilder(root)
    ledger = h.store.ledger
    clamp = Adjustment("max-running-requests", 4, 2, "max_running_requests=2", "mamba slots")
    base_ids = [h.boot(BASELINE, Phase.BASELINE, Arm.INCUMBENT, BootOutcome.MEASURED,
                       values=[142.0 + i, 162.6 - i, 161.0 + i, 163.2],
                       report=boot_report(1, 134016, adjustments=(clamp,)),
                       probes=(ProbeResult("max-context", ProbeStatus.PASSED, min_free_bytes=690 * MiB),)).boot_id
                for i in range(3)]
    decisions = []

    hicache = BASELINE.merged(flags={"enable-hierarchical-cache": True}, label="hicache")
    crash = Failure(FailureKind.TECHNIQUE_CRASH, f"{CRASH} {XSS}", "drop --enable-hierarchical-cache",
                    evidence=(f"Traceback: {CRASH}", f"log said {XSS}"), phase="serve")
    b = h.boot(hicache, Phase.SCREENING, Arm.CANDIDATE, BootOutcome.DIED, failure=crash, technique="hicache",
               log_lines=(CRASH, XSS), min_free_mib=None)
    decisions.append(h.decide(Phase.SCREENING, "hicache", {"enable-hierarchical-cache": True}, failure=crash,
                              candidate=[b.boot_id]))

    mixed = BASELINE.merged(flags={"enable-mixed-chunk": True}, label="mixed-chunk")
    ignored = Adjustment("enable-mixed-chunk", True, False, "server_args shows enable_mixed_chunk=False")
    b = h.boot(mixed, Phase.SCREENING, Arm.CANDIDATE, BootOutcome.READY, technique="mixed-chunk",
               report=boot_report(1, 134016, adjustments=(ignored,)))
    decisions.append(h.decide(Phase.SCREENING, "mixed-chunk", {"enable-mixed-chunk": True}, ignored=(ignored,),
                              candidate=[b.boot_id]))

    triton = BASELINE.merged(flags={"attention-backend": "triton"}, label="triton")
    cand = [h.boot(triton, Phase.SCREENING, Arm.CANDIDATE, BootOutcome.MEASURED, values=[90.0, 101.0, 99.0],
                   report=boot_report(1, 134016), technique="triton").boot_id for _ in range(2)]
    decisions.append(h.decide(Phase.SCREENING, "attention-backend triton", {"attention-backend": "triton"},
                              verdict=verdict(Decision.REJECT, 0.72, 0.64, 0.81, 2,
                                              by_workload={"short prompts": 1.11, "50K": 0.37}),
                              incumbent=base_ids[:2], candidate=cand))

    qk = BASELINE.merged(flags={"enable-fused-qk-norm-rope": True}, label="fused-qk")
    cand = [h.boot(qk, Phase.SCREENING, Arm.CANDIDATE, BootOutcome.MEASURED, values=[150.0, 163.0, 164.5],
                   report=boot_report(1, 134016), technique="fused-qk").boot_id for _ in range(6)]
    decisions.append(h.decide(Phase.SCREENING, "fused-qk-norm-rope", {"enable-fused-qk-norm-rope": True},
                              verdict=verdict(Decision.INCONCLUSIVE, 1.012, 0.96, 1.07, 6), incumbent=base_ids,
                              candidate=cand))

    study = h.store.create_or_load_study(f"{STUDY}-search", ["maximize"],
                                         optuna.samplers.TPESampler(seed=1))
    for slots, outcome in ((2, BootOutcome.MEASURED), (4, BootOutcome.PROBE_FAILED)):
        trial = h.store.ask(study)
        trial.suggest_int("max-running-requests", 1, 4)
        cand_c = BASELINE.merged(flags={"max-running-requests": slots, "max-mamba-cache-size": slots * 8},
                                 label=f"slots-{slots}")
        if outcome is BootOutcome.MEASURED:
            b = h.boot(cand_c, Phase.SEARCH, Arm.CANDIDATE, outcome, values=[150.0, 171.0, 172.5, 170.0],
                       report=boot_report(slots, 100480), trial=trial.number, min_free_mib=610)
            h.store.record_trial_result(study, trial, values=[b.boot_throughput() or 0.0], boot_ids=[b.boot_id])
        else:
            oom = Failure(FailureKind.OOM_UNDER_LOAD, "Triton Error [CUDA]: out of memory", "lower the slots",
                          evidence=("Triton Error [CUDA]: out of memory",), phase="serve")
            probe = ProbeResult("burst", ProbeStatus.FAILED, failure=oom, min_free_bytes=12 * MiB)
            b = h.boot(cand_c, Phase.SEARCH, Arm.CANDIDATE, outcome, failure=oom, report=boot_report(slots, 33440),
                       trial=trial.number, min_free_mib=12, probes=(probe,))
            h.store.record_trial_result(study, trial, values=None, failure=oom, boot_ids=[b.boot_id])

    page = BASELINE.merged(flags={"page-size": 32}, label="page-32")
    cand = [h.boot(page, Phase.SCREENING, Arm.CANDIDATE, BootOutcome.MEASURED, values=[150.0, 170.0, 171.0],
                   report=boot_report(1, 134016), technique="page-32").boot_id for _ in range(3)]
    decisions.append(h.decide(Phase.SCREENING, "page-size 32", {"page-size": 32},
                              verdict=verdict(Decision.KEEP, 1.052, 1.02, 1.09, 3), incumbent=base_ids,
                              candidate=cand))

    win = [h.boot(WINNER, Phase.CONFIRMATION, Arm.CANDIDATE, BootOutcome.MEASURED, values=[160.0, 180.1, 179.5],
                  report=boot_report(2, 100480, adjustments=(clamp,)), min_free_mib=640).boot_id for _ in range(3)]
    base2 = [h.boot(BASELINE, Phase.CONFIRMATION, Arm.INCUMBENT, BootOutcome.MEASURED, values=[140.0, 161.0, 162.0],
                    report=boot_report(1, 134016)).boot_id for _ in range(3)]
    decisions.append(h.decide(Phase.CONFIRMATION, "winner vs baseline", dict(WINNER.flags),
                              verdict=verdict(Decision.KEEP, 1.109, 1.06, 1.16, 3), incumbent=base2, candidate=win))

    for d in decisions:
        if d.phase is not Phase.CONFIRMATION:
            ledger.append(LedgerEntry.from_decision(d, h.fp, run_dir=h.run_dir))

    h.store.write_study(StudyRecord(
        name=STUDY, fingerprint=h.fp, started_at=T0, updated_at=h.clock, baseline=BASELINE, incumbent=WINNER,
        budget_s=8 * 3600.0, status=StudyStatus.FINISHED,
        phases=(PhaseSpan("baseline", T0, T0 + 720, 3600, 3), PhaseSpan("screening", T0 + 720, T0 + 3120, 10800, 13),
                PhaseSpan("search", T0 + 3120, T0 + 3600, 10800, 2), PhaseSpan("confirmation", T0 + 3600, h.clock,
                                                                             3600, 6)),
        noise=NoiseRecord(sigma_boot=0.031, sigma_run=0.012, warmup_bias=-0.127, boots=3, passes_per_boot=4.0,
                          mde=1.06),
        traffic="prod.parquet (Mooncake conversation, 1h window)", context_target=131072, image=h.fp.image_digest))
    return h
