"""One boot through the real simulated runtime: probes, quality reference, passes, the record, and reuse on resume."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.history.records import Arm, BootOutcome, Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.probes.protocol import ProbeBudget
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.sim.runtime import SIM_TIMEOUTS, SimulatedSGLang
from elsa_tune.search_spaces.candidate import Candidate
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.traffic.workload import synthetic
from elsa_tune.tuner.flow.booter import ABSampler, BootContext, BootPlan, CandidateBooter

BASE = {"mem-fraction-static": 0.6, "max-running-requests": 2, "max-mamba-cache-size": 24}


@pytest.fixture()
def ctx(tmp_path: Path) -> BootContext:
    runtime = SimulatedSGLang("tiny-test", card_dir=tmp_path / "card", seed=3, speedup=30.0,
                              timeouts=replace(SIM_TIMEOUTS, boot_s=60.0))
    workload = synthetic(6, 300, 24, 2, block_size=128, tag="sampler-test")
    store = StudyStore(tmp_path / "run", name="t", heartbeat_interval=None)
    fp = Fingerprint.build(runtime="sglang-sim", runtime_version="0.5.23", gpu=runtime.gpu.state())
    return BootContext(runtime=runtime, gpu=runtime.gpu, store=store, study="t", fingerprint=fp, workload=workload,
                       burst=None, prompts=PromptSynth(128), context_target=800,
                       probe_budget=ProbeBudget(deadline_s=60, request_timeout_s=30, hang_s=15,
                                                headroom_floor_bytes=1 << 20))


def test_a_first_boot_is_probed_measured_recorded_and_reused(ctx: BootContext) -> None:
    booter = CandidateBooter(ctx)
    plan = BootPlan(tag="baseline:0", candidate=Candidate(BASE, label="baseline"), phase=Phase.BASELINE, probes=True)
    result = booter.boot(plan)
    record = result.record
    assert record.outcome is BootOutcome.MEASURED and record.failure is None
    assert record.report is not None and record.report.max_total_num_tokens
    assert [p.name for p in record.probes] == ["long_context", "long_context_concurrent", "quality"]
    assert record.tag == "baseline:0" and record.quality_reference is not None
    assert len(result.sample.passes) == 3 and result.sample.passes[0].warmup
    assert record.throughput_tok_s and record.throughput_tok_s > 0
    assert (ctx.store.run_dir / (record.log_path or "x")).exists()
    assert [b.boot_id for b in ctx.store.load().boots] == [record.boot_id]

    again = CandidateBooter(ctx)          # a resumed study: the same tag is read back, not booted
    reused = again.boot(plan)
    assert reused.reused and reused.record.boot_id == record.boot_id
    assert reused.sample.passes == result.sample.passes
    assert len(ctx.store.load().boots) == 1


def test_a_crashing_candidate_is_a_record_not_an_exception(ctx: BootContext) -> None:
    booter = CandidateBooter(ctx)
    plan = BootPlan(tag="screening:hicache:probe1", phase=Phase.SCREENING, arm=Arm.CANDIDATE, probes=True,
                    candidate=Candidate({**BASE, "enable-hierarchical-cache": True}, label="hicache"))
    result = booter.boot(plan)
    assert result.record.outcome is BootOutcome.BOOT_FAILED
    assert result.sample.failed is not None and result.sample.failed.kind is FailureKind.TECHNIQUE_CRASH
    assert "HybridLinearKVPool" in result.sample.failed.summary


def test_ab_sampler_tags_boots_by_arm_and_slot(ctx: BootContext) -> None:
    booter = CandidateBooter(ctx)
    sampler = ABSampler(booter, incumbent=Candidate(BASE, label="a"), candidate=Candidate(BASE, label="b"),
                        phase=Phase.SCREENING, tag="screening:x:ab")
    sample = sampler.boot(Arm.CANDIDATE, 0, 1)
    assert sample.arm is Arm.CANDIDATE and sample.failed is None and len(sample.measured) == 2
    assert [r.tag for r in ctx.store.load().boots] == ["screening:x:ab:B0.1"]
    assert sampler.boot_ids[Arm.CANDIDATE] and not sampler.boot_ids[Arm.INCUMBENT]


def test_a_hang_under_load_is_recorded_as_a_hang_not_as_a_host_oom_kill(ctx: BootContext) -> None:
    # seed 004: "--max-mamba-cache-size 32 -> server hangs with no error". The server stays up with /health
    # answering; the probe sees the stall, the booter stops the server itself, and that stop is no crash.
    ctx.probe_budget = replace(ctx.probe_budget, request_timeout_s=10.0, hang_s=2.0, deadline_s=30.0)
    plan = BootPlan(tag="screening:slots:probe1", phase=Phase.SCREENING, arm=Arm.CANDIDATE, probes=True,
                    candidate=Candidate({**BASE, "max-running-requests": 1, "max-mamba-cache-size": 64},
                                        label="slots-64"))
    result = CandidateBooter(ctx).boot(plan)
    record = result.record
    assert record.outcome is BootOutcome.PROBE_FAILED
    assert record.failure is not None and record.failure.kind is FailureKind.HANG
    assert "while the server stayed up" in record.probes[0].detail
    log = (ctx.store.run_dir / (record.log_path or "x")).read_text()
    assert "SIGQUIT" not in log and "Shutting down" in log          # it did not die: we stopped it
