"""``SGLangProcess`` driving the real SGLang 0.5.23 launcher (``-m sglang``; no GPU needed: both fail early)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elsa_tune.errors import BootFailed, ConfigError
from elsa_tune.runtime.failure import FailureKind
from elsa_tune.runtime.process import SGLangProcess
from elsa_tune.runtime.protocol import RuntimeTimeouts
from elsa_tune.search_spaces.candidate import Candidate

pytestmark = pytest.mark.sglang


def real_runtime() -> SGLangProcess:
    python = os.environ.get("ELSA_SGLANG_PYTHON")
    if not python:
        pytest.skip("ELSA_SGLANG_PYTHON is not set")
    return SGLangProcess((python, "-m", "sglang.launch_server"), timeouts=RuntimeTimeouts(boot_s=300, stop_s=10))


def test_flag_removed_in_0523_is_a_classified_bad_flag(tmp_path: Path) -> None:
    with pytest.raises(BootFailed) as caught:
        real_runtime().start(Candidate(flags={"model-path": "/models/none", "cuda-graph-max-bs": 16}), tmp_path)
    failure = caught.value.failure
    assert failure.kind is FailureKind.BAD_FLAG and failure.exit_code == 2
    assert "--cuda-graph-max-bs" in failure.summary


def test_bad_model_path_stops_the_study(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        real_runtime().start(Candidate(flags={"model-path": "/nonexistent"}), tmp_path)
    assert "--model-path" in caught.value.remedy
