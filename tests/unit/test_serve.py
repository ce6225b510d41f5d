"""Discovery of a running ``conductor serve`` (flows/serve.py): the client finds it only for
its own conductor home and Prefect API, and only while that process is alive."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from flows import serve

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


def test_a_dead_process_is_ignored(home):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    _marker(home, int(gone.stdout))
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
