"""The training tasks against an MLflow tracking server that is down (issue #19, item 3): each
MLflow write of ``tasks.training`` and ``tasks.reward_model`` waits the bounded window
(``CONDUCTOR_MLFLOW_RETRY_S``) and fails in one ``TrackingUnavailableError`` line naming the
server and the write; Prefect does not retry that failure (it would wait the window again).

The server is a closed port of 127.0.0.1 and the window 1 s; TRL is replaced by a trainer
that records whether it trained, so no model is built.
"""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from conductor.errors import StoreUnavailableError, TrackingUnavailableError
from conductor.training.config import TrainConductorRequest
from reward_model.model import RewardModelRequest
from tasks import reward_model as rm_tasks
from tasks import training
from tasks.tracking import retry_unless_unreachable
from tests.unit.test_tracking import _closed_port, _State


@pytest.fixture
def down(monkeypatch: pytest.MonkeyPatch) -> str:
    """``MLFLOW_TRACKING_URI`` at a port nothing listens on; a 1 s retry window; MLflow's own
    client retries nothing (were the wait missing, a read would fail at once, not wait)."""
    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    monkeypatch.setenv("CONDUCTOR_MLFLOW_RETRY_S", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    return url


def _fails_in_one_line(call: Any, what: str, url: str) -> None:
    started = time.monotonic()
    with pytest.raises(TrackingUnavailableError) as caught:
        call()
    waited = time.monotonic() - started
    message = str(caught.value)
    assert message.startswith(f"MLflow tracking server {url} unreachable ({what}")
    assert "retried 1 s" in message and "\n" not in message
    assert 1.0 <= waited < 20.0  # the window, then no more than a few probes past it


def test_the_training_run_opens_and_finishes_only_with_a_server(down: str):
    request = TrainConductorRequest()
    _fails_in_one_line(
        lambda: training.start_training_run.fn(request, {}),
        "open run train-conductor in experiment train/conductor",
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
            TrainConductorRequest(), [example], tmp_path, "parent", stage="warm-start"
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


def test_the_retry_condition_knows_both_stores():
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
    run_id = training.start_training_run.fn(TrainConductorRequest(), {"who": "test"})
    training.finish_training_run.fn(run_id, {"accuracy": 0.5, "skipped": None}, "FINISHED")
    run = mlflow.MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics == {"accuracy": 0.5}
    assert run.data.params["dataset"] == "arithmetic" and run.data.tags["who"] == "test"
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

    run = training.start_training_run.fn(TrainConductorRequest(), {})
    reg = training.register_conductor.fn(run, model, 0.5, "sig", True, champion_accuracy=0.4)
    assert reg.promoted and training.champion_exists()
    assert training.champion_needs_eval("sig") is None  # its accuracy on "sig" is recorded
    assert training.champion_needs_eval("other") == "models:/conductor@champion"
