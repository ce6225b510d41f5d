"""Settings of the ephemeral Prefect server the CLI starts (prefect_conductor/runtime/server.py)."""

from __future__ import annotations

import pytest

from prefect_conductor.runtime.server import _EPHEMERAL_SERVER_ENV


def test_recorder_flush_interval_is_whole_seconds():
    # Prefect's task-run recorder sleeps int(flush_interval) between flushes: a fraction
    # becomes sleep(0), a busy loop that keeps the server at most of a core.
    value = float(_EPHEMERAL_SERVER_ENV["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL"])
    assert value >= 1 and value.is_integer()


def test_the_server_command_is_prefects_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary server is started with a parent-death signal by running Prefect's own
    command ourselves (issue #39: no process-wide ``subprocess.Popen`` patch). If Prefect
    changes the command, this says so."""
    import subprocess

    from prefect.server.api import server as prefect_server

    from prefect_conductor.runtime.server import _dies_with_this_process, uvicorn_command

    seen: list[tuple[list[str], dict[str, str]]] = []

    class Recorder:
        def __init__(self, args: list[str], env: dict[str, str], **_: object) -> None:
            seen.append((args, env))

    monkeypatch.setattr(prefect_server.subprocess, "Popen", Recorder)
    server = prefect_server.SubprocessASGIServer(port=54321)
    try:
        server._run_uvicorn_command()
        assert seen[0] == uvicorn_command(server)
        monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: seen.append(("ours", k)))
        with _dies_with_this_process(server):
            server._run_uvicorn_command()
        assert "preexec_fn" in seen[1][1]  # ours, with the parent-death signal
        assert "_run_uvicorn_command" not in vars(server)  # the class's method again
    finally:
        prefect_server.SubprocessASGIServer._instances.pop(54321, None)
