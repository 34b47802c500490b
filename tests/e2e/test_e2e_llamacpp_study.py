"""A whole short study with the real llama.cpp runtime on the CPU: preflight against the binary's own --help, real
boots, probes, measured passes, decisions, report and ``best/``. The binary is the one CI built (``llamacpp`` tier).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elsa_tune.runtime.llamacpp.build import ENV_BINARY, cached_binary
from elsa_tune.runtime.llamacpp.model import ModelKind, write_model

pytestmark = pytest.mark.llamacpp

SPACE = Path(__file__).parent / "data" / "llamacpp-ci.yaml"


def _binary() -> str:
    named = os.environ.get(ENV_BINARY)
    found = named or (str(cached_binary()) if cached_binary() else None)
    if not found or not Path(found).is_file():
        pytest.skip("no llama-server: set ELSA_LLAMA_SERVER or run `elsa-tune llamacpp setup` (.ci/run builds it)")
    return found


@pytest.mark.timeout(900)
def test_short_real_study_on_the_cpu(tmp_path: Path) -> None:
    binary = _binary()
    home = tmp_path / "home"
    models = home / ".cache" / "elsa-tune" / "models"
    models.mkdir(parents=True)
    write_model(ModelKind.TINY, models / "elsa-tiny.gguf")
    write_model(ModelKind.DRAFT, models / "elsa-tiny-draft.gguf")
    env = {**os.environ, "HOME": str(home), ENV_BINARY: binary, "ELSA_LEASE_DIR": str(tmp_path / "leases")}
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "elsa_tune", "--runtime", "llamacpp", "--gpu", "cpu", "--space", str(SPACE),
         "--traffic", "demo-chat", "--budget", "3m", "--pass-seconds", "2", "--baseline-boots", "3",
         "--out", str(out), "--no-live"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    study = json.loads((out / "study.json").read_text())
    assert study["status"] == "finished"
    assert study["fingerprint"]["runtime"] == "llamacpp"
    assert study["fingerprint"]["gpu_uuid"].startswith("host-")
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("boots/*/boot_report.json"))]
    assert len(reports) >= 3
    baseline = reports[0]
    assert baseline["max_running_requests"] == 2
    assert baseline["context_len"] == 4096
    assert baseline["kv_pool_tokens"] == 8192 and baseline["kv_dtype"] == "f16"
    assert baseline["pool_fixed_by_context"] is True
    assert any(b["device"].startswith("CPU") and b["kind"] == "kv" for b in baseline["buffers"])
    launch = (out / "best" / "launch.sh").read_text()
    assert binary in launch and "--model " in launch and "--model-path" not in launch
    assert "CUDA_VISIBLE_DEVICES" not in launch
    report = (out / "report.md").read_text()
    assert "llamacpp" in report
    refused = [line for line in done.stdout.splitlines() + done.stderr.splitlines()
               if "q8-kv-without-fa" in line and "decision" in line]
    if refused:   # screened within the budget: llama.cpp's own refusal is the reason
        assert "refused by the runtime" in refused[0] and "flash attention" in refused[0]
