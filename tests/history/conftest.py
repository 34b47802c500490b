"""A realistic history is built once per session and copied for each test that needs its own."""

from __future__ import annotations

from pathlib import Path

import pytest
from elsa_history_factory import HistoryBuilder, copy_history, shared_template


@pytest.fixture(scope="session")
def history_template(tmp_path_factory: pytest.TempPathFactory) -> HistoryBuilder:
    return shared_template(tmp_path_factory.getbasetemp())


@pytest.fixture
def history(history_template: HistoryBuilder, tmp_path: Path) -> HistoryBuilder:
    return copy_history(history_template, tmp_path / "copy")
