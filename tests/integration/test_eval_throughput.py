"""Eval throughput (issue #19 item 4): an eval's questions are task runs of the eval, with no
flow run or artifacts of their own, and their rows are stored in batches, each run once."""

from __future__ import annotations

import json
import time

import httpx
import prefect_conductor.tasks.artifacts
import pytest
from prefect_conductor.conductor.data.records import RunRecord, StepRecord
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.plan.requests import EvalRequest

from tests.integration.test_eval import _eval, setup  # noqa: F401 - a fixture, used by name

pytestmark = pytest.mark.usefixtures("prefect", "fake_provider")

QIDS = ["q0", "q1", "q2", "q3"]


def _setup(request):
    """``test_eval``'s four questions, pool and home (its ``setup`` fixture)."""
    return request.getfixturevalue("setup")


def _request(data, pool, tmp_path) -> EvalRequest:
    return EvalRequest(
        dataset=str(data),
        strategy="single:oracle",
        pool=str(pool),
        concurrency=2,
        artifacts=str(tmp_path / "art"),
    )


def _parts(root, table: str) -> int:
    return len(list((root / table).glob("*.parquet")))


def _task_runs(flow_run_id, expected: set[str], timeout_s: float = 60.0) -> dict:
    """The flow run's task runs by name, once ``expected`` are recorded in a final state (the
    server records task runs from events, in batches)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flt = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            runs = {r.name: r for r in client.read_task_runs(flow_run_filter=flt, limit=200)}
            final = {n for n, r in runs.items() if r.state is not None and r.state.is_final()}
            if expected <= final or time.monotonic() > deadline:
                return runs
            time.sleep(0.2)


def test_an_eval_writes_one_part_per_batch_and_one_row_per_question(request, monkeypatch):
    data, pool, tmp_path = _setup(request)
    monkeypatch.setattr(prefect_conductor.tasks.artifacts, "BATCH_RUNS", 3)
    monkeypatch.setattr(
        prefect_conductor.tasks.artifacts, "BATCH_WAIT_S", 3600.0
    )  # only the size decides
    result = _eval(data, pool, tmp_path, "single:oracle")
    assert result.n == 4 and result.correct == 3 and result.failed == 0

    art = tmp_path / "art"
    store = ArtifactStore(str(art))
    runs, steps = store.read_pandas("runs"), store.read_pandas("steps")
    assert sorted(runs["question_id"]) == QIDS and runs["run_id"].is_unique
    assert sorted(steps["run_id"]) == sorted(runs["run_id"])  # one step each
    assert {dict(t)["eval_id"] for t in runs["tags"]} == {result.eval_id}
    assert (_parts(art, "runs"), _parts(art, "steps")) == (2, 2)  # 3 runs, then the last one


def test_a_retried_question_keeps_its_run_id_and_adds_no_second_row(request, monkeypatch):
    """The first attempt of q1 ran its plan, then the API failed: the retry runs in the same
    task run (the run id), and only the outcome that came back is stored."""
    import dataclasses

    import prefect_conductor.flows.evaluate as ev  # hands eval_question its QUESTION_FLOWS
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect_conductor.tasks.questions import eval_question

    data, pool, tmp_path = _setup(request)
    real, attempts = ev.QUESTION_FLOWS.run_unstored, []

    def flaky(request, run_id):
        outcome = real(request, run_id)
        attempts.append((request.question_id, run_id))
        if request.question_id == "q1" and len([a for a in attempts if a[0] == "q1"]) == 1:
            url = "http://127.0.0.1/api/task_runs/"
            response = httpx.Response(503, request=httpx.Request("POST", url))
            error = httpx.HTTPStatusError("503", request=response.request, response=response)
            raise PrefectHTTPStatusError.from_httpx_error(error)
        return outcome

    monkeypatch.setattr(
        ev, "QUESTION_FLOWS", dataclasses.replace(ev.QUESTION_FLOWS, run_unstored=flaky)
    )
    monkeypatch.setattr(eval_question, "retry_delay_seconds", 0)
    state = ev.evaluate(_request(data, pool, tmp_path), return_state=True)
    result = state.result()
    assert result.n == 4 and result.failed == 0 and result.correct == 3
    q1 = [run_id for qid, run_id in attempts if qid == "q1"]
    assert len(q1) == 2 and q1[0] == q1[1]

    runs = ArtifactStore(str(tmp_path / "art")).read_pandas("runs")
    assert sorted(runs["question_id"]) == QIDS
    assert list(runs[runs["question_id"] == "q1"]["run_id"]) == [q1[0]]
    recorded = _task_runs(state.state_details.flow_run_id, {"question q1"})
    assert str(recorded["question q1"].id) == q1[0]
    assert recorded["question q1"].run_count == 2


def test_a_run_batch_stores_a_run_offered_twice_once(tmp_path):
    from prefect import flow

    run = RunRecord(
        run_id="r1",
        question_id="q",
        question="What is 1 + 1?",
        conductor_model="(single:echo)",
        format_valid=True,
        status="completed",
        wall_s=0.1,
    )
    step = StepRecord(
        run_id="r1",
        question_id="q",
        step=0,
        depth=0,
        worker="echo",
        model="fake/echo",
        instruction="What is 1 + 1?",
        access=[],
        status="completed",
    )

    @flow
    def store_twice(root: str) -> int:
        batch = prefect_conductor.tasks.artifacts.RunBatch(root, size=10)
        batch.add(run, [step])
        batch.add(run, [step])
        return batch.close()

    root = tmp_path / "art"
    assert store_twice(str(root)) == 1
    store = ArtifactStore(str(root))
    assert len(store.read_pandas("runs")) == 1 and len(store.read_pandas("steps")) == 1
    assert (_parts(root, "runs"), _parts(root, "steps")) == (1, 1)


def test_an_eval_shows_its_runs_in_one_table_and_its_questions_as_task_runs(request):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect_conductor.flows.evaluate import evaluate

    data, pool, tmp_path = _setup(request)
    state = evaluate(_request(data, pool, tmp_path), return_state=True)
    result = state.result()
    run_id = state.state_details.flow_run_id
    flt = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=flt)
    artifacts = {a.key: a for a in found if a.key}  # keyless: the persisted result
    # No per-question plan/answer/steps artifacts: the eval's runs are one table.
    assert set(artifacts) == {"eval-progress", "eval-runs", "eval-summary"}
    table = json.loads(artifacts["eval-runs"].data)
    stored = ArtifactStore(str(tmp_path / "art")).read_pandas("runs")
    assert sorted(r["question_id"] for r in table) == QIDS
    assert {r["run_id"] for r in table} == set(stored["run_id"])
    assert sum(bool(r["correct"]) for r in table) == result.correct == 3
    assert artifacts["eval-runs"].description == "single:oracle: 4 runs"

    questions = {f"question {q}" for q in QIDS}
    runs = _task_runs(run_id, questions | {"step-0 oracle"})
    assert questions <= set(runs)
    # Each stored run is its question's task run; its step ran as a task run under it.
    assert {str(runs[f"question {q}"].id) for q in QIDS} == set(stored["run_id"])
    assert "orchestrate" not in runs  # no subflow per question


def test_the_eval_thread_pool_leaves_room_for_steps_at_the_highest_concurrency():
    """Question tasks wait for their steps in the eval's pool: at the highest concurrency
    at least a plan runner's worth of threads stays free for steps (no deadlock)."""
    from prefect_conductor.flows.evaluate import MAX_CONCURRENCY, evaluate
    from prefect_conductor.flows.orchestrate import TASK_RUNNER_WORKERS

    limit = next(m.le for m in EvalRequest.model_fields["concurrency"].metadata if hasattr(m, "le"))
    assert limit <= MAX_CONCURRENCY
    assert evaluate.task_runner._max_workers >= MAX_CONCURRENCY + TASK_RUNNER_WORKERS
