"""Fixtures of the traffic tests: Prometheus servers holding backfilled SGLang and llama-server series, shared."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from llamacpp_backfill import LlamaTruth, generate_llamacpp
from prometheus_backfill import PROMETHEUS, PROMTOOL, Truth, generate, running_prometheus


@pytest.fixture(scope="session")
def one_day(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Truth]]:
    """(base URL, ground truth) of a real Prometheus holding one backfilled day; skips without Prometheus."""
    import shutil

    if not (shutil.which(PROMETHEUS) and shutil.which(PROMTOOL)):
        pytest.skip("Debian's prometheus package is not installed")
    work = tmp_path_factory.mktemp("prom-day")
    truth = generate(work / "series.om", days=1, end=time.time() - 3600)
    with running_prometheus(work / "series.om", work) as url:
        yield url, truth


@pytest.fixture(scope="session")
def llamacpp_hours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LlamaTruth]]:
    """(base URL, ground truth) of a real Prometheus holding six backfilled hours of llama-server series."""
    import shutil

    if not (shutil.which(PROMETHEUS) and shutil.which(PROMTOOL)):
        pytest.skip("Debian's prometheus package is not installed")
    work = tmp_path_factory.mktemp("prom-llamacpp")
    truth = generate_llamacpp(work / "series.om", hours=6, end=time.time() - 3600)
    with running_prometheus(work / "series.om", work) as url:
        yield url, truth
