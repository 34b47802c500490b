"""``Expression``: the tiny, safe expression language of search-space files.

Derived flags and rules are written over flag names as SGLang spells them, dashes included::

    max-running-requests * 8
    speculative-num-steps + 1
    speculative-eagle-topk == 1 or speculative-num-draft-tokens > speculative-num-steps
    kv-cache-dtype in ("auto", "fp8_e4m3") and mem-fraction-static <= 0.97

A dashed run of letters without spaces is one name; subtraction needs spaces (``a - b``) or a digit
(``a-1``). A name refers to a flag of the candidate being checked; a flag that is not set reads as
``None`` (test it with ``x is None``), and arithmetic on ``None`` is an error, never a silent zero.

Only literals, names, arithmetic (``+ - * / // %``), comparisons, ``and or not``, ``x if c else y``,
tuples for ``in`` and the calls ``min max round int float abs`` are allowed. The source is parsed with
``ast`` and checked node by node before anything is evaluated; nothing reaches ``eval``.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: A dashed flag name, or a plain identifier. ``-`` only joins parts that start with a letter.
_NAME = re.compile(r"(?<![\w.])[A-Za-z_][A-Za-z0-9_]*(?:-[A-Za-z][A-Za-z0-9_]*)*")
_STRING = re.compile(r"""("[^"\\]*(?:\\.[^"\\]*)*"|'[^'\\]*(?:\\.[^'\\]*)*')""")
_KEYWORDS = frozenset({"and", "or", "not", "in", "is", "if", "else", "True", "False", "None"})

_FUNCTIONS: Mapping[str, Callable[..., Any]] = {
    "min": min, "max": max, "round": round, "int": int, "float": float, "abs": abs,
}
_BINARY: Mapping[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
_COMPARE: Mapping[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_, ast.IsNot: operator.is_not,
}
_MAX_SOURCE = 2000
_MAX_REPEAT = 1000   # 'a' * n: a rule never needs a long string, and a huge one would exhaust memory


class ExpressionError(ValueError):
    """An expression is malformed, uses something outside the language, or cannot be evaluated."""


@dataclass(frozen=True)
class Expression:
    """A parsed, checked expression; ``names`` are the flags it reads."""

    source: str
    names: frozenset[str]
    _tree: ast.Expression = field(repr=False, compare=False)
    _aliases: Mapping[str, str] = field(repr=False, compare=False)

    @classmethod
    def parse(cls, source: str) -> Expression:
        """Parse and check ``source``; raise ``ExpressionError`` naming the offending part."""
        if not isinstance(source, str) or not source.strip():
            raise ExpressionError("an expression must be a non-empty string")
        if len(source) > _MAX_SOURCE:
            raise ExpressionError(f"expression longer than {_MAX_SOURCE} characters")
        text, aliases = _mangle(source.strip())
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as exc:
            raise ExpressionError(f"cannot parse {source.strip()!r}: {exc.msg}") from exc
        _check(tree.body, source.strip())
        names = frozenset(aliases[n.id] for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in aliases)
        return cls(source=source.strip(), names=names, _tree=tree, _aliases=aliases)

    def evaluate(self, values: Mapping[str, Any]) -> Any:
        """The value of the expression where each name reads ``values.get(name)``."""
        try:
            return _Evaluator(values, self._aliases).visit(self._tree.body)
        except ExpressionError:
            raise
        except (TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:
            shown = ", ".join(f"{n}={values.get(n)!r}" for n in sorted(self.names))
            raise ExpressionError(f"{self.source!r} cannot be evaluated with {shown or 'no flags'}: {exc}") from exc

    def holds(self, values: Mapping[str, Any]) -> bool:
        """Evaluate as a rule: the result must be a bool."""
        result = self.evaluate(values)
        if not isinstance(result, bool):
            raise ExpressionError(f"rule {self.source!r} gave {result!r}, not True or False")
        return result

    def __str__(self) -> str:
        return self.source


def _mangle(source: str) -> tuple[str, dict[str, str]]:
    """Replace each name (dashed or not) outside string literals by a Python identifier."""
    aliases: dict[str, str] = {}
    by_name: dict[str, str] = {}

    def rename(match: re.Match[str]) -> str:
        name = match.group(0)
        if name in _KEYWORDS or name in _FUNCTIONS:
            return name
        if name not in by_name:
            alias = f"_f{len(by_name)}"
            by_name[name] = alias
            aliases[alias] = name
        return by_name[name]

    pieces: list[str] = []
    last = 0
    for literal in _STRING.finditer(source):
        pieces.append(_NAME.sub(rename, source[last:literal.start()]))
        pieces.append(literal.group(0))
        last = literal.end()
    pieces.append(_NAME.sub(rename, source[last:]))
    return "".join(pieces), aliases


def _check(node: ast.AST, source: str) -> None:
    allowed = (ast.Constant, ast.Name, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call,
               ast.Tuple, ast.List)
    for child in ast.walk(node):
        if isinstance(child, ast.expr) and not isinstance(child, allowed):
            raise ExpressionError(f"{source!r}: {type(child).__name__} is not allowed in a search-space expression")
        if isinstance(child, ast.Constant) and not isinstance(child.value, int | float | str | bool | type(None)):
            raise ExpressionError(f"{source!r}: constant {child.value!r} is not allowed")
        if isinstance(child, ast.BinOp) and type(child.op) not in _BINARY:
            raise ExpressionError(f"{source!r}: operator {type(child.op).__name__} is not allowed")
        if isinstance(child, ast.UnaryOp) and not isinstance(child.op, ast.USub | ast.UAdd | ast.Not):
            raise ExpressionError(f"{source!r}: operator {type(child.op).__name__} is not allowed")
        if isinstance(child, ast.Call):
            if not isinstance(child.func, ast.Name) or child.func.id not in _FUNCTIONS:
                raise ExpressionError(f"{source!r}: only {', '.join(_FUNCTIONS)} may be called")
            if child.keywords or not child.args:
                raise ExpressionError(f"{source!r}: {child.func.id}() takes positional arguments only")
        if isinstance(child, ast.Name) and child.id in _FUNCTIONS and not _is_callee(node, child):
            raise ExpressionError(f"{source!r}: {child.id} is a function, call it")


def _is_callee(root: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(n, ast.Call) and n.func is name for n in ast.walk(root))


class _Evaluator:
    def __init__(self, values: Mapping[str, Any], aliases: Mapping[str, str]) -> None:
        self.values = values
        self.aliases = aliases

    def visit(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.values.get(self.aliases[node.id])
        if isinstance(node, ast.BinOp):
            left, right = self.visit(node.left), self.visit(node.right)
            for side in (left, right):
                if side is None or isinstance(side, bool):
                    raise ExpressionError(f"arithmetic on {side!r} (a flag that is unset or a switch)")
            if isinstance(node.op, ast.Mult) and any(isinstance(s, str | tuple) for s in (left, right)) \
                    and any(isinstance(s, int) and abs(s) > _MAX_REPEAT for s in (left, right)):
                raise ExpressionError(f"repeating a string or a list more than {_MAX_REPEAT} times")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp):
            operand = self.visit(node.operand)
            if isinstance(node.op, ast.Not):
                return not operand
            if operand is None or isinstance(operand, bool):
                raise ExpressionError(f"arithmetic on {operand!r} (a flag that is unset or a switch)")
            return -operand if isinstance(node.op, ast.USub) else +operand
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                return all(bool(self.visit(v)) for v in node.values)
            return any(bool(self.visit(v)) for v in node.values)
        if isinstance(node, ast.Compare):
            left = self.visit(node.left)
            for op, comparator in zip(node.ops, node.comparators, strict=True):
                right = self.visit(comparator)
                if isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE) and (left is None or right is None):
                    raise ExpressionError("ordering comparison with an unset flag (test it with `is None` first)")
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self.visit(node.body) if self.visit(node.test) else self.visit(node.orelse)
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name)
            return _FUNCTIONS[node.func.id](*(self.visit(a) for a in node.args))
        if isinstance(node, ast.Tuple | ast.List):
            return tuple(self.visit(e) for e in node.elts)
        raise ExpressionError(f"{type(node).__name__} is not allowed")  # unreachable after _check
