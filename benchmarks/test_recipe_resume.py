"""What ``python -m benchmarks.recipe_resume`` runs and how it judges a trial (issue #40,
goal row "resume"): its recipe, data and pool, the command and its environment, the kill of
a process group at a stage of a progress file, and the checks and table; no model, no
training."""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from prefect_conductor.conductor.data.datasets import load_dataset
from prefect_conductor.conductor.pool import load_pool
from prefect_conductor.conductor.providers.tools.calculator import evaluate, format_number
from prefect_conductor.conductor.training.recipe import (
    CollectStage,
    EvalStage,
    GrpoStage,
    SelfSampleStage,
    SftStage,
)

import benchmarks.recipe_resume as bench
from benchmarks._training import write_recipe

STAGES = ["before", "collect", "warm-start", "round", "grpo", "after"]


def test_the_benchmarks_examples_hold():
    assert doctest.testmod(bench).failed == 0


def test_its_recipe_has_a_stage_of_every_kind_and_no_stage_added(tmp_path):
    from prefect_conductor.conductor.training.recipe import load_recipe

    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", bench.resume_recipe("d.jsonl", "b")))
    assert [s.name for s in recipe.stages] == STAGES  # its own "after": nothing appended
    kinds = [type(s) for s in recipe.stages]
    assert kinds == [EvalStage, CollectStage, SftStage, SelfSampleStage, GrpoStage, EvalStage]
    assert recipe.stages[0].conductor == "start" and recipe.stages[-1].conductor == "current"
    grpo = recipe.stages[4]
    assert grpo.max_steps <= 2 and grpo.per_device_train_batch_size % grpo.num_generations == 0
    assert recipe.heldout.split == "test" and recipe.dataset == "d.jsonl" and recipe.base == "b"


def test_its_questions_load_and_their_references_are_the_calculators(tmp_path):
    rows = bench.arithmetic_rows(24, 8)
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train, test = load_dataset(str(path), split="train"), load_dataset(str(path), split="test")
    assert (len(train), len(test)) == (24, 8)
    assert len({e.id for e in train + test}) == 32
    assert not {e.question for e in train} & {e.question for e in test}
    for e in train + test:
        expression = e.question.removeprefix("What is ").removesuffix("?")
        assert format_number(evaluate(expression)) == e.reference, e.question
    bare = [e for e in train if not e.question.startswith("What is")]
    assert len(bare) == 12  # the python tool's share: code it can run


def test_its_pool_plans_with_the_tiny_model_and_calls_two_real_tools(tmp_path):
    import yaml

    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(bench.pool_dict(tmp_path / "tiny")))
    pool = load_pool(path)
    assert pool.conductor.model == f"local/{tmp_path / 'tiny'}"
    assert pool.conductor.params == {"temperature": 0.0, "max_tokens": 16}
    assert [(w.name, w.model) for w in pool.workers] == [
        ("calculator", "tool/calculator"),
        ("python", "tool/python"),
    ]


def _world(tmp_path: Path) -> bench.World:
    return bench.World(
        root=tmp_path,
        base=tmp_path / "b",
        data=tmp_path / "d.jsonl",
        pool=tmp_path / "p.yaml",
        recipe=tmp_path / "r.yaml",
        stages=tuple(STAGES),
        prefect_db=tmp_path / "t.db",
    )


def test_the_command_is_the_cli_and_its_environment_is_the_homes_alone(tmp_path, monkeypatch):
    world = _world(tmp_path)
    cmd = world.command()
    assert Path(cmd[0]).name == "conductor" and cmd[1] == "train-conductor"
    assert cmd[2:] == [
        "--recipe", str(world.recipe), "--pool", str(world.pool), "--dataset",
        str(world.data), "--no-promote", "--json",
    ]  # fmt: skip
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://elsewhere:5000")
    monkeypatch.setenv("PREFECT_API_URL", "http://elsewhere:4200/api")
    monkeypatch.setenv("CONDUCTOR_ARTIFACTS", "s3://elsewhere")
    env = world.env(tmp_path / "home")
    assert env["CONDUCTOR_HOME"] == str(tmp_path / "home")
    assert env["PREFECT_HOME"].startswith(env["CONDUCTOR_HOME"])
    assert env["HF_HUB_OFFLINE"] == "1" and env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert not {"MLFLOW_TRACKING_URI", "PREFECT_API_URL", "CONDUCTOR_ARTIFACTS"} & set(env)


# A stand-in for the command: writes the progress file as a training does (no stage, then
# one more every second) and starts a child of its own, as the CLI starts Prefect's server.
_FAKE = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    from pathlib import Path
    home = Path(sys.argv[1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (home / "child.pid").write_text(str(child.pid))
    path = home / "training" / "recipes" / "abc.json"
    path.parent.mkdir(parents=True)
    for n in range(4):
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"run_id": "r", "stages": [{"name": f"s{i}"} for i in range(n)]}))
        os.replace(tmp, path)
        time.sleep(1.0)
    time.sleep(60)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (killed, not yet reaped by its dead parent's reaper) is not running
    stat = Path(f"/proc/{pid}/stat")
    return stat.is_file() and stat.read_text().split(")")[-1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups, /proc")
def test_the_kill_lands_in_the_stage_and_takes_the_whole_process_group(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _FAKE, str(tmp_path)], start_new_session=True)
    total, into = bench.kill_in_stage(proc, tmp_path, 2, delay_s=0.2)
    assert proc.returncode == -9  # SIGKILL
    assert 0.2 <= into < 1.0 and total >= 2.0
    assert [s["name"] for s in bench.read_progress(tmp_path)["stages"]] == ["s0", "s1"]
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:  # SIGKILL is delivered, not awaited
        time.sleep(0.05)
    assert not _alive(child)  # the group went, not just the command


def _counts(**stages: tuple[int, int, int]) -> dict[str, dict[str, int]]:
    return {s: {"runs": r, "worker_calls": w, "mlflow_runs": m} for s, (r, w, m) in stages.items()}


BASELINE = _counts(
    before=(8, 4, 1), collect=(12, 10, 0), **{"warm-start": (0, 0, 1)}, round=(6, 0, 1),
    grpo=(4, 0, 1), after=(8, 8, 1),
)  # fmt: skip


def _trial(index: int = 1) -> tuple[dict, dict, dict]:
    """(at_kill, after, result) of a trial killed in ``STAGES[index]`` that resumed well."""
    entries = [
        {"name": s, "ledger": {"stage": s, "worker_calls": BASELINE[s]["worker_calls"]}}
        for s in STAGES
    ]
    killed = STAGES[index]
    left = {"runs": 3, "worker_calls": 2, "mlflow_runs": 1}
    at_kill_counts = {s: BASELINE[s] for s in STAGES[:index]} | {killed: left}
    after_counts = {
        **BASELINE, killed: {k: v + left[k] for k, v in BASELINE[killed].items()}
    }  # fmt: skip
    ledger = [{"stage": s, "worker_calls": after_counts[s]["worker_calls"]} for s in STAGES]
    total = sum(e["worker_calls"] for e in ledger)
    result = {
        "run_id": "r",
        "resumed_at": killed,
        "ledger": [*ledger, {"stage": "total", "worker_calls": total}],
    }
    at_kill = {"progress": {"run_id": "r", "stages": entries[:index]}, "counts": at_kill_counts}
    after = {"progress": {"run_id": "r", "stages": entries, "finished": True},
             "counts": after_counts}  # fmt: skip
    return at_kill, after, result


def _check(at_kill, after, result, index=1, rc=0) -> dict[str, bool]:
    return bench.check_trial(STAGES, index, BASELINE, at_kill, after, rc, result)


@pytest.mark.parametrize("index", range(len(STAGES)))
def test_a_trial_that_resumed_where_it_was_killed_passes_every_check(index):
    checks = _check(*_trial(index), index=index)
    assert checks and all(checks.values()), checks


def test_a_finished_stage_that_ran_again_fails_the_trial():
    at_kill, after, result = _trial(3)
    after["counts"]["collect"] = {"runs": 24, "worker_calls": 20, "mlflow_runs": 0}
    checks = _check(at_kill, after, result, index=3)
    assert not checks["no finished stage re-ran"]
    assert not checks["work = uninterrupted + killed attempt"]
    assert bench.rerun_stages(["before", "collect"], at_kill["counts"], after["counts"]) == [
        "collect"
    ]


def test_a_sft_stage_that_trained_again_fails_the_trial():
    at_kill, after, result = _trial(3)
    after["counts"]["warm-start"] = {"runs": 0, "worker_calls": 0, "mlflow_runs": 2}
    assert not _check(at_kill, after, result, index=3)["no finished stage re-ran"]


_NONE = {"runs": 0, "worker_calls": 0, "mlflow_runs": 0}


@pytest.mark.parametrize(
    ("change", "failed"),
    [
        (lambda k, a, r: r.update(resumed_at="before"), "resumed at the stage"),
        (lambda k, a, r: r.update(resumed_at=None), "resumed at the stage"),
        (lambda k, a, r: r.update(run_id="new"), "same MLflow run"),
        (lambda k, a, r: a["progress"].update(finished=False), "resumed to the end"),
        (lambda k, a, r: k["progress"]["stages"].pop(), "killed in the stage"),
        (lambda k, a, r: r["ledger"][0].update(worker_calls=99), "finished stages kept"),
        (lambda k, a, r: r["ledger"][-1].update(worker_calls=1), "ledger = steps"),
        (lambda k, a, r: a["counts"].update(grpo=_NONE), "work = uninterrupted + killed attempt"),
    ],
)
def test_each_check_fails_on_its_own_fault(change, failed):
    at_kill, after, result = _trial(2)
    change(at_kill, after, result)
    checks = _check(at_kill, after, result, index=2)
    assert not checks[failed], checks


def test_a_failed_resume_fails_without_crashing_the_checks():
    at_kill, after, _ = _trial(1)
    checks = _check(at_kill, {"progress": None, "counts": {}}, None, rc=1)
    assert not checks["resumed to the end"] and not checks["ledger = steps"]


def _row(**changes) -> dict:
    return {
        "stage": "collect", "index": 1, "killed_into_stage_s": 2.0,
        "finished_at_kill": ["before"], "resumed_at": "collect", "run_id": "r",
        "run_id_at_kill": "r", "rerun": [], "steps_worker_calls": 24,
        "ledger_worker_calls": 24, "killed_attempt": {"runs": 2, "worker_calls": 2},
        "killed_after_s": 30.0, "resumed_wall_s": 50.0, "wall_s": 80.0,
        "checks": {"a": True, "b": True}, **changes,
    }  # fmt: skip


def test_the_table_has_the_baseline_then_one_row_per_trial_and_names_failed_checks():
    base = {"worker_calls": 22, "steps_worker_calls": 22, "wall_s": 60.0}
    good = _row()
    bad = _row(stage="after", finished_at_kill=[], rerun=["collect"], run_id="other",
               killed_attempt={"runs": 0, "worker_calls": 0, "mlflow_runs": 1},
               mlflow_left_running=["after"],
               checks={"a": True, "no finished stage re-ran": False})  # fmt: skip
    lines = bench.markdown_table(base, [good, bad]).splitlines()
    assert len(lines) == 5 and lines[2].startswith("| – (uninterrupted)")
    cells = [c.strip() for c in lines[3].strip("|").split("|")]
    assert cells == [
        "collect (2.0 s in)", "2 runs, 2 worker calls", "before", "collect", "yes", "0",
        "24 / 24 (killed attempt 2, +2 vs uninterrupted)", "30.0 + 50.0 = 80.0 / 60.0", "pass",
    ]  # fmt: skip
    cells = [c.strip() for c in lines[4].strip("|").split("|")]
    assert cells[1] == "1 MLflow stage run (still RUNNING)"
    assert cells[2] == "none" and cells[4] == "no" and cells[5] == "1 (collect)"
    assert cells[-1] == "FAIL: no finished stage re-ran"
    out = bench.summary({**base, "stage_wall_s": {"before": 1.0}}, [good, bad], 12.0)
    assert out["passed"] is False and out["stages"] == ["before"]
    assert json.loads(json.dumps(out)) == out
