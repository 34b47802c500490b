"""Records written before the current schemas read back into the typed fields, deciding as they did.

``data/schema3-verdicts.json`` holds verdicts (schema 3: their facts in ``extra``) and a ledger entry as the code
before verdict schema 4 wrote them in a scenario study, beside the category, sentence and retest that code read
from them. ``data/schema5-verdicts-schema2-study.json`` holds verdicts of schema 5 (the A/B run's order and
schedule seed in ``extra``) and a study record of schema 2 (its ``--extend`` extensions in ``extra``) as the code
before verdict schema 6 and study schema 3 wrote them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from elsa_tune.history.ledger import LedgerEntry
from elsa_tune.history.reasons import reason_category, reason_from_verdict
from elsa_tune.history.verdict import SCHEMA_VERSION, Futility, Verdict

DATA = json.loads((Path(__file__).parent / "data" / "schema3-verdicts.json").read_text())


def _old(index: int) -> dict[str, Any]:
    verdict: dict[str, Any] = DATA["verdicts"][index]
    return verdict


def test_an_old_verdict_reads_into_typed_fields_and_decides_as_before() -> None:
    for old, expected in zip(DATA["verdicts"], DATA["expected"], strict=True):
        assert old["schema_version"] == 3
        verdict = Verdict.from_dict(old)
        assert verdict.schema_version == SCHEMA_VERSION
        category = reason_category(verdict)
        assert (category.value if category else None) == expected["category"]
        assert reason_from_verdict(verdict) == expected["sentence"]
        assert len(verdict.outlier_boots) == expected["outlier_boots"]
        extra = old["extra"]
        assert verdict.final is bool(extra.get("final", False))
        assert verdict.quality_failed is bool(extra.get("quality_failed", False))
        assert verdict.failed_guardrail == extra.get("failed_guardrail")
        assert verdict.pending_guardrail == extra.get("pending_guardrail")
        assert verdict.slow_boot_z == extra.get("z")
        assert (verdict.futility.value if verdict.futility else None) == extra.get("futility")
        if "look_blocks" in extra:
            assert verdict.statistics is not None and verdict.statistics.look_blocks == extra["look_blocks"]
            assert verdict.statistics.nominal_p == extra.get("nominal_p")
        if "multiplicity_level" in extra:
            assert verdict.night_control is not None and verdict.night_control.level == extra["multiplicity_level"]
            assert verdict.night_control.held is bool(extra.get("held_by_night_control", False))
        if "stages" in extra:
            assert verdict.stages is not None and verdict.stages.first_p == extra["stages"]["first_p"]
        if "context_target" in extra:
            assert verdict.pool is not None and verdict.pool.context_target == extra["context_target"]
        if "cap_p" in extra:
            assert verdict.at_cap is not None and verdict.at_cap.p == extra["cap_p"]
        # the typed facts leave ``extra``; descriptive detail stays in it
        assert not {"final", "futility", "z", "stages", "nominal_p", "outlier_boots"} & set(verdict.extra)
        assert verdict.order == extra.get("order") and "order" not in verdict.extra


def test_an_old_verdict_written_again_reads_back_the_same() -> None:
    for old in DATA["verdicts"]:
        verdict = Verdict.from_dict(old)
        assert Verdict.from_dict(json.loads(json.dumps(verdict.to_dict()))) == verdict


def test_an_old_ledger_entry_stopped_to_save_boots_is_still_retested() -> None:
    entry = LedgerEntry.from_dict(DATA["ledger_entry"])
    assert entry.verdict is not None and entry.verdict.futility is Futility.BOOT_SAVING
    assert entry.unresolved is DATA["ledger_unresolved"] is True


def test_kinds_and_futility_rules_are_closed_sets() -> None:
    old = _old(0)
    assert Verdict.from_dict({**old, "kind": "memory"}).kind.value == "memory"
    for bad in ({**old, "kind": "latency"}, {**old, "extra": {**old["extra"], "futility": "sometimes"}}):
        try:
            Verdict.from_dict(bad)
        except ValueError:
            continue
        raise AssertionError(f"read a verdict outside the closed sets: {bad['kind']}")


OLD = json.loads((Path(__file__).parent / "data" / "schema1-boot-study.json").read_text())


def test_an_old_boot_record_reads_its_tag_slot_passes_and_reference_into_fields() -> None:
    from elsa_tune.history.records import SCHEMA_VERSION as BOOT_SCHEMA
    from elsa_tune.history.records import BootRecord

    old = OLD["boot"]
    assert old["schema_version"] == 1
    record = BootRecord.from_dict(old)
    assert record.schema_version == BOOT_SCHEMA == 2
    assert record.tag == old["extra"]["tag"] and record.block == old["extra"]["block"]
    assert record.position == old["extra"]["position"]
    assert [dict(p) for p in record.gate_passes] == old["extra"]["passes"]
    assert record.quality_reference == old["extra"]["quality_reference"]
    assert not record.extra            # every key it had became a field (``gate_arm`` repeated ``arm``)
    assert BootRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record


def test_an_old_boot_record_gives_the_gate_the_sample_it_recorded() -> None:
    """A resumed study rebuilds the gate's view of a boot from the record: the passes and quality it stored."""
    from elsa_tune.history.records import BootRecord
    from elsa_tune.tuner.flow.booter import BootPlan, _sample_of

    record = BootRecord.from_dict(OLD["boot"])
    sample = _sample_of(record, BootPlan(tag=str(record.tag), candidate=record.candidate, phase=record.phase))
    assert len(sample.passes) == len(OLD["boot"]["extra"]["passes"]) > 0
    assert sample.quality_passed is True           # it recorded the quality reference


def test_an_old_study_record_reads_its_settings_digest_notes_and_confirmation_into_fields() -> None:
    from elsa_tune.history.study_record import SCHEMA_VERSION as STUDY_SCHEMA
    from elsa_tune.history.study_record import ConfirmationStatus, StudyRecord

    old = OLD["study"]
    assert old["schema_version"] == 1
    study = StudyRecord.from_dict(old)
    assert study.schema_version == STUDY_SCHEMA == 4 and study.extensions == ()
    assert study.confirmation is not None and study.confirmation.status is ConfirmationStatus.CONFIRMED
    assert study.confirmation.detail == old["extra"]["confirmation"]["detail"]
    assert study.settings == old["extra"]["settings"] and study.space_digest == old["extra"]["space_digest"]
    assert list(study.notes) == old["extra"]["notes"] and study.worker is None
    assert set(study.extra) == {"budget", "memory_model", "policy", "reconcile"}   # opaque detail only
    assert StudyRecord.from_dict(json.loads(json.dumps(study.to_dict()))) == study


SCHEMA5 = json.loads((Path(__file__).parent / "data" / "schema5-verdicts-schema2-study.json").read_text())


def test_a_schema_5_verdict_reads_its_order_and_schedule_seed_into_fields() -> None:
    for old in SCHEMA5["verdicts"]:
        assert old["schema_version"] == 5
        verdict = Verdict.from_dict(old)
        assert verdict.schema_version == SCHEMA_VERSION == 6
        assert verdict.order == old["extra"]["order"] and verdict.schedule_seed == old["extra"]["schedule_seed"]
        assert set(verdict.extra) == {"ci_note", "context", "looks"}           # descriptive detail only
        assert verdict.decision.value == old["decision"] and verdict.p_value == old["p_value"]
        assert Verdict.from_dict(json.loads(json.dumps(verdict.to_dict()))) == verdict


def test_a_schema_2_study_record_reads_its_extensions_and_its_budget_clock_into_fields() -> None:
    from elsa_tune.history.study_record import SCHEMA_VERSION as STUDY_SCHEMA
    from elsa_tune.history.study_record import StudyRecord

    old = SCHEMA5["study"]
    assert old["schema_version"] == 2
    study = StudyRecord.from_dict(old)
    assert study.schema_version == STUDY_SCHEMA == 4
    assert study.budget_clock == old["extra"]["budget"]["clock"] == "the simulated system's seconds"
    [extension] = study.extensions
    [recorded] = old["extra"]["extensions"]
    assert extension.from_budget_s == recorded["from_budget_s"] and extension.added_s == recorded["added_s"]
    assert extension.budget_s == recorded["budget_s"] == study.budget_s and extension.at == recorded["at"]
    assert "extensions" not in study.extra
    assert StudyRecord.from_dict(json.loads(json.dumps(study.to_dict()))) == study
