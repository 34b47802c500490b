"""The simulated vLLM's flag table against vLLM 0.33.0's own parser (tier ``vllm``).

Runs only with ``ELSA_VLLM_PYTHON`` naming a python with vllm==0.33.0 installed (built with
``VLLM_TARGET_DEVICE=cpu`` on a machine without a GPU). Every candidate the shipped vLLM spaces generate is parsed
by the simulator's parser and by ``make_arg_parser(FlexibleArgumentParser())`` in that python, and the two must
agree flag by flag; the simulator's table must be the one vLLM's parser yields today.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from elsa_tune.runtime.family import FamilyName
from elsa_tune.runtime.sim import vllm_flags
from elsa_tune.search_spaces import Candidate, RuleViolation, list_shipped_spaces, load_space
from elsa_tune.search_spaces.space import SearchSpace

pytestmark = pytest.mark.vllm

_CHECK = r'''
import json, sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.entrypoints.common.cli_args import make_arg_parser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
    from vllm.entrypoints.openai.cli_args import make_arg_parser
import vllm
parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
defaults = vars(parser.parse_args([]))
out = {"vllm": vllm.__version__, "parsed": [], "failures": []}
for item in json.load(sys.stdin):
    try:
        ns = vars(parser.parse_args(item["argv"]))
    except SystemExit as exc:
        out["failures"].append({"label": item["label"], "problem": f"argparse exit {exc.code}"})
        continue
    given = {k: v for k, v in ns.items() if v != defaults.get(k)}
    for k, v in list(given.items()):
        if hasattr(v, "__dataclass_fields__"):   # -cc / --compilation-config: vLLM's own config object
            given[k] = {f: getattr(v, f) for f in v.__dataclass_fields__}
    out["parsed"].append({"label": item["label"], "given": json.loads(json.dumps(given, default=str))})
json.dump(out, sys.stdout)
'''


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
    found += list(space.enumerate_grid(3, limit=150))
    found += space.sample(random.Random(space.name), 40)
    return list({c.key(): c for c in found}.values())


@pytest.fixture(scope="module")
def vllm_python() -> str:
    python = os.environ.get("ELSA_VLLM_PYTHON")
    if not python:
        pytest.skip("set ELSA_VLLM_PYTHON to a python with vllm==0.33.0 installed")
    return python


def _run(python: str, items: list[dict[str, object]], tmp_path: Path) -> dict[str, object]:
    done = subprocess.run([python, "-c", _CHECK], input=json.dumps(items), capture_output=True, text=True,
                          timeout=600, check=False, cwd=tmp_path, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_every_shipped_vllm_candidate_parses_alike(vllm_python: str, tmp_path: Path) -> None:
    items: list[dict[str, object]] = []
    ours: dict[str, dict[str, object]] = {}
    for name in list_shipped_spaces():
        space = load_space(name)
        if space.runtime.family is not FamilyName.VLLM:
            continue
        for candidate in every_candidate(space):
            label = f"{name}:{candidate.label}:{candidate.key()}"
            argv = candidate.argv()
            items.append({"label": label, "argv": argv})
            ours[label] = vllm_flags.non_default_args(vllm_flags.given_args(vllm_flags.parser().parse_args(argv)))
    assert len(items) > 50
    report = _run(vllm_python, items, tmp_path)
    assert report["vllm"] == vllm_flags.VLLM_VERSION
    assert report["failures"] == []
    parsed = report["parsed"]
    assert isinstance(parsed, list) and len(parsed) == len(items)
    for entry in parsed:
        theirs = entry["given"]
        mine = json.loads(json.dumps(ours[entry["label"]], default=str))
        assert set(mine) == set(theirs), entry["label"]
        for key, value in mine.items():
            if isinstance(value, dict) and not isinstance(theirs[key], dict):
                raise AssertionError(f"{entry['label']}: --{key} is {theirs[key]!r} in vLLM")
            if isinstance(value, dict):   # a config object: the keys we gave, as vLLM resolved them
                for sub, wanted in value.items():
                    got = str(theirs[key][sub]).rsplit(".", 1)[-1]
                    assert got.upper() == str(wanted).upper(), f"{entry['label']}: {key}.{sub}"
            else:
                assert value == theirs[key], f"{entry['label']}: {key}"


def test_an_unknown_flag_is_refused_by_both(vllm_python: str, tmp_path: Path) -> None:
    argv = ["--model", "m", "--max-num-seq-typo", "4"]
    report = _run(vllm_python, [{"label": "typo", "argv": argv}], tmp_path)
    assert [f["label"] for f in report["failures"]] == ["typo"]   # type: ignore[union-attr,index]
    with pytest.raises(SystemExit) as exc:
        vllm_flags.parser().parse_args(argv)
    assert exc.value.code == 2


def test_the_bundled_table_is_vllms_own(vllm_python: str) -> None:
    harvested = vllm_flags.harvest(vllm_python)
    assert {f.dest: f for f in harvested} == {f.dest: f for f in vllm_flags.vllm_flags()}
