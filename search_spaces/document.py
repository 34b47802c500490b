"""A YAML document that remembers where each value came from, and typed reads that blame a line.

``read_document(text)`` parses YAML with a bounded PyYAML ``SafeLoader`` (``BoundedLoader``: size, nesting, aliases,
items) whose mappings are ``LineMap``
(the line of the mapping and of each key) and whose lists are ``LineList`` (the line of each item);
duplicate keys and non-string keys are refused. The readers (``string``, ``integer``, ``fraction``...)
raise ``Problem(message, line)``, which the search-space loader turns into a ``SpaceError`` with the file.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal, NoReturn, overload

import yaml

from elsa_tune.finite_number import number_problem


class LineMap(dict[str, Any]):
    """A YAML mapping that remembers its own line and the line of each key (1-based)."""

    line: int = 0
    key_lines: dict[str, int]


class LineList(list[Any]):
    """A YAML list that remembers its own line and the line of each item (1-based)."""

    line: int = 0
    item_lines: list[int]


class Problem(Exception):
    """Something wrong at ``line`` of the document (the caller adds the file)."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


#: the bounds of every YAML document elsa-tune reads (a search space, a flag file): checked while it is composed,
#: before any value is built, so an alias bomb or a nesting a hundred thousand deep is refused in milliseconds
MAX_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_ALIASES = 100
MAX_ITEMS = 10_000


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's ``SafeLoader`` with bounds: at most ``MAX_DEPTH`` levels of nesting, ``MAX_ALIASES`` aliases and
    ``MAX_ITEMS`` values in one list or mapping, its aliases expanded (a value printed in a message is printed whole);
    a document past one raises ``Problem`` at its line."""

    def __init__(self, stream: str) -> None:
        if len(stream) > MAX_BYTES:
            raise Problem(f"the document is {len(stream):,} characters, more than the {MAX_BYTES:,} a search space "
                          "or a flag file may have", None)
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._sizes: dict[int, int] = {}     # values a list or mapping holds once its aliases are expanded

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        if isinstance(event, yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise Problem(f"more than {MAX_ALIASES} YAML aliases (*name): write the values out", line)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise Problem(f"nested more than {MAX_DEPTH} levels deep", line)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)):
            if len(node.value) > MAX_ITEMS:
                raise Problem(f"a list or mapping of {len(node.value):,} items, more than {MAX_ITEMS:,}", line)
            if id(node) not in self._sizes:     # an alias returns its anchor's node: already counted
                children = (node.value if isinstance(node, yaml.SequenceNode)
                            else [part for pair in node.value for part in pair])
                size = 1 + sum(self._sizes.get(id(child), 1) for child in children)
                if size > MAX_ITEMS:
                    raise Problem(f"the aliases expand to more than {MAX_ITEMS:,} values (an alias bomb): write the "
                                  "values out", line)
                self._sizes[id(node)] = size
        return node


class _LineLoader(BoundedLoader):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineMap:
    loader.flatten_mapping(node)
    out = LineMap()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, str):
            raise Problem(f"key {key!r} must be a string (quote it)", line)
        if key in out:
            raise Problem(f"duplicate key {key!r} (first at line {out.key_lines[key]})", line)
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = line
    return out


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> LineList:
    out = LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def read_document(text: str) -> Any:
    """The YAML ``text`` as ``LineMap``/``LineList``/scalars; YAML errors propagate as ``yaml.YAMLError``, a document
    past the loader's bounds as ``Problem``."""
    loader = _LineLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def fail(message: str, m: LineMap, key: str | None) -> NoReturn:
    raise Problem(message, m.key_lines.get(key, m.line) if key else m.line)


def keys(m: LineMap, allowed: tuple[str, ...]) -> None:
    for key in m:
        if key not in allowed:
            hint = difflib.get_close_matches(key, allowed, n=1)
            fail(f"unknown key {key!r}" + (f" (did you mean {hint[0]!r}?)" if hint else
                                            f"; expected one of {', '.join(allowed)}"), m, key)


def mapping(m: LineMap, key: str) -> LineMap:
    value = m.get(key)
    if value is None:
        empty = LineMap()
        empty.line = m.key_lines.get(key, m.line)
        empty.key_lines = {}
        return empty
    if not isinstance(value, LineMap):
        fail(f"{key} must be a mapping", m, key)
    return value


@overload
def string(m: LineMap, key: str, *, required: Literal[True]) -> str: ...
@overload
def string(m: LineMap, key: str, *, required: bool = False) -> str | None: ...
def string(m: LineMap, key: str, *, required: bool = False) -> str | None:
    value = m.get(key)
    if value is None:
        if required:
            fail(f"missing required key {key!r}", m, None)
        return None
    if not isinstance(value, str) or not value.strip():
        fail(f"{key} must be a non-empty string, not {value!r}", m, key)
    return value


def boolean(m: LineMap, key: str, default: bool) -> bool:
    value = m.get(key, default)
    if not isinstance(value, bool):
        fail(f"{key} must be true or false, not {value!r}", m, key)
    return value


def _number(m: LineMap, key: str, default: Any, *, kinds: tuple[type, ...], required: bool,
            low: float | None, high: float | None) -> Any:
    if key not in m or m[key] is None:
        if required:
            fail(f"missing required key {key!r}", m, None)
        return default
    value: float = m[key]
    if isinstance(value, bool) or not isinstance(value, kinds):
        what = "an integer" if kinds == (int,) else "a number"
        fail(f"{key} must be {what}, not {value!r}", m, key)
    problem = number_problem(value)
    if problem is not None:
        fail(f"{key} must be a finite number: {problem}", m, key)
    if low is not None and value < low:
        fail(f"{key} = {value!r} is below the minimum {low:g}", m, key)
    if high is not None and value > high:
        fail(f"{key} = {value!r} is above the maximum {high:g}", m, key)
    return value


def integer(m: LineMap, key: str, default: int | None, *, required: bool = False, low: float | None = None,
         high: float | None = None) -> Any:
    return _number(m, key, default, kinds=(int,), required=required, low=low, high=high)


def number(m: LineMap, key: str, default: float | None, *, required: bool = False, low: float | None = None,
           high: float | None = None) -> Any:
    value = _number(m, key, default, kinds=(int, float), required=required, low=low, high=high)
    return float(value) if value is not None else None


def fraction(m: LineMap, key: str, default: float) -> float:
    value = number(m, key, default, low=0.0)
    if value is None or value >= 1.0:
        fail(f"{key} = {value!r} must be a fraction in [0, 1) (0.10 means 10 %)", m, key)
    return float(value)
