"""Fast tier: every candidate of the shipped spaces parses with a parser built from the bundled SGLang 0.5.23
flag table (``runtime/sglang_flags.py``, harvested from the real parser). The ``sglang``-marked test in
``test_space_sglang_parser.py`` does the same with SGLang itself."""

from __future__ import annotations

import argparse
import contextlib
import io
import random

import pytest

from elsa_tune.runtime import sglang_flags
from elsa_tune.runtime.family import FamilyName
from elsa_tune.search_spaces import Candidate, RuleViolation, list_shipped_spaces, load_space


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang", add_help=False)
    sglang_flags.add_sglang_arguments(p)
    return p


def parse_problem(p: argparse.ArgumentParser, candidate: Candidate) -> str | None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            p.parse_args(candidate.argv())
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    return None


@pytest.mark.parametrize("name", [n for n in list_shipped_spaces()
                                  if load_space(n).runtime.family is FamilyName.SGLANG])
def test_shipped_candidates_parse(name: str) -> None:
    space = load_space(name).with_model("/models/m")
    candidates = [space.baseline(), *(space.candidate(techniques=[t.name]) for t in space.techniques if t.screen)]
    for p in space.parameters:
        for value in p.grid(2):
            with contextlib.suppress(RuleViolation):
                candidates.append(space.candidate({p.name: value}))
    candidates += list(space.enumerate_grid(3, limit=60)) + space.sample(random.Random(0), 20)
    p = parser()
    problems = {c.label: parse_problem(p, c) for c in candidates}
    assert {label: problem for label, problem in problems.items() if problem} == {}


def test_bundled_parser_refuses_what_sglang_refuses() -> None:
    bad = Candidate(flags={"model-path": "/m", "cuda-graph-max-bs": 8})
    assert parse_problem(parser(), bad) is not None
