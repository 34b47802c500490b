from __future__ import annotations

import json
from pathlib import Path

from elsa_history_factory import fingerprint, gpu_state

from elsa_tune.history.fingerprint import Fingerprint, model_config_hash


def test_key_is_stable_across_roundtrip(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"a": 1, "b": [1, 2]}')
    fp = fingerprint(tmp_path)
    again = Fingerprint.from_dict(json.loads(json.dumps(fp.to_dict())))
    assert again == fp
    assert again.key() == fp.key() and len(fp.key()) == 12
    assert fp.gpu_uuid == gpu_state().uuid and fp.power_limit_w == 600.0


def test_config_hash_ignores_formatting_but_not_content(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"b": [1, 2], "a": 1}')
    first = model_config_hash(tmp_path)
    (tmp_path / "config.json").write_text('{\n  "a": 1,\n  "b": [1, 2]\n}\n')
    assert model_config_hash(tmp_path) == first
    (tmp_path / "config.json").write_text('{"a": 2, "b": [1, 2]}')
    assert model_config_hash(tmp_path) != first
    assert model_config_hash(tmp_path / "missing") is None


def test_ledger_match_ignores_card_identity_but_not_driver(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    fp = fingerprint(tmp_path)
    other_card = Fingerprint.from_dict({**fp.to_dict(), "gpu_uuid": "GPU-other", "power_limit_w": 575.0})
    assert other_card.key() != fp.key()
    assert other_card.matches_for_ledger(fp)
    new_driver = fingerprint(tmp_path, driver="625.01")
    assert not new_driver.matches_for_ledger(fp)
    assert fp.differences(new_driver) == ["driver: 620.70 → 625.01"]


def test_retest_condition_and_description_name_the_setup(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    fp = fingerprint(tmp_path)
    assert fp.retest_condition().startswith("retest when sglang ≠ 0.5.23")
    assert "driver ≠ 620.70" in fp.retest_condition()
    assert "RTX 5090" in fp.describe() and "600 W" in fp.describe()
