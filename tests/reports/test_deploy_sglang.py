"""SGLang 0.5.23's own parser reads ``best/server-args.yaml`` as exactly the flags of ``best/launch.sh``.

Runs only with ``ELSA_SGLANG_PYTHON`` pointing at a python with ``sglang==0.5.23`` (see ``.ci/run``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from elsa_history_factory import HistoryBuilder, copy_history

from elsa_tune.reports.build import write_outputs
from elsa_tune.reports.deploy import build_bundle, server_argv

pytestmark = pytest.mark.sglang

CHECKER = Path(__file__).with_name("sglang_config_check.py")


def test_sglang_reads_server_args_yaml_as_the_launch_flags(history_template: HistoryBuilder,
                                                          tmp_path: Path) -> None:
    python = os.environ.get("ELSA_SGLANG_PYTHON")
    if not python:
        pytest.skip("set ELSA_SGLANG_PYTHON to a python with sglang==0.5.23 installed")
    h = copy_history(history_template, tmp_path)
    outputs = write_outputs(h.run_dir, with_plots=False)
    assert outputs.best is not None
    bundle = build_bundle(outputs.report)
    assert bundle is not None
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    config = outputs.best / "server-args.yaml"
    text = config.read_text().replace("/models/qwen", str(model))
    config.write_text(text)
    argv = [str(model) if w == "/models/qwen" else w for w in server_argv(outputs.report, bundle.candidate)]
    proc = subprocess.run([python, str(CHECKER)], input=json.dumps({"config": str(config), "argv": argv}),
                          capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(proc.stdout)
    assert result["sglang"] == "0.5.23"
    assert result["error"] is None, result["error"]
    assert result["differences"] == {}
    assert "--config" in text and "label:" not in text and "flags:" not in text
