"""SGLang 0.5.23's own parser reads ``best/server-args.yaml`` as exactly the flags of ``best/launch.sh``.

Runs only with ``ELSA_SGLANG_PYTHON`` pointing at a python with ``sglang==0.5.23`` (see ``.ci/run``). The checker
parses the config and the launch command line with ``prepare_server_args`` and compares every field SGLang's parser
sets.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest
from elsa_history_factory import HistoryBuilder, copy_history

from elsa_tune.reports.build import write_outputs
from elsa_tune.reports.deploy import build_bundle, server_argv
from elsa_tune.reports.model import Report

pytestmark = pytest.mark.sglang

CHECKER = Path(__file__).with_name("sglang_config_check.py")


def _check(python: str, report: Report, folder: Path, model: Path) -> dict[str, object]:
    bundle = build_bundle(report)
    assert bundle is not None
    text = bundle.server_args_yaml.replace("/models/qwen", str(model))
    assert "--config" in text and "label:" not in text and "flags:" not in text
    config = folder / "server-args.yaml"
    config.write_text(text)
    argv = [str(model) if w == "/models/qwen" else w for w in server_argv(report, bundle.candidate)]
    proc = subprocess.run([python, str(CHECKER)], input=json.dumps({"config": str(config), "argv": argv}),
                          capture_output=True, text=True, timeout=300, check=True)
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def test_sglang_reads_server_args_yaml_as_the_launch_flags(history_template: HistoryBuilder,
                                                          tmp_path: Path) -> None:
    python = os.environ.get("ELSA_SGLANG_PYTHON")
    if not python:
        pytest.skip("set ELSA_SGLANG_PYTHON to a python with sglang==0.5.23 installed")
    report = write_outputs(copy_history(history_template, tmp_path).run_dir, with_plots=False).report
    assert report.study is not None
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    drawn = report.study.incumbent.merged(flags={"enable-metrics": True, "mamba-full-memory-ratio": 1.8000227980835264,
                                                 "speculative-algorithm": "EAGLE", "disable-radix-cache": False})
    with_switches = dataclasses.replace(report, study=dataclasses.replace(report.study, incumbent=drawn))
    for name, case in (("winner", report), ("switches", with_switches)):
        folder = tmp_path / name
        folder.mkdir()
        result = _check(python, case, folder, model)
        assert result["sglang"] == "0.5.23"
        assert result["error"] is None, result["error"]
        assert result["differences"] == {} and int(str(result["compared"])) > 300
