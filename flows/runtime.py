"""Prefect settings for a run the CLI starts in this process.

Against Prefect's *ephemeral* API (no ``PREFECT_API_URL``) the server lives and dies with
the command, so flow-run heartbeats, which exist to let a server mark crashed runs, have
no one to tell. They also cost time: Prefect 3.9 joins the heartbeat thread when a flow
ends, which waits up to one second per flow run (measured in benchmarks/engine_overhead.py).
With a real server configured, heartbeats stay on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

__all__ = ["local_run_settings"]


@contextmanager
def local_run_settings() -> Iterator[None]:
    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
