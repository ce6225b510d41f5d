"""Settings of the ephemeral Prefect server the CLI starts (flows/runtime.py)."""

from __future__ import annotations

from flows.runtime import _EPHEMERAL_SERVER_ENV


def test_recorder_flush_interval_is_whole_seconds():
    # Prefect's task-run recorder sleeps int(flush_interval) between flushes: a fraction
    # becomes sleep(0), a busy loop that keeps the server at most of a core.
    value = float(_EPHEMERAL_SERVER_ENV["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL"])
    assert value >= 1 and value.is_integer()
