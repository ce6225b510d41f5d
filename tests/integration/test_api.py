"""The Python API (issue #39): five lines from a user's own project, offline, in one name.

Each script runs as a user runs it: a fresh interpreter in a project directory that has its
own ``flows``, ``tasks`` and ``conductor`` packages (Prefect projects often do), which raise if
anything of ours imports them; every process of the tree records outbound connection attempts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.test_cli import cli_env, write_tool_pool
from tests.netguard import guard

FIVE_LINES = """\
import prefect_conductor as pc

result = pc.run("What is 17 + 25?", pool="tools.yaml")
print(result.answer)
"""


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """A user's Prefect project: its own packages named as ours were."""
    root = tmp_path / "project"
    for name in ("flows", "tasks", "conductor", "reward_model"):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(
            f"raise ImportError('the project\\'s own {name} package was imported')\n"
        )
    write_tool_pool(root)
    return root


def _python(project: Path, code: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    env, log = guard(cli_env(tmp_path), tmp_path)
    script = project / "main.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=project, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    return proc, log


def test_the_readme_five_lines_run_offline_from_a_users_project(project, tmp_path):
    proc, log = _python(project, FIVE_LINES, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "42"
    assert log.read_text() == ""  # no network attempt, anywhere in the tree
    assert (tmp_path / "home" / "artifacts").is_dir()  # stored under the one home


def test_run_evaluate_and_a_pool_built_in_code(project, tmp_path):
    rows = [{"id": f"q{i}", "question": f"What is {i} + 1?", "reference": str(i + 1),
             "kind": "math"} for i in range(3)]  # fmt: skip
    (project / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    code = """\
import json
import prefect_conductor as pc

pool = pc.pool_from_dict({
    "conductor": {"model": "openai/gpt-4o-mini", "params": {"mock_response": "x"}},
    "workers": [{"name": "calc", "kind": "tool", "model": "tool/calculator"}],
})
single = pc.run("What is 6 * 7?", pool=pool, strategy="single:calc", reference="42")
report = pc.evaluate("data.jsonl", pool="tools.yaml", strategy="single:calculator")
try:
    pc.run("   ")
except pc.ConductorError as exc:
    blank = str(exc)
print(json.dumps({"single": single.model_dump(mode="json"), "report": report.model_dump(mode="json"),
                  "blank": blank}))
"""
    proc, _ = _python(project, code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    single, report = out["single"], out["report"]
    assert single["status"] == "completed" and single["answer"] == "42"
    assert single["correct"] is True and single["reward"] == 1.0
    assert [s["worker"] for s in single["workflow"]] == ["calc"]
    assert report["n"] == 3 and report["correct"] == 3 and report["strategy"] == "single:calculator"
    assert "question is blank" in out["blank"] and "\n" not in out["blank"]
    # The pool built in code was written once, content-addressed, under the home.
    (written,) = (tmp_path / "home" / "pools").glob("pool-*.yaml")
    assert yaml.safe_load(written.read_text())["workers"][0]["name"] == "calc"


def test_the_cli_runs_from_a_users_project_too(project, tmp_path):
    env = cli_env(tmp_path)
    proc = subprocess.run([str(Path(sys.executable).parent / "conductor"), "run", "What is 17 + 25?", "--pool", "tools.yaml",
                           "--in-process"], cwd=project, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "answer: 42"


def test_the_packaged_files_resolve_from_a_users_project(project, tmp_path):
    """The embedded pool and the shipped adapter are package data of the one import name
    (a ``resources.files("conductor")`` failed only outside the repository)."""
    code = """\
from prefect_conductor.conductor.adapters import embedded_adapter_path
from prefect_conductor.conductor.pool import load_pool

print(len(load_pool().workers), embedded_adapter_path().is_dir())
"""
    proc, _ = _python(project, code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    workers, shipped = proc.stdout.split()
    assert int(workers) >= 2 and shipped == "True"
