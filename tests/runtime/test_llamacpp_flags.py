"""``llama-server --help`` read into a ``FlagSet`` (the saved help of the pinned build, ``logs/llamacpp/help.txt``)."""

from __future__ import annotations

import subprocess

import pytest
from llamacpp_cases import FIXTURES, binary

from elsa_tune.errors import SpaceError
from elsa_tune.runtime.flags import validate
from elsa_tune.runtime.llamacpp.flags import KNOWN_ALIASES, KNOWN_ENV, LlamaFlagSet, canonical, parse_help
from elsa_tune.search_spaces import parse_space

SPACE = """\
name: llama
model:
  path: tiny.gguf
base:
  flags:
    ctx-size: 4096
    parallel: 4
parameters:
  flash-attn: {type: categorical, choices: ["on", "off"], baseline: "on"}
  cache-type-k: {type: categorical, choices: [f16, q8_0], baseline: f16}
techniques:
  draft:
    kind: speed
    rationale: a draft model
    flags:
      model-draft: draft.gguf
"""

HELP = (FIXTURES / "help.txt").read_text()


@pytest.fixture(scope="module")
def flags() -> LlamaFlagSet:
    return parse_help(HELP, "llama-server")


def test_long_names_and_short_aliases(flags: LlamaFlagSet) -> None:
    for name in ("ctx-size", "parallel", "batch-size", "ubatch-size", "flash-attn", "cache-type-k", "cache-type-v",
                 "n-gpu-layers", "kv-unified", "no-kv-unified", "spec-draft-n-max", "model-draft", "spec-type",
                 "fit", "metrics", "model", "cache-ram", "threads"):
        assert name in flags.names, name
    assert {a: flags.aliases[a] for a in ("c", "np", "ub", "fa", "ctk", "ngl", "gpu-layers", "md", "spec-draft-model",
                                          "kvu", "no-kvu", "nkvo", "nocb")} == {
        "c": "ctx-size", "np": "parallel", "ub": "ubatch-size", "fa": "flash-attn", "ctk": "cache-type-k",
        "ngl": "n-gpu-layers", "gpu-layers": "n-gpu-layers", "md": "model-draft", "spec-draft-model": "model-draft",
        "kvu": "kv-unified", "no-kvu": "no-kv-unified", "nkvo": "no-kv-offload", "nocb": "no-cont-batching"}
    assert "help" not in flags and "usage" not in flags
    assert not any(n.startswith("-") or " " in n for n in flags.all_names())


def test_value_shapes_choices_and_environment(flags: LlamaFlagSet) -> None:
    shapes = flags.shapes()
    assert shapes["fa"].choices == ("on", "off", "auto") and shapes["fa"].takes_value
    assert shapes["ctk"].choices == ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
    assert shapes["split-mode"].choices == ("none", "layer", "row", "tensor")
    assert shapes["cpu-strict"].choices == ("0", "1")
    assert shapes["spec-type"].choices is None          # a comma-separated list of types
    assert shapes["c"].takes_value and shapes["c"].choices is None
    assert not shapes["kv-unified"].takes_value and not shapes["metrics"].takes_value
    assert shapes["no-kv-unified"].negates == "kv-unified"
    env = flags.env_vars()
    assert env["LLAMA_ARG_CTX_SIZE"] == "ctx-size" and env["LLAMA_ARG_N_PARALLEL"] == "parallel"
    assert env["LLAMA_ARG_NO_KV_UNIFIED"] == "no-kv-unified" and env["LLAMA_ARG_NO_HOST"] == "no-host"


def test_removed_flags_are_refused_with_their_replacement(flags: LlamaFlagSet) -> None:
    assert "draft-max" not in flags and "draft-max" in flags.removed
    assert "--spec-draft-n-max" in flags.removed["draft-max"]
    (problem,) = validate(["draft-max"], flags)
    assert problem.suggestion is not None


def test_the_tables_the_log_reader_uses_match_the_help(flags: LlamaFlagSet) -> None:
    for alias, name in KNOWN_ALIASES.items():
        assert flags.canonical(alias) == name, alias
    env = flags.env_vars()
    for var, name in KNOWN_ENV.items():
        assert env.get(var) == name, var
    assert canonical("-np") == "parallel" and canonical("--ctx-size") == "ctx-size"


def test_a_space_is_validated_against_the_shapes(flags: LlamaFlagSet) -> None:
    # the space loader still names the model --model-path (SGLang's flag): stand llama's --model in for it
    shapes = flags.shapes() | {"model-path": flags.flags["model"]}
    parse_space(SPACE, "llama.yaml").validate_flags(shapes)
    with pytest.raises(SpaceError, match="sometimes"):
        parse_space(SPACE.replace('"off"', '"sometimes"'), "llama.yaml").validate_flags(shapes)
    with pytest.raises(SpaceError, match="draft-max"):
        parse_space(SPACE.replace("model-draft: draft.gguf", "draft-max: 4"), "llama.yaml").validate_flags(shapes)


def test_a_text_without_options_gives_no_flags() -> None:
    assert parse_help("usage: nothing here\n").names == frozenset()


@pytest.mark.llamacpp
def test_the_saved_help_is_the_binary_s_help() -> None:
    server = binary()
    if server is None:
        pytest.skip("no llama-server: set ELSA_LLAMA_SERVER or build it (python -m elsa_tune.runtime.llamacpp.build)")
    done = subprocess.run([str(server), "--help"], capture_output=True, text=True, check=True, timeout=60)
    assert parse_help(done.stdout) == parse_help(HELP)
