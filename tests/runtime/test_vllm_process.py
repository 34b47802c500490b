"""``ServerProcess`` with the vLLM family: readiness is ``/health`` alone (vLLM 0.33 prints no ready line), the
boot report joins the log with ``vllm:cache_config_info`` and ``/v1/models``, and a failed boot is classified.

The server is ``fake_vllm.py``: vLLM's log lines and endpoints, scripted.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from elsa_tune.errors import BootFailed
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.process import ServerProcess
from elsa_tune.runtime.protocol import RuntimeTimeouts
from elsa_tune.runtime.vllm.family import VLLM
from elsa_tune.search_spaces.candidate import Candidate

FAKE = Path(__file__).with_name("fake_vllm.py")


def runtime(scenario: str, warmup_s: float = 1.5) -> ServerProcess:
    return ServerProcess(VLLM, (sys.executable, str(FAKE), "serve"), None,
                         timeouts=RuntimeTimeouts(boot_s=30.0, stop_s=2.0, memory_release_s=5.0, health_s=2.0),
                         extra_env={"FAKE_VLLM_SCENARIO": scenario, "FAKE_VLLM_WARMUP_S": str(warmup_s)})


def test_ready_only_once_health_answers_and_the_report_joins_log_and_metrics(tmp_path: Path) -> None:
    rt = runtime("ok", warmup_s=1.5)
    started = time.monotonic()
    server = rt.start(Candidate(flags={"model": "/models/m", "max-num-seqs": 24, "max-model-len": 4096}), tmp_path)
    try:
        assert time.monotonic() - started >= 1.5          # /health answered 503 until the engine was up
        assert rt.check(server).ok
        report = server.report
        assert report.max_running_requests == 24                                          # non-default args
        assert report.max_total_num_tokens == 98_304 and report.max_concurrency == 24.0   # vllm:cache_config_info
        assert report.context_len == 4096                                                # /v1/models
        launched = (tmp_path / "launch.json").read_text()
        assert '"serve",\n    "/models/m"' in launched
    finally:
        rt.stop(server)


def test_a_failed_boot_is_classified_from_the_log(tmp_path: Path) -> None:
    with pytest.raises(BootFailed) as caught:
        runtime("no_room").start(Candidate(flags={"model": "/models/m", "max-model-len": 65536}), tmp_path)
    failure = caught.value.failure
    assert failure.kind is FailureKind.NO_ROOM_FOR_KV and "--max-model-len 1,024" in failure.remedy
