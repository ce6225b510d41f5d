"""Waiting for a tracking server that answers (issue #19, item 3): a small HTTP server that
answers ``/health`` as a server or a proxy in front of a stopped one would, and a real
``mlflow server`` that comes up while an eval's MLflow write waits for it (the write succeeds,
whole, once the server answers).

The waits run on a fake clock (``tests/clock.py``) where the server is local and quick, and
are counted in probes where a real ``mlflow server`` takes its time (10-30 s to answer
``/health`` on a busy 2-core machine): no test times anything. A server that is down (a
closed port) is ``tests/unit/test_tracking.py``.
"""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import prefect_conductor.tasks.tracking
import pytest
from prefect_conductor.tasks.tracking import (
    TrackingUnavailableError,
    log_eval,
    wait_for_tracking_server,
)

from tests.clock import FakeClock

WINDOW_S = 120  # far more than the server needs; the test ends as soon as it answers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


# -- a local HTTP server ---------------------------------------------------------------------


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


def test_a_server_that_answers_is_not_waited_for(health, monkeypatch, probes):
    monkeypatch.setenv("CONDUCTOR_MLFLOW_RETRY_S", "30")
    clock = FakeClock().install(monkeypatch, prefect_conductor.tasks.tracking)
    wait_for_tracking_server("log", _url(health))
    assert probes == [None] and clock.sleeps == []  # one probe, no wait
    health.status = 404  # any answer but a proxy's 502-504 means it is up (a path prefix)
    wait_for_tracking_server("log", _url(health))
    assert probes == [None, None] and clock.sleeps == []


def test_a_proxy_answering_503_counts_as_down(health, monkeypatch, probes):
    clock = FakeClock().install(monkeypatch, prefect_conductor.tasks.tracking)
    health.status = 503
    with pytest.raises(TrackingUnavailableError, match=r"retried 0.3 s\): HTTP 503"):
        wait_for_tracking_server("log eval", _url(health), retry_s=0.3)
    assert clock.slept == pytest.approx(0.3)  # the whole window, as for a closed port
    assert len(probes) == 3 and all(why and why.startswith("HTTP 503") for why in probes)


# -- a real mlflow server --------------------------------------------------------------------


@pytest.fixture
def late_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, list[subprocess.Popen], list[str | None]]]:
    """The URL of an ``mlflow server`` that is started once a probe has found it down, the
    server's process, and what each probe found."""
    port, procs, found = _free_port(), [], []
    cmd = [
        *(sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1"),
        *("--port", str(port), "--workers", "1"),
        *("--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"),
        *("--artifacts-destination", str(tmp_path / "mlartifacts")),
    ]
    env = {
        **os.environ,
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    log = (tmp_path / "mlflow.log").open("wb")
    why_down = prefect_conductor.tasks.tracking._why_down

    def probe(url: str, timeout: float) -> str | None:
        found.append(why_down(url, timeout))
        if found[-1] is not None and not procs:  # the write is waiting: start the server
            procs.append(
                subprocess.Popen(
                    cmd,
                    env=env,
                    cwd=tmp_path,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own group: the worker goes with it
                )
            )
        return found[-1]

    monkeypatch.setattr(prefect_conductor.tasks.tracking, "_why_down", probe)
    yield f"http://127.0.0.1:{port}", procs, found
    for proc in procs:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log.close()


def test_a_write_waits_for_a_server_that_comes_up(late_server, monkeypatch):
    import mlflow

    url, procs, probes = late_server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    monkeypatch.setenv("CONDUCTOR_MLFLOW_RETRY_S", str(WINDOW_S))
    rows = [{"question_id": "q1", "answer": "42", "correct": True}]
    run_id = log_eval.fn(
        "eval/arithmetic",
        "single:calculator",
        params={"strategy": "single:calculator"},
        metrics={"accuracy": 1.0, "n": 1},
        rows=rows,
        tags={"eval_id": "e1"},
    )
    assert len(procs) == 1 and procs[0].poll() is None, "the server was not started by the test"
    # It found the server down, kept probing while it came up, and wrote once it answered;
    # the write's later waits found it up at once.
    up = probes.index(None)
    assert up >= 1 and probes[0] == "Connection refused"
    assert probes[up:] == [None] * (len(probes) - up)

    run = mlflow.MlflowClient(url).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics == {"accuracy": 1.0, "n": 1.0}
    assert run.data.params == {"strategy": "single:calculator"}
    assert run.data.tags["eval_id"] == "e1"
    artifacts = [a.path for a in mlflow.MlflowClient(url).list_artifacts(run_id)]
    assert artifacts == ["results.json"]  # the table went through the server's proxy
    probed = len(probes)
    wait_for_tracking_server("check", url, retry_s=0)  # still up: answers at once
    assert probes[probed:] == [None]
