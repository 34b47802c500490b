"""The reports tests render the realistic history that ``tests/history/elsa_history_factory.py`` writes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HISTORY_TESTS = str(Path(__file__).resolve().parent.parent / "history")
if HISTORY_TESTS not in sys.path:
    sys.path.insert(0, HISTORY_TESTS)

from elsa_history_factory import HistoryBuilder, shared_template  # noqa: E402


@pytest.fixture(scope="session")
def history_template(tmp_path_factory: pytest.TempPathFactory) -> HistoryBuilder:
    return shared_template(tmp_path_factory.getbasetemp())
