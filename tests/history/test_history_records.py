from __future__ import annotations

import json
from pathlib import Path

import pytest
from elsa_history_factory import BASELINE, HistoryBuilder, verdict

from elsa_tune.errors import HistoryError
from elsa_tune.history.decision import DecisionRecord, Kept
from elsa_tune.history.reasons import pct, reason_from_failure, reason_from_verdict
from elsa_tune.history.records import Arm, BootOutcome, BootRecord, Phase
from elsa_tune.history.run_dir import RunDir
from elsa_tune.history.verdict import Decision
from elsa_tune.runtime.boot_report import Adjustment
from elsa_tune.runtime.failure import Failure, FailureKind


@pytest.fixture
def history_dir(history_template: HistoryBuilder) -> Path:
    return history_template.run_dir


def test_every_record_round_trips_through_json(history_dir: Path) -> None:
    history = RunDir(history_dir).load()
    assert history.study is not None and history.boots and history.decisions and history.trials
    for boot in history.boots:
        assert BootRecord.from_dict(json.loads(json.dumps(boot.to_dict()))) == boot
    for decision in history.decisions:
        assert DecisionRecord.from_dict(json.loads(json.dumps(decision.to_dict()))) == decision
    assert type(history.study).from_dict(json.loads(json.dumps(history.study.to_dict()))) == history.study


def test_boot_folders_hold_log_and_record(history_dir: Path) -> None:
    history = RunDir(history_dir).load()
    numbers = [b.boot_number for b in history.boots]
    assert numbers == sorted(numbers) == list(range(1, len(numbers) + 1))
    for boot in history.boots:
        assert boot.log_path and (history_dir / boot.log_path).is_file()
        assert boot.boot_id.startswith(f"{boot.boot_number:04d}-")
        assert boot.fingerprint.runtime_version == "0.5.23"
    assert history.incomplete_boots == ()


def test_boot_throughput_discards_warmup_and_never_invents_zero(history_dir: Path) -> None:
    boot = RunDir(history_dir).load().boots[0]
    assert boot.passes()[0] == 142.0
    assert boot.boot_throughput() == pytest.approx((162.6 + 161.0 + 163.2) / 3)
    empty = BootRecord.from_dict({**boot.to_dict(), "measurements": [boot.measurements[0]]})
    assert empty.boot_throughput() is None
    failed = {**boot.measurements[1], "requests_ok": 0}
    assert BootRecord.from_dict({**boot.to_dict(), "measurements": [boot.measurements[0], failed]}
                                ).boot_throughput() is None


def test_decision_kept_and_result_sentences(history_dir: Path) -> None:
    decisions = {d.technique: d for d in RunDir(history_dir).load().decisions}
    assert decisions["hicache"].kept is Kept.NO
    assert decisions["hicache"].result.startswith("crashes: AttributeError: ")
    assert "'HybridLinearKVPool' object has no attribute 'layer_num'" in decisions["hicache"].result
    assert decisions["mixed-chunk"].result == "accepted and silently ignored: server_args shows False"
    assert decisions["attention-backend triton"].result == "+11% at short prompts, −63% at 50K"
    assert decisions["fused-qk-norm-rope"].kept is Kept.INCONCLUSIVE
    assert decisions["fused-qk-norm-rope"].result.startswith("no demonstrated benefit: +1.2% [−4%, +7%] over 12 boots")
    assert decisions["page-size 32"].kept is Kept.YES
    assert decisions["page-size 32"].delta_text() == "--page-size 32"


def test_reason_phrasing() -> None:
    assert pct(0.8) == "−20%" and pct(1.012) == "+1.2%" and pct(None) == "n/a" and pct(1.0) == "0.0%"
    failure = Failure(FailureKind.OOM_UNDER_LOAD, "Triton Error [CUDA]: out of memory", "lower it")
    assert reason_from_failure(failure) == "boots, then OOM under load: Triton Error [CUDA]: out of memory"
    v = verdict(Decision.REJECT, 0.95, 0.92, 0.98, 4)
    assert reason_from_verdict(v) == "slower: −5.0% [−8%, −2%] over 8 boots"
    clamp = DecisionRecord(study="s", number=1, phase=Phase.SEARCH, technique="slots",
                           ignored=(Adjustment("max-running-requests", 4, 2, "max_running_requests=2"),))
    assert clamp.result == "silently clamped: --max-running-requests 4 → 2"
    ngram = DecisionRecord(study="s", number=2, phase=Phase.SCREENING, technique="ngram", failure=failure, attempts=3)
    assert ngram.result == "3 attempts, 3 failures — boots, then OOM under load: Triton Error [CUDA]: out of memory"


def test_unreadable_record_names_the_file(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    slot = run.new_boot("baseline")
    (slot.folder / "boot.json").write_text("{not json")
    with pytest.raises(HistoryError, match=r"0001-baseline/boot\.json"):
        run.load()


def test_boot_numbers_are_never_reused(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    first = run.new_boot("a/b <c>")
    assert first.boot_id == "0001-a-b-c"
    second = run.new_boot("baseline")
    assert second.number == 2 and run.incomplete_boots() == ["0001-a-b-c", "0002-baseline"]
    record = BootRecord(study="s", boot_id=second.boot_id, boot_number=2, phase=Phase.BASELINE, arm=Arm.INCUMBENT,
                        candidate=BASELINE, fingerprint=build_fp(tmp_path), started_at=1.0, ended_at=2.0,
                        outcome=BootOutcome.BOOT_FAILED)
    run.write_boot(record)
    assert run.incomplete_boots() == ["0001-a-b-c"]
    assert run.new_boot("x").number == 3


def build_fp(tmp_path: Path):  # type: ignore[no-untyped-def]
    from elsa_history_factory import fingerprint
    return fingerprint(tmp_path)
