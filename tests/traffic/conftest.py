"""Fixtures of the traffic tests: Prometheus servers holding backfilled SGLang and llama-server series, shared."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from llamacpp_backfill import LlamaTruth, generate_llamacpp
from prometheus_backfill import PROMETHEUS, PROMTOOL, Truth, generate, running_prometheus

T = TypeVar("T")


def _backfilled(factory: pytest.TempPathFactory, name: str, write: Callable[[Path], T]) -> Iterator[tuple[str, T]]:
    """(base URL, ground truth) of a real Prometheus holding what ``write`` wrote; skips without Prometheus."""
    if not (shutil.which(PROMETHEUS) and shutil.which(PROMTOOL)):
        pytest.skip("Debian's prometheus package is not installed")
    work = factory.mktemp(name)
    truth = write(work / "series.om")
    with running_prometheus(work / "series.om", work) as url:
        yield url, truth


@pytest.fixture(scope="session")
def one_day(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Truth]]:
    """One backfilled day of SGLang series."""
    yield from _backfilled(tmp_path_factory, "prom-day", lambda path: generate(path, days=1, end=time.time() - 3600))


@pytest.fixture(scope="session")
def vllm_hours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LlamaTruth]]:
    """Six backfilled hours of vLLM's token series, the cached-token counter under its pre-0.10 name."""
    from elsa_tune.runtime.vllm.family import VLLM

    yield from _backfilled(tmp_path_factory, "prom-vllm", lambda path: generate_llamacpp(
        path, hours=6, end=time.time() - 3600, names=VLLM.metrics, cached_name="vllm:gpu_prefix_cache_hits_total"))


@pytest.fixture(scope="session")
def llamacpp_hours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LlamaTruth]]:
    """Six backfilled hours of llama-server series."""
    yield from _backfilled(tmp_path_factory, "prom-llamacpp",
                           lambda path: generate_llamacpp(path, hours=6, end=time.time() - 3600))
