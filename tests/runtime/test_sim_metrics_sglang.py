"""Every metric the simulated server exports is SGLang 0.5.23's: name, type, labels, buckets and documentation.

Tier ``sglang``: the definitions are read from the installed SGLang (``ELSA_SGLANG_PYTHON``) by
``sglang_metrics_dump.py``, which builds SGLang's own collectors; the simulator's come from ``SglangMetrics``
and from a booted simulated server's ``/metrics`` (so a series the simulator renders but does not define
cannot slip through). The meanings the names do not carry are written down, with SGLang's files, in
``runtime/sim/metrics.py`` (``SCHEDULER_GAUGES``); idle ``token_usage`` is tested in ``test_sim_clock.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_sim_server_http import boot, shutdown

from elsa_tune.runtime.sim.metrics import Counter, Histogram, SglangMetrics

pytestmark = pytest.mark.sglang
DUMP = Path(__file__).parent / "sglang_metrics_dump.py"


@pytest.fixture(scope="module")
def sglang_metrics() -> dict[str, dict[str, Any]]:
    python = os.environ.get("ELSA_SGLANG_PYTHON")
    if not python:
        pytest.skip("ELSA_SGLANG_PYTHON names no Python with sglang==0.5.23")
    done = subprocess.run([python, str(DUMP)], capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr[-3000:]
    definitions: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return definitions


def test_the_simulators_metrics_are_sglangs(sglang_metrics: dict[str, dict[str, Any]]) -> None:
    ours = SglangMetrics("m")._metrics
    assert len(ours) > 40
    for metric in ours:
        theirs = sglang_metrics.get(metric.name)
        assert theirs is not None, f"{metric.name} is not an SGLang 0.5.23 metric"
        assert metric.kind == theirs["type"], metric.name
        assert list(metric.labels) == theirs["labels"], metric.name
        assert metric.doc == theirs["doc"], metric.name
        if isinstance(metric, Histogram):
            assert list(metric.buckets) == [float(b) for b in theirs["buckets"]], metric.name
        if isinstance(metric, Counter):
            assert metric.name.endswith("_total")


def test_a_served_boots_metrics_are_all_defined_by_sglang(sglang_metrics: dict[str, dict[str, Any]],
                                                          tmp_path: Path) -> None:
    running = boot(tmp_path, "tiny-test", seed=1, flags=["--enable-metrics", "--sim-noise", "off"])
    try:
        body = {"prompt": list(range(700)), "max_tokens": 40, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", running.base_url + "/v1/completions", json=body, timeout=60) as resp:
            assert resp.status_code == 200
            for _ in resp.iter_raw():
                pass
        text = httpx.get(running.base_url + "/metrics", timeout=10).text
        info = httpx.get(running.base_url + "/server_info", timeout=10).json()
    finally:
        shutdown(running)
    exported = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert "sglang:token_usage" in exported and "sglang:time_to_first_token_seconds" in exported
    for name, kind in exported.items():   # counters are named with their _total, as in the dump
        assert name in sglang_metrics, name
        assert sglang_metrics[name]["type"] == kind, name
    for line in re.findall(r"^(sglang:\w+?)(?:_bucket|_sum|_count)?\{([^}]*)\} ", text, re.M):
        name, labels = line
        family = name if name in sglang_metrics else re.sub(r"_(bucket|sum|count)$", "", name)
        keys = [pair.split("=")[0] for pair in labels.split(",") if pair and not pair.startswith("le=")]
        assert sorted(keys) == sorted(sglang_metrics[family]["labels"]), (name, keys)
    assert info["simulated"]["clock"]["speedup"] > 0
