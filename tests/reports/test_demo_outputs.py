"""The README demo's own outputs, from its study run in virtual time (the same profile, space and traffic; the
demo's eight wall minutes at ``--sim-speedup 40`` are 5 h 20 min of simulated time), so they take seconds.

What an operator reads first: report.md leads with the decision and ``best/launch.sh`` and lists every technique the
study booted; every Optuna study in study.db has trials and metric names; and, in the ``sglang`` tier, SGLang
0.5.23's own parser reads the demo's ``best/server-args.yaml`` as exactly the flags of its launch command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import optuna
import pytest

from elsa_tune.history.run_dir import RunDir
from elsa_tune.reports.build import write_outputs
from elsa_tune.reports.deploy import build_bundle, server_argv

CHECKER = Path(__file__).with_name("sglang_config_check.py")
DEMO = ["--gpu", "sim", "--virtual", "--sim-profile", "rtx5090-qwen3.8-27b-nvfp4", "--space",
        "qwen3.8-27b-nvfp4-rtx5090", "--traffic", "demo", "--budget", "5h20m", "-q"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "demo"
    proc = subprocess.run([sys.executable, "-m", "elsa_tune", *DEMO, "--out", str(out)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_the_demo_report_leads_with_the_decision_and_lists_every_technique_it_booted(demo: Path) -> None:
    md = (demo / "report.md").read_text()
    head = "\n".join(md.splitlines()[:15])
    assert "## Decision" in head and "`best/launch.sh`" in head and "SIMULATED — do not deploy" in head
    history = RunDir(demo).load()
    booted = {b.technique for b in history.boots if b.technique}
    assert booted, "the demo's study screened no technique"
    tried = {line.split(" | ")[0].removeprefix("| ").split(" (`")[0] for line in md.splitlines()
             if line.startswith("| ")}
    # a search trial's boots carry its label ("trial-4"), its decision the words "search trial 4"
    assert {t.replace("trial-", "search trial ") if t.startswith("trial-") and t not in tried else t
            for t in booted} <= tried
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        url = f"sqlite:///{demo / 'study.db'}"
        summaries = optuna.get_all_study_summaries(url)
        assert summaries
        for summary in summaries:
            study = optuna.load_study(study_name=summary.study_name, storage=url)
            assert study.trials and study.metric_names, summary.study_name


@pytest.mark.sglang
def test_sglang_reads_the_demos_server_args_yaml_as_its_launch_flags(demo: Path, tmp_path: Path) -> None:
    python = os.environ.get("ELSA_SGLANG_PYTHON")
    if not python:
        pytest.skip("set ELSA_SGLANG_PYTHON to a python with sglang==0.5.23 installed")
    report = write_outputs(demo, with_plots=False).report
    bundle = build_bundle(report)
    assert bundle is not None
    written = (demo / "best" / "server-args.yaml").read_text()
    assert written == bundle.server_args_yaml           # the file on disk is what the bundle says
    served = next(line.split(":", 1)[1].strip() for line in written.splitlines() if line.startswith("model-path:"))
    model = tmp_path / "model"                          # a local model folder stands in for the checkpoint's id
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    config = tmp_path / "server-args.yaml"
    config.write_text(written.replace(f"model-path: {served}", f"model-path: {model}"))
    argv = [str(model) if w == served else w for w in server_argv(report, bundle.candidate)]
    proc = subprocess.run([python, str(CHECKER)], input=json.dumps({"config": str(config), "argv": argv}),
                          capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(proc.stdout)
    assert result["sglang"] == "0.5.23"
    assert result["error"] is None, result["error"]
    assert result["differences"] == {} and int(str(result["compared"])) > 300
