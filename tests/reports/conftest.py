"""The reports tests render the realistic history that ``tests/history/elsa_history_factory.py`` writes."""

from __future__ import annotations

import pytest
from elsa_history_factory import HistoryBuilder, shared_template


@pytest.fixture(scope="session")
def history_template(tmp_path_factory: pytest.TempPathFactory) -> HistoryBuilder:
    return shared_template(tmp_path_factory.getbasetemp())
