"""ArtifactStore under concurrency in one process: writer threads, and compaction that
concurrent readers and writers never notice. Writers in several processes, and a writer killed
mid-write, are ``tests/integration/test_store_processes.py``. The records and read scenarios
are ``tests/store_records.py``.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from prefect_conductor.conductor.data.store import TABLES, ArtifactStore, TableName
from prefect_conductor.conductor.errors import StoreError

from tests.store_records import (
    make_run,
    make_steps,
    parquet_files,
    read_while_a_compaction_deletes_its_files,
    reading_all_the_time,
)

RUN_TABLES: tuple[TableName, ...] = ("runs", "steps")


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "artifacts")


# -- concurrent writers ----------------------------------------------------------------------


def test_threads_writing_concurrently_lose_nothing(store: ArtifactStore):
    def writer(k: int) -> None:
        for b in range(20):
            store.write([make_run(1000 * k + b)], make_steps(f"run-{1000 * k + b:05d}"))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.read("runs").num_rows == 80 == len(set(store.read("runs")["run_id"].to_pylist()))
    assert store.summary().steps == 160


def test_stray_tmp_file_is_ignored_by_every_reader(store: ArtifactStore):
    store.write([make_run(1)], make_steps("run-00001"))
    for table in TABLES:
        stray = Path(store.table_path(table)) / ".tmp-deadbeef.inprogress"
        stray.parent.mkdir(exist_ok=True)  # pairs were never written
        stray.write_bytes(b"PAR1 half a file")
    assert store.read("runs").num_rows == 1 and store.summary().steps == 2
    assert pd.read_parquet(store.table_path("runs")).shape[0] == 1
    assert ds.dataset(store.table_path("steps"), format="parquet").count_rows() == 2
    steps_glob = f"{store.table_path('steps')}/*.parquet"
    assert duckdb.sql(f"select count(*) from read_parquet('{steps_glob}')").fetchall()[0] == (2,)
    store.compact(min_files=1)
    assert store.read("steps").num_rows == 2 and store.read("pairs").num_rows == 0
    assert (Path(store.table_path("steps")) / ".tmp-deadbeef.inprogress").exists()  # recent: kept


# -- compaction ------------------------------------------------------------------------------


def test_compaction_merges_files_into_one_with_identical_rows(store: ArtifactStore):
    for b in range(5):
        runs = [make_run(10 * b + i) for i in range(3)]
        store.write(runs, [s for r in runs for s in make_steps(r.run_id)])
    before = {t: store.read(t).sort_by("run_id").to_pylist() for t in RUN_TABLES}
    result = store.compact()
    assert result.files_before == {"runs": 5, "steps": 5, "pairs": 0}
    assert result.files_after == {"runs": 1, "steps": 1, "pairs": 0}
    assert result.rows == {"runs": 15, "steps": 30, "pairs": 0}
    for table in RUN_TABLES:
        files = parquet_files(store, table)
        assert len(files) == 1 and files[0].name.startswith("compact-")
        assert store.read(table).sort_by("run_id").to_pylist() == before[table]
    merged_file = parquet_files(store, "runs")[0].name
    merged = store.read("runs")["created_at"].to_pylist()
    assert merged == sorted(merged)  # the merged file is sorted
    assert not list(Path(store.table_path("runs")).glob(".*"))  # no lock or temp file left
    # Below min_files nothing is rewritten.
    again = store.compact("runs")
    assert again.files_after == {"runs": 1} and again.rows == {"runs": 0}
    assert [f.name for f in parquet_files(store, "runs")] == [merged_file]


def test_compaction_skips_a_locked_table_and_breaks_a_stale_lock(store: ArtifactStore):
    store.write([make_run(1)], [])
    store.write([make_run(2)], [])
    lock = Path(store.table_path("runs")) / ".compact.lock"
    lock.write_text("someone else")
    result = store.compact("runs")
    assert result.busy == ("runs",) and len(parquet_files(store, "runs")) == 2
    old = time.time() - 3600
    os.utime(lock, (old, old))  # its holder died an hour ago
    assert store.compact("runs").files_after == {"runs": 1}
    assert not lock.exists() and store.read("runs").num_rows == 2


def test_compaction_aborts_when_its_lock_is_taken_over(
    store: ArtifactStore, monkeypatch: pytest.MonkeyPatch
):
    store.write([make_run(1)], [])
    store.write([make_run(2)], [])
    load = store._load

    def steal(*args: object) -> pa.Table:
        (Path(store.table_path("runs")) / ".compact.lock").write_text("thief")
        return load(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_load", steal)
    with pytest.raises(StoreError, match="taken over"):
        store.compact("runs")
    names = [f.name for f in parquet_files(store, "runs")]
    assert len(names) == 2 and all(n.startswith("part-") for n in names)


def test_writer_during_compaction_keeps_its_rows(
    store: ArtifactStore, monkeypatch: pytest.MonkeyPatch
):
    for i in range(3):
        store.write([make_run(i)], [])
    other = ArtifactStore(store.root)
    load = store._load

    def load_while_another_writes(*args: object) -> pa.Table:
        other.write([make_run(99)], [])  # lands after compaction listed its sources
        return load(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_load", load_while_another_writes)
    result = store.compact("runs")
    assert result.files_before == {"runs": 3} and result.rows == {"runs": 3}
    names = sorted(f.name[:4] for f in parquet_files(store, "runs"))
    assert names == ["comp", "part"]
    assert sorted(other.read("runs")["run_id"].to_pylist())[-1] == "run-00099"
    assert other.read("runs").num_rows == 4


def test_compaction_with_a_concurrent_writer_thread(store: ArtifactStore):
    done = threading.Event()

    def writer() -> None:
        for b in range(40):
            store.write([make_run(b)], make_steps(f"run-{b:05d}", 1))
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    while not done.is_set():
        store.compact(min_files=2)
    thread.join()
    store.compact(min_files=2)
    assert sorted(store.read("runs")["run_id"].to_pylist()) == [f"run-{b:05d}" for b in range(40)]
    assert store.summary().steps == 40


def test_reader_never_sees_loss_or_duplicates_during_compaction_cycles(store: ArtifactStore):
    with reading_all_the_time(store.root) as counts:
        for cycle in range(25):
            store.write([make_run(10 * cycle + i) for i in range(3)], [])
            store.write([make_run(10 * cycle + 5)], [])
            store.compact("runs")
    assert len(counts) > 25 and counts[-1] == store.read("runs").num_rows == 100


def test_read_retries_when_a_compaction_deletes_files_under_it(
    store: ArtifactStore, monkeypatch: pytest.MonkeyPatch
):
    read_while_a_compaction_deletes_its_files(store, monkeypatch)


def test_read_detects_a_torn_listing(
    store: ArtifactStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    for i in range(3):
        store.write([make_run(i)], [])
    runs_dir, saved = Path(store.table_path("runs")), tmp_path / "saved"
    shutil.copytree(runs_dir, saved)
    store.compact("runs")
    for f in sorted(saved.iterdir())[1:]:  # the compactor has deleted only the first source
        shutil.copy(f, runs_dir)
    listing, calls = store._list, []

    def torn(table: str) -> list[str]:
        # A directory scan that ran during the rename and the delete: it missed both the new
        # compact file and the deleted source, so its files read fine but lack a row.
        calls.append(table)
        return [n for n in listing(table) if len(calls) > 1 or not n.startswith("compact-")]

    monkeypatch.setattr(store, "_list", torn)
    assert store.read("runs").num_rows == 3
    assert len(calls) == 4  # torn listing + the check that caught it, clean listing + check


def test_read_hides_leftovers_of_a_killed_compaction(store: ArtifactStore, tmp_path: Path):
    for i in range(3):
        store.write([make_run(i)], [])
    saved = tmp_path / "saved"
    shutil.copytree(store.table_path("runs"), saved)
    store.compact("runs")
    for f in saved.iterdir():  # as if killed after the rename, before deleting its sources
        shutil.copy(f, store.table_path("runs"))
    assert store.read("runs").num_rows == 3 and store.summary().files == {"runs": 1, "steps": 0}
    # Raw readers do see duplicates in this window; that is the documented trade-off.
    assert pd.read_parquet(store.table_path("runs")).shape[0] == 6
    store.compact("runs")  # the next compaction deletes the leftovers
    assert len(parquet_files(store, "runs")) == 1 and store.read("runs").num_rows == 3
