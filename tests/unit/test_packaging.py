"""One import name (issue #39): the card's folders install under ``prefect_conductor``, so a
user's own ``flows`` or ``tasks`` package collides with nothing of ours."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"conductor": "conductor", "reward_model": "reward_model", "tasks": "tasks",
           "flows": "flows", "prefect_conductor": None}  # fmt: skip
GENERIC = {"conductor", "reward_model", "tasks", "flows"}


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_of_the_tree_is_installed_under_one_name() -> None:
    config = _config()
    where = {pkg: Path(path) for pkg, path in config["package-dir"].items()}
    found = set()
    for pkg, path in where.items():
        for init in (ROOT / path).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / path).parts
            if "__pycache__" not in rel:
                found.add(".".join((pkg, *rel)))
    assert set(config["packages"]) == found
    assert all(p == "prefect_conductor" or p.startswith("prefect_conductor.") for p in found)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("top", ["conductor", "reward_model", "tasks", "flows",
                                 "prefect_conductor", "tests", "benchmarks", "deployments",
                                 "docs"])  # fmt: skip
def test_nothing_imports_a_generic_top_level_name(top: str) -> None:
    """Importing ``conductor`` or ``flows`` from the repository root would load a second copy
    of a module (two ``ConductorError`` classes); from a user's project, their package."""
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & GENERIC)
        for path in (ROOT / top).rglob("*.py")
        if ".venv" not in path.parts and _imports(path) & GENERIC
    }
    assert offenders == {}
