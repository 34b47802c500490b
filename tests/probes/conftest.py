"""Fixtures of the probe tests: simulated servers (``elsa_probe_sims.py``) and the baseline's quality sample."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from elsa_probe_sims import BUDGET, GATE, SPEC, SimBoots

from elsa_tune.probes.quality import QualitySample


@pytest.fixture
def boots(tmp_path: Path) -> Iterator[SimBoots]:
    sim = SimBoots(tmp_path)
    try:
        yield sim
    finally:
        sim.stop_all()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> QualitySample:
    """The baseline's quality sample (MTP on, no technique), recorded once per test module."""
    sim = SimBoots(tmp_path_factory.mktemp("baseline"))
    try:
        return GATE.sample(sim.start(SPEC), BUDGET)
    finally:
        sim.stop_all()
