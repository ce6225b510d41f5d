"""How ``python -m benchmarks.engine_overhead`` reads its child's stderr."""

from __future__ import annotations

from benchmarks.engine_overhead import ROW_MARK, _problems_by_row


def test_engine_overhead_attributes_stderr_problems_to_the_row_they_appeared_in():
    stderr = "\n".join(
        [
            "starting",
            f"{ROW_MARK}orchestrate grid16x4",
            "all fine",
            f"{ROW_MARK}prefect-async grid16x4",
            "Traceback (most recent call last):",
            '  File "logging_worker.py", line 1',
            "RuntimeError: Queue is bound to a different event loop",
            f"{ROW_MARK}exit",
            "sqlite3.OperationalError: database is locked",
        ]
    )
    rows = _problems_by_row(stderr)
    assert set(rows) == {"prefect-async grid16x4", "exit"}  # no problem, no entry
    (line,) = rows["prefect-async grid16x4"]
    assert line.startswith("1x Traceback") and "bound to a different event loop" in line
    assert rows["exit"] == ["1x sqlite3.OperationalError: database is locked"]
