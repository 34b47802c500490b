"""Shared test configuration. Fixtures that belong to one layer live in that layer's folder."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared is not present beside the checkout")
    return SHARED


@pytest.fixture(autouse=True)
def _own_lease_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own server-lease folder: no test reaps (or leaves) leases in the user's own."""
    directory = tmp_path_factory.mktemp("leases")
    monkeypatch.setenv("ELSA_LEASE_DIR", str(directory))
    return directory
