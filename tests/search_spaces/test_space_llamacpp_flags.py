"""Every shipped llama.cpp space uses only flags, values and switches the pinned ``llama-server`` accepts, read from
that binary's own ``--help`` (saved from the build of commit 0c1e570), as preflight checks them before a night."""

from __future__ import annotations

from pathlib import Path

import pytest

from elsa_tune.errors import SpaceError
from elsa_tune.runtime.family import FamilyName, family
from elsa_tune.runtime.llamacpp.flags import LlamaFlagSet
from elsa_tune.search_spaces import list_shipped_spaces, load_space

HELP = Path(__file__).parents[1] / "runtime" / "logs" / "llamacpp" / "help.txt"
LLAMACPP_SPACES = [n for n in list_shipped_spaces() if load_space(n).runtime.family is FamilyName.LLAMACPP]


def flags() -> LlamaFlagSet:
    parsed = family(FamilyName.LLAMACPP).parse_help(HELP.read_text(), "llama-server --help (0c1e570)")
    assert isinstance(parsed, LlamaFlagSet)
    return parsed


def test_llamacpp_spaces_are_shipped() -> None:
    assert {"llamacpp-cpu-tiny", "llamacpp-gpu-1b"} <= set(LLAMACPP_SPACES)


@pytest.mark.parametrize("name", LLAMACPP_SPACES)
def test_every_flag_and_value_is_accepted_by_llama_server(name: str) -> None:
    load_space(name).validate_flags(flags().shapes())


def test_a_value_outside_a_flags_choices_is_refused(tmp_path: Path) -> None:
    shipped = Path(load_space("llamacpp-cpu-tiny").path).read_text()
    text = shipped.replace('flash-attn: "on"}', "flash-attn: maybe}", 1)
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError):
        load_space(str(path)).validate_flags(flags().shapes())
