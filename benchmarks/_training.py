"""Training from a benchmark: ``conductor train-conductor --recipe … --set … --json`` (issue #40).

A benchmark that needs a trained conductor runs the command a user runs, in a subprocess of
this environment (so the training is timed as one command and its stages resume as the CLI's
do), and reads back its ``--json`` result: the adapter (``adapter_uri``), the stages and the
cost ``ledger``. What an old option did that no recipe field does is a recipe file the
benchmark writes (:func:`write_recipe`) or a ``--set``. The ledger's worker calls are checked
against the ``steps`` table of the same home (:func:`steps_worker_calls`), read with pyarrow,
not by the ledger's own code.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent


def train_command(
    recipe: str | Path, sets: list[str] | tuple[str, ...] = (), *extra: str
) -> list[str]:
    """The ``conductor train-conductor`` command line of a recipe (a built-in name or a file)
    with ``--set KEY=VALUE`` overrides and ``extra`` options (``--no-promote``, ``--pool …``).

    >>> train_command("grpo", ["stages.grpo.max_steps=0"], "--no-promote")[2:]
    ['--recipe', 'grpo', '--set', 'stages.grpo.max_steps=0', '--no-promote', '--json']
    """
    conductor = str(Path(sys.executable).with_name("conductor"))  # the CLI of this environment
    cmd = [conductor, "train-conductor", "--recipe", str(recipe)]
    for item in sets:
        cmd += ["--set", item]
    return [*cmd, *extra, "--json"]


def run_training(
    recipe: str | Path, sets: list[str] | tuple[str, ...] = (), extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Run one training (its progress on this process's stderr); its ``--json`` result, plus
    ``command_wall_s``: the whole command as a user would time it."""
    cmd = train_command(recipe, sets, *extra)
    print("running " + " ".join(cmd[1:]), file=sys.stderr)
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"train-conductor --recipe {recipe} failed ({done.returncode})")
    result = json.loads(done.stdout)
    result["command_wall_s"] = round(time.perf_counter() - started, 1)
    return result


def write_recipe(path: Path, recipe: dict[str, Any]) -> Path:
    """A recipe file the benchmark writes, validated before anything runs (one line naming
    the stage and the field, as ``conductor recipes FILE`` would print)."""
    from prefect_conductor.conductor.training.recipe import load_recipe

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    load_recipe(path)
    return path


def ledger_total(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``total`` entry of a ``train-conductor --json`` result's ledger (None if absent).

    >>> ledger_total({"ledger": [{"stage": "collect", "worker_calls": 3},
    ...                          {"stage": "total", "worker_calls": 3}]})["worker_calls"]
    3
    """
    ledger = (result or {}).get("ledger") or []
    return next((e for e in ledger if e.get("stage") == "total"), None)


def steps_worker_calls(train_run: str) -> int:
    """Rows of the ``steps`` table that called a worker (not ``skipped``) in runs tagged
    ``train_run``: what the ledger's total ``worker_calls`` must equal on a fresh store."""
    from prefect_conductor.conductor.data.store import ArtifactStore

    store = ArtifactStore()
    runs = store.read_pandas("runs", columns=["run_id", "tags"])
    ids = {
        run_id
        for run_id, tags in zip(runs["run_id"], runs["tags"], strict=True)
        if dict(tags if tags is not None else []).get("train_run") == train_run
    }
    steps = store.read_pandas("steps", columns=["run_id", "status"])
    return int((steps["run_id"].isin(ids) & (steps["status"] != "skipped")).sum())
