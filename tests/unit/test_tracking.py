"""MLflow writes against a tracking server that is down (issue #19, item 3): a bounded wait
(``CONDUCTOR_MLFLOW_RETRY_S``), then one ``TrackingUnavailableError`` line naming the server
and the write; Prefect does not retry that failure (it would wait the window again).

The server is a closed port of 127.0.0.1, and the wait runs on a fake clock
(``tests/clock.py``): the tests count the probes and add up the sleeps, they never time
anything. The training tasks (``prefect_conductor.tasks.training``, ``prefect_conductor.tasks.reward_model``) get the same checks,
with TRL replaced by a trainer that records whether it trained, so no model is built. Probing a
real HTTP server, and a real ``mlflow server`` that comes up during the wait, are in
``tests/integration/test_tracking_server.py``.
"""

from __future__ import annotations

import socket
import sys
import types
from pathlib import Path
from typing import Any

import prefect_conductor.tasks.tracking
import pytest
from prefect_conductor.conductor.errors import ConductorError, StoreError, StoreUnavailableError
from prefect_conductor.conductor.training.config import TrainConductorRequest
from prefect_conductor.conductor.training.recipe import SftSettings
from prefect_conductor.reward_model.model import RewardModelRequest
from prefect_conductor.tasks import reward_model as rm_tasks
from prefect_conductor.tasks import training
from prefect_conductor.tasks.tracking import (
    TrackingError,
    TrackingUnavailableError,
    _unreachable,
    log_eval,
    mlflow_experiment,
    register_version,
    retry_unless_unreachable,
    tracking_retry_s,
    tracking_server,
    wait_for_tracking_server,
)

from tests.clock import FakeClock


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def down(monkeypatch: pytest.MonkeyPatch) -> str:
    """``MLFLOW_TRACKING_URI`` at a port nothing listens on; a 1 s retry window; MLflow's own
    client retries nothing (were the wait missing, a read would fail at once, not wait)."""
    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    monkeypatch.setenv("CONDUCTOR_MLFLOW_RETRY_S", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    return url


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The clock the waits of ``prefect_conductor.tasks.tracking`` read and sleep on."""
    return FakeClock().install(monkeypatch, prefect_conductor.tasks.tracking)


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """What each ``GET /health`` probe found: None when the server answered, else why not."""
    found: list[str | None] = []
    why_down = prefect_conductor.tasks.tracking._why_down

    def probe(url: str, timeout: float) -> str | None:
        found.append(why_down(url, timeout))
        return found[-1]

    monkeypatch.setattr(prefect_conductor.tasks.tracking, "_why_down", probe)
    return found


def test_log_eval_fails_in_one_line_after_the_retry_window(down: str, clock, probes):
    with pytest.raises(TrackingUnavailableError) as caught:
        log_eval.fn("eval/x", "single:calculator", {}, {"accuracy": 1.0}, [], {})
    message = str(caught.value)
    assert message.startswith(f"MLflow tracking server {down} unreachable (log eval")
    assert "retried 1 s" in message and "Connection refused" in message
    assert "\n" not in message and "CONDUCTOR_MLFLOW_RETRY_S" in message
    assert isinstance(caught.value, ConductorError)  # the CLI prints it as one line
    assert isinstance(caught.value, StoreError)  # a runtime failure: the CLI exits 1
    # It waited the window, backing off from 0.2 s, and probed once more at its end (MLflow's
    # own client, left alone on a refused connection, retries for about 4 minutes).
    assert clock.sleeps == pytest.approx([0.2, 0.4, 0.4])
    assert len(probes) == 4 and all(why == "Connection refused" for why in probes)


def test_every_write_helper_waits_for_the_server(down: str, clock, monkeypatch, tmp_path):
    import mlflow

    monkeypatch.setenv("CONDUCTOR_MLFLOW_RETRY_S", "0.3")
    client = mlflow.MlflowClient(down)
    with pytest.raises(TrackingUnavailableError, match="open experiment train/conductor"):
        mlflow_experiment(client, "train/conductor")
    # The module, after set_tracking_uri, as prefect_conductor.tasks.training passes it (restored after).
    monkeypatch.setattr(mlflow.tracking._tracking_service.utils, "_tracking_uri", down)
    with pytest.raises(TrackingUnavailableError, match="open experiment eval/y"):
        mlflow_experiment(mlflow, "eval/y")
    with pytest.raises(TrackingUnavailableError, match="register a version of model orchrm"):
        register_version(client, "run", tmp_path, "orchrm", "model", {})
    assert clock.slept == pytest.approx(3 * 0.3)  # each one waited its own window


def test_a_local_store_is_not_waited_for(monkeypatch, tmp_path, clock, probes):
    monkeypatch.setenv("CONDUCTOR_MLFLOW_RETRY_S", "30")
    wait_for_tracking_server("log", f"sqlite:///{tmp_path / 'mlflow.db'}")
    with tracking_server("log", f"sqlite:///{tmp_path / 'mlflow.db'}"):
        pass
    assert probes == [] and clock.sleeps == []  # not probed, not waited for


def test_credentials_in_the_uri_are_not_shown():
    url = f"http://alice:s3cret@127.0.0.1:{_closed_port()}"
    with pytest.raises(TrackingUnavailableError) as caught:
        wait_for_tracking_server("log", url, retry_s=0)
    assert "s3cret" not in str(caught.value) and "alice" not in str(caught.value)
    assert "http://127.0.0.1:" in str(caught.value)


def test_mlflow_gives_up_on_a_refused_connection_as_unreachable(monkeypatch):
    """What MLflow's client raises when its own retries on a refused connection run out
    (its ``MlflowException`` is raised in the ``except`` of the ``requests`` error)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    client = mlflow.MlflowClient(f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(MlflowException) as caught:
        client.get_experiment_by_name("x")
    assert _unreachable(caught.value)
    assert not _unreachable(MlflowException("no such run", error_code="RESOURCE_DOES_NOT_EXIST"))


def test_a_server_lost_during_the_write_is_one_line(monkeypatch):
    import requests
    from mlflow.exceptions import MlflowException

    url = "http://127.0.0.1:5000"
    monkeypatch.setattr(
        prefect_conductor.tasks.tracking, "_why_down", lambda url, timeout: None
    )  # it answers

    def lost() -> None:
        try:
            raise requests.ConnectionError("[Errno 111] Connection refused")
        except requests.ConnectionError as e:  # as MLflow's client raises it: no "from"
            raise MlflowException(f"API request to {url} failed: {e}")  # noqa: B904

    with pytest.raises(TrackingUnavailableError, match="lost during the write") as caught:
        with tracking_server("log eval", url):
            lost()
    assert "Connection refused" in str(caught.value) and "\n" not in str(caught.value)
    refused = MlflowException("bad param", error_code="INVALID_PARAMETER_VALUE")
    with pytest.raises(MlflowException, match="bad param"):  # a refused request stays itself
        with tracking_server("log eval", url):
            raise refused


def test_the_retry_window_setting(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("CONDUCTOR_MLFLOW_RETRY_S", raising=False)
    assert tracking_retry_s() == 15.0
    monkeypatch.setenv("CONDUCTOR_MLFLOW_RETRY_S", "2.5")
    assert tracking_retry_s() == 2.5
    monkeypatch.setenv("CONDUCTOR_MLFLOW_RETRY_S", "soon")
    with pytest.raises(TrackingError, match="CONDUCTOR_MLFLOW_RETRY_S must be a number"):
        tracking_retry_s()


class _State:
    def __init__(self, exc: Exception):
        self.exc = exc

    def result(self) -> None:
        raise self.exc


def test_the_tracking_errors_live_with_the_other_errors():
    import prefect_conductor.conductor.errors

    # One error root (conductor/errors.py); prefect_conductor.tasks.tracking keeps its names importable.
    assert TrackingUnavailableError is prefect_conductor.conductor.errors.TrackingUnavailableError
    assert TrackingError is prefect_conductor.conductor.errors.TrackingError
    assert issubclass(TrackingUnavailableError, TrackingError)
    assert issubclass(TrackingError, StoreError)  # a runtime failure: the CLI exits 1
    assert not issubclass(
        TrackingUnavailableError, prefect_conductor.conductor.errors.StoreUnavailableError
    )


# -- the training tasks ---------------------------------------------------------------------------


def _fails_in_one_line(call: Any, what: str, url: str) -> None:
    clock = FakeClock()
    with pytest.MonkeyPatch.context() as patch:
        clock.install(patch, prefect_conductor.tasks.tracking)
        with pytest.raises(TrackingUnavailableError) as caught:
            call()
    message = str(caught.value)
    assert message.startswith(f"MLflow tracking server {url} unreachable ({what}")
    assert "retried 1 s" in message and "\n" not in message
    assert clock.slept == pytest.approx(1.0)  # the window, on the clock the wait reads
    assert len(clock.sleeps) == 3  # backing off: 0.2 s, 0.4 s, what is left


def test_the_training_run_opens_and_finishes_only_with_a_server(down: str):
    request = TrainConductorRequest(recipe="default")
    _fails_in_one_line(
        lambda: training.start_training_run.fn(request, {}),
        "open run train-conductor · default in experiment train/conductor",
        down,
    )
    _fails_in_one_line(
        lambda: training.finish_training_run.fn("r1", {"accuracy": 1.0}, "FINISHED"),
        "finish run r1 (FINISHED)",
        down,
    )


def test_the_reward_model_run_opens_logs_and_finishes_only_with_a_server(down: str):
    _fails_in_one_line(
        lambda: rm_tasks.start_rm_run.fn(RewardModelRequest(), {}),
        "open run train-rm in experiment train/orchrm",
        down,
    )
    built = rm_tasks.BuiltPairs(train=[], test=[], new=0, stats={})
    _fails_in_one_line(
        lambda: rm_tasks.log_pair_stats.fn("r2", built, None),
        "log pair statistics to run r2",
        down,
    )
    _fails_in_one_line(
        lambda: rm_tasks.finish_rm_run.fn("r2", "FAILED", {"loss": 0.5}),
        "finish run r2 (FAILED)",
        down,
    )


def test_a_champion_is_not_missing_when_the_server_is(down: str, tmp_path: Path):
    """Before: ``get_model_version_by_alias`` failing for any reason read as "no champion", so
    a server outage let a candidate be promoted as the first champion."""
    what = "read model conductor@champion"
    _fails_in_one_line(training.champion_exists, what, down)
    _fails_in_one_line(lambda: training.champion_needs_eval("sig"), what, down)
    _fails_in_one_line(
        lambda: training.register_conductor.fn("r3", tmp_path, 0.9, "sig", promote=True),
        what,
        down,
    )
    _fails_in_one_line(rm_tasks.champion_ref, "read model orchrm@champion", down)
    _fails_in_one_line(
        lambda: rm_tasks.register_reward_model.fn("r4", tmp_path, 0.8, None, False, True),
        "register a version of model orchrm",
        down,
    )


class _Trainer:
    """TRL's trainers as far as these tasks use them, recording whether they trained."""

    trained = 0

    def __init__(self, **kwargs: Any):
        self.model = None

    def train(self) -> Any:
        _Trainer.trained += 1
        raise AssertionError("trained with the tracking server down")


@pytest.fixture
def fake_trl(monkeypatch: pytest.MonkeyPatch) -> type[_Trainer]:
    trl = types.ModuleType("trl")
    trl.SFTTrainer = trl.GRPOTrainer = trl.RewardTrainer = _Trainer  # type: ignore[attr-defined]
    datasets = types.ModuleType("datasets")
    datasets.Dataset = types.SimpleNamespace(from_list=list)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "trl", trl)
    monkeypatch.setitem(sys.modules, "datasets", datasets)
    for module in (training, rm_tasks):
        monkeypatch.setattr(module, "use_all_cores", lambda: None)
        monkeypatch.setattr(module, "lora_config", lambda *a: None)
    monkeypatch.setattr(training, "load_trainable_base", lambda base: (None, None))
    monkeypatch.setattr(training, "sft_config", lambda *a: None)
    monkeypatch.setattr(rm_tasks, "load_backbone", lambda base: (None, None))
    monkeypatch.setattr(rm_tasks, "reward_config", lambda *a: None)
    _Trainer.trained = 0
    return _Trainer


def test_a_stage_does_not_train_into_a_server_that_is_down(down: str, fake_trl, tmp_path):
    """TRL's MLflow callback logs into the stage's run during ``train()``: the stage waits
    for the server before it opens that run, and never trains without it."""
    example = {"prompt": "p", "completion": "c"}
    _fails_in_one_line(
        lambda: training.warm_start_train.fn(
            TrainConductorRequest(recipe="default").recipe,
            SftSettings(),
            [example],
            tmp_path,
            "parent",
            stage="warm-start",
        ),
        "log stage warm-start",
        down,
    )
    pair = {"input": "i", "chosen": "c", "rejected": "r"}
    _fails_in_one_line(
        lambda: rm_tasks.train_on_pairs.fn(RewardModelRequest(), [pair], tmp_path, "parent"),
        "log stage reward-trainer",
        down,
    )
    assert fake_trl.trained == 0


MLFLOW_TASKS = [
    training.start_training_run,
    training.finish_training_run,
    training.register_conductor,
    rm_tasks.start_rm_run,
    rm_tasks.finish_rm_run,
    rm_tasks.log_pair_stats,
    rm_tasks.register_reward_model,
    rm_tasks.store_pairs,  # the artifact store: its own wait, CONDUCTOR_ARTIFACTS_RETRY_S
]


@pytest.mark.parametrize("task", MLFLOW_TASKS, ids=lambda t: t.name)
def test_tasks_that_retry_do_not_retry_a_server_that_stayed_down(task: Any):
    assert task.retries == 2
    assert task.retry_condition_fn is retry_unless_unreachable


def test_prefect_does_not_retry_a_write_that_already_waited():
    assert not retry_unless_unreachable(None, None, _State(TrackingUnavailableError("down")))
    assert not retry_unless_unreachable(None, None, _State(StoreUnavailableError("s3 down")))
    assert retry_unless_unreachable(None, None, _State(RuntimeError("database is locked")))


def test_a_local_store_still_records_the_training_run(monkeypatch, tmp_path: Path):
    """The waits are no-ops on the embedded sqlite store: a run opens and finishes."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CONDUCTOR_MLFLOW_RETRY_S", "30")
    request = TrainConductorRequest(recipe="default")
    run_id = training.start_training_run.fn(request, {"who": "test"})
    training.finish_training_run.fn(run_id, {"accuracy": 0.5, "skipped": None}, "FINISHED")
    run = mlflow.MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics == {"accuracy": 0.5}
    assert run.data.params["dataset"] == "mixed" and run.data.tags["who"] == "test"
    assert run.data.params["recipe"] == "default"
    assert not training.champion_exists()  # no champion: a real "none", not an outage


def test_a_local_store_still_registers_and_promotes(monkeypatch, tmp_path: Path):
    """The champion reads and the alias writes, on the embedded store: a first candidate
    with a figure to beat is promoted, and the champion is then found."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path / "home"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "adapter_config.json").write_text("{}")

    rm_run = rm_tasks.start_rm_run.fn(RewardModelRequest(), {})
    assert rm_tasks.champion_ref() is None
    reg = rm_tasks.register_reward_model.fn(rm_run, model, 0.7, None, False, True)
    assert reg.promoted and rm_tasks.champion_ref() == "models:/orchrm@champion"
    built = rm_tasks.BuiltPairs(train=[{}], test=[], new=1, stats={"by_source": {"a": 1}})
    rm_tasks.log_pair_stats.fn(rm_run, built, None)
    rm_tasks.finish_rm_run.fn(rm_run, "FINISHED", {"train_loss": 0.1})

    run = training.start_training_run.fn(TrainConductorRequest(recipe="default"), {})
    reg = training.register_conductor.fn(run, model, 0.5, "sig", True, champion_accuracy=0.4)
    assert reg.promoted and training.champion_exists()
    assert training.champion_needs_eval("sig") is None  # its accuracy on "sig" is recorded
    assert training.champion_needs_eval("other") == "models:/conductor@champion"
