"""End to end through a real Prefect server and a process worker, as a user of the UI runs it.

One server for the module: ``prefect server start`` on a free port with its own
``PREFECT_HOME``; the deployments are registered with the project's own script
(``deployments/register.sh``, run from an unrelated directory); a process worker runs in
another directory, a project with its own ``flows``, ``tasks`` and ``conductor`` packages, without ``CONDUCTOR_HOME`` in its environment, so the conductor home can
only come from the deployments' job variables. Flow runs are created through the REST API as
the UI's Run button does (``POST /deployments/{id}/create_flow_run``). Both flows use the
calculator alone (``single:calculator``): no model is loaded.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prefect_conductor.conductor.data.store import ArtifactStore

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PREFECT = shutil.which("prefect", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
RETRY_STATUS = {429, 502, 503}
RUN_TIMEOUT_S = 240  # a loaded 2-core machine: the flow-run process imports torch & co.


@dataclass
class Server:
    api: str  # http://127.0.0.1:PORT/api
    home: Path  # the CONDUCTOR_HOME the deployments were registered with
    env: dict[str, str]  # environment of the test's own prefect commands
    logs: Path
    register_output: str

    def call(self, method: str, path: str, body: Any = None) -> Any:
        # A busy server on SQLite answers 503 (a locked database, rolled back) or 429; Prefect's
        # own client retries those with backoff, and so does this one (CI saw a 503 here).
        with httpx.Client(base_url=self.api, timeout=30) as client:
            for attempt in range(6):
                response = client.request(method, path, json=body)
                if response.status_code not in RETRY_STATUS:
                    break
                time.sleep(0.5 * 2**attempt)
        assert response.status_code < 300, f"{method} {path}: {response.text[:500]}"
        return response.json() if response.content else None

    def tail(self, name: str, chars: int = 3000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    with log.open("wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(proc: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM to the process group we started (server + uvicorn, worker + flow runs)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def _wait_healthy(api: str, proc: subprocess.Popen, log: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"prefect server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"prefect server not healthy after {timeout_s} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    if PREFECT is None:
        pytest.skip("the `prefect` CLI is not installed next to this Python or on PATH")
    base = tmp_path_factory.mktemp("real-server")
    logs, home = base / "logs", base / "conductor-home"
    for d in (logs, base / "prefect-home", base / "register-cwd", base / "worker-cwd"):
        d.mkdir()
    # The worker starts in a user's Prefect project with its own `flows` and `tasks` packages
    # (issue #39): ours install under `prefect_conductor` and never meet them.
    for name in ("flows", "tasks", "conductor"):
        (base / "worker-cwd" / name).mkdir()
        (base / "worker-cwd" / name / "__init__.py").write_text(
            f"raise ImportError('the project's own {name} package was imported')\n"
        )
    api = f"http://127.0.0.1:{_free_port()}/api"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PREFECT_API_", "PREFECT_PROFILE", "PREFECT_UI_"))
        and k not in {"CONDUCTOR_HOME", "CONDUCTOR_ARTIFACTS", "MLFLOW_TRACKING_URI", "PYTHONPATH"}
    }
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PREFECT_HOME=str(base / "prefect-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_LOGGING_LEVEL="WARNING",
    )
    port = api.rsplit(":", 1)[1].split("/")[0]
    server_proc = _start(
        [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", port, "--no-ui"],
        env,
        base,
        logs / "server.log",
    )
    worker_proc = None
    try:
        _wait_healthy(api, server_proc, logs / "server.log")
        client_env = {**env, "PREFECT_API_URL": api}
        register = subprocess.run(
            ["bash", str(ROOT / "deployments" / "register.sh")],
            env={**client_env, "CONDUCTOR_HOME": str(home)},
            cwd=base / "register-cwd",  # not the checkout: nothing may depend on it
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert register.returncode == 0, register.stdout[-3000:] + register.stderr[-3000:]
        worker_proc = _start(
            [PREFECT, "worker", "start", "--pool", "conductor-process"],
            {**client_env, "PREFECT_WORKER_QUERY_SECONDS": "1"},
            base / "worker-cwd",
            logs / "worker.log",
        )
        yield Server(api, home, client_env, logs, register.stdout + register.stderr)
    finally:
        if worker_proc is not None:
            _stop(worker_proc)
        _stop(server_proc)


def _deployment(server: Server, flow: str, name: str | None = None) -> dict:
    return server.call("GET", f"/deployments/name/{flow}/{name or flow}")


def _run(server: Server, flow: str, request: dict) -> dict:
    """Create a flow run of the deployment as the UI does; wait until it is final."""
    deployment = _deployment(server, flow)
    run = server.call(
        "POST",
        f"/deployments/{deployment['id']}/create_flow_run",
        {"parameters": {"request": request}},
    )
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        run = server.call("GET", f"/flow_runs/{run['id']}")
        if run["state"] and run["state"]["type"] in FINAL:
            break
        time.sleep(1)
    state = run["state"] or {}
    if state.get("type") != "COMPLETED":
        logs = server.call(
            "POST",
            "/logs/filter",
            {"logs": {"flow_run_id": {"any_": [run["id"]]}}, "limit": 200, "sort": "TIMESTAMP_ASC"},
        )
        lines = "\n".join(f"{x['level']} {x['message']}" for x in logs)
        pytest.fail(
            f"{flow} run {run['name']} is {state.get('type')} ({state.get('message')}):\n"
            f"{lines[-4000:]}\n--- worker ---\n{server.tail('worker')}"
        )
    return run


def _task_runs(server: Server, flow_run_id: str) -> list[dict]:
    return server.call(
        "POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200}
    )


def _artifacts(server: Server, flow_run_id: str) -> list[dict]:
    return server.call(
        "POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}}
    )


def _result(server: Server, flow_run: dict) -> Any:
    """The flow's return value as an API client reads it (what the UI's result tab shows)."""
    from prefect.client.orchestration import get_client
    from prefect.results import ResultRecord
    from prefect.settings import PREFECT_API_URL, temporary_settings

    data = flow_run["state"]["data"]
    assert data, "the flow run's result is not persisted: the API gives data: null"
    with temporary_settings(updates={PREFECT_API_URL: server.api}):
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run["id"]).state
        try:
            return state.result()
        except Exception as exc:  # noqa: BLE001 - then read the record where it was written
            key = Path(str(data.get("storage_key", "")))
            assert key.is_file(), f"result not readable ({exc!r}); record {data}"
            return ResultRecord.deserialize(key.read_bytes()).result


def _tags(value: Any) -> dict[str, str]:
    return dict(value) if value is not None else {}


def test_registration_stores_no_machine_directory_and_an_absolute_home(server):
    stored = {}
    for flow, name in [
        ("orchestrate", None),
        ("evaluate", None),
        ("train-conductor", None),
        ("train-reward-model", "retrain-orchrm"),
    ]:
        d = _deployment(server, flow, name)
        stored[d["name"]] = d["pull_steps"]
        assert not d["pull_steps"], d["pull_steps"]  # no set_working_directory, no clone
        assert d["path"] in (None, "", "."), d["path"]
        home = d["job_variables"]["env"]["CONDUCTOR_HOME"]
        assert Path(home).is_absolute() and Path(home) == server.home, home
    print("stored pull steps:", json.dumps(stored))


def test_orchestrate_deployment_runs_on_a_worker_in_another_directory(server):
    run = _run(
        server, "orchestrate", {"question": "What is 17 + 25?", "strategy": "single:calculator"}
    )

    names = [t["name"] for t in _task_runs(server, run["id"])]
    steps = [n for n in names if n.startswith("step-")]
    assert any(n.startswith("step-0") and "calculator" in n for n in steps), names

    artifacts = _artifacts(server, run["id"])
    keys = {a["key"] for a in artifacts}
    assert {"conductor-plan", "conductor-steps"} <= keys, keys
    assert any("42" in json.dumps(a["data"]) for a in artifacts), "no artifact shows the answer"

    result = _result(server, run)
    assert result.status == "completed" and result.answer.strip() == "42"

    store = ArtifactStore(str(server.home / "artifacts"))  # the registered home, not the cwd
    runs = store.read_pandas("runs")
    row = runs[runs["run_id"] == run["id"]]
    assert len(row) == 1 and row.iloc[0]["answer"].strip() == "42"
    stored_steps = store.read_pandas("steps")
    assert set(stored_steps[stored_steps["run_id"] == run["id"]]["worker"]) == {"calculator"}
    assert not (server.logs.parent / "worker-cwd" / ".conductor").exists()


def test_evaluate_deployment_reports_its_summary(server):
    request = {
        "dataset": "arithmetic",
        "split": "test",
        "limit": 3,
        "strategy": "single:calculator",
        "concurrency": 3,
    }
    run = _run(server, "evaluate", request)
    assert "arithmetic" in run["name"] and "single:calculator" in run["name"], run["name"]

    artifacts = _artifacts(server, run["id"])
    summary = [a for a in artifacts if a["key"] == "eval-summary"]
    assert summary and summary[-1]["type"] == "table", [(a["key"], a["type"]) for a in artifacts]
    assert "accuracy" in json.dumps(summary[-1]["data"])
    progress = [a for a in artifacts if a["type"] == "progress"]
    assert progress and float(progress[-1]["data"]) == 100.0, progress

    runs = ArtifactStore(str(server.home / "artifacts")).read_pandas("runs")
    mine = runs[[_tags(t).get("eval_id") == run["id"] for t in runs["tags"]]]
    assert len(mine) == 3, runs[["run_id", "tags"]].tail()
    assert (server.home / "mlflow.db").exists()  # the eval's MLflow run, under the home


# --- conductor serve: a warm process that `conductor run` hands its request to -------------

TOOL_POOL = """\
conductor:
  model: openai/gpt-4o-mini
  params: {mock_response: "model_id = [0]\\nsubtasks = ['17 + 25']\\naccess_list = [[]]"}
workers:
  - {name: calculator, kind: tool, model: tool/calculator, retries: 0}
"""


def _conductor(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "conductor"), *args], env=env, cwd=cwd, capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S,
    )  # fmt: skip


def test_conductor_run_goes_through_a_running_conductor_serve(server, tmp_path):
    home = tmp_path / "serve-home"
    env = {**server.env, "CONDUCTOR_HOME": str(home)}
    (tmp_path / "client").mkdir()
    pool = tmp_path / "client" / "pool.yaml"
    pool.write_text(TOOL_POOL)
    serve = _start(
        [str(BIN / "conductor"), "serve", "--pool", str(pool)], env, tmp_path, tmp_path / "s.log"
    )
    marker = home / "serve.json"
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not marker.exists():
            assert serve.poll() is None, (tmp_path / "s.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "conductor serve never became ready"
            time.sleep(0.25)
        assert json.loads(marker.read_text())["api_url"] == server.api

        # A relative --pool from the client's directory: the serving process is elsewhere.
        done = _conductor(["run", "What is 17 + 25?", "--pool", "pool.yaml", "--json"], env,
                          tmp_path / "client")  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert "via conductor serve" in done.stderr
        result = json.loads(done.stdout)
        assert result["status"] == "completed" and result["answer"].strip() == "42"

        # The same flow run as in-process: the orchestrate run, its steps, its answer log line.
        flow_run = server.call("GET", f"/flow_runs/{result['run_id']}")
        assert flow_run["state_type"] == "COMPLETED", flow_run["state"]
        names = [t["name"] for t in _task_runs(server, result["run_id"])]
        assert any(n.startswith("step-0") for n in names), names
        logged = False  # the serving process ships its logs in batches (every ~2 s)
        for _ in range(40):
            flt = {"logs": {"flow_run_id": {"any_": [result["run_id"]]}}}
            if any(e["message"] == "answer: 42" for e in server.call("POST", "/logs/filter", flt)):
                logged = True
                break
            time.sleep(0.5)
        assert logged, "no `answer: 42` line in the flow run's logs"
        runs = ArtifactStore(str(home / "artifacts")).read_pandas("runs")
        assert result["run_id"] in set(runs["run_id"])

        # A failing request fails the command with the run's own reason.
        pool.write_text(TOOL_POOL.replace("'17 + 25'", "'seventeen'"))
        failed = _conductor(["run", "Seventeen plus twenty-five?", "--pool", "pool.yaml"], env,
                            tmp_path / "client")  # fmt: skip
        assert failed.returncode == 1 and "via conductor serve" in failed.stderr
        assert "no arithmetic expression" in failed.stderr, failed.stderr[-2000:]

        pool.write_text(TOOL_POOL)
        local = _conductor(["run", "What is 17 + 25?", "--pool", "pool.yaml", "--in-process"],
                           env, tmp_path / "client")  # fmt: skip
        assert local.returncode == 0 and "via conductor serve" not in local.stderr
    finally:
        _stop(serve)
    assert serve.returncode is not None and not marker.exists()  # SIGTERM removes the marker

    # With the serving process gone, run works in-process again.
    again = _conductor(["run", "What is 17 + 25?", "--pool", str(pool)], env, tmp_path)
    assert again.returncode == 0 and "via conductor serve" not in again.stderr
    assert "answer: 42" in again.stdout
