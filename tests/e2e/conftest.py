"""Fixtures of the end-to-end tests (the helpers live in ``elsa_e2e_helpers``, importable in any import mode)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from elsa_e2e_helpers import RunStudy, study_runner, write_small_trace  # noqa: E402


@pytest.fixture(scope="session")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_small_trace(tmp_path_factory.mktemp("traffic") / "small.parquet")


@pytest.fixture()
def run_study(tmp_path: Path) -> RunStudy:
    return study_runner(tmp_path)
