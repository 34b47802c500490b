"""Every candidate the shipped spaces can generate is accepted by SGLang's own argument parser.

Runs only with ``ELSA_SGLANG_PYTHON`` pointing at a python with sglang installed (e.g.
``/opt/sglang-venv/bin/python``). All candidates go through one subprocess running
``sglang_argv_check.py`` (parse with ``ServerArgs.add_cli_args`` + ``prepare_server_args``, then a
field-by-field comparison of what each flag set).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from elsa_tune.runtime.family import FamilyName
from elsa_tune.search_spaces import Candidate, RuleViolation, list_shipped_spaces, load_space
from elsa_tune.search_spaces.space import SearchSpace

pytestmark = pytest.mark.sglang

CHECKER = Path(__file__).with_name("sglang_argv_check.py")
GRID_LIMIT = 150
SAMPLES = 40


def every_candidate(space: SearchSpace) -> list[Candidate]:
    """Baseline, each screened technique, each parameter at its extremes, a grid and a seeded sample."""
    found = [space.baseline()]
    found += [space.candidate(techniques=[t.name]) for t in space.techniques if t.screen]
    for p in space.parameters:
        for value in p.grid(2):
            try:
                found.append(space.candidate({p.name: value}))
            except RuleViolation:
                continue
    found += list(space.enumerate_grid(3, limit=GRID_LIMIT))
    found += space.sample(random.Random(space.name), SAMPLES)
    return list({c.key(): c for c in found}.values())


@pytest.fixture(scope="module")
def sglang_python() -> str:
    python = os.environ.get("ELSA_SGLANG_PYTHON")
    if not python:
        pytest.skip("set ELSA_SGLANG_PYTHON to a python with sglang==0.5.23 installed")
    return python


def test_every_shipped_candidate_parses(sglang_python: str, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    items = []
    for name in list_shipped_spaces():
        space = load_space(name).with_model(str(model))
        if space.runtime.family is not FamilyName.SGLANG:
            continue
        items += [{"label": f"{name}:{c.label}", "argv": c.argv()} for c in every_candidate(space)]
    assert len(items) > 300
    done = subprocess.run([sglang_python, str(CHECKER)], input=json.dumps(items), capture_output=True, text=True,
                          timeout=900, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["sglang"] == "0.5.23"
    assert report["checked"] == len(items)
    assert report["failures"] == [], json.dumps(report["failures"][:10], indent=1)


def test_checker_catches_a_bad_flag(sglang_python: str, tmp_path: Path) -> None:
    items = [{"label": "bad", "argv": ["--model-path", "/m", "--cuda-graph-max-bs", "8"]},
             {"label": "choice", "argv": ["--model-path", "/m", "--kv-cache-dtype", "int3"]},
             {"label": "good", "argv": ["--model-path", "/m", "--page-size", "32"]}]
    done = subprocess.run([sglang_python, str(CHECKER)], input=json.dumps(items), capture_output=True, text=True,
                          timeout=300, check=True, cwd=tmp_path)
    failures = {f["label"]: f["problem"] for f in json.loads(done.stdout)["failures"]}
    assert set(failures) == {"bad", "choice"}
    assert "argparse exit 2" in failures["bad"]
