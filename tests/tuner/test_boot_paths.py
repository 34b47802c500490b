"""The virtual and the HTTP boot paths are one: the same candidates booted through ``CandidateBooter`` on the
virtual runtime (``VirtualSGLang`` + ``VirtualLoad``) and on the HTTP-simulated server (``SimulatedSGLang`` +
``HttpLoad``) give the same boot records — outcome, the BootReport's pool, slots and context, each probe's name and
status, the failure kind. Only the numbers that come from noise may differ. The profile is a vision model on the
tiny card, so a probed boot runs every probe: long context, long context beside long generations, the maximum-size
image, the quality gate."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.history.records import Arm, BootOutcome, BootRecord, Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.probes.protocol import ProbeBudget, ProbeStatus
from elsa_tune.probes.quality import QualityGate, QualitySettings, knowledge_file
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.protocol import Runtime
from elsa_tune.runtime.sim.runtime import SIM_TIMEOUTS, SimulatedSGLang
from elsa_tune.runtime.sim.virtual import VirtualSGLang
from elsa_tune.search_spaces.candidate import Candidate, FlagValue
from elsa_tune.traffic.prompts import PromptSynth
from elsa_tune.traffic.workload import synthetic
from elsa_tune.tuner.flow.booter import BootContext, BootPlan, CandidateBooter
from elsa_tune.tuner.flow.load import ServerLoad
from elsa_tune.tuner.flow.virtual import VirtualLoad

PROFILE = Path(__file__).resolve().parents[1] / "probes" / "profiles" / "probe-tiny.yaml"
BASE: dict[str, FlagValue] = {"mem-fraction-static": 0.8, "max-running-requests": 4, "max-mamba-cache-size": 24}
CANDIDATES: tuple[tuple[str, dict[str, FlagValue]], ...] = (
    ("baseline", BASE),                                                   # every probe passes, then measured
    ("short-of-headroom", {**BASE, "mem-fraction-static": 0.88}),        # text survives; the image kills it
    ("boot-crash", {**BASE, "mem-fraction-static": 0.99}),               # never ready
    ("ngram", {**BASE, "speculative-algorithm": "NGRAM"}),               # dies under load
)
BUDGET = ProbeBudget(deadline_s=90.0, request_timeout_s=45.0, hang_s=5.0, headroom_floor_bytes=1 << 20)
GATE = QualityGate(QualitySettings(greedy_max_tokens=32, tool_requests=4, cache_words=1200))


def _shape(record: BootRecord) -> dict[str, object]:
    """What the two paths must agree on; what comes from noise (throughput, seconds) is left out."""
    report = record.report
    return {"outcome": record.outcome,
            "report": (report.max_total_num_tokens, report.max_running_requests, report.context_len)
            if report is not None else None,
            "probes": [(p.name, p.status) for p in record.probes],
            "failure": record.failure.kind if record.failure is not None else None,
            "measured": len(record.measurements)}


def _boot_all(root: Path, runtime: Runtime, load: ServerLoad | None) -> dict[str, dict[str, object]]:
    store = StudyStore(root / "run", name="paths", heartbeat_interval=None)
    ctx = BootContext(runtime=runtime, gpu=None, store=store, study="paths",
                      fingerprint=Fingerprint.build(runtime="paths", runtime_version="0.5.23"),
                      workload=synthetic(6, 300, 24, 2, block_size=128, tag="paths"), burst=None,
                      prompts=PromptSynth(128), context_target=2000, probe_budget=BUDGET, quality=GATE, vision=True)
    booter = CandidateBooter(ctx, load=load)
    shapes = {}
    for label, flags in CANDIDATES:
        plan = BootPlan(tag=f"screening:{label}:probe", candidate=Candidate(flags, label=label),
                        phase=Phase.SCREENING, arm=Arm.CANDIDATE, probes=True)
        shapes[label] = _shape(booter.boot(plan).record)
    return shapes


def test_the_virtual_and_the_http_boot_paths_record_the_same_boots(tmp_path: Path) -> None:
    virtual = VirtualSGLang(PROFILE)
    on_virtual = _boot_all(tmp_path / "virtual", virtual, VirtualLoad(virtual, hang_s=BUDGET.hang_s))
    http = SimulatedSGLang(PROFILE, card_dir=tmp_path / "card", seed=3, speedup=20.0, knowledge=knowledge_file(),
                           timeouts=replace(SIM_TIMEOUTS, boot_s=60.0, stop_s=10.0, memory_release_s=15.0))
    on_http = _boot_all(tmp_path / "http", http, None)
    assert on_virtual == on_http, (on_virtual, on_http)

    # and what they agree on is what each candidate is
    names = ["long_context", "long_context_concurrent", "vision", "quality"]
    assert on_virtual["baseline"]["outcome"] is BootOutcome.MEASURED
    assert on_virtual["baseline"]["probes"] == [(n, ProbeStatus.PASSED) for n in names]
    short = on_virtual["short-of-headroom"]
    assert short["outcome"] is BootOutcome.PROBE_FAILED and short["failure"] is FailureKind.OOM_UNDER_LOAD
    assert short["probes"] == [("long_context", ProbeStatus.PASSED), ("long_context_concurrent", ProbeStatus.PASSED),
                               ("vision", ProbeStatus.FAILED)]
    assert on_virtual["boot-crash"]["outcome"] is BootOutcome.BOOT_FAILED
    ngram = on_virtual["ngram"]
    assert ngram["outcome"] is BootOutcome.PROBE_FAILED and ngram["failure"] is FailureKind.OOM_UNDER_LOAD
