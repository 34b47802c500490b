"""Real boots of the simulated runtime recorded through the store and rendered: records accept what the
runtime really produces (its BootReport, its classified Failure, its server log)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from elsa_tune.errors import BootFailed
from elsa_tune.history.fingerprint import Fingerprint
from elsa_tune.history.records import Arm, BootOutcome, BootRecord, Covariates, Phase
from elsa_tune.history.store import StudyStore
from elsa_tune.reports.build import write_outputs
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.sim.runtime import SIM_TIMEOUTS, SimulatedSGLang
from elsa_tune.search_spaces.candidate import Candidate

pytestmark = pytest.mark.slow


def test_sim_boots_round_trip_through_the_store(tmp_path: Path) -> None:
    runtime = SimulatedSGLang("tiny-test", card_dir=tmp_path / "card", seed=1, speedup=50.0,
                              timeouts=replace(SIM_TIMEOUTS, boot_s=90.0, stop_s=10.0, memory_release_s=15.0))
    store = StudyStore(tmp_path / "runs" / "sim", name="sim", heartbeat_interval=None)
    state = runtime.gpu.state()
    fp = Fingerprint.build(runtime="sglang-sim", runtime_version="0.5.23", gpu=state)
    candidates = [Candidate(flags={"max-running-requests": 4}, label="baseline"),
                  Candidate(flags={"max-running-requests": 4}, env={"ELSA_SIM_FAULT": "no_room_for_kv"}, label="nokv")]
    written = []
    for candidate in candidates:
        slot = store.new_boot(candidate.label)
        started = time.time()
        try:
            server = runtime.start(candidate, slot.folder)
            report, failure, outcome = server.report, None, BootOutcome.READY
            runtime.stop(server)
        except BootFailed as exc:
            report, failure, outcome = None, exc.failure, BootOutcome.BOOT_FAILED
        record = BootRecord(study="sim", boot_id=slot.boot_id, boot_number=slot.number, phase=Phase.BASELINE,
                            arm=Arm.INCUMBENT, candidate=candidate, fingerprint=fp, started_at=started,
                            ended_at=time.time(), outcome=outcome, report=report, failure=failure,
                            covariates=Covariates.from_gpu_state(state), log_path=slot.log_relpath)
        store.record_boot(record)
        written.append(record)
    history = store.load()
    assert list(history.boots) == written
    ready, failed = history.boots
    assert ready.report is not None and ready.report.max_total_num_tokens and ready.report.server_args
    assert failed.failure is not None and failed.failure.kind is FailureKind.NO_ROOM_FOR_KV
    assert (store.run_dir / failed.log_path).read_text() if failed.log_path else False
    md = write_outputs(store.run_dir, with_plots=False).markdown.read_text()
    assert f"{ready.report.max_total_num_tokens:,}" in md and "no room left for the KV pool" in md
