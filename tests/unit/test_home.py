"""The conductor home is absolute; MLflow artifacts live under it, never in ``./mlruns`` of the
current directory; an eval's MLflow run spans the eval's real start and end (issue #10).

The MLflow tests use the real sqlite store of the default configuration, with the current
directory and ``$CONDUCTOR_HOME`` two different temporary directories.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from conductor.home import artifacts_location, conductor_home, mlflow_artifacts_dir
from tasks.tracking import experiment_artifact_location, log_eval, mlflow_experiment, tracking_uri


def test_the_home_is_absolute_wherever_it_is_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONDUCTOR_HOME", "state")
    assert conductor_home() == tmp_path / "state" and conductor_home().is_absolute()
    monkeypatch.delenv("CONDUCTOR_HOME")
    monkeypatch.delenv("CONDUCTOR_ARTIFACTS", raising=False)
    assert conductor_home() == tmp_path / ".conductor"
    assert artifacts_location() == str(tmp_path / ".conductor" / "artifacts")
    monkeypatch.setenv("CONDUCTOR_HOME", "~/somewhere")
    assert conductor_home() == Path.home() / "somewhere"


def test_experiments_of_a_local_store_go_under_the_home_and_a_servers_to_the_server(home):
    location = experiment_artifact_location("eval/arithmetic", f"sqlite:///{home}/mlflow.db")
    assert location == (home / "mlartifacts" / "eval" / "arithmetic").as_uri()
    assert experiment_artifact_location("x", "postgresql://db/mlflow") is not None
    assert experiment_artifact_location("x", "http://127.0.0.1:5000") is None
    assert experiment_artifact_location("x", "https://mlflow.example.com") is None


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Default tracking (no MLFLOW_TRACKING_URI), the home and the cwd apart; one sqlite
    store for the module (creating one takes seconds)."""
    home = tmp_path_factory.mktemp("home")
    cwd = tmp_path_factory.mktemp("cwd")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CONDUCTOR_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.chdir(cwd)
        yield home, cwd
        # mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI; ``mp`` restores an earlier one.
        os.environ.pop("MLFLOW_TRACKING_URI", None)


def test_a_run_of_the_fluent_api_keeps_its_artifacts_under_the_home(store):
    """The training tasks' path: ``set_tracking_uri`` (which exports MLFLOW_TRACKING_URI,
    the bug of issue #10), then ``mlflow_experiment`` and ``start_run``."""
    import mlflow

    home, cwd = store
    mlflow.set_tracking_uri(tracking_uri())
    experiment_id = mlflow_experiment(mlflow, "train/test")
    with mlflow.start_run(experiment_id=experiment_id) as run:
        mlflow.log_text("hello", "note.txt")
    uri = mlflow.get_run(run.info.run_id).info.artifact_uri
    assert uri.startswith(mlflow_artifacts_dir().as_uri())
    assert (home / "mlartifacts" / "train" / "test" / run.info.run_id / "artifacts").is_dir()
    assert not (cwd / "mlruns").exists()
    assert list(cwd.iterdir()) == []


def test_an_eval_run_spans_the_eval_and_keeps_its_table_under_the_home(store):
    import mlflow

    home, cwd = store
    started = time.time() - 9.25
    ended = started + 9.25
    run_id = log_eval.fn(
        "eval/test",
        "single:calculator",
        params={"strategy": "single:calculator", "limit": None},
        metrics={"accuracy": 0.5, "n": 2, "mean_cost_usd": None},
        rows=[{"question_id": "q0", "correct": True}, {"question_id": "q1", "correct": False}],
        tags={"eval_id": "e-1"},
        started_at=started,
        ended_at=ended,
    )
    run = mlflow.MlflowClient(tracking_uri()).get_run(run_id)
    assert run.info.start_time == int(started * 1000)
    assert run.info.end_time == int(ended * 1000)
    assert run.info.status == "FINISHED" and run.info.run_name == "single:calculator"
    assert run.data.metrics == {"accuracy": 0.5, "n": 2.0}
    assert run.data.params == {"strategy": "single:calculator", "limit": ""}
    assert run.data.tags["eval_id"] == "e-1"
    table = home / "mlartifacts" / "eval" / "test" / run_id / "artifacts" / "results.json"
    assert table.is_file()
    assert not (cwd / "mlruns").exists()
    assert list(cwd.iterdir()) == []


def test_an_eval_run_without_times_is_finished_now(store):
    import mlflow

    before = int(time.time() * 1000)
    run_id = log_eval.fn("eval/test", "conductor", {}, {"accuracy": 1.0}, [], {})
    run = mlflow.MlflowClient(tracking_uri()).get_run(run_id)
    assert before <= run.info.start_time <= run.info.end_time <= int(time.time() * 1000)
    assert run.info.status == "FINISHED"
