"""The package's dependencies are declared as imported: every third-party module the package imports comes from a
declared distribution (main or an extra), every main dependency is imported somewhere, no module imports a
private (underscore) module of Optuna, and every package-data pattern matches a file."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIRS = PYPROJECT["tool"]["setuptools"]["package-dir"]


def _requirement_name(spec: str) -> str:
    return re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower().replace("_", "-")


@functools.cache
def _imports() -> dict[str, set[str]]:
    """Every imported module path (``a.b.c``) of the package → the files importing it."""
    found: dict[str, set[str]] = {}
    for folder in set(PACKAGE_DIRS.values()):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                         else [])
                for name in names:
                    found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def _third_party(imports: dict[str, set[str]]) -> set[str]:
    tops = {name.split(".")[0] for name in imports}
    return {t for t in tops if t not in sys.stdlib_module_names and t not in ("elsa_tune", "__future__")}


def test_every_imported_module_comes_from_a_declared_distribution() -> None:
    declared = {_requirement_name(s) for s in PYPROJECT["project"]["dependencies"]}
    extras = {_requirement_name(s) for specs in PYPROJECT["project"]["optional-dependencies"].values()
              for s in specs}
    providers = importlib.metadata.packages_distributions()
    missing = {}
    for module in sorted(_third_party(_imports())):
        dists = {d.lower().replace("_", "-") for d in providers.get(module, [module])}
        if not dists & (declared | extras):
            missing[module] = sorted(dists)
    assert missing == {}


def test_every_main_dependency_is_imported() -> None:
    providers = importlib.metadata.packages_distributions()
    provided = {d.lower().replace("_", "-") for module in _third_party(_imports())
                for d in providers.get(module, [module])}
    unused = [name for s in PYPROJECT["project"]["dependencies"] if (name := _requirement_name(s)) not in provided]
    assert unused == []


def test_no_private_optuna_module_is_imported() -> None:
    private = {name: files for name, files in _imports().items()
               if name.split(".")[0] == "optuna" and any(part.startswith("_") for part in name.split("."))}
    assert private == {}


def _package_dir(package: str) -> Path:
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        if (prefix := ".".join(parts[:cut])) in PACKAGE_DIRS:
            return ROOT / PACKAGE_DIRS[prefix] / Path(*parts[cut:])
    raise AssertionError(f"{package} is not under a package-dir entry")


def test_every_package_data_pattern_matches_a_file() -> None:
    empty = [f"{package}: {pattern}" for package, patterns in PYPROJECT["tool"]["setuptools"]["package-data"].items()
             for pattern in patterns if not list(_package_dir(package).glob(pattern))]
    assert empty == []
