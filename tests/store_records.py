"""Records and read scenarios shared by the ArtifactStore tests of every tier: the local
store (``tests/unit/test_store.py``, ``test_store_concurrency.py``), writers in several
processes and the S3 store (``tests/integration/test_store_processes.py``,
``test_store_s3.py``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from prefect_conductor.conductor.data.records import RunRecord, StepRecord
from prefect_conductor.conductor.data.store import ArtifactStore, TableName

REPO = Path(__file__).resolve().parents[1]

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def make_run(i: int, **kw: object) -> RunRecord:
    fields: dict[str, object] = dict(
        run_id=f"run-{i:05d}",
        question_id=f"q{i % 7}",
        question=f"What is {i} + 1?",
        conductor_model="smollm2",
        format_valid=True,
        status="completed",
        input_tokens=10 * i,
        output_tokens=i,
        wall_s=0.5 + i,
        created_at=T0 + timedelta(seconds=i),
        tags={"split": "train"},
    )
    fields.update(kw)
    return RunRecord(**fields)  # type: ignore[arg-type]


def make_steps(run_id: str, n: int = 2, **kw: object) -> list[StepRecord]:
    return [
        StepRecord(
            **{  # type: ignore[arg-type]
                "run_id": run_id,
                "question_id": "q",
                "step": j,
                "worker": "calculator",
                "model": "tool",
                "instruction": f"step {j}",
                "access": list(range(j)),
                "status": "completed",
                **kw,
            }
        )
        for j in range(n)
    ]


def parquet_files(store: ArtifactStore, table: TableName) -> list[Path]:
    return sorted(Path(store.table_path(table)).glob("*.parquet"))


@contextlib.contextmanager
def reading_all_the_time(root: str) -> Iterator[list[int]]:
    """A thread of its own store reads ``runs`` in a loop while the block runs; every view
    must hold no duplicate and never fewer rows than the one before. Yields the row counts."""
    reader, stop = ArtifactStore(root), threading.Event()
    counts: list[int] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            while not stop.is_set():
                ids = reader.read("runs", columns=["run_id"])["run_id"].to_pylist()
                assert len(ids) == len(set(ids)), "duplicate rows"
                assert not counts or len(ids) >= counts[-1], "row count went down"
                counts.append(len(ids))
        except BaseException as e:  # reported to the main thread below
            errors.append(e)

    thread = threading.Thread(target=read)
    thread.start()
    try:
        yield counts
    finally:
        stop.set()
        thread.join()
    assert not errors, errors


def read_while_a_compaction_deletes_its_files(
    store: ArtifactStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read whose listed files are all deleted before it loads them lists again."""
    for i in range(4):
        store.write([make_run(i)], [])
    compactor, load, calls = ArtifactStore(store.root), store._load, []

    def load_after_compaction(*args: object) -> pa.Table:
        calls.append(args[1])
        if len(calls) == 1:
            compactor.compact("runs")  # deletes every file this read just listed
        return load(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_load", load_after_compaction)
    assert sorted(store.read("runs")["run_id"].to_pylist()) == [f"run-{i:05d}" for i in range(4)]
    assert len(calls) == 2 and len(calls[1]) == 1  # the retry read the one merged file
