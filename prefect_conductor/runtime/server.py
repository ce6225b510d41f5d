"""Prefect settings and shutdown for the runs the CLI starts in this process.

Against Prefect's *ephemeral* API (no ``PREFECT_API_URL``) the server lives and dies with
the command. Measured in ``benchmarks/engine_overhead.py`` on Prefect 3.9:

- flow-run heartbeats, which let a server mark crashed runs, have no one to tell, and
  Prefect joins the heartbeat thread when a flow ends, which waits up to one second per
  flow run: they are turned off;
- the server's task-run recorder writes one event per database transaction by default,
  and competes with the flow for the same cores: it batches here (every 0.5 s at most);
- the server may be stopped while its recorder still holds events, which leaves task runs
  shown as running in the database: ``wait_until_recorded`` waits (bounded) until every
  task run of the flow run is final before the process exits;
- the server is a subprocess that inherits the command's stdout and stderr, and when it is
  stopped at exit its services can log ``CancelledError`` tracebacks there (a flush of the
  task-run recorder cut short; CI saw one under ``conductor run --json``). This process
  cannot filter another's output, so the server is started here, before Prefect would start
  it lazily, with its output in ``$CONDUCTOR_HOME/logs/prefect-server.log``: nothing of the
  server reaches the terminal, and nothing it says is lost.

Also (issue #17), for the temporary server and every command:

- **offline**: no library phones home (``prefect_conductor.runtime.quiet.OFFLINE_DEFAULTS``:
Prefect's server analytics,
  MLflow's usage telemetry, Hugging Face's telemetry; ``DO_NOT_TRACK``), set as defaults
  before they are imported, so a user's own setting wins;
- **a slow host is not a failure**: the server may take minutes to start on a loaded
  machine (its first start migrates its database). It gets ``STARTUP_TIMEOUT_S`` unless
  Prefect's own ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` says otherwise. The
  terminal is told once that it is still starting only when the wait is worth a word: after
  ``NEW_DATABASE_NOTICE_S`` when the database is new (the first start migrates it), after
  ``SLOW_START_NOTICE_S`` otherwise (issue #39: the notice came on every command);
- **one home** (issue #39): the temporary server's database is
  ``$CONDUCTOR_HOME/prefect/prefect.db``, not ``~/.prefect/prefect.db``, unless Prefect is
  configured with a database of its own (``PREFECT_SERVER_DATABASE_CONNECTION_URL``, from
  the environment or a profile);
- **no orphans**: the server subprocess gets a parent-death signal (``PR_SET_PDEATHSIG``),
  so it ends when the command ends, however it ends (SIGKILL included), instead of living
  on with PPID 1 and holding its port and memory.

With a real server configured, Prefect's defaults stay as they are.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from prefect_conductor.conductor.errors import ConductorError
from prefect_conductor.runtime.quiet import offline_defaults

__all__ = [
    "STARTUP_TIMEOUT_S",
    "TemporaryServerError",
    "local_run_settings",
    "result_storage",
    "with_local_results",
    "server_log_path",
    "start_temporary_server",
    "wait_until_recorded",
]

R = TypeVar("R")

_SERVER_LOG_MAX_BYTES = 8 * 1024 * 1024  # started afresh past this
STARTUP_TIMEOUT_S = 300  # Prefect's default is 20 s; a loaded 2-core machine needed more
SLOW_START_NOTICE_S = 30.0  # an existing database: only a loaded machine waits this long
NEW_DATABASE_NOTICE_S = 5.0  # a new database: its migrations take most of a minute here
_DATABASE_SETTING = "PREFECT_SERVER_DATABASE_CONNECTION_URL"
_STARTUP_TIMEOUT_SETTING = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"


class TemporaryServerError(ConductorError):
    """Prefect's temporary API server did not start (a runtime failure: exit code 1)."""


_EPHEMERAL_SERVER_ENV = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "50",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "50",
    # Whole seconds: the recorder sleeps int(flush_interval) between flushes, so "0.5" became
    # sleep(0), a busy loop that kept the ephemeral server at ~70 % of a core for the whole
    # command (measured with py-spy during train-rm; it halved a 2-core training step).
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
}


def _ephemeral() -> bool:
    from prefect.settings import PREFECT_API_URL

    return not PREFECT_API_URL.value()


def server_log_path() -> Path:
    from prefect_conductor.conductor.home import conductor_home

    return conductor_home() / "logs" / "prefect-server.log"


def start_temporary_server() -> None:
    """Start Prefect's temporary server with its stdout and stderr in ``server_log_path()``.

    Prefect keeps one temporary server per process (``SubprocessASGIServer()`` is a
    singleton) and stops it at exit; every client of this process finds this one running.
    The child inherits file descriptors 1 and 2 as they are when it is spawned, so they point
    at the log for the spawn only and are restored at once."""
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    if server.running:
        return
    offline_defaults()  # read by the server subprocess when it starts
    new_database = _database_default()
    timeout = _startup_timeout()
    path = server_log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "ab" if path.exists() and path.stat().st_size < _SERVER_LOG_MAX_BYTES else "wb"
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    try:
        with path.open(mode) as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}\n".encode())
            log.flush()
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            notice = threading.Timer(
                NEW_DATABASE_NOTICE_S if new_database else SLOW_START_NOTICE_S,
                _say_still_starting,
                (saved[1], timeout, new_database),
            )
            notice.daemon = True
            notice.start()
            try:
                with _dies_with_this_process(server):
                    server.start(timeout=timeout)
            finally:
                notice.cancel()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    except RuntimeError as exc:  # Prefect's "Timed out while attempting to connect ..."
        raise TemporaryServerError(
            f"Prefect's temporary server did not start ({str(exc).splitlines()[0]}); "
            f"its log: {path}. Or run `prefect server start` and set PREFECT_API_URL."
        ) from None
    finally:
        for fd in saved:
            os.close(fd)


def _startup_timeout() -> int:
    """Prefect's setting when the user gave one (0 included), else ``STARTUP_TIMEOUT_S``."""
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS as setting

    configured = setting.value()
    if _STARTUP_TIMEOUT_SETTING in os.environ or configured != setting.default():
        return max(int(configured), 0)
    return STARTUP_TIMEOUT_S


def server_database_path() -> Path:
    from prefect_conductor.conductor.home import conductor_home

    return conductor_home() / "prefect" / "prefect.db"


def _database_default() -> bool:
    """Point the temporary server at ``server_database_path()`` unless Prefect is configured
    with a database; True when that database does not exist yet (its first start)."""
    from prefect.settings import get_current_settings

    database = get_current_settings().server.database
    if _DATABASE_SETTING in os.environ or "connection_url" in database.model_fields_set:
        return False
    path = server_database_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.environ[_DATABASE_SETTING] = f"sqlite+aiosqlite:///{path}"  # read by the subprocess
    return not path.exists()


def _say_still_starting(fd: int, timeout: int, new_database: bool) -> None:
    why = "its first start sets up its database" if new_database else "a loaded machine"
    message = (
        f"conductor: Prefect's temporary server is still starting ({why}; waiting up to "
        f"{timeout} s). A running server (PREFECT_API_URL) starts nothing.\n"
    )
    try:
        os.write(fd, message.encode())
    except OSError:
        pass


def _parent_death_signal(parent: int) -> Any:
    """A ``preexec_fn`` (it runs in the child between fork and exec, so it only calls what
    is already loaded): SIGTERM when the parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, in the parent

    def preexec() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl: no one sends the signal
            os._exit(1)

    return preexec


def uvicorn_command(server: Any) -> tuple[list[str], dict[str, str]]:
    """The command and environment Prefect 3.9's ``SubprocessASGIServer._run_uvicorn_command``
    runs (``tests/integration/test_cli.py`` checks them against Prefect's own)."""
    import prefect
    from prefect.settings import get_current_settings

    argv = [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent)]
    argv += ["--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1"]
    argv += ["--port", str(server.port), "--log-level", "error", "--lifespan", "on"]
    env = {
        **os.environ,
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        **get_current_settings().to_environment_variables(exclude_unset=True),
    }
    return argv, env


@contextmanager
def _dies_with_this_process(server: Any) -> Iterator[None]:
    """The server subprocess started in this block gets a parent-death signal.

    Prefect spawns its server in ``_run_uvicorn_command`` and offers no hook, so *this
    server object's* method is replaced for the block (nothing global changes: no
    ``subprocess.Popen`` patch, other servers and threads are untouched) by one that starts
    the same command with the signal. The signal follows the *thread* that spawned the child,
    so it is set only from the main thread, which lives as long as the command; on other
    platforms and threads Prefect's own method runs."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not (
        threading.main_thread()
    ):
        yield
        return
    preexec = _parent_death_signal(os.getpid())

    def run_uvicorn_command() -> subprocess.Popen[Any]:
        argv, env = uvicorn_command(server)
        return subprocess.Popen(argv, env=env, preexec_fn=preexec)  # noqa: S603

    server._run_uvicorn_command = run_uvicorn_command
    try:
        yield
    finally:
        del server._run_uvicorn_command  # back to the class's method


@contextmanager
def local_run_settings() -> Iterator[None]:
    if not _ephemeral():
        yield
        return
    for key, value in _EPHEMERAL_SERVER_ENV.items():
        os.environ.setdefault(key, value)  # read by the server subprocess when it starts
    start_temporary_server()
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def wait_until_recorded(flow_run_id: object, timeout_s: float = 5.0) -> bool:
    """Wait until the server has recorded every task run of the flow run as final."""
    if not _ephemeral() or flow_run_id is None:
        return True
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout_s
    flt = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    try:
        with get_client(sync_client=True) as client:
            while True:
                runs = client.read_task_runs(flow_run_filter=flt, limit=200)
                # A skipped step stays Pending ("NotReady") by design: it never ran.
                if all(_settled(r.state) for r in runs):
                    return True
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.1)
    except Exception:  # noqa: BLE001 - best effort: the run itself is already stored
        return False


def _settled(state: object) -> bool:
    return state is None or state.is_final() or state.name == "NotReady"  # type: ignore[attr-defined]


def with_local_results(runnable: R) -> R:
    """``runnable`` (a flow or a task) persisting its result under ``result_storage()``, chosen
    now, per call (issue #39), not when the module was imported; unchanged when Prefect is
    configured with result storage of its own."""
    storage = result_storage()
    return runnable if storage is None else runnable.with_options(result_storage=storage)


def result_storage() -> Path | None:
    """Where flow results are persisted: ``$CONDUCTOR_HOME/results`` (absolute, so the UI,
    the API and other processes can read a result back), unless Prefect is configured with
    its own result storage (``PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK`` or
    ``PREFECT_LOCAL_STORAGE_PATH``, from the environment, a profile or temporary settings);
    then ``None`` lets Prefect's setting apply. Read at each call (``with_local_results``)."""
    from prefect.settings import get_current_settings

    from prefect_conductor.conductor.home import conductor_home

    results = get_current_settings().results
    if results.default_storage_block or "local_storage_path" in results.model_fields_set:
        return None
    return conductor_home() / "results"
