"""``conductor eval --fan-out`` over a fleet (issue #19): the local stack of
``deployments/stack.py`` (PostgreSQL, the S3 server, MLflow's and Prefect's servers), a
``conductor serve`` per host, each with its own home, and an eval on host 0 whose questions
the Prefect server hands to the serve processes.

What a host reads of another's work can only come through the shared services: each host is
a subprocess with that host's environment only (``prefect_conductor.testing.fleet``). The
``sleepy`` worker is the fake provider's ``fake/sleep-…``; the calculator is the real tool.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from prefect_conductor.testing.fleet import (
    CLI,
    Serve,
    conductor,
    eval_args,
    eval_rows,
    host_env,
    kill_mid_question,
    on_host,
    subscribed_workers,
    tagged_rows,
    write_pool,
)
from tests.integration import test_stack
from tests.integration.test_stack import HOST_TIMEOUT_S

stack = test_stack.stack  # the module's own stack of services (a module-scoped fixture)

QUESTIONS = 36  # in the data set; the kill test uses them all
SLEEP_S = 2.0  # the fake worker's latency: long enough to kill a worker mid-question
SERVE_LIMIT = 2  # questions a fleet serve runs at once (the eval sends 8)


@pytest.fixture(scope="module")
def fleet(stack, tmp_path_factory) -> Iterator[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("fleet")
    pool = write_pool(directory / "pool.yaml", SLEEP_S)
    data = directory / "sums.jsonl"
    rows = (
        {"id": f"s{i}", "question": f"{i} + {2 * i}", "reference": str(3 * i), "kind": "math"}
        for i in range(QUESTIONS)
    )
    data.write_text("\n".join(json.dumps(row) for row in rows))
    # Questions that take the sleepy worker's latency, sent 8 at a time (``eval_args``) to
    # serves that run SERVE_LIMIT at once: a serve holds at most SERVE_LIMIT + 1 (Prefect's
    # subscription acknowledges one more while the limiter is full), so however the server
    # orders its subscribers, some of the 8 wait in its queue for the other serve (instant
    # calculator questions all went to one serve once, under load; with --limit 4, 16 slept
    # questions did too, twice in CI).
    slow = directory / "slept.jsonl"
    slow.write_text(
        "\n".join(
            json.dumps(
                {
                    "id": f"s{i}",
                    "question": f"wait {i}",
                    "reference": f"slept {SLEEP_S}",
                    "kind": "text",
                }
            )
            for i in range(16)
        )
    )
    serves = [Serve(host, pool, limit=SERVE_LIMIT) for host in stack["hosts"][:2]]
    try:
        for serve in serves:
            serve.wait_ready()
        yield {"pool": pool, "data": data, "slow": slow, "serves": serves, "dir": directory}
    finally:
        for serve in serves:
            serve.stop()


def _logs(fleet: dict[str, Any]) -> str:
    """The fleet serves' log tails and the task workers the Prefect server lists: what a
    failure of the fan-out needs to be read."""
    serves = fleet["serves"]
    listed = subscribed_workers(serves[0].api_url)
    tails = "\n".join(f"--- {s.id} ---\n{s.log.read_text()[-1500:]}" for s in serves)
    return f"listed: {listed}\n{tails}"


def _eval_args(fleet: dict[str, Any], strategy: str, limit: int, data: str = "data") -> list[str]:
    return eval_args(str(fleet[data]), strategy, fleet["pool"], limit)


def test_an_eval_fans_out_over_two_hosts_into_one_store_and_one_mlflow_run(stack, fleet):
    first, second = stack["hosts"][:2]
    fanned = conductor(first, *_eval_args(fleet, "single:sleepy", 16, "slow"))
    here = conductor(second, *_eval_args(fleet, "single:sleepy", 16, "slow")[:-1])  # in-process
    assert (fanned["n"], fanned["correct"], fanned["failed"]) == (16, 16, 0)
    assert (here["n"], here["correct"]) == (fanned["n"], fanned["correct"])

    rows = eval_rows(second, fanned["eval_id"])
    assert sorted(r["question_id"] for r in rows) == sorted(f"s{i}" for i in range(16))
    assert len({r["run_id"] for r in rows}) == 16 and all(r["correct"] for r in rows)
    # Both hosts' serve processes answered, and no question ran on the eval's host itself.
    served = Counter(r["served_by"] for r in rows)
    assert set(served) == {s.id for s in fleet["serves"]}, (served, _logs(fleet))

    tracked = on_host(
        second,
        f"""
        import json
        import mlflow
        from prefect_conductor.tasks.tracking import tracking_uri

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
    assert mine == [[fanned["mlflow_run_id"], 1.0, "single:sleepy"]]
    assert here["mlflow_run_id"] in {r[0] for r in tracked}  # the same tracking server


def test_a_killed_worker_loses_no_question_and_stores_none_twice(stack, fleet):
    first, second = stack["hosts"][:2]
    victim = Serve(second, fleet["pool"], home=fleet["dir"] / "victim-home")
    try:
        victim.wait_ready()
        args = [*_eval_args(fleet, "single:sleepy", QUESTIONS), "--json"]
        out = fleet["dir"] / "killed.json"
        with out.open("w") as stdout:
            evaluation = subprocess.Popen(
                [sys.executable, "-c", CLI, *args],
                stdout=stdout,
                stderr=subprocess.PIPE,
                text=True,
                env=host_env(first),
                cwd=first["home"],
            )
        kill_mid_question(victim, first["env"]["PREFECT_API_URL"], evaluation, HOST_TIMEOUT_S)
        _, err = evaluation.communicate(timeout=HOST_TIMEOUT_S)
        assert evaluation.returncode == 0, err[-3000:]
    finally:
        victim.kill()
    result = json.loads(out.read_text())
    assert (result["n"], result["failed"]) == (QUESTIONS, 0), err[-3000:]
    # The victim's questions went to the others, and the terminal said so.
    assert f"conductor serve {victim.id} stopped; sending it again" in err, err[-3000:]

    rows = eval_rows(second, result["eval_id"])
    qids = [r["question_id"] for r in rows]
    assert sorted(qids) == sorted(f"s{i}" for i in range(QUESTIONS))  # none lost, none twice
    assert len({r["run_id"] for r in rows}) == QUESTIONS
    survivors = {s.id for s in fleet["serves"]}
    assert {r["served_by"] for r in rows} <= survivors | {victim.id}
    assert {r["served_by"] for r in rows} & survivors


def test_grpo_rewards_come_from_plans_the_fleet_executed(stack, fleet):
    """``fan_out``: the trainer's host sends each rollout to the fleet and stores its rows;
    it executes none itself. Three rollouts of one question are three runs (run ids)."""
    first, second = stack["hosts"][:2]
    right = 'model_id = [0]\nsubtasks = ["2 + 3"]\naccess_list = [[]]'  # the calculator
    wrong = 'model_id = [1]\nsubtasks = ["2 + 3"]\naccess_list = [[]]'  # sleepy
    rewards = on_host(
        first,
        f"""
        import json
        from prefect import flow
        from prefect_conductor.conductor.pool import load_pool
        from prefect_conductor.conductor.training.config import TrainConductorRequest
        from prefect_conductor.conductor.training.rewards import ExecutedPlanReward
        from prefect_conductor.flows._stages import Training as _Training

        request = TrainConductorRequest(
            recipe={{"dataset": "{fleet["data"]}", "stages": [{{"kind": "grpo"}}]}},
            pool="{fleet["pool"]}",
            fan_out=True,
            rollout_concurrency=4,
        )

        @flow
        def score():
            # The fleet is created in the flow run (fan_out): the training's executor sends
            # the GRPO stage's rollouts to it.
            training = _Training(request, "train-fleet", load_pool(request.pool))
            execute = training._executor(request.recipe.stage("grpo"), request.recipe.dataset)
            return ExecutedPlanReward(execute)(
                ["p"] * 3,
                [[{{"role": "assistant", "content": t}}] for t in
                 ("no plan here", {wrong!r}, {right!r})],
                question=["2 + 3"] * 3,
                question_id=["s1"] * 3,
                reference=["5"] * 3,
                kind=["math"] * 3,
                meta=["{{}}"] * 3,
                trainer_state=type("S", (), {{"global_step": 3}})(),
            )

        print(json.dumps(score()))
        """,
    )
    assert rewards == [0.0, 0.5, 1.0]
    rows = tagged_rows(second, "train_run", "train-fleet")
    assert len(rows) == 3 and len({r["run_id"] for r in rows}) == 3
    assert sorted(r["format_valid"] for r in rows) == [False, True, True]
    assert {r["tags"]["train_step"] for r in rows} == {"3"}
    assert {r["tags"]["train_stage"] for r in rows} == {"grpo"}
    assert {r["served_by"] for r in rows} <= {s.id for s in fleet["serves"]}  # not host 0
