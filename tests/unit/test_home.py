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
from prefect_conductor.conductor.home import (
    artifacts_location,
    conductor_home,
    default_home,
    legacy_home_notice,
    mlflow_artifacts_dir,
    model_cache_dir,
)
from prefect_conductor.tasks.tracking import (
    experiment_artifact_location,
    log_eval,
    mlflow_experiment,
    tracking_uri,
)


def test_the_home_is_absolute_wherever_it_is_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONDUCTOR_HOME", "state")
    assert conductor_home() == tmp_path / "state" and conductor_home().is_absolute()
    monkeypatch.setenv("CONDUCTOR_HOME", "~/somewhere")
    assert conductor_home() == Path.home() / "somewhere"


@pytest.fixture()
def user(tmp_path, monkeypatch):
    """A user's $HOME and a working directory apart, no CONDUCTOR_* or XDG variables."""
    (tmp_path / "user").mkdir()
    (tmp_path / "project").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    for name in ("CONDUCTOR_HOME", "CONDUCTOR_ARTIFACTS", "CONDUCTOR_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path / "project")
    return tmp_path


def test_the_default_home_is_per_user_in_every_directory(user, monkeypatch):
    assert conductor_home() == user / "user" / ".conductor" == default_home()
    assert artifacts_location() == str(user / "user" / ".conductor" / "artifacts")
    monkeypatch.chdir(user)
    assert conductor_home() == user / "user" / ".conductor"
    (user / "project" / ".conductor").mkdir()  # an empty directory is no home
    monkeypatch.chdir(user / "project")
    assert conductor_home() == user / "user" / ".conductor"
    assert legacy_home_notice() is None


def test_a_legacy_project_home_keeps_working_and_is_announced_once(user):
    legacy = user / "project" / ".conductor"
    (legacy / "artifacts").mkdir(parents=True)
    assert conductor_home() == legacy
    notice = legacy_home_notice()
    assert notice is not None and str(legacy) in notice and str(default_home()) in notice
    assert legacy_home_notice() is None  # said once per home
    assert conductor_home() == legacy


def test_the_variable_wins_over_a_legacy_home(user, monkeypatch):
    (user / "project" / ".conductor" / "mlflow.db").parent.mkdir(parents=True)
    (user / "project" / ".conductor" / "mlflow.db").touch()
    monkeypatch.setenv("CONDUCTOR_HOME", str(user / "elsewhere"))
    assert conductor_home() == user / "elsewhere"
    assert legacy_home_notice() is None


def test_the_model_cache_depends_on_neither_the_home_nor_the_directory(user, monkeypatch):
    cache = user / "user" / ".cache" / "conductor" / "models"
    assert model_cache_dir() == cache
    monkeypatch.setenv("CONDUCTOR_HOME", str(user / "a"))
    monkeypatch.chdir(user)
    assert model_cache_dir() == cache
    monkeypatch.setenv("XDG_CACHE_HOME", str(user / "xdg"))
    assert model_cache_dir() == user / "xdg" / "conductor" / "models"
    monkeypatch.setenv("CONDUCTOR_CACHE", "~/models-here")
    assert model_cache_dir() == user / "user" / "models-here" / "models"


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
