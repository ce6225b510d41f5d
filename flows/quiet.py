"""Keep Prefect's shutdown noise off the user's terminal.

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

__all__ = ["quiet_prefect_shutdown", "silence_stderr_at_exit"]

_CANCELLED = (asyncio.CancelledError, concurrent.futures.CancelledError)


class _DropCancelled(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, _CANCELLED):
            return False
        return "CancelledError" not in record.getMessage()


@contextmanager
def quiet_prefect_shutdown() -> Iterator[None]:
    """Drop cancellation tracebacks from every handler of the root and Prefect loggers."""
    flt = _DropCancelled()
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
