"""Docstrings say what the code does and promises: none cites a field note ("seed 001") kept outside the repository.

A docstring that needs a measured fact states it ("a maximum-size image in a ~29K-token request can need 144 MiB
more than the pool leaves"); the history of the decision rules lives in ``docs/decision-rules.md``.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: "seed 001", "seeds 001/004", "seed-004", "Seed 000's": a citation of a note outside the repository
SEED_CITATION = re.compile(r"(?<![-\w])seeds?[ -]00[0-9]", re.IGNORECASE)
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def package_folders() -> list[Path]:
    """The folders the package is installed from, as ``pyproject.toml``'s ``package-dir`` maps them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    return sorted({ROOT / folder for folder in package_dir.values()})


def seed_citations(source: str, name: str) -> list[str]:
    """``name:line: text`` for every docstring line of ``source`` that cites a seed note."""
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if not isinstance(node, _DOCUMENTED):
            continue
        docstring = ast.get_docstring(node, clean=False)
        if docstring is None:
            continue
        first = node.body[0].lineno
        for offset, line in enumerate(docstring.splitlines()):
            if SEED_CITATION.search(line):
                found.append(f"{name}:{first + offset}: {line.strip()}")
    return found


def test_the_check_sees_a_citation_in_every_kind_of_docstring() -> None:
    source = '''"""Module (seed 001's crash)."""
class A:
    """Class, seeds 001/004."""
    def f(self) -> None:
        """Method: Seed-004 trap 2."""
async def g() -> None:
    """Coroutine, fine."""
'''
    found = seed_citations(source, "m.py")
    assert [entry.split(":")[1] for entry in found] == ["1", "3", "5"]


def test_the_check_passes_what_only_looks_like_a_citation() -> None:
    source = '''"""``--sim-seed 001`` is a flag value; a seed 0 RNG; the seeds of a schedule."""
# seed 004 in a comment is not a docstring
'''
    assert seed_citations(source, "m.py") == []


def test_no_docstring_in_the_package_cites_a_seed_note() -> None:
    folders = package_folders()
    files = [path for folder in folders for path in sorted(folder.rglob("*.py"))]
    assert len(files) > 100, f"the scan found only {len(files)} files under {folders}"
    found = [hit for path in files
             for hit in seed_citations(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not found, ("docstrings cite field notes that live outside the repository; state the fact instead:\n"
                       + "\n".join(found))
