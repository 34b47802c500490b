"""The ``vllm`` tier: vLLM 0.33.0's own parser and engine config, in the environment ``ELSA_VLLM_PYTHON`` names.

The model is a folder holding only ``config.json`` (a Qwen2 of 14 heads, 2 KV heads, 32,768 positions): vLLM
builds its engine config from it offline and reads no weights.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from elsa_tune.runtime.flags import harvest
from elsa_tune.runtime.vllm.family import VLLM
from elsa_tune.runtime.vllm.flags import help_launch, parse_help, rejected_by_vllm

pytestmark = pytest.mark.vllm
HELP = Path(__file__).parent / "data" / "vllm-0.33.0-help.txt"
QWEN2_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_attention_heads": 14, "num_key_value_heads": 2, "num_hidden_layers": 24, "max_position_embeddings": 32768,
    "vocab_size": 151936, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "torch_dtype": "bfloat16",
    "tie_word_embeddings": True, "hidden_act": "silu", "sliding_window": 32768, "use_sliding_window": False,
    "max_window_layers": 21,
}


@pytest.fixture(scope="module")
def python() -> str:
    named = os.environ.get("ELSA_VLLM_PYTHON")
    if not named:
        pytest.skip("set ELSA_VLLM_PYTHON to a python with vllm==0.33.0 installed")
    return os.path.expanduser(named)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("qwen2-config")
    (folder / "config.json").write_text(json.dumps(QWEN2_CONFIG))
    return str(folder)


def test_the_installed_vllm_is_0_33_0(python: str) -> None:
    assert VLLM.installed_version((python, "-m", "vllm.entrypoints.cli.main", "serve")) == "0.33.0"


def test_the_live_help_is_the_saved_help(python: str) -> None:
    live = harvest(help_launch(python)[:-1], timeout_s=300, parse=VLLM.parse_help, help_flag=VLLM.help_flag,
                   env={**os.environ, **VLLM.help_env})
    saved = parse_help(HELP.read_text())
    assert live.names == saved.names and dict(live.aliases) == dict(saved.aliases)


def test_the_checker_accepts_good_flags_and_refuses_each_trap(python: str, model: str) -> None:
    argvs = {
        "baseline": [model],
        "tuned": [model, "--max-num-seqs", "64", "--max-num-batched-tokens", "4096", "--gpu-memory-utilization", "0.85",
                  "--kv-cache-dtype", "fp8", "--enable-prefix-caching", "--max-model-len", "16384", "--block-size",
                  "32"],
        "kv-cache-dtype fp7": [model, "--kv-cache-dtype", "fp7"],
        "gpu-memory-utilization 1.5": [model, "--gpu-memory-utilization", "1.5"],
        "abbreviated --max-num-seq": [model, "--max-num-seq", "8"],
        "max-model-len above the model": [model, "--max-model-len", "100000"],
        "budget below max-model-len": [model, "--max-num-batched-tokens", "512", "--disable-chunked-prefill",
                                       "--max-model-len", "4096"],
        "tensor parallel 3 of 14 heads": [model, "--tensor-parallel-size", "3"],
        "not an int": [model, "--max-num-seqs", "x"],
        "unknown flag": [model, "--max-num-seqz", "8"],
    }
    names = list(argvs)
    refused = {names[i]: why for i, why in rejected_by_vllm(python, list(argvs.values()))}
    assert set(refused) == set(names) - {"baseline", "tuned"}, refused
    assert "kv_cache_dtype" in refused["kv-cache-dtype fp7"] or "fp7" in refused["kv-cache-dtype fp7"]
    assert "gpu_memory_utilization" in refused["gpu-memory-utilization 1.5"]
    assert "--max-num-seqs" in refused["abbreviated --max-num-seq"] and "abbreviation" in refused[
        "abbreviated --max-num-seq"]
    assert "max_model_len" in refused["max-model-len above the model"]
    assert "max_num_batched_tokens" in refused["budget below max-model-len"]
    assert "divisible" in refused["tensor parallel 3 of 14 heads"]
    assert "invalid int value" in refused["not an int"]


def test_vllm_serve_refuses_an_unknown_flag_with_exit_2(python: str, model: str) -> None:
    done = subprocess.run([python, "-m", "vllm.entrypoints.cli.main", "serve", model, "--max-num-seqz", "8"],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, **VLLM.help_env, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2
    failure = VLLM.classify(done.stdout + done.stderr)
    assert failure.kind.value == "bad_flag" and "--max-num-seqz" in failure.summary


SPACE = """schema_version: 1
name: vllm-tier-space
model:
  path: {model}
  context_target: 4096
runtime:
  family: vllm
  command: [vllm, serve]
parameters:
  max-num-seqs: {{type: int, low: 8, high: 64, baseline: 32}}
  gpu-memory-utilization: {{type: float, low: 0.8, high: 0.95, baseline: 0.9}}
techniques:
  fp8-kv: {{kind: memory, rationale: fp8 KV cache, flags: {{kv-cache-dtype: fp8}}}}
{extra}"""


def test_space_check_runs_every_screened_candidate_through_vllm(python: str, model: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from elsa_tune.tuner.cli import main

    good = tmp_path / "good.yaml"
    good.write_text(SPACE.format(model=model, extra=""))
    assert main(["space", "check", str(good), "--runtime-python", python]) == 0
    assert "vLLM's parser and engine config accept all 2" in capsys.readouterr().out
    trap = tmp_path / "trap.yaml"
    trap.write_text(SPACE.format(model=model, extra="  tp3: {kind: speed, rationale: TP 3 of 14 heads, "
                                                    "flags: {tensor-parallel-size: 3}}\n"))
    assert main(["space", "check", str(trap), "--runtime-python", python]) == 2
    err = capsys.readouterr().err
    assert "tp3" in err and "divisible by tensor parallel size (3)" in err and "remedy:" in err
