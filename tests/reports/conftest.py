"""The reports tests render the realistic history that ``tests/history/elsa_history_factory.py`` writes."""

from __future__ import annotations

import sys
from pathlib import Path

HISTORY_TESTS = str(Path(__file__).resolve().parent.parent / "history")
if HISTORY_TESTS not in sys.path:
    sys.path.insert(0, HISTORY_TESTS)
