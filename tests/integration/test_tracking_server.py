"""A real ``mlflow server`` that comes up while an eval's MLflow write waits for it
(issue #19, item 3): the write succeeds, whole, once the server answers.

The server (sqlite backend and proxied artifacts in ``tmp_path``) starts a second after the
write begins; on a busy 2-core machine it takes 10-30 s to answer ``/health``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.tracking import log_eval, wait_for_tracking_server

START_AFTER_S = 1.0
WINDOW_S = 120  # far more than the server needs; the test ends as soon as it answers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def late_server(tmp_path: Path) -> Iterator[tuple[str, list[subprocess.Popen]]]:
    """The URL of an ``mlflow server`` started ``START_AFTER_S`` from now, in a thread."""
    port, procs = _free_port(), []
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

    def start() -> None:
        time.sleep(START_AFTER_S)
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

    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    yield f"http://127.0.0.1:{port}", procs
    starter.join()
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

    url, procs = late_server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    monkeypatch.setenv("CONDUCTOR_MLFLOW_RETRY_S", str(WINDOW_S))
    started = time.monotonic()
    rows = [{"question_id": "q1", "answer": "42", "correct": True}]
    run_id = log_eval.fn(
        "eval/arithmetic",
        "single:calculator",
        params={"strategy": "single:calculator"},
        metrics={"accuracy": 1.0, "n": 1},
        rows=rows,
        tags={"eval_id": "e1"},
    )
    waited = time.monotonic() - started
    assert procs and procs[0].poll() is None, "the server was not started by the test"
    assert START_AFTER_S <= waited < WINDOW_S  # it waited for the server, then wrote

    run = mlflow.MlflowClient(url).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics == {"accuracy": 1.0, "n": 1.0}
    assert run.data.params == {"strategy": "single:calculator"}
    assert run.data.tags["eval_id"] == "e1"
    artifacts = [a.path for a in mlflow.MlflowClient(url).list_artifacts(run_id)]
    assert artifacts == ["results.json"]  # the table went through the server's proxy
    wait_for_tracking_server("check", url, retry_s=0)  # still up: answers at once
