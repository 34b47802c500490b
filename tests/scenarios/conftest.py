"""The scenario benchmark's modules (``benchmarks/scenarios/``) are imported by name, as ``run.py`` imports them."""

from __future__ import annotations

import sys
from pathlib import Path

SCENARIOS = str(Path(__file__).resolve().parents[2] / "benchmarks" / "scenarios")
if SCENARIOS not in sys.path:
    sys.path.insert(0, SCENARIOS)
