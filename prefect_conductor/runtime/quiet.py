"""Keep third-party noise off the terminal: start-up notices, progress bars into pipes,
Prefect's shutdown noise, and engine tracebacks of our own errors.

- ``quiet_third_party_notices``, at CLI start: Prefect's "Starting temporary server" and
  MLflow's "Creating initial MLflow database tables" are INFO lines of the libraries' own
  loggers; those loggers are set to WARNING, so errors and warnings still show. The run's
  own progress (Prefect's flow- and task-run loggers) stays at INFO (issue #10).
- ``progress_bars_off``, at CLI start when stderr is not a terminal: tqdm, Hugging Face and
  MLflow bars would write carriage-return lines into a log or a captured stderr.
- ``hide_deprecation_warnings``, at CLI start: libraries' deprecation notices.
- Prefect's flow- and task-run log lines ("Beginning flow run", "Finished in state
  Completed()", a failed task's exception) stay off the terminal: they reach the Prefect API
  and UI, where the run's log belongs, while the terminal shows the command's own lines
  (the plan, one line per step, the answer, a failure's reason once; issue #16).
  ``verbose_output`` (``--verbose``) brings them, and third-party INFO lines, back.
- When the process exits, Prefect stops its ephemeral API server and cancels background
  services; on some runs that logs ``asyncio.CancelledError`` tracebacks (issue #2 measured
  them on Prefect 3.9). They say nothing about the user's run, so: during the run, a logging
  filter drops records whose exception is a cancellation; after the result is printed,
  ``silence_stderr_at_exit`` points file descriptor 2 at /dev/null for the interpreter's
  shutdown, once nothing of ours can still write there.
- The same terminal handlers print through ``TerminalFormatter``: a run's log lines quote
  worker and tool output (``answer: …`` under ``--verbose``), and control characters in it
  would retitle or recolour the terminal (issue #38). The API's copy of the log is unchanged.

The first two only set defaults in the environment, before the libraries are imported (each
reads them once, at import or logging setup): a user's own setting wins.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import warnings
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager

from prefect_conductor.conductor.errors import ConductorError
from prefect_conductor.conductor.terminal import TerminalFormatter

__all__ = [
    "OFFLINE_DEFAULTS",
    "RUN_LOGGERS",
    "hide_deprecation_warnings",
    "offline_defaults",
    "progress_bars_off",
    "quiet_prefect_shutdown",
    "quiet_third_party_notices",
    "silence_stderr_at_exit",
    "verbose_output",
]

#: Prefect's per-run loggers: their records go to the API (a handler on these loggers) and,
#: by propagation, to the console handler of the root logger, where they are dropped.
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
_verbose = False

_NOTICES_OFF = {
    # The "prefect" logger itself says "Starting temporary server on ..." at INFO.
    "PREFECT_LOGGING_LEVEL": "WARNING",
    # Prefect's per-logger overrides (``PREFECT_LOGGING_[PATH]_[TO]_[KEY]``): the runs' logs
    # keep INFO for the Prefect API (the console drops them unless --verbose).
    "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO",
    "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL": "INFO",
    # MLflow sets its "mlflow" logger (mlflow.store.db.utils: "Creating initial MLflow
    # database tables...") from this when imported; alembic follows it at WARNING or above.
    "MLFLOW_LOGGING_LEVEL": "WARNING",
    # MLflow prints "View run ... at: URL" on stdout when a run against a server ends.
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}

_PROGRESS_BARS_OFF = {
    "TQDM_DISABLE": "1",  # tqdm's default for ``disable``: the trainers' bars
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",  # datasets' map/filter bars
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # huggingface_hub's and transformers' bars
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # artifact uploads and downloads
}


#: Telemetry and analytics off: the offline default makes no outbound connection attempt.
OFFLINE_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # the server's "Failed to send telemetry"
    "MLFLOW_DISABLE_TELEMETRY": "true",  # MLflow 3's usage telemetry
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",  # the cross-tool convention (MLflow reads it too)
}


def offline_defaults(environ: MutableMapping[str, str] = os.environ) -> None:
    """``OFFLINE_DEFAULTS`` as defaults: call before the libraries are imported."""
    for key, value in OFFLINE_DEFAULTS.items():
        environ.setdefault(key, value)


def quiet_third_party_notices(environ: MutableMapping[str, str] = os.environ) -> None:
    """Third-party loggers at WARNING; call before Prefect or MLflow is imported."""
    for key, value in _NOTICES_OFF.items():
        environ.setdefault(key, value)


def verbose_output(environ: MutableMapping[str, str] = os.environ) -> None:
    """``--verbose``: Prefect's and MLflow's INFO lines and the runs' own log lines on the
    terminal. Call before Prefect or MLflow is imported (they read the levels then)."""
    global _verbose
    _verbose = True
    environ["PREFECT_LOGGING_LEVEL"] = "INFO"
    environ["MLFLOW_LOGGING_LEVEL"] = "INFO"


def hide_deprecation_warnings() -> None:
    """Deprecations inside transformers, TRL or PEFT (``gradient_checkpointing is
    deprecated``) are for this project's developers, who see them in the tests, not for a
    user of the CLI, who cannot act on them. Other warnings still show."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def progress_bars_off(environ: MutableMapping[str, str] = os.environ) -> None:
    """No third-party progress bars; call before tqdm or Hugging Face is imported."""
    for key, value in _PROGRESS_BARS_OFF.items():
        environ.setdefault(key, value)


class _QuietFilter(logging.Filter):
    """Drops cancellation noise and (unless verbose) the runs' log lines; keeps our own
    errors to their one-line message.

    A ``ConductorError`` (a failed worker call, a bad plan) is already one precise line;
    its traceback is engine internals. Prefect's API log handler sees the record first
    (it sits lower in the logger tree), so the server-side log keeps the traceback.
    """

    def __init__(self) -> None:
        super().__init__()
        import asyncio  # here, not at import: ``conductor --help`` needs neither
        import concurrent.futures

        self._cancelled = (asyncio.CancelledError, concurrent.futures.CancelledError)

    def filter(self, record: logging.LogRecord) -> bool:
        if not _verbose and record.name.startswith(RUN_LOGGERS):
            return False
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, self._cancelled):
            return False
        if isinstance(exc, ConductorError):
            record.exc_info = None
            record.exc_text = None
        return "CancelledError" not in record.getMessage()


@contextmanager
def quiet_prefect_shutdown() -> Iterator[None]:
    """Drop cancellation tracebacks from every handler of the root and Prefect loggers."""
    flt = _QuietFilter()
    loggers = [
        logging.getLogger(),
        logging.getLogger("prefect"),
        logging.getLogger("uvicorn.error"),
    ]
    handlers = {h for lg in loggers for h in lg.handlers}
    for h in handlers:
        h.addFilter(flt)
        # Terminal handlers only: the API's log handler is no StreamHandler.
        if isinstance(h, logging.StreamHandler) and not isinstance(h.formatter, TerminalFormatter):
            h.setFormatter(TerminalFormatter(inner=h.formatter or logging.Formatter()))
    try:
        yield
    finally:
        # Leave the filter installed: the noise comes after the run, at interpreter exit.
        pass


def silence_stderr_at_exit() -> None:
    """Send fd 2 to /dev/null once the user's output is complete (success paths only)."""

    def _redirect() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)

    # atexit runs handlers last-in first-out: registered now, after Prefect registered its
    # own server shutdown, this runs before Prefect's handlers do.
    atexit.register(_redirect)
