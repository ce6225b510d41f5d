"""Keep Prefect's shutdown noise, and engine tracebacks of our own errors, off the terminal.

When the process exits, Prefect stops its ephemeral API server and cancels background
services; on some runs that logs ``asyncio.CancelledError`` tracebacks (issue #2 measured
them on Prefect 3.9). They say nothing about the user's run, so: during the run, a logging
filter drops records whose exception is a cancellation; after the result is printed,
``silence_stderr_at_exit`` points file descriptor 2 at /dev/null for the interpreter's
shutdown, once nothing of ours can still write there.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from conductor.errors import ConductorError

__all__ = ["quiet_prefect_shutdown", "silence_stderr_at_exit"]

_CANCELLED = (asyncio.CancelledError, concurrent.futures.CancelledError)


class _QuietFilter(logging.Filter):
    """Drops cancellation noise; keeps our own errors to their one-line message.

    A ``ConductorError`` (a failed worker call, a bad plan) is already one precise line;
    its traceback is engine internals. Prefect's API log handler sees the record first
    (it sits lower in the logger tree), so the server-side log keeps the traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, _CANCELLED):
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
