"""Discovery of a running ``conductor serve`` (prefect_conductor/fleet/serve.py): the client finds it only for
its own conductor home and Prefect API, and only while that process is alive."""

from __future__ import annotations

import json
import os
import threading

import pytest

from prefect_conductor.fleet import serve

API = "http://127.0.0.1:4200/api"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path))
    monkeypatch.setenv("PREFECT_API_URL", API)
    return tmp_path


def _marker(home, pid: int, api_url: str = API) -> None:
    (home / "serve.json").write_text(
        json.dumps({"pid": pid, "api_url": api_url, "started_at": 1.0})
    )


def test_a_live_server_for_the_same_api_is_found(home):
    _marker(home, os.getpid(), API + "/")  # a trailing slash is the same API
    found = serve.find_served()
    assert found is not None and found.pid == os.getpid() and found.api_url == API + "/"


def test_no_marker_or_no_api_url_finds_nothing(home, monkeypatch):
    assert serve.find_served() is None
    _marker(home, os.getpid())
    monkeypatch.delenv("PREFECT_API_URL")
    assert serve.find_served() is None  # the ephemeral API: a task worker can't serve it


def test_another_api_is_not_ours(home):
    _marker(home, os.getpid(), "http://127.0.0.1:4999/api")
    assert serve.find_served() is None


def _dead_pid() -> int:
    """A pid no process has: Linux never hands out one above ``PID_MAX_LIMIT`` (2**22)."""
    return 2**22 + 1


def test_a_dead_process_is_ignored(home):
    _marker(home, _dead_pid())
    assert serve.find_served() is None


@pytest.mark.parametrize("text", ["", "{", '{"pid": "x"}', '{"api_url": "a"}', "[]"])
def test_a_damaged_marker_is_ignored(home, text):
    (home / "serve.json").write_text(text)
    assert serve.find_served() is None


def test_the_marker_is_removed_only_by_its_own_process(home):
    path = serve._write_marker(API)
    assert json.loads(path.read_text())["pid"] == os.getpid()
    _marker(home, os.getpid() + 1)
    serve._remove_marker(path)
    assert path.exists()  # another process's marker stays
    serve._write_marker(API)
    serve._remove_marker(path)
    assert not path.exists()


def test_serve_needs_a_running_server(home, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL")
    with pytest.raises(serve.ServeError, match="running Prefect server"):
        serve.serve(pool=None)


def test_serve_refuses_a_second_process_for_the_same_home(home):
    parent = os.getppid()
    _marker(home, parent)
    with pytest.raises(serve.ServeError, match=f"already running .* \\(pid {parent}\\)"):
        serve.serve(pool=None)


def test_request_paths_become_absolute_for_the_serving_process(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pool.yaml").write_text("workers: []")
    assert serve._absolute("pool.yaml") == str(tmp_path / "pool.yaml")
    assert serve._absolute("models:/conductor@champion") == "models:/conductor@champion"
    assert serve._absolute("no-such-file.yaml") == "no-such-file.yaml"  # the server says so
    assert serve._absolute(None) is None


class _Future:
    """A served task run's future; wait() raises, as Prefect's does, while the run has no state
    (Pending here), so the client may call it only once the run is final."""

    task_run_id = "00000000-0000-0000-0000-000000000001"

    def __init__(self, states, result=None):
        self.states = list(states)
        self.waits = 0
        self._result = result

    @property
    def state(self):
        return self.states[-1]

    def wait(self, timeout=None):
        if not self.states[-1].is_final():
            raise RuntimeError("Task run x has no state which means it hasn't started yet.")
        self.waits += 1

    def result(self, raise_on_failure=True):
        return self._result


class _Client:
    """The API as the client's safety-net check reads it: ``states`` in turn."""

    def __init__(self, states):
        self.states, self.reads = list(states), 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read_task_run(self, task_run_id):
        self.reads += 1
        state = self.states[0] if len(self.states) == 1 else self.states.pop(0)
        return type("TaskRun", (), {"state": state})()


def _request():
    from prefect_conductor.conductor.plan.requests import OrchestrateRequest

    return OrchestrateRequest(question="What is 17 + 25?")


def _run_result():
    return {
        "run_id": "r1",
        "status": "completed",
        "answer": "42",
        "workflow": [],
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_usd": 0.0,
        "wall_s": 0.1,
        "artifacts": "/tmp/a",
        "format_valid": True,
    }


@pytest.fixture
def waiting(monkeypatch):
    """The client's wait with fast polls, a scripted API, and the terminal event after
    ``event_after`` seconds (None: the event never comes). The submission itself is replaced
    on ``served_request``, so its per-call result storage (a copy of the task) is not made."""
    monkeypatch.setattr(serve, "with_local_results", lambda task: task)
    from prefect.task_runs import TaskRunWaiter

    setup = {"event_after": 0.05, "client": _Client([None])}

    def add_done_callback(task_run_id, callback):
        if setup["event_after"] is not None:
            threading.Timer(setup["event_after"], callback).start()

    monkeypatch.setattr(TaskRunWaiter, "add_done_callback", add_done_callback)
    monkeypatch.setattr(TaskRunWaiter, "instance", lambda: None)  # no real subscription
    monkeypatch.setattr(
        "prefect.client.orchestration.get_client", lambda sync_client=False: setup["client"]
    )
    monkeypatch.setattr(serve, "_POLL_S", 0.01)
    monkeypatch.setattr(serve, "_CHECK_S", 0.03)
    return setup


def test_submit_returns_when_the_terminal_event_arrives(home, monkeypatch, waiting):
    from prefect.states import Completed, Running

    future = _Future([Running()], _run_result())
    monkeypatch.setattr(serve.served_request, "delay", lambda *a: future)
    threading.Timer(0.02, lambda: future.states.append(Completed())).start()
    result = serve.submit(_request(), serve.Served(os.getpid(), API, 0.0))
    assert result.answer == "42"
    assert future.waits == 1  # once, on the final state: never on a run without one


def test_submit_reads_the_state_when_the_event_is_missed(home, monkeypatch, waiting):
    from prefect.states import Completed, Pending, Running

    waiting["event_after"] = None
    waiting["client"] = _Client([None, Pending(), Running(), Completed()])
    future = _Future([Completed()], _run_result())
    monkeypatch.setattr(serve.served_request, "delay", lambda *a: future)
    assert serve.submit(_request(), serve.Served(os.getpid(), API, 0.0)).answer == "42"
    assert waiting["client"].reads >= 4  # a state-less run, Pending, Running, Completed


def test_submit_fails_in_one_line_when_the_server_dies_or_the_api_fails(home, monkeypatch, waiting):
    import httpx
    from prefect.states import Failed, Scheduled

    waiting["event_after"] = None
    dead = serve.Served(_dead_pid(), API, 0.0)
    monkeypatch.setattr(serve.served_request, "delay", lambda *a: _Future([Scheduled()]))
    with pytest.raises(serve.ServeError, match="stopped before answering"):
        serve.submit(_request(), dead)

    def unreachable(*args):
        raise httpx.ConnectError("All connection attempts failed")

    monkeypatch.setattr(serve.served_request, "delay", unreachable)
    with pytest.raises(serve.ServeError, match=f"Prefect API at {API} failed.*ConnectError"):
        serve.submit(_request(), serve.Served(os.getpid(), API, 0.0))

    waiting["event_after"] = 0.01
    failed = _Future([Failed(message="calculator: no arithmetic expression")])
    monkeypatch.setattr(serve.served_request, "delay", lambda *a: failed)
    with pytest.raises(serve.ServeError, match="no arithmetic expression"):
        serve.submit(_request(), serve.Served(os.getpid(), API, 0.0))


def test_submit_says_once_when_the_request_is_not_picked_up(home, monkeypatch, waiting, caplog):
    from prefect.states import Completed, Running, Scheduled

    waiting["event_after"] = None
    monkeypatch.setattr(serve, "_PICKUP_NOTICE_S", 0.05)
    waiting["client"] = _Client([Scheduled()] * 5 + [Running(), Completed()])
    monkeypatch.setattr(
        serve.served_request, "delay", lambda *a: _Future([Completed()], _run_result())
    )
    with caplog.at_level("WARNING", logger="prefect_conductor.serve"):
        assert serve.submit(_request(), serve.Served(os.getpid(), API, 0.0)).answer == "42"
    notices = [r.getMessage() for r in caplog.records if "has not started" in r.getMessage()]
    assert len(notices) == 1 and f"pid {os.getpid()}" in notices[0]


@pytest.mark.parametrize(
    ("name", "shown"),
    [("served_request", "conductor-request"), ("fleet_question", "fleet-question")],
)
def test_a_served_task_outside_conductor_serve_says_what_serves_it(monkeypatch, name, shown):
    """The fleet's tasks run the flows that ``serve`` hands them (``tasks/`` imports no
    ``flows/``): run anywhere else, they say so in one line instead of running nothing."""
    from prefect_conductor.conductor.plan.requests import OrchestrateRequest
    from prefect_conductor.tasks import fleet

    monkeypatch.setattr(fleet, "_served", None)
    request = OrchestrateRequest(question="What is 1 + 1?")
    args = (request.model_dump(mode="json"),) if name == "served_request" else (request, "r")
    with pytest.raises(serve.ServeError, match=f"^{shown} runs the flows that `conductor serve`"):
        getattr(fleet, name).fn(*args)
