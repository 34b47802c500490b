"""Fixtures of the end-to-end tests (the helpers live in ``elsa_e2e_helpers``, importable in any import mode)."""

from __future__ import annotations

from pathlib import Path

import pytest
from elsa_e2e_helpers import RunStudy, study_runner, write_small_trace


@pytest.fixture(scope="session")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_small_trace(tmp_path_factory.mktemp("traffic") / "small.parquet")


@pytest.fixture()
def run_study(tmp_path: Path) -> RunStudy:
    return study_runner(tmp_path)
