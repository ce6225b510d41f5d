"""A training recipe killed in each stage in turn resumes there (issue #40, goal row "resume").

Measured with real SIGKILLs of the real command, offline, on the CPU. In a fresh
``CONDUCTOR_HOME`` per trial it runs ``conductor train-conductor --recipe FILE --pool POOL
--dataset DATA --no-promote --json`` as a subprocess in its own session (the kill reaches the
command and Prefect's temporary server together):

- **baseline**: the recipe once, uninterrupted: its ledger, each stage's wall, and per stage
  the store's runs, their ``steps`` rows and the MLflow stage runs;
- **trial i** (one per stage, the first included): the same command, killed with SIGKILL of
  its process group *inside* stage i, then the same command again, to the end.

When to kill: the progress file (``$CONDUCTOR_HOME/training/recipes/<digest>.json``,
rewritten atomically after each finished stage) is polled every 0.1 s until it lists i
finished stages; the flow starts stage i right after that write (stage 0: right after the
file is first written, with none). The kill then waits a seeded fraction (0.25-0.75) of the
baseline's wall for stage i, so it lands in the stage's middle, whatever its kind: no
stage-specific sign is needed, and an SFT (no rows until it ends) is killed as surely as a
collect. A kill that missed (more stages finished once the process is dead) fails a check.
What the killed attempt left (rows, worker calls, MLflow stage run) is reported.

Checks, read from the home's own stores (``runs``/``steps`` Parquet with pyarrow, the MLflow
child runs of the training run), not by the ledger's code:

- the kill landed in stage i; the second command exits 0 with its progress file finished,
  ``resumed_at`` = stage i, in the same MLflow run (``run_id`` of the file at the kill);
- no finished stage ran again: its runs, worker calls and MLflow stage runs are what they
  were at the kill, and its progress entry and ledger row are the ones written before it;
- every stage's work equals the uninterrupted run's, plus, for stage i, what its killed
  attempt left (it reruns from its start; later stages run once);
- each stage's ledger ``worker_calls`` equals the ``steps`` rows of its runs (the killed
  stage's counts both attempts, as ``conductor/training/ledger.py`` says), and so does the
  total.

Each home starts with a migrated, empty Prefect database (a template migrated once with
``prefect server database upgrade``): a new home's first server start spends most of a
minute on migrations here, which says nothing about resuming and would swamp the walls.

The world (in ``--home DIR`` or a temporary directory; nothing downloaded): a tiny random
Llama with SmolLM2's tokenizer (as ``tests/conftest.py``'s ``tiny_base``), a JSONL of
arithmetic questions, a pool whose conductor is that model (greedy, 16 tokens) and whose
workers are the real ``calculator`` and ``python`` tools; a recipe with a stage of every kind.

    python -m benchmarks.recipe_resume [--stages 0,3] [--home DIR] [--seed 0] [--json]

Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks._training import ROOT, train_command, write_recipe
from prefect_conductor.testing.tiny import build_tiny_base

POLL_S = 0.1
KILL_FRACTION = (0.25, 0.75)  # of the baseline's stage wall: a kill in the stage's middle
COMMAND_TIMEOUT_S = 1800


# --- the world -------------------------------------------------------------------------------


def arithmetic_rows(train: int, test: int, seed: int = 0) -> list[dict[str, Any]]:
    """Questions with their references: every other one a bare expression (the python tool
    runs it) and the rest "What is …?" (the calculator's only).

    >>> rows = arithmetic_rows(2, 1)
    >>> [(r["id"], r["split"]) for r in rows]
    [('train-0', 'train'), ('train-1', 'train'), ('test-0', 'test')]
    >>> all(r["kind"] == "math" for r in rows)
    True
    """
    rng = random.Random(seed)
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    rows = []
    for split, n in (("train", train), ("test", test)):
        for i in range(n):
            a, b, op = rng.randint(2, 60), rng.randint(2, 30), rng.choice(sorted(ops))
            expression = f"{a} {op} {b}"
            question = expression if i % 2 else f"What is {expression}?"
            rows.append(
                {"id": f"{split}-{i}", "question": question, "reference": str(ops[op](a, b)),
                 "kind": "math", "split": split}
            )  # fmt: skip
    return rows


def pool_dict(base: Path) -> dict[str, Any]:
    """The pool: the tiny model plans (greedy, 16 tokens: cheap), two real tools answer."""
    return {
        "conductor": {
            "model": f"local/{base}",
            "params": {"temperature": 0.0, "max_tokens": 16},
        },
        "workers": [
            {"name": "calculator", "kind": "tool", "model": "tool/calculator"},
            {"name": "python", "kind": "tool", "model": "tool/python"},
        ],
    }


def resume_recipe(data: Path | str, base: Path | str, heldout: int = 8) -> dict[str, Any]:
    """A stage of every kind, each a few seconds on the CPU with the tiny model."""
    return {
        "name": "resume-bench",
        "description": "benchmarks/recipe_resume.py: a stage of every kind, tiny.",
        "dataset": str(data),
        "base": str(base),
        "heldout": {"split": "test", "limit": heldout},
        "seed": 0,
        "stages": [
            {"kind": "eval", "name": "before", "conductor": "start"},
            {"kind": "collect", "name": "collect", "questions": {"limit": 6}},
            {"kind": "sft", "name": "warm-start", "num_train_epochs": 1, "max_examples": 8},
            {"kind": "self-sample", "name": "round", "questions": {"limit": 3},
             "num_generations": 2,
             "sft": {"init": "previous", "num_train_epochs": 1, "max_examples": 8}},
            {"kind": "grpo", "name": "grpo", "max_steps": 2, "num_generations": 2,
             "per_device_train_batch_size": 2, "max_completion_length": 16,
             "questions": {"limit": 4, "fresh": False}},
            {"kind": "eval", "name": "after"},
        ],
    }  # fmt: skip


@dataclass(frozen=True)
class World:
    root: Path
    base: Path
    data: Path
    pool: Path
    recipe: Path
    stages: tuple[str, ...]
    prefect_db: Path  # a migrated, empty Prefect database, copied into every home

    def command(self) -> list[str]:
        extra = ("--pool", str(self.pool), "--dataset", str(self.data), "--no-promote")
        return train_command(self.recipe, (), *extra)

    def env(self, home: Path) -> dict[str, str]:
        """This process's environment, offline, with every home-bound setting on ``home``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
        env.update(
            CONDUCTOR_HOME=str(home),
            CONDUCTOR_CACHE=str(self.root / "cache"),
            PREFECT_HOME=str(home / "prefect-home"),
            LITELLM_LOCAL_MODEL_COST_MAP="True",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        return env


# A user's tracking server, Prefect server, profile or store would be written to otherwise.
_NOT_INHERITED = (
    "MLFLOW_TRACKING_URI",
    "CONDUCTOR_ARTIFACTS",
    "PREFECT_API_URL",
    "PREFECT_PROFILE",
    "PREFECT_SERVER_DATABASE_CONNECTION_URL",
)


def build_world(root: Path, train: int = 24, test: int = 8) -> World:
    from prefect_conductor.conductor.training.recipe import load_recipe

    root.mkdir(parents=True, exist_ok=True)
    base = build_tiny_base(root / "tiny-base")
    data = root / "arithmetic.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in arithmetic_rows(train, test)))
    pool = root / "pool.yaml"
    pool.write_text(yaml.safe_dump(pool_dict(base), sort_keys=False))
    recipe = write_recipe(root / "recipe.yaml", resume_recipe(data, base))
    stages = tuple(s.name for s in load_recipe(recipe).stages)
    db = root / "prefect-template.db"
    if not db.is_file():
        prefect = str(Path(sys.executable).with_name("prefect"))
        env = World(root, base, data, pool, recipe, stages, db).env(root / "template-home")
        env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{db}"
        env.update(DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
        subprocess.run(
            [prefect, "server", "database", "upgrade", "-y"],
            env=env, check=True, capture_output=True, timeout=600,
        )  # fmt: skip
    return World(root, base, data, pool, recipe, stages, db)


# --- one command -----------------------------------------------------------------------------


def new_home(world: World, name: str) -> Path:
    home = world.root / name
    shutil.rmtree(home, ignore_errors=True)
    (home / "prefect").mkdir(parents=True)
    shutil.copyfile(world.prefect_db, home / "prefect" / "prefect.db")
    return home


def start(world: World, home: Path, tag: str) -> subprocess.Popen:
    """The command, in its own session (its process group is the command and its server)."""
    out = (home / f"{tag}.stdout").open("wb")
    err = (home / f"{tag}.stderr").open("wb")
    return subprocess.Popen(
        world.command(), cwd=ROOT, env=world.env(home), stdout=out, stderr=err,
        start_new_session=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen, home: Path, tag: str) -> tuple[int, dict[str, Any] | None]:
    """Wait for the command; its exit status and ``--json`` result (None if it failed)."""
    try:
        rc = proc.wait(timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill(proc)
        rc = -signal.SIGKILL
    text = (home / f"{tag}.stdout").read_text().strip()
    try:
        return rc, json.loads(text.splitlines()[-1]) if rc == 0 and text else None
    except json.JSONDecodeError:
        return rc, None


def kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def read_progress(home: Path) -> dict[str, Any] | None:
    """The training's progress file (a fresh home holds one), or None before it is written."""
    files = sorted((home / "training" / "recipes").glob("*.json"))
    if not files:
        return None
    try:
        return json.loads(files[0].read_text())
    except (FileNotFoundError, json.JSONDecodeError):  # replaced between glob and read
        return None


def kill_delay(seed: int, index: int, stage_wall_s: float) -> float:
    """Seconds into stage ``index`` to kill it: a seeded fraction of its baseline wall.

    >>> kill_delay(0, 2, 10.0) == kill_delay(0, 2, 10.0)
    True
    >>> 2.5 <= kill_delay(0, 2, 10.0) <= 7.5
    True
    """
    return random.Random(seed * 1000 + index).uniform(*KILL_FRACTION) * stage_wall_s


def kill_in_stage(
    proc: subprocess.Popen, home: Path, index: int, delay_s: float
) -> tuple[float, float]:
    """SIGKILL the command ``delay_s`` into stage ``index``. Returns (seconds since the
    command started, seconds into the stage) at the kill."""
    started = time.perf_counter()
    while True:
        progress = read_progress(home)
        if progress is not None and len(progress["stages"]) >= index:
            break
        if proc.poll() is not None or time.perf_counter() - started > COMMAND_TIMEOUT_S:
            raise RuntimeError(f"the command ended (rc {proc.poll()}) before stage {index}")
        time.sleep(POLL_S)
    entered = time.perf_counter()
    time.sleep(delay_s)
    kill(proc)
    now = time.perf_counter()
    return now - started, now - entered


# --- what the home's stores say ---------------------------------------------------------------

_NONE = {"runs": 0, "worker_calls": 0, "mlflow_runs": 0}


def stage_counts(
    runs: Any, steps: Any, stage_runs: list[str], train_run: str
) -> dict[str, dict[str, int]]:
    """Per stage: the store's ``runs`` rows tagged with the training and the stage, their
    ``steps`` rows that called a worker (not ``skipped``), and MLflow stage runs (the
    ``stage`` tags of the training run's child runs, one item per run).

    >>> import pandas as pd
    >>> runs = pd.DataFrame({"run_id": ["a", "b", "c"], "tags": [
    ...     [("train_run", "T"), ("train_stage", "collect")],
    ...     {"train_run": "T", "train_stage": "collect"}, {"train_run": "U"}]})
    >>> steps = pd.DataFrame({"run_id": ["a", "a", "b", "c"],
    ...                       "status": ["ok", "skipped", "failed", "ok"]})
    >>> stage_counts(runs, steps, ["before", "collect"], "T")["collect"]
    {'runs': 2, 'worker_calls': 2, 'mlflow_runs': 1}
    """
    by_stage: dict[str, set[str]] = {}
    for run_id, tags in zip(runs["run_id"], runs["tags"], strict=True):
        t = dict(tags.items() if isinstance(tags, dict) else (tags if tags is not None else []))
        if t.get("train_run") == train_run:
            by_stage.setdefault(t.get("train_stage", ""), set()).add(run_id)
    called = steps[steps["status"] != "skipped"]["run_id"]
    counts: dict[str, dict[str, int]] = {}
    for stage in sorted(set(by_stage) | set(stage_runs)):
        ids = by_stage.get(stage, set())
        counts[stage] = {
            "runs": len(ids),
            "worker_calls": int(called.isin(ids).sum()),
            "mlflow_runs": stage_runs.count(stage),
        }
    return counts


def read_stores(home: Path, train_run: str) -> dict[str, Any]:
    """``counts``: :func:`stage_counts` of ``home`` (Parquet with pyarrow, MLflow's sqlite
    store); ``running``: the stages of the training's MLflow stage runs still RUNNING."""
    import mlflow
    import pandas as pd
    from prefect_conductor.conductor.data.store import ArtifactStore

    store = ArtifactStore(home / "artifacts")
    try:
        runs = store.read_pandas("runs", columns=["run_id", "tags"])
        steps = store.read_pandas("steps", columns=["run_id", "status"])
    except Exception:  # noqa: BLE001 - no table yet: a kill before any row
        runs = pd.DataFrame({"run_id": [], "tags": []})
        steps = pd.DataFrame({"run_id": [], "status": []})
    client = mlflow.MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    children = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string=f"tags.mlflow.parentRunId = '{train_run}'",
        max_results=10_000,
    )
    stage_runs = [r.data.tags.get("stage", "") for r in children]
    return {
        "counts": stage_counts(runs, steps, stage_runs, train_run),
        "running": sorted(r.data.tags.get("stage", "") for r in children
                          if r.info.status == "RUNNING"),
    }  # fmt: skip


# --- the checks (pure) ------------------------------------------------------------------------


def expected_counts(
    stages: list[str],
    index: int,
    baseline: dict[str, dict[str, int]],
    at_kill: dict[str, dict[str, int]],
) -> dict[str, dict[str, int]]:
    """What each stage should hold after the resume: the uninterrupted run's, plus, for the
    killed stage ``index``, what its killed attempt left (it runs again from its start).

    >>> expected_counts(["a", "b"], 1, {"a": {"runs": 2}, "b": {"runs": 4}},
    ...                 {"a": {"runs": 2}, "b": {"runs": 1}})
    {'a': {'runs': 2}, 'b': {'runs': 5}}
    """
    out = {}
    for i, stage in enumerate(stages):
        base = baseline.get(stage, _NONE)
        left = at_kill.get(stage, _NONE) if i == index else {}
        out[stage] = {k: v + left.get(k, 0) for k, v in base.items()}
    return out


def check_trial(
    stages: list[str],
    index: int,
    baseline: dict[str, dict[str, int]],
    at_kill: dict[str, Any],
    after: dict[str, Any],
    rc: int,
    result: dict[str, Any] | None,
) -> dict[str, bool]:
    """The checks of one trial. ``baseline``: the uninterrupted run's :func:`stage_counts`;
    ``at_kill``/``after``: ``progress`` (the progress file) and ``counts`` when the command
    was killed and when the second one ended; ``result``: the second command's ``--json``
    (None if it failed)."""
    before, done = at_kill["progress"] or {}, after["progress"] or {}
    finished = [s["name"] for s in before.get("stages", [])]
    result = result or {}
    ledger = {e["stage"]: e for e in result.get("ledger", [])}
    counts = after["counts"]
    expected = expected_counts(stages, index, baseline, at_kill["counts"])
    return {
        "killed in the stage": finished == stages[:index],
        "resumed to the end": rc == 0 and bool(done.get("finished")) and bool(result),
        "resumed at the stage": result.get("resumed_at") == stages[index],
        "same MLflow run": bool(before) and result.get("run_id") == before.get("run_id"),
        "finished stages kept": done.get("stages", [])[: len(finished)] == before.get("stages")
        and all(ledger.get(s["name"]) == s["ledger"] for s in before.get("stages", [])),
        "no finished stage re-ran": not rerun_stages(finished, at_kill["counts"], counts),
        "work = uninterrupted + killed attempt": {s: counts.get(s, _NONE) for s in stages}
        == expected,
        "ledger = steps": bool(ledger)
        and all(
            e["worker_calls"] == counts.get(name, _NONE)["worker_calls"]
            for name, e in ledger.items()
            if name != "total"
        )
        and ledger["total"]["worker_calls"] == sum(c["worker_calls"] for c in counts.values()),
    }


def rerun_stages(
    finished: list[str], at_kill: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
) -> list[str]:
    """Finished stages with more runs, worker calls or MLflow stage runs after the resume
    than at the kill.

    >>> rerun_stages(["a", "b"], {"a": {"runs": 2}, "b": {"runs": 0}},
    ...              {"a": {"runs": 2}, "b": {"runs": 1}, "c": {"runs": 5}})
    ['b']
    """
    return [s for s in finished if after.get(s, _NONE) != at_kill.get(s, _NONE)]


# --- the trials ---------------------------------------------------------------------------------


def run_baseline(world: World) -> dict[str, Any]:
    home = new_home(world, "baseline")
    started = time.perf_counter()
    rc, result = finish(start(world, home, "run"), home, "run")
    wall = time.perf_counter() - started
    if result is None:
        raise SystemExit(f"the uninterrupted training failed (rc {rc}); see {home}/run.stderr")
    stores = read_stores(home, result["run_id"])
    ledger = {e["stage"]: e for e in result["ledger"]}
    return {
        "home": str(home),
        "run_id": result["run_id"],
        "wall_s": round(wall, 1),
        "stage_wall_s": {s: ledger[s]["wall_s"] for s in world.stages},
        "worker_calls": ledger["total"]["worker_calls"],
        "steps_worker_calls": sum(c["worker_calls"] for c in stores["counts"].values()),
        "ledger": result["ledger"],
        "counts": stores["counts"],
    }


def run_trial(world: World, index: int, baseline: dict[str, Any], seed: int) -> dict[str, Any]:
    stage = world.stages[index]
    home = new_home(world, f"kill-{index}-{stage}")
    delay = kill_delay(seed, index, baseline["stage_wall_s"][stage])
    killed_s, into_s = kill_in_stage(start(world, home, "killed"), home, index, delay)
    progress = read_progress(home)
    run_id = (progress or {}).get("run_id", "")
    at_kill = {"progress": progress, **read_stores(home, run_id)}
    started = time.perf_counter()
    rc, result = finish(start(world, home, "resumed"), home, "resumed")
    resumed_s = time.perf_counter() - started
    after = {"progress": read_progress(home), **read_stores(home, run_id)}
    stages = list(world.stages)
    checks = check_trial(stages, index, baseline["counts"], at_kill, after, rc, result)
    finished = [s["name"] for s in (progress or {}).get("stages", [])]
    total = next((e for e in (result or {}).get("ledger", []) if e["stage"] == "total"), None)
    return {
        "stage": stage,
        "index": index,
        "home": str(home),
        "kill_delay_s": round(delay, 1),
        "killed_after_s": round(killed_s, 1),
        "killed_into_stage_s": round(into_s, 1),
        "finished_at_kill": finished,
        "killed_attempt": at_kill["counts"].get(stage, _NONE),
        "rc": rc,
        "resumed_at": (result or {}).get("resumed_at"),
        "run_id_at_kill": run_id,
        "run_id": (result or {}).get("run_id"),
        "rerun": rerun_stages(finished, at_kill["counts"], after["counts"]),
        "ledger_worker_calls": total["worker_calls"] if total else None,
        "steps_worker_calls": sum(c["worker_calls"] for c in after["counts"].values()),
        "mlflow_left_running": after["running"],
        "resumed_wall_s": round(resumed_s, 1),
        "wall_s": round(killed_s + resumed_s, 1),
        "counts": after["counts"],
        "checks": checks,
    }


# --- output -------------------------------------------------------------------------------------


def markdown_table(baseline: dict[str, Any], trials: list[dict[str, Any]]) -> str:
    """One row per trial under the uninterrupted baseline's."""
    head = [
        "| stage killed | the killed attempt left | finished before kill | resumed at "
        "| same MLflow run | finished stages re-run | worker calls: steps / ledger "
        "| wall s: killed + resumed / uninterrupted | checks |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| – (uninterrupted) | – | – | – | – | – | {baseline['steps_worker_calls']} / "
        f"{baseline['worker_calls']} | {baseline['wall_s']} | – |",
    ]
    rows = []
    for t in trials:
        failed = [name for name, ok in t["checks"].items() if not ok]
        extra = (t["ledger_worker_calls"] or 0) - baseline["worker_calls"]
        rows.append(
            f"| {t['stage']} ({t['killed_into_stage_s']} s in) | {_left(t)} "
            f"| {', '.join(t['finished_at_kill']) or 'none'} | {t['resumed_at'] or '–'} "
            f"| {'yes' if t['run_id'] and t['run_id'] == t['run_id_at_kill'] else 'no'} "
            f"| {len(t['rerun'])}{' (' + ', '.join(t['rerun']) + ')' if t['rerun'] else ''} "
            f"| {t['steps_worker_calls']} / {t['ledger_worker_calls']} (killed attempt "
            f"{t['killed_attempt']['worker_calls']}, {extra:+d} vs uninterrupted) "
            f"| {t['killed_after_s']} + {t['resumed_wall_s']} = {t['wall_s']} / "
            f"{baseline['wall_s']} | {'pass' if not failed else 'FAIL: ' + '; '.join(failed)} |"
        )
    return "\n".join(head + rows)


def _left(trial: dict[str, Any]) -> str:
    """What the killed attempt of a trial left in the stores."""
    left = trial["killed_attempt"]
    parts = [f"{left[k]} {what}" for k, what in _LEFT if left.get(k)]
    if left.get("mlflow_runs") and trial["stage"] in trial.get("mlflow_left_running", []):
        parts[-1] += " (still RUNNING)"
    return ", ".join(parts) or "nothing stored"


_LEFT = (("runs", "runs"), ("worker_calls", "worker calls"), ("mlflow_runs", "MLflow stage run"))


def summary(baseline: dict[str, Any], trials: list[dict[str, Any]], wall_s: float) -> dict:
    return {
        "stages": list(baseline["stage_wall_s"]),
        "baseline": baseline,
        "trials": trials,
        "passed": all(all(t["checks"].values()) for t in trials),
        "wall_s": round(wall_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", help="kill only in these stages (indices, e.g. 0,3)")
    ap.add_argument("--home", type=Path, help="build and keep it all here (default: a temp dir)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill delays")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="recipe-resume-") as tmp:
        world = build_world(args.home or Path(tmp))
        chosen = (
            [int(i) for i in args.stages.split(",")] if args.stages else range(len(world.stages))
        )
        baseline = run_baseline(world)
        print(f"baseline: {baseline['wall_s']} s, stages {baseline['stage_wall_s']}",
              file=sys.stderr)  # fmt: skip
        trials = []
        for i in chosen:
            trials.append(run_trial(world, i, baseline, args.seed))
            t = trials[-1]
            print(f"killed in {t['stage']}: {t['checks']}", file=sys.stderr)
    out = summary(baseline, trials, time.perf_counter() - started)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"recipe stages: {', '.join(world.stages)}; wall {out['wall_s']} s")
        print(markdown_table(baseline, trials))
        for t in trials:
            if t["mlflow_left_running"]:
                print(f"killed in {t['stage']}: MLflow stage runs left RUNNING after the "
                      f"resume: {', '.join(t['mlflow_left_running'])}")  # fmt: skip
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
