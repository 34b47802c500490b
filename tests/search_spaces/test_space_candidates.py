from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from elsa_tune.errors import ConfigError, SpaceError
from elsa_tune.search_spaces import RuleViolation, load_space, parse_space
from elsa_tune.search_spaces.space import SearchSpace

SPACE = """\
name: bundles
model:
  path: /models/m
base:
  flags:
    speculative-algorithm: EAGLE
    speculative-eagle-topk: 1
    page-size: 32
  env:
    SGLANG_A: "1"
parameters:
  speculative-num-steps: {type: int, low: 2, high: 11, baseline: 5}
  max-running-requests: {type: int, low: 1, high: 4, baseline: 1}
  mem-fraction-static: {type: float, low: 0.85, high: 0.97, step: 0.01, baseline: 0.97}
  kv-cache-dtype: {type: categorical, choices: [auto, fp8_e4m3], baseline: fp8_e4m3}
  metrics: {type: bool, flag: enable-metrics, baseline: true}
  finalize: {type: bool, env: SGLANG_FUSED, baseline: false}
derived:
  speculative-num-draft-tokens:
    value: speculative-num-steps + 1
    when: speculative-eagle-topk == 1 and speculative-num-steps is not None
  max-mamba-cache-size: max-running-requests * 8
rules:
  - name: draft-tokens-follow-steps
    rule: speculative-eagle-topk != 1 or speculative-num-draft-tokens == speculative-num-steps + 1
  - name: mamba-slots
    rule: max-mamba-cache-size is None or max-mamba-cache-size >= max-running-requests * 8
    message: too few Mamba slots
  - name: no-mtp-headroom
    rule: speculative-algorithm is not None or mem-fraction-static <= 0.90
techniques:
  triton:
    kind: speed
    rationale: triton attention
    flags: {attention-backend: triton}
  hicache:
    kind: speed
    rationale: host tier
    flags: {enable-hierarchical-cache: true, hicache-size: 24}
    env: {SGLANG_B: "2"}
  flashinfer:
    kind: speed
    rationale: flashinfer attention
    flags: {attention-backend: flashinfer}
  cache-24:
    kind: memory
    rationale: more slots
    flags: {max-mamba-cache-size: 24}
  cache-4:
    kind: memory
    rationale: fewer slots than the rule allows
    flags: {max-mamba-cache-size: 4}
    screen: false
  no-mtp:
    kind: memory
    rationale: no speculative decoding
    flags: {speculative-algorithm: null, speculative-eagle-topk: null, speculative-num-steps: null,
            speculative-num-draft-tokens: null, mem-fraction-static: 0.90}
  chain-9:
    kind: speed
    rationale: deeper chain
    flags: {speculative-num-steps: 9}
    requires: speculative-algorithm is not None
"""


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    return parse_space(SPACE, "bundles.yaml")


def test_baseline_applies_base_parameters_and_derived(space: SearchSpace) -> None:
    b = space.baseline()
    assert b.label == "baseline"
    assert dict(b.flags) == {
        "model-path": "/models/m", "speculative-algorithm": "EAGLE", "speculative-eagle-topk": 1, "page-size": 32,
        "speculative-num-steps": 5, "speculative-num-draft-tokens": 6, "max-running-requests": 1,
        "max-mamba-cache-size": 8, "mem-fraction-static": 0.97, "kv-cache-dtype": "fp8_e4m3",
        "enable-metrics": True}
    assert dict(b.env) == {"SGLANG_A": "1", "SGLANG_FUSED": "0"}
    assert "--enable-metrics" in b.argv()


def test_derived_flags_follow_parameters(space: SearchSpace) -> None:
    c = space.candidate({"speculative-num-steps": 3, "max-running-requests": 4})
    assert c.flags["speculative-num-draft-tokens"] == 4
    assert c.flags["max-mamba-cache-size"] == 32
    assert c.label == "speculative-num-steps=3+max-running-requests=4"


def test_bool_parameters_toggle_switches_and_env(space: SearchSpace) -> None:
    c = space.candidate({"metrics": False, "finalize": True})
    assert "enable-metrics" not in c.flags and "--enable-metrics" not in c.argv()
    assert c.env["SGLANG_FUSED"] == "1"


def test_candidates_are_deterministic(space: SearchSpace) -> None:
    values = {"speculative-num-steps": 7, "kv-cache-dtype": "auto"}
    a = space.candidate(values, ["hicache", "triton"])
    b = space.candidate(dict(reversed(list(values.items()))), ["hicache", "triton"])
    assert a == b and a.key() == b.key() and a.argv() == b.argv()
    again = parse_space(SPACE, "bundles.yaml").candidate(values, ["hicache", "triton"])
    assert again.key() == a.key()
    code = ("from elsa_tune.search_spaces import parse_space; import sys; "
            "print(parse_space(sys.stdin.read(), 'x').candidate({'speculative-num-steps': 7, "
            "'kv-cache-dtype': 'auto'}, ['hicache', 'triton']).key())")
    other = subprocess.run([sys.executable, "-c", code], input=SPACE, capture_output=True, text=True, timeout=60,
                           check=True)
    assert other.stdout.strip() == a.key()


def test_technique_bundles_merge(space: SearchSpace) -> None:
    c = space.candidate(techniques=["triton", "hicache"])
    assert c.flags["attention-backend"] == "triton"
    assert c.flags["enable-hierarchical-cache"] is True and c.flags["hicache-size"] == 24
    assert dict(c.env) == {"SGLANG_A": "1", "SGLANG_B": "2", "SGLANG_FUSED": "0"}
    assert c.label == "triton+hicache"


def test_conflicting_techniques_are_refused(space: SearchSpace) -> None:
    with pytest.raises(ConfigError, match="'triton' and 'flashinfer' set --attention-backend"):
        space.candidate(techniques=["triton", "flashinfer"])


def test_technique_pins_beat_derived_flags(space: SearchSpace) -> None:
    c = space.candidate({"max-running-requests": 2}, ["cache-24"])
    assert c.flags["max-mamba-cache-size"] == 24
    chain = space.candidate(techniques=["chain-9"])
    assert chain.flags["speculative-num-steps"] == 9 and chain.flags["speculative-num-draft-tokens"] == 10


def test_technique_removing_flags_drops_derived_ones(space: SearchSpace) -> None:
    c = space.candidate(techniques=["no-mtp"])
    assert not any(f.startswith("speculative-") for f in c.flags)
    assert c.flags["mem-fraction-static"] == 0.90


def test_rule_violations_name_the_rule(space: SearchSpace) -> None:
    with pytest.raises(RuleViolation) as info:
        space.candidate({"max-running-requests": 2}, ["cache-4"])
    assert "mamba-slots" in info.value.message and "too few Mamba slots" in info.value.message
    assert [v.rule.name for v in info.value.violations] == ["mamba-slots"]
    assert isinstance(info.value, ConfigError)


def test_technique_requires(space: SearchSpace) -> None:
    with pytest.raises(RuleViolation, match="requires of technique chain-9"):
        space.candidate(techniques=["no-mtp", "chain-9"])


def test_check_reports_violated_rules(space: SearchSpace) -> None:
    assert space.check(space.baseline()) == []
    bad = space.baseline().merged(flags={"speculative-num-draft-tokens": 9, "max-mamba-cache-size": 2})
    assert [m.split(":")[0] for m in space.check(bad)] == ["draft-tokens-follow-steps", "mamba-slots"]


def test_bad_values_and_names(space: SearchSpace) -> None:
    with pytest.raises(ConfigError, match="outside"):
        space.candidate({"max-running-requests": 5})
    with pytest.raises(ConfigError, match="not one of"):
        space.candidate({"kv-cache-dtype": "nvfp4"})
    with pytest.raises(ConfigError, match="lattice"):
        space.candidate({"mem-fraction-static": 0.905})
    with pytest.raises(ConfigError, match="no parameter 'page-size'"):
        space.candidate({"page-size": 64})
    with pytest.raises(ConfigError, match="no technique 'trition'") as info:
        space.candidate(techniques=["trition"])
    assert "did you mean 'triton'" in info.value.remedy


def test_grid_covers_extremes_and_obeys_rules(space: SearchSpace) -> None:
    grid = list(space.enumerate_grid(3))
    steps = {c.flags["speculative-num-steps"] for c in grid}
    assert {2, 11} <= steps
    fractions = {c.flags["mem-fraction-static"] for c in grid}
    assert {0.85, 0.97} <= fractions
    assert all(space.check(c) == [] for c in grid)
    assert len({c.key() for c in grid}) == len(grid)
    assert len(list(space.enumerate_grid(3, limit=5))) == 5


def test_sample_is_seeded_and_valid(space: SearchSpace) -> None:
    a = space.sample(random.Random(7), 25)
    b = space.sample(random.Random(7), 25)
    assert [c.key() for c in a] == [c.key() for c in b]
    assert len(a) == 25 and all(space.check(c) == [] for c in a)


def test_with_model_and_generic_space() -> None:
    generic = load_space("generic-sglang")
    with pytest.raises(ConfigError, match="names no model"):
        generic.baseline()
    local = generic.with_model("/models/local")
    assert local.baseline().flags["model-path"] == "/models/local"
    assert generic.model.path is None


def test_validate_flags_against_known_list(tmp_path: Path, space: SearchSpace) -> None:
    known = {use.flag for use in space.flag_uses()}
    space.validate_flags(known)
    with pytest.raises(SpaceError) as info:
        space.validate_flags(known - {"hicache-size"} | {"hicache-ratio"})
    assert "--hicache-size" in info.value.message
    assert info.value.line == next(i for i, line in enumerate(SPACE.splitlines(), 1) if "hicache-size: 24" in line)


def test_shipped_techniques_apply_to_their_baselines() -> None:
    for name in ("qwen3.6-35b-a3b-nvfp4-rtx5090", "qwen3.8-27b-nvfp4-rtx5090"):
        space = load_space(name)
        base = space.baseline()
        for technique in space.techniques:
            if not technique.screen:
                continue
            c = space.candidate(techniques=[technique.name])
            assert c.key() != base.key(), technique.name
            assert space.check(c) == []


def test_seed_004_clamp_traps_are_rules() -> None:
    space = load_space("qwen3.8-27b-nvfp4-rtx5090")
    four = space.candidate({"max-running-requests": 4})
    assert four.flags["max-mamba-cache-size"] == 32
    clamped = four.merged(flags={"max-mamba-cache-size": 16})
    assert any(m.startswith("mamba-slots-cover-requests") for m in space.check(clamped))
    no_mtp_at_097 = space.baseline().merged(flags={"speculative-algorithm": None})
    assert any(m.startswith("no-mtp-needs-headroom") for m in space.check(no_mtp_at_097))


def test_space_text_with_tabs_is_a_space_error(tmp_path: Path) -> None:
    path = tmp_path / "tabs.yaml"
    path.write_text(textwrap.dedent(SPACE).replace("  path: /models/m", "\tpath: /models/m"))
    with pytest.raises(SpaceError) as info:
        load_space(path)
    assert info.value.line == 3
