"""One import name (issue #39): the card's folders install under ``prefect_conductor``, so a
user's own ``flows`` or ``tasks`` package collides with nothing of ours; and no import hacks:
nothing edits ``sys.path``, and ``tests/`` and ``benchmarks/`` are leaves that import each
other never (the fakes both need ship as ``prefect_conductor.testing``)."""

from __future__ import annotations

import ast
import textwrap
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


TOPS = ["conductor", "reward_model", "tasks", "flows", "prefect_conductor", "tests",
        "benchmarks", "deployments", "docs"]  # fmt: skip


def _python_files(top: str) -> list[Path]:
    return [path for path in (ROOT / top).rglob("*.py") if ".venv" not in path.parts]


def _code_strings(tree: ast.AST) -> list[tuple[int, ast.Module]]:
    """The string constants that are Python with an import (``python -c`` programs, code run
    on a host), each with its line: an import or a path edit hidden in one counts the same."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "import" in node.value:
                try:
                    found.append((node.lineno, ast.parse(textwrap.dedent(node.value))))
                except SyntaxError:  # prose that mentions importing
                    continue
    return found


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    code = [tree, *(module for _, module in _code_strings(tree))]
    for node in (n for t in code for n in ast.walk(t)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("top", TOPS)
def test_nothing_imports_a_generic_top_level_name(top: str) -> None:
    """Importing ``conductor`` or ``flows`` from the repository root would load a second copy
    of a module (two ``ConductorError`` classes); from a user's project, their package."""
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & GENERIC)
        for path in _python_files(top)
        if _imports(path) & GENERIC
    }
    assert offenders == {}


def _is_sys_path(node: ast.AST) -> bool:
    if isinstance(node, ast.Subscript):  # sys.path[0:0] = [...]
        node = node.value
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _edits(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            site = isinstance(owner, ast.Name) and owner.id == "site"
            if _is_sys_path(owner) or (site and node.func.attr == "addsitedir"):
                lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_sys_path(t) for t in targets):
                lines.append(node.lineno)
    return lines


def _path_edits(path: Path) -> list[int]:
    """The lines that change the import path: a call of a method of ``sys.path``
    (``insert``, ``append``, ``extend``, …), an assignment to it or to a slice of it, or
    ``site.addsitedir``; in a code string, the string's line."""
    tree = ast.parse(path.read_text(), str(path))
    lines = _edits(tree)
    lines += [line for line, module in _code_strings(tree) if _edits(module)]
    return sorted(set(lines))


@pytest.mark.parametrize("top", TOPS)
def test_nothing_edits_sys_path(top: str) -> None:
    """The package is installed, so nothing needs the repository on the path: benchmarks run
    as ``python -m benchmarks.NAME``, the stack as ``python -m deployments.stack``, and
    pytest's ``pythonpath`` option finds ``tests`` (issue #39)."""
    offenders = {
        str(path.relative_to(ROOT)): lines
        for path in _python_files(top)
        if (lines := _path_edits(path))
    }
    assert offenders == {}


@pytest.mark.parametrize("top", TOPS)
def test_tests_and_benchmarks_import_each_other_never(top: str) -> None:
    """``tests`` and ``benchmarks`` are leaves: only their own modules import them (a
    benchmark's own checks are ``benchmarks/test_*.py``)."""
    leaves = {"tests", "benchmarks"} - {top}
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & leaves)
        for path in _python_files(top)
        if _imports(path) & leaves
    }
    assert offenders == {}


def test_the_checks_see_a_path_edit_and_an_import_hidden_in_a_code_string(tmp_path) -> None:
    hacked = tmp_path / "hacked.py"
    lines = [  # one string a line, so that this file's own scan sees no hack in them
        "import sys",
        "sys.path.insert(0, '.')",
        "sys.path[0:0] = ['.']",
        'CLI = "import sys; sys.path.append(0); from tests.fakes import x"',
    ]
    hacked.write_text("\n".join(lines))
    assert _path_edits(hacked) == [2, 3, 4]
    assert "tests" in _imports(hacked)


# What each layer may import of ours (CONTRIBUTING's table; issue #39: measured, not hoped).
_LAYERS = {
    "conductor": {"conductor"},
    "reward_model": {"conductor", "reward_model"},
    "tasks": {"conductor", "reward_model", "tasks"},
    "flows": {"conductor", "reward_model", "tasks", "flows", "fleet"},  # fleet: fanout only
}


def _ours(path: Path) -> set[str]:
    """The subpackages of ``prefect_conductor`` that ``path`` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "prefect_conductor":
                found.add(parts[1] if len(parts) > 1 else "prefect_conductor")
    return found


@pytest.mark.parametrize("layer", sorted(_LAYERS))
def test_imports_point_downward_only(layer: str) -> None:
    upward = {
        str(path.relative_to(ROOT)): sorted(_ours(path) - _LAYERS[layer])
        for path in (ROOT / layer).rglob("*.py")
        if _ours(path) - _LAYERS[layer]
    }
    assert upward == {}


def test_the_flows_use_only_the_fleets_scheduler_and_it_imports_no_face() -> None:
    for path in (ROOT / "flows").rglob("*.py"):
        text = path.read_text()
        assert "prefect_conductor.fleet.serve" not in text, path
    assert _ours(ROOT / "prefect_conductor" / "fleet" / "fanout.py") <= {"conductor", "tasks"}
