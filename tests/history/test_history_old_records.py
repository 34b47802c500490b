"""Records written before the current schemas read back into the typed fields, deciding as they did.

``data/schema3-verdicts.json`` holds verdicts (schema 3: their facts in ``extra``) and a ledger entry as the code
before verdict schema 4 wrote them in a scenario study, beside the category, sentence and retest that code read
from them.
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
        assert verdict.extra.get("order") == extra.get("order")


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
