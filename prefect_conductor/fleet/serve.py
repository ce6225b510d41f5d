"""``conductor serve``: a warm process that answers ``conductor run`` (issue #10, cold start).

A fresh ``conductor run`` pays, before its first worker call, for importing litellm (3.6 s on
the 2-core machine), torch and transformers, and for loading the local model. ``conductor
serve`` pays that once: it is a Prefect **task worker** (``prefect.task_worker.serve``) that
has imported the engine and loaded every local model of its pool (one short completion per
model; the conductor's with its planning prompt, so that the prompt's system part is kept and
never computed again, ``conductor.providers._prefix_cache``). ``conductor run``, when it finds one,
submits its request as a background task run (``Task.delay``) and waits for its result; the
command itself then imports only Prefect.

The served task (``served_request``, ``tasks/fleet.py``) calls the ``orchestrate`` flow (or
``best-of-n``) in the serving process, so the run is the same Prefect flow run with the same
artifacts, Parquet rows and persisted result as in-process (a flow run of its own: Prefect
links a flow run to a parent task run only inside a parent flow run, and a task worker's task
runs have none). ``serve`` hands the served tasks their flows before it serves
(``SERVED_FLOWS`` of ``flows/fleet_question.py``): ``tasks/`` imports no ``flows/``.

Discovery, without a network call: ``serve`` writes ``$CONDUCTOR_HOME/serve.json`` (its pid
and Prefect API URL) and removes it when it stops. ``run`` uses it only when its own
``PREFECT_API_URL`` is the same and that pid is alive; ``--in-process`` bypasses it. Task
workers need a running Prefect server (the ephemeral one lives and dies with each command),
so ``serve`` refuses to start without ``PREFECT_API_URL``.

It serves ``prefect_conductor.tasks.fleet.fleet_question`` too: the questions of ``conductor
eval --fan-out`` (``fanout.py``), from any host of the fleet, each run by whichever serve
process the Prefect server hands it to.

The request's parameters and result travel through the task's result storage
(``$CONDUCTOR_HOME/results``), so client and server share the conductor home; paths in the
request (``--pool``, an adapter directory) are made absolute by the client.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect_conductor.conductor.home import conductor_home
from prefect_conductor.runtime.server import with_local_results
from prefect_conductor.tasks.fleet import ServeError, fleet_question, serve_flows, served_request

__all__ = [
    "ServeError",
    "Served",
    "find_served",
    "marker_path",
    "serve",
    "submit",
]

MARKER = "serve.json"
# While the client waits for the answer: how often it looks at the serving process, and how
# often it reads the task run's state from the API (in case its terminal event was missed).
_POLL_S = 1.0
_CHECK_S = 5.0
_PICKUP_NOTICE_S = 15.0  # still not started by then: one line on stderr
_log = logging.getLogger("prefect_conductor.serve")


@dataclass(frozen=True)
class Served:
    pid: int
    api_url: str
    started_at: float


def marker_path() -> Path:
    return conductor_home() / MARKER


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def find_served(api_url: str | None = None) -> Served | None:
    """The serving process for this conductor home and Prefect API, if one is running."""
    api_url = api_url if api_url is not None else os.environ.get("PREFECT_API_URL", "")
    if not api_url:
        return None
    try:
        data = json.loads(marker_path().read_text())
        served = Served(int(data["pid"]), str(data["api_url"]), float(data["started_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if served.api_url.rstrip("/") != api_url.rstrip("/") or not _alive(served.pid):
        return None
    return served


def _write_marker(api_url: str) -> Path:
    path = marker_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "api_url": api_url, "started_at": time.time()}))
    tmp.replace(path)  # atomic: a client never reads half a file
    return path


def _remove_marker(path: Path) -> None:
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def warm(pool: Any) -> list[str]:
    """Load every local model of ``pool`` with one short completion; the models warmed.

    The conductor is warmed with its real planning prompt, so its system prompt's states are
    kept (``conductor.providers._prefix_cache``) and the first request computes only its question.
    """
    from prefect_conductor.conductor.plan.prompts import conductor_messages
    from prefect_conductor.conductor.providers.llm import complete

    warmed = []
    endpoints = [pool.conductor, *pool.workers]
    for endpoint in endpoints:
        if endpoint.model.startswith("local/") and endpoint.model not in warmed:
            if endpoint is pool.conductor:
                messages = conductor_messages("What is 1 + 1?", pool)
            else:
                messages = [{"role": "user", "content": "Hi"}]
            from prefect_conductor.tasks.secrets import prefect_secrets

            with prefect_secrets():
                complete(endpoint, messages, max_tokens=1)
            warmed.append(endpoint.model)
    return warmed


def serve(pool: Any, limit: int = 4, on_ready: Any = None) -> None:
    """Warm up, advertise this process in the conductor home, and serve until stopped."""
    from prefect.task_worker import serve as serve_tasks

    api_url = os.environ.get("PREFECT_API_URL", "")
    if not api_url:
        raise ServeError(
            "conductor serve needs a running Prefect server: start one with "
            "`prefect server start` and export PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
    other = find_served(api_url)
    if other is not None and other.pid != os.getpid():
        raise ServeError(
            f"conductor serve is already running for {conductor_home()} (pid {other.pid})"
        )
    started = time.perf_counter()
    # The engine, imported before the first request, and the flows the served tasks run.
    from prefect_conductor.flows.fleet_question import SERVED_FLOWS

    serve_flows(SERVED_FLOWS)

    warmed = warm(pool)
    path = _write_marker(api_url)
    atexit.register(_remove_marker, path)
    # SIGTERM (a process manager, `kill`) stops as Ctrl-C does, so the marker goes too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if on_ready is not None:
        on_ready(warmed, time.perf_counter() - started)
    # The request's own task-run lines ("Finished in state ...") have no flow run to go to;
    # the flow run it starts logs to the API as usual.
    warnings.filterwarnings("ignore", message=r"Logger 'prefect\.task_runs' attempted to send")
    try:  # ``conductor run`` requests, and the questions of ``eval --fan-out``
        serve_tasks(with_local_results(served_request), fleet_question, limit=limit)
    finally:
        _remove_marker(path)


def _absolute(value: str | None) -> str | None:
    """A path that exists here, made absolute for a process in another directory."""
    if value and not value.startswith("models:/") and Path(value).expanduser().exists():
        return str(Path(value).expanduser().resolve())
    return value


def submit(request: Any, served: Served, best_of: bool = False) -> Any:
    """Send ``request`` to the serving process and wait for its RunResult."""
    import httpx

    from prefect_conductor.conductor.plan.requests import RunResult

    payload = request.model_copy(
        update={"pool": _absolute(request.pool), "conductor": _absolute(request.conductor)}
    ).model_dump(mode="json")
    from prefect.task_runs import TaskRunWaiter

    try:
        TaskRunWaiter.instance()  # subscribed to task-run events before the request exists
        future = with_local_results(served_request).delay(payload, best_of)
        state = _wait(future, served)
        result = future.result(raise_on_failure=False)
    except httpx.HTTPError as exc:  # the server went away, or answered with an error
        raise ServeError(
            f"the Prefect API at {served.api_url} failed while conductor serve (pid "
            f"{served.pid}) ran the request: {type(exc).__name__}: {exc}"
        ) from exc
    if not state.is_completed() or isinstance(result, BaseException):
        message = str(result).strip() if isinstance(result, BaseException) else state.message
        raise ServeError(message or f"the served run ended {state.name}")
    return RunResult.model_validate(result)


def _wait(future: Any, served: Served) -> Any:
    """The final state of the served task run; fails when the serving process dies first.

    The wait is Prefect's event subscription (``TaskRunWaiter``: the server pushes the task
    run's terminal event over a websocket), checked every ``_POLL_S`` with no API call, and
    the task run's state read from the API every ``_CHECK_S`` in case an event was missed.
    Not ``future.wait()`` in a loop: each call builds an API client (an SSL context, ~50 ms
    of CPU on the core the model needs) and it raised "has no state" for a task run the API
    had not given a state yet (seen in benchmarks/cold_start.py on 2 cores).
    """
    from prefect.client.orchestration import get_client
    from prefect.task_runs import TaskRunWaiter

    done = threading.Event()
    TaskRunWaiter.add_done_callback(future.task_run_id, done.set)
    with get_client(sync_client=True) as client:
        start = checked = time.monotonic()
        picked_up = told = False
        while not done.wait(_POLL_S):
            if not _alive(served.pid):
                raise ServeError(f"conductor serve (pid {served.pid}) stopped before answering")
            if time.monotonic() - checked >= _CHECK_S:
                state = client.read_task_run(future.task_run_id).state
                if state is not None and state.is_final():
                    break
                picked_up = picked_up or (state is not None and not state.is_scheduled())
                checked = time.monotonic()
                if not picked_up and not told and checked - start >= _PICKUP_NOTICE_S:
                    told = True  # busy with --limit requests, or deaf: say so, keep waiting
                    _log.warning(
                        "conductor serve (pid %d) has not started this request after %.0f s: "
                        "it runs --limit requests at once; if it is stuck, restart it, or "
                        "use --in-process",
                        served.pid,
                        checked - start,
                    )
    future.wait()  # final now: reads the state once, so result() needs no further wait
    return future.state
