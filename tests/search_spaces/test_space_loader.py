from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from elsa_tune.errors import SpaceError
from elsa_tune.search_spaces import list_shipped_spaces, load_space
from elsa_tune.search_spaces.space import ReasonCategory, TechniqueKind

VALID = """\
name: tiny
model:
  path: /models/tiny
base:
  flags:
    speculative-algorithm: EAGLE
    speculative-eagle-topk: 1
parameters:
  speculative-num-steps:
    type: int
    low: 1
    high: 6
    baseline: 3
  max-running-requests:
    type: int
    low: 1
    high: 8
    baseline: 2
  mem-fraction-static:
    type: float
    low: 0.80
    high: 0.95
    step: 0.05
    baseline: 0.85
derived:
  speculative-num-draft-tokens: speculative-num-steps + 1
  max-mamba-cache-size: max-running-requests * 8
rules:
  - rule: mem-fraction-static <= 0.97
    message: leave workspace
techniques:
  fp8-kv:
    kind: memory
    rationale: halve the KV cache
    flags: {kv-cache-dtype: fp8_e4m3}
"""


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path: Path, text: str) -> SpaceError:
    path = write(tmp_path, text)
    with pytest.raises(SpaceError) as info:
        load_space(path)
    assert info.value.path == str(path)
    assert info.value.remedy, "every space error carries a remedy"
    return info.value


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize("name", list_shipped_spaces())
def test_every_shipped_space_loads(name: str) -> None:
    space = load_space(name)
    assert space.name == name
    assert space.parameters and space.techniques and space.rules
    built = space if space.model.path else space.with_model("/models/any")
    assert built.baseline().flags[built.model_flag] == built.model.path


def test_shipped_spaces_include_the_seed_spaces() -> None:
    assert {"qwen3.6-35b-a3b-nvfp4-rtx5090", "qwen3.8-27b-nvfp4-rtx5090", "generic-sglang"} <= set(
        list_shipped_spaces())


def test_seed_004_space_carries_every_rejected_technique() -> None:
    space = load_space("qwen3.8-27b-nvfp4-rtx5090")
    names = {t.name for t in space.techniques}
    expected = {"fp4-gemm-flashinfer-cudnn", "fp4-gemm-flashinfer-cutedsl", "attention-triton",
                "speculative-attention-decode", "fused-qk-norm-rope", "speculative-adaptive", "speculative-ngram",
                "hierarchical-cache", "int8-mamba-checkpoint", "mamba-track-interval-64", "tokenizer-workers-4",
                "mixed-chunk", "mamba-cache-24", "mamba-cache-32", "spec-chain-7", "spec-chain-9", "spec-chain-11",
                "kv-cache-fp4", "kv-turboquant-polarquant", "speculative-dflash", "speculative-dspark",
                "speculative-weaver", "quantize-mtp-head"}
    assert expected <= names
    for name in expected:
        prior = space.technique(name).prior
        assert prior is not None and prior.verdict == "reject" and prior.source == "seed 004"
    baseline = space.baseline()
    assert baseline.flags["speculative-num-steps"] == 5
    assert baseline.flags["speculative-num-draft-tokens"] == 6
    assert baseline.flags["max-mamba-cache-size"] == 8
    assert baseline.flags["mem-fraction-static"] == 0.97
    assert space.guardrails.min_context_tokens == 63000


def test_seed_004_priors_name_the_category_of_their_reason() -> None:
    space = load_space("qwen3.8-27b-nvfp4-rtx5090")
    screened = [t for t in space.techniques if t.screen]
    assert all(t.prior is not None and t.prior.categories for t in screened)
    category = {t.name: t.prior.categories for t in screened if t.prior is not None}
    assert category["mamba-cache-32"] == (ReasonCategory.HANG,)
    assert category["mamba-track-interval-64"] == (ReasonCategory.NO_GAIN,)
    assert category["mixed-chunk"] == (ReasonCategory.IGNORED,)
    assert category["speculative-attention-decode"] == (ReasonCategory.NO_GAIN, ReasonCategory.SLOWER)


def test_prior_category_is_optional_one_or_a_list_and_checked(tmp_path: Path) -> None:
    prior = "    prior: {verdict: reject, reason: zero gain, source: seed 004"
    plain = VALID + prior + "}\n"
    one = VALID + prior + ", category: no gain}\n"
    two = VALID + prior + ", category: [no gain, slower]}\n"

    def categories(text: str, name: str) -> tuple[ReasonCategory, ...]:
        found = load_space(write(tmp_path, text, name)).technique("fp8-kv").prior
        assert found is not None
        return found.categories

    assert categories(plain, "a.yaml") == ()
    assert categories(one, "b.yaml") == (ReasonCategory.NO_GAIN,)
    assert categories(two, "c.yaml") == (ReasonCategory.NO_GAIN, ReasonCategory.SLOWER)
    bad = VALID + prior + ", category: meh}\n"
    err = error_of(tmp_path, bad)
    assert "prior category 'meh'" in err.message and "no gain" in err.message


def test_seed_000_space_marks_the_fp8_draft_head_as_memory() -> None:
    space = load_space("qwen3.6-35b-a3b-nvfp4-rtx5090")
    head = space.technique("fp8-draft-head")
    assert head.kind is TechniqueKind.MEMORY and head.prior is not None and head.prior.verdict == "keep"
    baseline = space.baseline()
    assert baseline.flags["max-running-requests"] == 12
    assert baseline.flags["max-mamba-cache-size"] == 48
    assert baseline.flags["moe-runner-backend"] == "cutlass"
    assert baseline.env["SGLANG_FLASHINFER_MOE_FUSED_FINALIZE"] == "1"
    assert baseline.flags["enable-linear-replayssm-spec"] is True
    assert space.guardrails.min_context_tokens == 200_000  # seed 000 stress-tested a 200K prompt


def test_valid_space_loads(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, VALID))
    assert [p.name for p in space.parameters] == ["speculative-num-steps", "max-running-requests",
                                                  "mem-fraction-static"]
    assert space.probes.headroom_floor_mib == 512
    assert space.runtime.command == ("python3", "-m", "sglang.launch_server")   # the SGLang family default


def test_malformed_yaml_points_at_the_line(tmp_path: Path) -> None:
    text = VALID.replace("    low: 1\n    high: 8", "    low: 1\n   high: 8")
    err = error_of(tmp_path, text)
    assert "malformed YAML" in err.message
    assert err.line is not None and abs(err.line - line_of(text, "   high: 8")) <= 1


def test_unknown_key_names_the_nearest(tmp_path: Path) -> None:
    text = VALID.replace("    baseline: 2\n", "    baselin: 2\n")
    err = error_of(tmp_path, text)
    assert err.line == line_of(text, "baselin:")
    assert "unknown key 'baselin'" in err.message and "did you mean 'baseline'" in err.message


def test_unknown_top_level_key(tmp_path: Path) -> None:
    text = VALID + "objectivez: []\n"
    err = error_of(tmp_path, text)
    assert err.line == line_of(text, "objectivez")


@pytest.mark.parametrize(("old", "new", "needle", "words"), [
    ("    low: 1\n    high: 8", "    low: 9\n    high: 8", "high: 8", "above high"),
    ("    baseline: 2\n", "    baseline: 12\n", "baseline: 12", "outside [1, 8]"),
    ("    baseline: 0.85\n", "    baseline: 0.87\n", "baseline: 0.87", "not on the lattice"),
    ("    step: 0.05\n", "    step: -0.05\n", "step: -0.05", "minimum"),
    ("    type: int\n    low: 1\n    high: 8", "    type: integer\n    low: 1\n    high: 8", "type: integer",
     "not one of int"),
    ("    step: 0.05\n", "    step: 0.05\n    log: true\n", "step: 0.05", "step and log cannot be combined"),
])
def test_bad_range(tmp_path: Path, old: str, new: str, needle: str, words: str) -> None:
    text = VALID.replace(old, new, 1)
    assert text != VALID
    err = error_of(tmp_path, text)
    assert words in err.message
    assert err.line == line_of(text, needle)


@pytest.mark.parametrize("expression", [
    "__import__('os').system('true')", "max-running-requests ** 2", "[x for x in y]",
    "max-running-requests.real", "lambda: 1",
])
def test_bad_expression(tmp_path: Path, expression: str) -> None:
    text = VALID.replace("max-running-requests * 8", f'"{expression}"')
    err = error_of(tmp_path, text)
    assert "bad expression" in err.message
    assert err.line == line_of(text, "max-mamba-cache-size:")


def test_expression_with_unknown_flag_names_the_nearest(tmp_path: Path) -> None:
    text = VALID.replace("max-running-requests * 8", "max-runing-requests * 8")
    err = error_of(tmp_path, text)
    assert "'max-runing-requests'" in err.message and "max-running-requests" in err.remedy
    assert err.line == line_of(text, "max-mamba-cache-size:")


def test_unsatisfiable_rule_is_named_at_load_time(tmp_path: Path) -> None:
    text = VALID.replace("mem-fraction-static <= 0.97", "mem-fraction-static > 0.99")
    err = error_of(tmp_path, text)
    assert "no candidate of the space can satisfy rule 'mem-fraction-static > 0.99'" in err.message
    assert err.line == line_of(text, "mem-fraction-static > 0.99")


def test_rule_the_baseline_breaks(tmp_path: Path) -> None:
    text = VALID.replace("mem-fraction-static <= 0.97", "mem-fraction-static >= 0.90")
    err = error_of(tmp_path, text)
    assert "the baseline breaks rule" in err.message
    assert err.line == line_of(text, "mem-fraction-static >= 0.90")


def test_technique_that_breaks_a_rule_on_the_baseline(tmp_path: Path) -> None:
    text = VALID.replace("flags: {kv-cache-dtype: fp8_e4m3}", "flags: {mem-fraction-static: 0.99}")
    err = error_of(tmp_path, text)
    assert "technique 'fp8-kv' on the baseline breaks rule" in err.message
    assert err.line == line_of(text, "fp8-kv:")


@pytest.mark.parametrize(("value", "words"), [
    ("-5", "below the minimum"), ("0", "below the minimum"), ("'512MiB'", "must be an integer"),
    ("1000000", "above the maximum"), ("12.5", "must be an integer"),
])
def test_bad_probe_headroom(tmp_path: Path, value: str, words: str) -> None:
    text = VALID + f"probes:\n  headroom_floor_mib: {value}\n"
    err = error_of(tmp_path, text)
    assert words in err.message
    assert err.line == line_of(text, "headroom_floor_mib")


def test_hang_detection_must_fit_in_the_probe_timeout(tmp_path: Path) -> None:
    text = VALID + "probes:\n  probe_timeout_s: 60\n  hang_s: 120\n"
    err = error_of(tmp_path, text)
    assert err.line == line_of(text, "hang_s")


@pytest.mark.parametrize(("section", "needle"), [
    ("guardrails:\n  ttft_p99_margin: 20\n", "ttft_p99_margin"),
    ("guardrails:\n  min_context_tokens: -1\n", "min_context_tokens"),
    ("objectives:\n  - metric: output_throughpt\n", "metric: output_throughpt"),
    ("budget:\n  boots_per_arm: 1\n", "boots_per_arm"),
])
def test_bad_guardrails_objectives_budget(tmp_path: Path, section: str, needle: str) -> None:
    text = VALID + section
    err = error_of(tmp_path, text)
    assert err.line == line_of(text, needle)


def test_duplicate_key_and_dashed_flag_names(tmp_path: Path) -> None:
    twice = "    speculative-eagle-topk: 1\n    speculative-eagle-topk: 2\n"
    text = VALID.replace("    speculative-eagle-topk: 1\n", twice)
    err = error_of(tmp_path, text)
    assert "duplicate key" in err.message and err.line == line_of(text, "speculative-eagle-topk: 2")
    text = VALID.replace("    speculative-eagle-topk: 1\n", "    --page-size: 32\n")
    err = error_of(tmp_path, text)
    assert "without leading dashes" in err.message and err.line == line_of(text, "--page-size")
    text = VALID.replace("    speculative-eagle-topk: 1\n", "    page_size: 32\n")
    err = error_of(tmp_path, text)
    assert "'page-size'" in err.message


def test_derived_flag_that_is_also_a_parameter(tmp_path: Path) -> None:
    text = VALID.replace("  max-mamba-cache-size: max-running-requests * 8",
                         "  mem-fraction-static: 0.5 + 0.3")
    err = error_of(tmp_path, text)
    assert "both derived and the parameter" in err.message


def test_not_a_mapping_and_missing_file(tmp_path: Path) -> None:
    err = error_of(tmp_path, "- just\n- a list\n")
    assert err.line == 1
    with pytest.raises(SpaceError) as info:
        load_space(tmp_path / "missing.yaml")
    assert "does not exist" in info.value.message
    with pytest.raises(SpaceError) as info:
        load_space("qwen3.8-27b-nvfp4")
    assert "did you mean 'qwen3.8-27b-nvfp4-rtx5090'" in info.value.remedy


def test_error_message_names_file_and_line(tmp_path: Path) -> None:
    text = VALID.replace("    baseline: 2\n", "    baselin: 2\n")
    err = error_of(tmp_path, text)
    assert str(err).startswith(f"{tmp_path / 'space.yaml'}:{line_of(text, 'baselin:')}: ")


def test_digest_identifies_the_file_content(tmp_path: Path) -> None:
    a = load_space(write(tmp_path, VALID, "a.yaml"))
    b = load_space(write(tmp_path, VALID, "b.yaml"))
    c = load_space(write(tmp_path, VALID.replace("baseline: 3", "baseline: 4"), "c.yaml"))
    assert len(a.digest) == 64 and a.digest == b.digest != c.digest
    assert a.to_dict()["digest"] == a.digest


def test_runtime_image_objectives_and_budget(tmp_path: Path) -> None:
    text = VALID + textwrap.dedent("""\
        runtime:
          image: lmsysorg/sglang:v0.5.23
          volumes: ["/srv/models:/models:ro", "/srv/cache:/root/.cache"]
          shm_size: 32g
          version: "0.5.23"
        gpu: {name: NVIDIA GeForce RTX 5090, memory_gib: 32}
        objectives:
          - {metric: output_throughput, workload: burst}
          - {metric: ttft_p99, weight: 0.5}
        budget: {hours: 8, max_boots: 60, boots_per_arm: 4}
        """)
    space = load_space(write(tmp_path, text))
    assert space.runtime.image == "lmsysorg/sglang:v0.5.23" and space.runtime.command is None
    assert space.runtime.volumes == ("/srv/models:/models:ro", "/srv/cache:/root/.cache")
    assert (space.gpu, space.gpu_memory_gib) == ("NVIDIA GeForce RTX 5090", 32.0)
    assert [(o.metric, o.direction, o.workload, o.weight) for o in space.objectives] == [
        ("output_throughput", "maximize", "burst", 1.0), ("ttft_p99", "minimize", None, 0.5)]
    assert (space.budget.hours, space.budget.max_boots, space.budget.boots_per_arm) == (8.0, 60, 4)


def test_runtime_command_string_and_conflicts(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, VALID + "runtime:\n  command: /opt/elsa/bin/python -m sglang.launch_server\n"))
    assert space.runtime.command == ("/opt/elsa/bin/python", "-m", "sglang.launch_server")
    text = VALID + "runtime:\n  command: [python]\n  image: x\n"
    err = error_of(tmp_path, text)
    assert "either command or image" in err.message and err.line == line_of(text, "image: x")
    text = VALID + "runtime:\n  command: [python]\n  volumes: ['/a:/b']\n"
    assert "only apply to a Docker image" in error_of(tmp_path, text).message
