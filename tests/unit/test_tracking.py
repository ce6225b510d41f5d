"""MLflow writes against a tracking server that is down (issue #19, item 3): a bounded wait
(``CONDUCTOR_MLFLOW_RETRY_S``), then one ``TrackingUnavailableError`` line naming the server.

The server here is a closed port of 127.0.0.1, or a small HTTP server that answers
``/health`` as a proxy in front of a stopped server would; ``test_tracking_server.py`` brings
a real ``mlflow server`` up during the wait.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from conductor.errors import ConductorError, StoreError
from tasks.tracking import (
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


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def down(monkeypatch: pytest.MonkeyPatch) -> str:
    """``MLFLOW_TRACKING_URI`` at a port nothing listens on; a 1 s retry window."""
    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    monkeypatch.setenv("CONDUCTOR_MLFLOW_RETRY_S", "1")
    return url


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(self.server.status)  # type: ignore[attr-defined]
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def health() -> Iterator[http.server.HTTPServer]:
    """An HTTP server on 127.0.0.1 whose every GET answers ``server.status``."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    server.status = 200  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server: http.server.HTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_log_eval_fails_in_one_line_after_the_retry_window(down: str):
    started = time.monotonic()
    with pytest.raises(TrackingUnavailableError) as caught:
        log_eval.fn("eval/x", "single:calculator", {}, {"accuracy": 1.0}, [], {})
    waited = time.monotonic() - started
    message = str(caught.value)
    assert message.startswith(f"MLflow tracking server {down} unreachable (log eval")
    assert "retried 1 s" in message and "Connection refused" in message
    assert "\n" not in message and "CONDUCTOR_MLFLOW_RETRY_S" in message
    assert isinstance(caught.value, ConductorError)  # the CLI prints it as one line
    assert isinstance(caught.value, StoreError)  # a runtime failure: the CLI exits 1
    # It waited the window, and no more than a few probes past it (MLflow's own client,
    # left alone on a refused connection, retries for about 4 minutes).
    assert 1.0 <= waited < 20.0


def test_every_write_helper_waits_for_the_server(down: str, monkeypatch, tmp_path):
    import mlflow

    monkeypatch.setenv("CONDUCTOR_MLFLOW_RETRY_S", "0.3")
    client = mlflow.MlflowClient(down)
    with pytest.raises(TrackingUnavailableError, match="open experiment train/conductor"):
        mlflow_experiment(client, "train/conductor")
    # The module, after set_tracking_uri, as tasks.training passes it (restored after).
    monkeypatch.setattr(mlflow.tracking._tracking_service.utils, "_tracking_uri", down)
    with pytest.raises(TrackingUnavailableError, match="open experiment eval/y"):
        mlflow_experiment(mlflow, "eval/y")
    with pytest.raises(TrackingUnavailableError, match="register a version of model orchrm"):
        register_version(client, "run", tmp_path, "orchrm", "model", {})


def test_a_local_store_is_not_waited_for(monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.setenv("CONDUCTOR_MLFLOW_RETRY_S", "30")
    started = time.monotonic()
    wait_for_tracking_server("log", f"sqlite:///{tmp_path / 'mlflow.db'}")
    with tracking_server("log", f"sqlite:///{tmp_path / 'mlflow.db'}"):
        pass
    assert time.monotonic() - started < 1.0


def test_a_server_that_answers_is_not_waited_for(health: http.server.HTTPServer, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_MLFLOW_RETRY_S", "30")
    started = time.monotonic()
    wait_for_tracking_server("log", _url(health))
    assert time.monotonic() - started < 5.0
    health.status = 404  # any answer but a proxy's 502-504 means it is up (a path prefix)
    wait_for_tracking_server("log", _url(health))


def test_a_proxy_answering_503_counts_as_down(health: http.server.HTTPServer):
    health.status = 503
    with pytest.raises(TrackingUnavailableError, match=r"retried 0.3 s\): HTTP 503"):
        wait_for_tracking_server("log eval", _url(health), retry_s=0.3)


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


def test_a_server_lost_during_the_write_is_one_line(health: http.server.HTTPServer):
    import requests
    from mlflow.exceptions import MlflowException

    def lost() -> None:
        try:
            raise requests.ConnectionError("[Errno 111] Connection refused")
        except requests.ConnectionError as e:  # as MLflow's client raises it: no "from"
            raise MlflowException(f"API request to {_url(health)} failed: {e}")  # noqa: B904

    with pytest.raises(TrackingUnavailableError, match="lost during the write") as caught:
        with tracking_server("log eval", _url(health)):
            lost()
    assert "Connection refused" in str(caught.value) and "\n" not in str(caught.value)
    refused = MlflowException("bad param", error_code="INVALID_PARAMETER_VALUE")
    with pytest.raises(MlflowException, match="bad param"):  # a refused request stays itself
        with tracking_server("log eval", _url(health)):
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


def test_prefect_does_not_retry_a_write_that_already_waited():
    assert not retry_unless_unreachable(None, None, _State(TrackingUnavailableError("down")))
    assert retry_unless_unreachable(None, None, _State(RuntimeError("database is locked")))


def test_the_tracking_errors_live_with_the_other_errors():
    import conductor.errors

    # One error root (conductor/errors.py); tasks.tracking keeps its names importable.
    assert TrackingUnavailableError is conductor.errors.TrackingUnavailableError
    assert TrackingError is conductor.errors.TrackingError
    assert issubclass(TrackingUnavailableError, TrackingError)
    assert issubclass(TrackingError, StoreError)  # a runtime failure: the CLI exits 1
    assert not issubclass(TrackingUnavailableError, conductor.errors.StoreUnavailableError)
