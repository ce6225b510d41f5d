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


def test_train_runs_a_recipe_with_settings_from_a_users_project(project, tmp_path, tiny_base):
    """``pc.train(recipe, pool=..., dataset=..., settings={...})``: a recipe file of the
    user's, its settings as a mapping, the typed result with its ledger; a bad setting is
    one ConductorError line before anything runs."""
    rows = [{"id": f"{s}{i}", "question": f"What is {i} + {n}?", "reference": str(i + n),
             "kind": "math", "split": s} for s, n in (("train", 1), ("test", 2)) for i in range(3)]  # fmt: skip
    (project / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    recipe = {"stages": [{"kind": "collect", "questions": {"limit": 2}},
                         {"kind": "sft", "num_train_epochs": 1}]}  # fmt: skip
    (project / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    pool = {
        "conductor": {"model": f"local/{tiny_base}", "params": {"max_tokens": 16}},
        "workers": [{"name": "calculator", "kind": "tool", "model": "tool/calculator"}],
    }
    (project / "tiny.yaml").write_text(yaml.safe_dump(pool))
    code = f"""\
import json
import prefect_conductor as pc

settings = {{"base": {str(tiny_base)!r}, "heldout.limit": 1}}
try:
    pc.train("recipe.yaml", pool="tiny.yaml", settings={{"stages.sft.num_train_epochz": 1}})
except pc.ConductorError as exc:
    bad = str(exc)
result = pc.train("recipe.yaml", pool="tiny.yaml", dataset="data.jsonl", settings=settings,
                  promote=False)
print(json.dumps({{"result": result.model_dump(mode="json"), "bad": bad}}))
"""
    proc, _ = _python(project, code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bad"].startswith("recipe recipe.yaml: stage 2 (sft): num_train_epochz: Extra")
    result = out["result"]
    assert [s["stage"] for s in result["stages"]] == ["collect", "sft", "after"]
    ledger = {e["stage"]: e for e in result["ledger"]}
    assert ledger["collect"]["worker_calls"] == 2  # one worker, two training questions
    assert ledger["total"]["worker_calls"] == sum(
        e["worker_calls"] for e in result["ledger"] if e["stage"] != "total"
    )
    assert result["stages"][-1]["questions"] == 1  # heldout.limit from the settings
