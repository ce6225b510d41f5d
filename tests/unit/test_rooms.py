"""Every file in its room (issue #39; CONTRIBUTING, "Where a change goes"): ``flows/`` holds
``@flow``s and the wiring between tasks, every ``@task`` is defined in ``tasks/``, and
``tasks/`` imports no ``flows/`` (a task that runs a flow is handed it)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import prefect_conductor.flows
import pytest
from prefect import Flow
from prefect.tasks import Task

ROOT = Path(__file__).resolve().parents[2]
#: The folders of the installed package but ``tasks/``.
NOT_TASKS = ["conductor", "reward_model", "flows", "prefect_conductor"]
FLOW_MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(
        prefect_conductor.flows.__path__, prefect_conductor.flows.__name__ + "."
    )
)


def _files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _decorated(tree: ast.AST, name: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions decorated ``@name`` or ``@name(...)`` (also ``@prefect.name``)."""

    def is_name(node: ast.AST) -> bool:
        node = node.func if isinstance(node, ast.Call) else node
        return (isinstance(node, ast.Name) and node.id == name) or (
            isinstance(node, ast.Attribute) and node.attr == name
        )

    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(is_name(d) for d in node.decorator_list)
    ]


def _imported(tree: ast.AST) -> set[str]:
    """Every module an ``import`` names, at any depth of the file (in a function too)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def test_the_flows_package_is_seen() -> None:
    assert {"prefect_conductor.flows.orchestrate", "prefect_conductor.flows.best_of_n"} <= set(
        FLOW_MODULES
    )


@pytest.mark.parametrize("name", FLOW_MODULES)
def test_a_module_of_flows_defines_no_task(name: str) -> None:
    """No attribute of the module is a Prefect task made there, and its source neither
    decorates with ``@task`` nor imports Prefect's ``task`` (a task made in a function)."""
    module = importlib.import_module(name)
    made_here = [
        attr
        for attr, value in vars(module).items()
        if isinstance(value, Task) and getattr(value.fn, "__module__", None) == name
    ]
    assert made_here == []
    tree = ast.parse(Path(module.__file__).read_text(), module.__file__)
    assert [f.name for f in _decorated(tree, "task")] == []
    assert not _imported(tree) & {"prefect.task", "prefect.tasks.task", "prefect.tasks.Task"}


@pytest.mark.parametrize("name", FLOW_MODULES)
def test_every_flow_of_a_module_of_flows_is_a_prefect_flow(name: str) -> None:
    """Each module holds at least one ``@flow``, and what it decorates is a Prefect flow; a
    private module (``flows/_stages.py``) holds the wiring of a flow module, no flow."""
    module = importlib.import_module(name)
    tree = ast.parse(Path(module.__file__).read_text(), module.__file__)
    flows = [f.name for f in _decorated(tree, "flow")]
    private = name.rsplit(".", 1)[-1].startswith("_")
    assert flows or private, f"{name} holds no @flow: flows/ is for flows and their wiring"
    if private:
        users = [m for m in FLOW_MODULES if name in _imported(ast.parse(
            Path(importlib.import_module(m).__file__).read_text()))]  # fmt: skip
        assert users, f"{name} is the wiring of no flow module"
    assert [f for f in flows if not isinstance(getattr(module, f), Flow)] == []


@pytest.mark.parametrize("folder", NOT_TASKS)
def test_every_task_is_defined_in_tasks(folder: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): [f.name for f in found]
        for path in _files(folder)
        if (found := _decorated(ast.parse(path.read_text(), str(path)), "task"))
    }
    assert offenders == {}


@pytest.mark.parametrize("path", _files("tasks"), ids=lambda p: p.name)
def test_a_module_of_tasks_imports_no_flow_and_no_face(path: Path) -> None:
    """``tasks/`` may import ``conductor/`` and ``reward_model/``; the one piece of the faces
    it uses is ``prefect_conductor.runtime`` (result storage), which imports only Prefect and
    ``conductor/``. Never ``flows/``, the CLI, the fleet or the Python API."""
    forbidden = ("prefect_conductor.flows", "prefect_conductor.cli", "prefect_conductor.fleet",
                 "prefect_conductor.api", "prefect_conductor.testing")  # fmt: skip
    tree = ast.parse(path.read_text(), str(path))
    assert sorted(n for n in _imported(tree) if n.startswith(forbidden)) == []


def test_the_checks_see_a_task_and_a_flow_import() -> None:
    tree = ast.parse(
        "from prefect import flow, task\n"
        "@task(name='x')\ndef a(): ...\n"
        "@prefect.task\ndef b(): ...\n"
        "def c():\n    from prefect_conductor.flows.orchestrate import orchestrate\n"
    )
    assert [f.name for f in _decorated(tree, "task")] == ["a", "b"]
    assert "prefect.task" in _imported(tree)
    assert "prefect_conductor.flows.orchestrate.orchestrate" in _imported(tree)
