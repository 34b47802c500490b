"""A realistic history is built once per session and copied for each test that needs its own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # the factory is imported by name, whatever pytest's import mode
    sys.path.insert(0, HERE)

from elsa_history_factory import HistoryBuilder, copy_history, shared_template  # noqa: E402


@pytest.fixture(scope="session")
def history_template(tmp_path_factory: pytest.TempPathFactory) -> HistoryBuilder:
    return shared_template(tmp_path_factory.getbasetemp())


@pytest.fixture
def history(history_template: HistoryBuilder, tmp_path: Path) -> HistoryBuilder:
    return copy_history(history_template, tmp_path / "copy")
