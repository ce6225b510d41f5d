"""``evaluate``: a small dataset end to end, with fake workers, artifacts and MLflow."""

from __future__ import annotations

import json

import pytest
import yaml
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.plan.requests import EvalRequest

from prefect_conductor.testing.fakes import ANSWERS, PLANS

pytestmark = pytest.mark.usefixtures("prefect", "fake_provider")

QUESTIONS = {
    "What is 2 + 3?": "5",
    "What is 10 - 4?": "6",
    "What is 7 * 6?": "42",
    "What is 9 + 9?": "18",
}


@pytest.fixture()
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data = tmp_path / "mini.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"id": f"q{i}", "question": q, "reference": a, "kind": "math"})
            for i, (q, a) in enumerate(QUESTIONS.items())
        )
    )
    ANSWERS.clear()
    ANSWERS.update({q: f"The answer is {a}." for q, a in QUESTIONS.items()})
    ANSWERS["What is 9 + 9?"] = "The answer is 17."  # one wrong answer
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        yaml.safe_dump(
            {
                "conductor": {"model": "fake/plan"},
                "workers": [
                    {
                        "name": "oracle",
                        "model": "fake/lookup",
                        "input_cost_per_token": 0.0,
                        "output_cost_per_token": 0.0,
                    },
                    {"name": "echo", "model": "fake/echo"},
                ],
            }
        )
    )
    return data, pool, tmp_path


def _eval(data, pool, tmp_path, strategy):
    from prefect_conductor.flows.evaluate import evaluate

    return evaluate(
        EvalRequest(
            dataset=str(data),
            strategy=strategy,
            pool=str(pool),
            concurrency=2,
            artifacts=str(tmp_path / "art"),
        )
    )


def test_single_worker_eval_scores_stores_and_tracks(setup):
    data, pool, tmp_path = setup
    result = _eval(data, pool, tmp_path, "single:oracle")
    assert result.n == 4 and result.correct == 3 and result.accuracy == pytest.approx(0.75)
    assert result.failed == 0 and result.format_valid_rate is None
    assert result.mean_cost_usd == 0.0 and result.mean_output_tokens > 0

    runs = ArtifactStore(str(tmp_path / "art")).read_pandas("runs")
    assert len(runs) == 4
    assert set(runs["reference"]) == set(QUESTIONS.values())
    assert sorted(runs["correct"]) == [False, True, True, True]
    assert sorted(runs["reward"]) == [0.5, 1.0, 1.0, 1.0]
    tags = [dict(t) for t in runs["tags"]]
    assert {t["eval_id"] for t in tags} == {result.eval_id}
    assert {t["strategy"] for t in tags} == {"single:oracle"}

    import mlflow

    assert (tmp_path / "home" / "mlflow.db").exists()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}")
    run = mlflow.get_run(result.mlflow_run_id)
    assert run.data.metrics["accuracy"] == pytest.approx(0.75)
    assert run.data.params["strategy"] == "single:oracle"
    assert run.data.params["dataset"] == str(data)
    # the run spans the eval, not only the logging at its end (issue #10): it starts before the
    # first question is answered and ends after the last (an order of times, not a duration)
    stored = [r["created_at"].timestamp() * 1000 for r in runs.to_dict("records")]
    assert run.info.start_time <= min(stored) and run.info.end_time >= max(stored)
    assert run.info.status == "FINISHED"
    table = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/results.json")
    rows = [dict(zip(table["columns"], row, strict=False)) for row in table["data"]]
    assert len(rows) == 4 and sum(r["correct"] for r in rows) == 3
    assert {r["question_id"] for r in rows} == {"q0", "q1", "q2", "q3"}


def test_strategies_share_one_experiment_and_conductor_reports_format_validity(setup):
    data, pool, tmp_path = setup
    PLANS["top"] = "not a plan"  # the conductor fails to plan: fallback to the default worker
    conductor = _eval(data, pool, tmp_path, "conductor")
    assert conductor.format_valid_rate == 0.0
    assert conductor.accuracy == pytest.approx(0.75)  # fallback ran on oracle, the first llm
    sc = _eval(data, pool, tmp_path, "self-consistency:oracle:3")
    assert sc.accuracy == pytest.approx(0.75)
    rnd = _eval(data, pool, tmp_path, "random-plan")
    assert rnd.n == 4 and rnd.format_valid_rate is None
    assert (
        conductor.mlflow_experiment == sc.mlflow_experiment == rnd.mlflow_experiment == "eval/mini"
    )

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["eval/mini"])
    assert sorted(runs["params.strategy"]) == [
        "conductor",
        "random-plan",
        "self-consistency:oracle:3",
    ]
    steps = ArtifactStore(str(tmp_path / "art")).read_pandas("steps")
    sc_runs = {
        r
        for r, t in zip(
            ArtifactStore(str(tmp_path / "art")).read_pandas("runs")["run_id"],
            ArtifactStore(str(tmp_path / "art")).read_pandas("runs")["tags"],
            strict=False,
        )
        if dict(t)["strategy"].startswith("self")
    }
    assert (steps[steps["run_id"].isin(sc_runs)].groupby("run_id").size() == 3).all()


def test_a_question_whose_run_the_prefect_api_fails_runs_again(setup, monkeypatch):
    """A 503 from a busy server (seen under load) retries the question; nothing is lost."""
    import dataclasses

    import httpx
    import prefect_conductor.flows.evaluate as ev  # hands eval_question its QUESTION_FLOWS
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect_conductor.tasks.questions import eval_question

    data, pool, tmp_path = setup
    real = ev.QUESTION_FLOWS.run_unstored
    failures: list[str] = []

    def flaky(request, *args, **kw):
        if request.question_id == "q1" and not failures:
            failures.append(request.question_id)
            url = "http://127.0.0.1/api/task_runs/"
            response = httpx.Response(503, request=httpx.Request("POST", url))
            error = httpx.HTTPStatusError("503", request=response.request, response=response)
            raise PrefectHTTPStatusError.from_httpx_error(error)
        return real(request, *args, **kw)

    flows = dataclasses.replace(ev.QUESTION_FLOWS, run_unstored=flaky)
    monkeypatch.setattr(ev, "QUESTION_FLOWS", flows)
    monkeypatch.setattr(eval_question, "retry_delay_seconds", 0)
    result = _eval(data, pool, tmp_path, "single:oracle")
    assert failures == ["q1"]
    assert result.n == 4 and result.failed == 0 and result.correct == 3
    runs = ArtifactStore(str(tmp_path / "art")).read_pandas("runs")
    assert sorted(runs["question_id"]) == ["q0", "q1", "q2", "q3"]


def test_a_question_that_fails_for_another_reason_is_not_retried(setup, monkeypatch):
    import dataclasses

    import prefect_conductor.flows.evaluate as ev

    data, pool, tmp_path = setup
    calls: list[str] = []

    def broken(request, *args, **kw):
        calls.append(request.question_id)
        raise ValueError("a bug, not the API")

    monkeypatch.setattr(
        ev, "QUESTION_FLOWS", dataclasses.replace(ev.QUESTION_FLOWS, run_unstored=broken)
    )
    result = _eval(data, pool, tmp_path, "single:oracle")
    assert sorted(calls) == ["q0", "q1", "q2", "q3"]  # once each
    assert result.n == 4 and result.failed == 4 and result.correct == 0


def test_eval_shows_its_name_progress_summary_and_result_in_prefect(setup, capsys, monkeypatch):
    import prefect_conductor.tasks.artifacts
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect_conductor.flows.evaluate import evaluate

    data, pool, tmp_path = setup
    shown: list[float] = []
    real_update = prefect_conductor.tasks.artifacts.update_progress_artifact

    def update(artifact_id, progress, **kw):
        shown.append(progress)
        return real_update(artifact_id, progress, **kw)

    monkeypatch.setattr(prefect_conductor.tasks.artifacts, "update_progress_artifact", update)
    state = evaluate(
        EvalRequest(
            dataset=str(data),
            strategy="single:oracle",
            pool=str(pool),
            concurrency=2,
            artifacts=str(tmp_path / "art"),
        ),
        return_state=True,
    )
    result = state.result()
    assert result.n == 4 and result.correct == 3
    run_id = state.state_details.flow_run_id
    flt = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        artifacts = {a.key: a for a in client.read_artifacts(artifact_filter=flt)}
        assert run.state.result() == result  # persisted: the API gives the result back
    assert run.name == "eval · mini · single:oracle"

    progress = artifacts["eval-progress"]
    assert progress.type == "progress" and float(progress.data) == 100.0
    assert progress.description == "4 of 4 runs finished"
    # Moved while the eval ran (the third question waits for one of the first two).
    assert shown[-1] == 100.0 and 0 < shown[0] <= 50.0 and shown == sorted(set(shown))

    summary = artifacts["eval-summary"]
    assert summary.type == "table"
    rows = {r["metric"]: r["value"] for r in json.loads(summary.data)}
    assert rows["accuracy"] == pytest.approx(result.accuracy) == pytest.approx(0.75)
    assert (rows["runs (n)"], rows["correct"], rows["failed runs"]) == (4, 3, 0)
    assert rows["mean output tokens"] == pytest.approx(result.mean_output_tokens, rel=1e-5)
    assert rows["mean cost (USD)"] == 0.0
    assert rows["wall time (s)"] == pytest.approx(result.wall_s, rel=1e-5)
    assert rows["format-valid rate"] == "n/a"  # not a conductor strategy
    assert rows["MLflow run id"] == result.mlflow_run_id is not None
    assert summary.description == "single:oracle: accuracy 75.0% (3/4), 0 failed"

    assert "\r" not in capsys.readouterr().err  # no progress bar: stderr is not a terminal


def test_an_mlflow_outage_keeps_the_runs_and_the_summary(setup, monkeypatch):
    """MLflow down at the end of an eval (issue #19): the eval fails in one line naming the
    server, but its runs are stored and its eval-runs and eval-summary artifacts exist."""
    import socket

    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect_conductor.conductor.errors import TrackingUnavailableError
    from prefect_conductor.flows.evaluate import evaluate

    data, pool, tmp_path = setup
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("CONDUCTOR_MLFLOW_RETRY_S", "1")
    request = EvalRequest(
        dataset=str(data),
        strategy="single:oracle",
        pool=str(pool),
        concurrency=2,
        artifacts=str(tmp_path / "art"),
    )
    state = evaluate(request, return_state=True)
    assert state.is_failed()
    with pytest.raises(TrackingUnavailableError, match=r"unreachable \(log eval") as caught:
        state.result()
    assert "\n" not in str(caught.value)

    runs = ArtifactStore(str(tmp_path / "art")).read_pandas("runs")
    assert sorted(runs["question_id"]) == ["q0", "q1", "q2", "q3"]
    run_id = state.state_details.flow_run_id
    flt = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
    with get_client(sync_client=True) as client:
        artifacts = {a.key: a for a in client.read_artifacts(artifact_filter=flt)}
    assert len(json.loads(artifacts["eval-runs"].data)) == 4
    summary = artifacts["eval-summary"]
    rows = {r["metric"]: r["value"] for r in json.loads(summary.data)}
    assert rows["accuracy"] == pytest.approx(0.75)
    assert (rows["runs (n)"], rows["correct"], rows["failed runs"]) == (4, 3, 0)
    assert rows["MLflow experiment"] == "eval/mini" and rows["MLflow run id"] == "n/a"
    assert summary.description == "single:oracle: accuracy 75.0% (3/4), 0 failed"


def test_a_question_that_cannot_be_asked_fails_alone(setup):
    """Issue #38: one question over a request's 20,000 characters (or blank, or no question
    at all) failed the whole eval and stored nothing; now each fails alone, with its reason."""
    data, pool, tmp_path = setup
    too_long = "What is 2 + 3? " + "x" * 20_000
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    rows[1:1] = [{"id": "long", "question": too_long, "reference": "5", "kind": "math"}]
    rows += [
        {"id": "blank", "question": "  ", "reference": "0", "kind": "math"},
        {"id": "none", "reference": "0", "kind": "math"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = _eval(data, pool, tmp_path, "single:oracle")
    assert (result.n, result.questions, result.correct, result.failed) == (7, 7, 3, 3)
    assert result.accuracy == pytest.approx(3 / 7)

    runs = ArtifactStore(str(tmp_path / "art")).read_pandas("runs").set_index("question_id")
    assert sorted(runs.index) == ["blank", "long", "none", "q0", "q1", "q2", "q3"]
    failed = runs[runs["status"] == "failed"]
    assert sorted(failed.index) == ["blank", "long", "none"]
    assert not failed["correct"].any() and (failed["reward"] == 0.0).all()
    assert failed.loc["long", "question"] == too_long  # stored as the dataset has it
    assert failed.loc["long", "reason"] == (
        "question 'long' not asked: question: String should have at most 20000 characters "
        f"(it has {len(too_long):,})"
    )
    assert "has a blank 'question'" in failed.loc["blank", "reason"]
    assert "has no 'question'" in failed.loc["none", "reason"]
    assert {dict(t)["eval_id"] for t in failed["tags"]} == {result.eval_id}
    assert runs.loc[["q0", "q1", "q2", "q3"], "reason"].isna().all()

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}")
    run = mlflow.get_run(result.mlflow_run_id)
    assert run.data.metrics["failed"] == 3
    table = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/results.json")
    by_id = {r[table["columns"].index("question_id")]: r for r in table["data"]}
    reason = table["columns"].index("reason")
    assert (
        by_id["long"][reason].startswith("question 'long' not asked")
        and by_id["q0"][reason] is None
    )
