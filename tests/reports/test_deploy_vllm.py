"""``best/`` for a vLLM winner: ``vllm serve MODEL`` in ``launch.sh`` and Compose, a ``--config`` YAML with the model
under ``model:``, vLLM's upstream image; and (the ``vllm`` tier) vLLM 0.33.0's own ``--config`` reads the YAML as
exactly the flags of ``launch.sh`` and builds its engine config from it."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from elsa_history_factory import HistoryBuilder, copy_history

from elsa_tune.reports.deploy import build_bundle, image_of, server_argv
from elsa_tune.reports.model import Report, build_report
from elsa_tune.search_spaces.candidate import Candidate

CHECKER = Path(__file__).with_name("vllm_config_check.py")
MODEL = "/models/qwen2-0.5b"
WINNER = Candidate(flags={"model": MODEL, "max-num-seqs": 48, "max-num-batched-tokens": 4096,
                          "gpu-memory-utilization": 0.8700000000000001, "enable-prefix-caching": True,
                          "kv-cache-dtype": "fp8", "max-model-len": 16384,
                          "speculative-config": '{"method": "ngram", "num_speculative_tokens": 3, '
                                                '"prompt_lookup_max": 4}'},
                   label="vllm winner")


@pytest.fixture(scope="module")
def report(history_template: HistoryBuilder, tmp_path_factory: pytest.TempPathFactory) -> Report:
    base = build_report(copy_history(history_template, tmp_path_factory.mktemp("deploy-vllm")).run_dir)
    assert base.fingerprint is not None and base.study is not None
    fp = dataclasses.replace(base.fingerprint, runtime="vllm", runtime_version="0.33.0", image_digest=None,
                             launch_command=("vllm", "serve"), model_path=MODEL)
    study = dataclasses.replace(base.study, fingerprint=fp, incumbent=WINNER, image=None)
    return dataclasses.replace(base, fingerprint=fp, study=study)


def test_launch_and_compose_serve_the_model_positionally(report: Report) -> None:
    bundle = build_bundle(report)
    assert bundle is not None
    exec_line = bundle.launch_sh.split("\nexec ", 1)[1].replace(" \\\n", " ")
    words = shlex.split(exec_line.replace('"$BIND_HOST"', "HOST").replace('"$@"', ""))
    assert words[:3] == ["vllm", "serve", MODEL] and "--model" not in words
    assert "--gpu-memory-utilization" in words and words[words.index("--gpu-memory-utilization") + 1] == "0.87"
    compose = yaml.safe_load(bundle.compose_yaml)["services"]["vllm"]
    assert compose["image"] == "vllm/vllm-openai:v0.33.0" and compose["entrypoint"] == ["vllm", "serve"]
    assert compose["command"][0] == MODEL and compose["command"][-4:-2] == ["--host", "0.0.0.0"]
    assert image_of(report)[0] == "vllm/vllm-openai:v0.33.0"


def test_the_config_names_the_model_and_says_how_to_use_it(report: Report) -> None:
    bundle = build_bundle(report)
    assert bundle is not None
    config = yaml.safe_load(bundle.server_args_yaml)
    assert config["model"] == MODEL and config["max-num-seqs"] == 48 and config["enable-prefix-caching"] is True
    assert json.loads(config["speculative-config"])["method"] == "ngram"
    assert "# Use: vllm serve --config server-args.yaml" in bundle.server_args_yaml
    assert "vLLM server arguments of the winner" in bundle.server_args_yaml


@pytest.mark.vllm
def test_vllm_reads_server_args_yaml_as_the_launch_flags(report: Report, tmp_path: Path) -> None:
    python = os.environ.get("ELSA_VLLM_PYTHON")
    if not python:
        pytest.skip("set ELSA_VLLM_PYTHON to a python with vllm==0.33.0 installed")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
        "num_attention_heads": 14, "num_key_value_heads": 2, "num_hidden_layers": 24,
        "max_position_embeddings": 32768, "vocab_size": 151936, "torch_dtype": "bfloat16"}))
    bundle = build_bundle(report)
    assert bundle is not None
    config = tmp_path / "server-args.yaml"
    config.write_text(bundle.server_args_yaml.replace(MODEL, str(model)))
    argv = [str(model) if w == MODEL else w for w in server_argv(report, bundle.candidate)]
    proc = subprocess.run([os.path.expanduser(python), str(CHECKER)],
                          input=json.dumps({"config": str(config), "argv": argv}), capture_output=True, text=True,
                          timeout=300, check=True,
                          env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"})
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["vllm"] == "0.33.0"
    assert result["error"] is None, result["error"]
    assert result["differences"] == {} and int(result["compared"]) > 300
