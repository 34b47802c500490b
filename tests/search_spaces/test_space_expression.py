from __future__ import annotations

import pytest

from elsa_tune.search_spaces.expression import Expression, ExpressionError


@pytest.mark.parametrize(("source", "values", "expected"), [
    ("max-running-requests * 8", {"max-running-requests": 3}, 24),
    ("speculative-num-steps + 1", {"speculative-num-steps": 5}, 6),
    ("x-1", {"x": 4}, 3),
    ("a - b", {"a": 4, "b": 1}, 3),
    ("max(page-size, 16) // 2", {"page-size": 64}, 32),
    ("min(a, b, 3)", {"a": 5, "b": 4}, 3),
    ("round(mem-fraction-static * 100) / 100", {"mem-fraction-static": 0.876}, 0.88),
    ("int(a / 3)", {"a": 10}, 3),
    ("-a + abs(b)", {"a": 1, "b": -2}, 1),
    ("a % 32 == 0", {"a": 64}, True),
    ("kv-cache-dtype in ('auto', 'fp8_e4m3')", {"kv-cache-dtype": "auto"}, True),
    ("kv-cache-dtype not in ['nvfp4']", {"kv-cache-dtype": "auto"}, True),
    ("speculative-algorithm is None or mem-fraction-static <= 0.9", {"mem-fraction-static": 0.97}, True),
    ("not enable-mixed-chunk", {}, True),
    ("8 if a > 2 else 4", {"a": 3}, 8),
    ("1 < a <= 3", {"a": 3}, True),
    ("attention-backend == 'max-running-requests'", {"attention-backend": "max-running-requests"}, True),
])
def test_evaluates(source: str, values: dict[str, object], expected: object) -> None:
    assert Expression.parse(source).evaluate(values) == expected


def test_names_are_the_flags_read() -> None:
    e = Expression.parse("speculative-eagle-topk == 1 or speculative-num-draft-tokens > x - 1")
    assert e.names == {"speculative-eagle-topk", "speculative-num-draft-tokens", "x"}
    assert Expression.parse("a == 'b-c'").names == {"a"}


@pytest.mark.parametrize("source", [
    "", "   ", "__import__('os')", "a.b", "a ** 2", "a[0]", "lambda: 1", "f(a)", "max", "max(a, key=b)",
    "(a := 1)", "a @ b", "{1: 2}", "[x for x in y]", "a if", "open('x')", "b'x'", "a << 1", "~a", "x" * 3000,
])
def test_rejects_everything_else(source: str) -> None:
    with pytest.raises(ExpressionError):
        Expression.parse(source)


@pytest.mark.parametrize(("source", "values"), [
    ("a * 8", {}),  # an unset flag is not a zero
    ("a + 1", {"a": True}),  # a switch is not a number
    ("a < 3", {}),
    ("a / b", {"a": 1, "b": 0}),
])
def test_evaluation_errors_never_fail_open(source: str, values: dict[str, object]) -> None:
    with pytest.raises(ExpressionError):
        Expression.parse(source).evaluate(values)


def test_rules_must_return_bools() -> None:
    with pytest.raises(ExpressionError, match="not True or False"):
        Expression.parse("a + 1").holds({"a": 1})
    assert Expression.parse("a > 1").holds({"a": 2}) is True
