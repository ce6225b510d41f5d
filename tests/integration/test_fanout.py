"""``conductor eval --fan-out`` over a fleet (issue #19): the local stack of
``deployments/stack.py`` (PostgreSQL, the S3 server, MLflow's and Prefect's servers), a
``conductor serve`` per host, each with its own home, and an eval on host 0 whose questions
the Prefect server hands to the serve processes.

What a host reads of another's work can only come through the shared services: each host is
a subprocess with that host's environment only. The serve processes and the evals load the
fake litellm provider (``tests/fakes.py``) for the ``fake/sleep-…`` worker; the calculator is
the real tool.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration import test_stack
from tests.integration.test_stack import HOST_TIMEOUT_S, ROOT, _on_host

stack = test_stack.stack  # the module's own stack of services (a module-scoped fixture)

READY_S = 180  # a serve process's start on a loaded 2-core machine
QUESTIONS = 36  # in the data set; the kill test uses them all
SLEEP_S = 2.0  # the fake worker's latency: long enough to kill a worker mid-question

# `conductor …` with the fake provider registered first (test-only workers); offline first,
# as `conductor` itself is, before litellm is imported.
CLI = (
    "import sys; from flows.quiet import offline_defaults; offline_defaults(); "
    "from tests.fakes import register_fake_provider; register_fake_provider(); "
    "from flows.cli import main; sys.argv = ['conductor', *sys.argv[1:]]; main()"
)


def _env(stack: dict[str, Any], index: int, **extra: str) -> dict[str, str]:
    env = {**os.environ, **stack["hosts"][index]["env"], **extra}
    env["PYTHONPATH"] = str(ROOT)
    env.pop("PREFECT_PROFILE", None)
    return env


class Serve:
    """One ``conductor serve`` process of the fleet."""

    def __init__(self, stack: dict[str, Any], index: int, pool: Path, home: Path | None = None):
        extra = {"CONDUCTOR_HOME": str(home)} if home else {}
        home = home or Path(stack["hosts"][index]["home"])
        home.mkdir(parents=True, exist_ok=True)
        self.log = home / f"serve-{time.monotonic_ns()}.log"
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-c", CLI, "serve", "--pool", str(pool), "--limit", "4"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_env(stack, index, **extra),
                cwd=home,
                start_new_session=True,
            )
        self.id = f"{socket.gethostname()}-{self.process.pid}"  # flows.fanout.worker_id

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_S
        while "ready in" not in self.log.read_text():
            assert self.process.poll() is None, f"serve exited: {self.log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"serve not ready: {self.log.read_text()[-2000:]}"
            time.sleep(0.5)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def fleet(stack, tmp_path_factory) -> Iterator[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("fleet")
    pool = directory / "pool.yaml"
    pool.write_text(
        yaml.safe_dump(
            {
                "conductor": {"model": "fake/plan"},
                "default_worker": "calculator",
                "workers": [
                    {"name": "calculator", "kind": "tool", "model": "tool/calculator"},
                    {"name": "sleepy", "model": f"fake/sleep-{SLEEP_S}", "retries": 0},
                ],
            }
        )
    )
    data = directory / "sums.jsonl"
    data.write_text(
        "\n".join(
            json.dumps(
                {
                    "id": f"s{i}",
                    "question": f"{i} + {2 * i}",
                    "reference": str(3 * i),
                    "kind": "math",
                }
            )
            for i in range(QUESTIONS)
        )
    )
    serves = [Serve(stack, i, pool) for i in (0, 1)]
    try:
        for serve in serves:
            serve.wait_ready()
        yield {"pool": pool, "data": data, "serves": serves, "dir": directory}
    finally:
        for serve in serves:
            serve.stop()


def _eval_args(fleet: dict[str, Any], strategy: str, limit: int) -> list[str]:
    return [
        "eval",
        "--dataset",
        str(fleet["data"]),
        "--strategy",
        strategy,
        "--pool",
        str(fleet["pool"]),
        "--limit",
        str(limit),
        "--concurrency",
        "8",
        "--json",
    ]


def _eval(stack, index: int, args: list[str]) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, "-c", CLI, *args],
        capture_output=True,
        text=True,
        timeout=HOST_TIMEOUT_S,
        env=_env(stack, index),
        cwd=stack["hosts"][index]["home"],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr


def _rows(stack, eval_id: str) -> list[dict[str, Any]]:
    """The eval's runs as host 1 reads them from the shared store (S3)."""
    return _on_host(
        stack,
        1,
        f"""
        import json, os
        from conductor.data.store import ArtifactStore

        store = ArtifactStore(os.environ["CONDUCTOR_ARTIFACTS"])
        runs = store.read_pandas("runs")
        rows = []
        for run_id, qid, tags, correct in zip(
            runs["run_id"], runs["question_id"], runs["tags"], runs["correct"]
        ):
            tags = dict(tags)
            if tags.get("eval_id") == "{eval_id}":
                rows.append({{"run_id": run_id, "question_id": qid, "correct": bool(correct),
                              "served_by": tags.get("served_by")}})
        print(json.dumps({{"rows": rows, "root": store.root}}))
        """,
    )["rows"]


def test_an_eval_fans_out_over_two_hosts_into_one_store_and_one_mlflow_run(stack, fleet):
    fanned, err = _eval(stack, 0, [*_eval_args(fleet, "single:calculator", 16), "--fan-out"])
    here, _ = _eval(stack, 1, _eval_args(fleet, "single:calculator", 16))  # in-process
    assert (fanned["n"], fanned["correct"], fanned["failed"]) == (16, 16, 0)
    assert (here["n"], here["correct"]) == (fanned["n"], fanned["correct"])
    assert "Traceback" not in err

    rows = _rows(stack, fanned["eval_id"])
    assert sorted(r["question_id"] for r in rows) == sorted(f"s{i}" for i in range(16))
    assert len({r["run_id"] for r in rows}) == 16 and all(r["correct"] for r in rows)
    # Both hosts' serve processes answered, and no question ran on the eval's host itself.
    served = Counter(r["served_by"] for r in rows)
    assert set(served) == {s.id for s in fleet["serves"]}, served

    tracked = _on_host(
        stack,
        1,
        f"""
        import json
        import mlflow
        from tasks.tracking import tracking_uri

        client = mlflow.MlflowClient(tracking_uri())
        experiment = client.get_experiment_by_name("{fanned["mlflow_experiment"]}")
        runs = client.search_runs([experiment.experiment_id])
        print(json.dumps([
            [r.info.run_id, r.data.metrics.get("accuracy"), r.data.params.get("strategy")]
            for r in runs
        ]))
        """,
    )
    mine = [r for r in tracked if r[0] == fanned["mlflow_run_id"]]
    assert mine == [[fanned["mlflow_run_id"], 1.0, "single:calculator"]]
    assert here["mlflow_run_id"] in {r[0] for r in tracked}  # the same tracking server


def _running_on(stack, worker: str) -> int:
    """How many task runs are Running on ``worker`` (``question <id> on <worker>``), from the
    Prefect server's REST API (a host subprocess per look would be too slow to catch one)."""
    import httpx

    filters = {
        "task_runs": {
            "name": {"like_": f" on {worker}"},
            "state": {"type": {"any_": ["RUNNING"]}},
        }
    }
    api = stack["hosts"][1]["env"]["PREFECT_API_URL"]
    answer = httpx.post(f"{api}/task_runs/filter", json=filters, timeout=30)
    answer.raise_for_status()
    return len(answer.json())


def test_a_killed_worker_loses_no_question_and_stores_none_twice(stack, fleet):
    victim = Serve(stack, 1, fleet["pool"], home=fleet["dir"] / "victim-home")
    try:
        victim.wait_ready()
        args = [*_eval_args(fleet, "single:sleepy", QUESTIONS), "--fan-out"]
        out = fleet["dir"] / "killed.json"
        with out.open("w") as stdout:
            evaluation = subprocess.Popen(
                [sys.executable, "-c", CLI, *args],
                stdout=stdout,
                stderr=subprocess.PIPE,
                text=True,
                env=_env(stack, 0),
                cwd=stack["hosts"][0]["home"],
            )
        deadline = time.monotonic() + HOST_TIMEOUT_S
        while _running_on(stack, victim.id) == 0:
            assert evaluation.poll() is None, "the eval ended before the victim took a question"
            assert time.monotonic() < deadline, "the victim never ran a question"
            time.sleep(0.3)
        victim.kill()  # mid-question: its task runs stay Running on the server
        _, err = evaluation.communicate(timeout=HOST_TIMEOUT_S)
        assert evaluation.returncode == 0, err[-3000:]
    finally:
        victim.kill()
    result = json.loads(out.read_text())
    assert (result["n"], result["failed"]) == (QUESTIONS, 0), err[-3000:]
    # The victim's questions went to the others, and the terminal said so.
    assert f"conductor serve {victim.id} stopped; sending it again" in err, err[-3000:]

    rows = _rows(stack, result["eval_id"])
    qids = [r["question_id"] for r in rows]
    assert sorted(qids) == sorted(f"s{i}" for i in range(QUESTIONS))  # none lost, none twice
    assert len({r["run_id"] for r in rows}) == QUESTIONS
    survivors = {s.id for s in fleet["serves"]}
    assert {r["served_by"] for r in rows} <= survivors | {victim.id}
    assert {r["served_by"] for r in rows} & survivors
