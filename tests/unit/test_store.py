"""ArtifactStore: round trips, outside readers, atomic writes under SIGKILL, concurrent writers,
and compaction that concurrent readers and writers never notice."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from conductor.data.records import PAIRS_SCHEMA, RUNS_SCHEMA, STEPS_SCHEMA, RunRecord, StepRecord
from conductor.data.store import TABLES, ArtifactStore, TableName
from conductor.errors import StoreError

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
RUN_TABLES: tuple[TableName, ...] = ("runs", "steps")
REPO = Path(__file__).resolve().parents[2]


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


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "artifacts")


# -- round trip and outside readers ----------------------------------------------------------


def test_default_root_is_artifacts_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("CONDUCTOR_ARTIFACTS", raising=False)
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path / "home"))
    store = ArtifactStore()
    assert store.root == str(tmp_path / "home" / "artifacts")
    assert store.table_path("steps") == str(tmp_path / "home" / "artifacts" / "steps")


def test_round_trip_keeps_every_column_type_and_null(store: ArtifactStore):
    runs = [
        make_run(2, reference="3", correct=True, reward=1.0, cost_usd=0.25, answer="3"),
        make_run(1, status="failed", format_valid=False, format_error="no steps"),
    ]
    stamp = T0 + timedelta(minutes=1)
    steps = make_steps("run-00002", 3, started_at=stamp, finished_at=stamp, latency_s=0.1)
    steps += make_steps("run-00001", 1, status="failed", error="boom", parent_step=0, depth=1)
    paths = store.write(runs, steps)

    assert len(paths) == 2 and all(os.path.exists(p) for p in paths)
    got_runs, got_steps = store.read("runs"), store.read("steps")
    assert got_runs.schema == RUNS_SCHEMA and got_steps.schema == STEPS_SCHEMA
    # Files are sorted by created_at / run_id, so row order is known.
    assert got_runs.to_pylist() == [runs[1].row(), runs[0].row()]
    assert got_steps.to_pylist() == [s.model_dump() for s in steps[3:] + steps[:3]]
    nulls = got_runs.to_pydict()
    assert nulls["reference"] == [None, "3"] and nulls["correct"] == [None, True]
    assert nulls["reward"] == [None, 1.0] and nulls["cost_usd"] == [None, 0.25]


def test_outside_readers_see_the_same_rows(store: ArtifactStore):
    for b in range(3):
        runs = [make_run(10 * b + i, reference=None if i else "x") for i in range(4)]
        store.write(runs, [s for r in runs for s in make_steps(r.run_id, 2)])
    runs_path, steps_path = store.table_path("runs"), store.table_path("steps")

    frame = pd.read_parquet(steps_path)
    assert frame.shape == (24, len(STEPS_SCHEMA))
    assert pd.read_parquet(runs_path)["reference"].isna().sum() == 9
    assert ds.dataset(runs_path, format="parquet").to_table().num_rows == 12
    count, refs, tokens = duckdb.sql(
        f"select count(*), count(reference), sum(input_tokens) "
        f"from read_parquet('{runs_path}/*.parquet')"
    ).fetchall()[0]
    assert (count, refs, tokens) == (
        12,
        3,
        sum(10 * (10 * b + i) for b in range(3) for i in range(4)),
    )
    assert store.read_pandas("steps", columns=["run_id", "step"]).shape == (24, 2)


def test_one_file_per_table_per_batch_and_empty_store(store: ArtifactStore):
    assert store.read("runs").num_rows == 0 and store.read("steps").schema == STEPS_SCHEMA
    assert store.write([], []) == []
    store.write([make_run(i) for i in range(50)], [])
    assert len(parquet_files(store, "runs")) == 1 and parquet_files(store, "steps") == []
    assert store.summary().files == {"runs": 1, "steps": 0}


def test_columns_and_filters(store: ArtifactStore):
    store.write([make_run(i, status="failed" if i % 3 == 0 else "completed") for i in range(9)], [])
    failed = store.read("runs", columns=["run_id"], filter=[("status", "=", "failed")])
    assert failed.column_names == ["run_id"] and failed.num_rows == 3
    expr = ds.field("input_tokens") >= 50
    assert store.read("runs", filter=expr).num_rows == 4


def test_files_missing_a_newer_column_read_as_null(store: ArtifactStore):
    store.write([make_run(1)], [])
    old = pa.Table.from_pylist([make_run(2).row()], schema=RUNS_SCHEMA).drop_columns(["tags"])
    pq.write_table(old, Path(store.table_path("runs")) / "part-old.parquet")
    got = store.read("runs").to_pydict()
    tags = dict(zip(got["run_id"], got["tags"], strict=True))
    assert tags == {"run-00001": [("split", "train")], "run-00002": None}


def test_summary_counts_written_rows(store: ArtifactStore):
    runs = [
        make_run(i, status="failed" if i < 2 else "completed", cost_usd=0.5 if i % 2 else None)
        for i in range(6)
    ]
    steps = [
        *make_steps("run-00000", 3, status="failed"),
        *make_steps("run-00001", 2, status="skipped"),
        *make_steps("run-00002", 4),
    ]
    store.write(runs[:3], steps[:5])
    store.write(runs[3:], steps[5:])
    summary = store.summary()
    assert (summary.runs, summary.steps) == (6, 9)
    assert (summary.failed_runs, summary.failed_steps, summary.skipped_steps) == (2, 3, 2)
    assert summary.input_tokens == sum(r.input_tokens for r in runs) == 150
    assert summary.output_tokens == 15
    assert summary.cost_usd == pytest.approx(1.5)
    assert summary.files == {"runs": 2, "steps": 2}


def test_summary_cost_is_none_when_no_cost_is_known(store: ArtifactStore):
    store.write([make_run(1), make_run(2)], [])
    assert store.summary().cost_usd is None


# -- OrchRM pairs ----------------------------------------------------------------------------


def make_pairs(n: int, offset: int = 0, **kw: object) -> pa.Table:
    """``n`` pairs in PAIRS_SCHEMA order; ``kw`` replaces whole columns (types inferred)."""
    ids = range(offset, offset + n)
    columns: dict[str, object] = {
        "pair_id": [f"{i:016x}" for i in ids],
        "question_id": [f"q{i % 3}" for i in ids],
        "input": [f"Question: What is {i} + 1?\nWorkers: calculator\nPlan:" for i in ids],
        "chosen": [f"step 0 · calculator · reads [-]: {i} + 1" for i in ids],
        "rejected": [f"step 0 · smol · reads [-]: {i} + 1" for i in ids],
        "source": ["correct-over-incorrect"] * n,
        "margin": [1.0 if i % 2 else None for i in ids],
        "split": ["test" if i % 3 == 0 else "train" for i in ids],
        "chosen_run_id": [f"run-{i:05d}" for i in ids],
        "rejected_run_id": [f"run-{i + 1:05d}" for i in ids],
        "truncated": [i % 4 == 0 for i in ids],
        "pair_set": ["mlflow-run-1"] * n,
        "created_at": [T0 + timedelta(seconds=i) for i in ids],
    }
    table = pa.Table.from_pydict(columns, schema=PAIRS_SCHEMA)
    for name, values in kw.items():
        table = table.set_column(PAIRS_SCHEMA.get_field_index(name), name, pa.array(values))
    return table


def test_pairs_round_trip_and_outside_readers(store: ArtifactStore):
    pairs = make_pairs(6)
    path = store.write_pairs(pairs)
    assert path is not None and os.path.exists(path) and "/pairs/part-" in path
    got = store.read("pairs")
    assert got.schema == PAIRS_SCHEMA and got.to_pylist() == pairs.to_pylist()
    pd.testing.assert_frame_equal(store.read_pandas("pairs"), pairs.to_pandas())
    # The released-dataset field names load straight from the folder, no store needed.
    raw = pd.read_parquet(store.table_path("pairs"))
    assert raw.shape == (6, len(PAIRS_SCHEMA))
    assert raw[["input", "chosen", "rejected", "source"]].equals(
        pairs.to_pandas()[["input", "chosen", "rejected", "source"]]
    )
    assert raw["margin"].isna().sum() == 3 and store.read("runs").num_rows == 0


def test_write_pairs_casts_compatible_types_and_sorts(store: ArtifactStore):
    pairs = make_pairs(3)
    naive = pa.array([datetime(2025, 1, 1, 0, 0, 3 - i) for i in range(3)], pa.timestamp("ns"))
    wide = pa.array(["mlflow-run-1"] * 3, pa.large_string())  # what from_pandas gives
    other = pairs.set_column(12, "created_at", naive).set_column(11, "pair_set", wide)
    store.write_pairs(other.select(list(reversed(PAIRS_SCHEMA.names))))
    got = store.read("pairs")
    assert got.schema == PAIRS_SCHEMA
    assert got["pair_id"].to_pylist() == list(reversed(pairs["pair_id"].to_pylist()))
    assert got["created_at"].to_pylist()[0] == T0 + timedelta(seconds=1)


def test_write_pairs_of_an_empty_table_writes_nothing(store: ArtifactStore):
    assert store.write_pairs(PAIRS_SCHEMA.empty_table()) is None
    assert not Path(store.table_path("pairs")).exists()
    assert store.read("pairs").num_rows == 0


@pytest.mark.parametrize(
    ("table", "match"),
    [
        (make_pairs(2).drop_columns(["source"]), r"missing \['source'\]"),
        (make_pairs(2).append_column("reference", pa.array(["3", "4"])), r"'reference'"),
        (make_pairs(2, margin=["big", "small"]), r"column 'margin' is string, expected double"),
        (make_pairs(2, chosen=["a", None]), r"column 'chosen' has 1 null"),
        (make_pairs(2, split=["train", "valid"]), r"'split' must be .*\['valid'\]"),
        (make_pairs(2).to_pandas(), r"expected a pyarrow.Table, got DataFrame"),
    ],
)
def test_write_pairs_rejects_a_bad_table(store: ArtifactStore, table: object, match: str):
    with pytest.raises(StoreError, match=match):
        store.write_pairs(table)  # type: ignore[arg-type]
    assert parquet_files(store, "pairs") == []


def test_compaction_merges_pairs_files(store: ArtifactStore):
    for b in range(3):
        store.write_pairs(make_pairs(4, offset=10 * b))
    store.write([make_run(1)], [])
    before = store.read("pairs").sort_by("pair_id").to_pylist()
    result = store.compact()
    assert result.files_before == {"runs": 1, "steps": 0, "pairs": 3}
    assert result.files_after["pairs"] == 1 and result.rows["pairs"] == 12
    files = parquet_files(store, "pairs")
    assert len(files) == 1 and files[0].name.startswith("compact-")
    assert store.read("pairs").sort_by("pair_id").to_pylist() == before
    assert pd.read_parquet(store.table_path("pairs")).shape[0] == 12
    assert store.compact("pairs").rows == {"pairs": 0}


# -- atomicity and concurrent writers --------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import os, sys
    from conductor.data.records import StepRecord
    from conductor.data.store import TABLES, ArtifactStore, TableName

    root, mode, batches, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store, tag = ArtifactStore(root), str(os.getpid())
    for b in range(batches if batches > 0 else 10**9):
        steps = [
            StepRecord(run_id=f"{tag}-{b}", question_id="q", step=j, worker="w", model="m",
                       instruction="go", status="completed",
                       output=os.urandom(2048).hex() if mode == "big" else "ok")
            for j in range(size)
        ]
        store.write([], steps)
        print("done", flush=True)
    """
)


def _child(root: Path, mode: str, batches: int, size: int) -> subprocess.Popen[str]:
    args = [sys.executable, "-c", _CHILD, str(root), mode, str(batches), str(size)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=REPO)


def test_sigkill_mid_write_leaves_no_partial_visible_file(tmp_path: Path):
    size, caught_mid_write = 1500, False
    for attempt in range(3):  # the kill almost always lands mid-write; retry if it did not
        root = tmp_path / f"a{attempt}"
        child = _child(root, "big", 0, size)
        assert child.stdout is not None
        assert child.stdout.readline() == "done\n"  # one complete write, then kill during one
        steps_dir = root / "steps"
        deadline = time.monotonic() + 10
        while not any(steps_dir.glob(".tmp-*")) and time.monotonic() < deadline:
            time.sleep(0.002)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        completed = 1 + child.stdout.read().count("done")
        store = ArtifactStore(root)
        visible = parquet_files(store, "steps")
        # A write may finish its rename an instant before its "done" line is printed.
        assert completed <= len(visible) <= completed + 1
        assert all(pq.read_table(f).num_rows == size for f in visible)
        assert store.read("steps").num_rows == size * len(visible)
        assert pd.read_parquet(store.table_path("steps")).shape[0] == size * len(visible)
        if any(steps_dir.glob(".tmp-*")):
            caught_mid_write = True
            break
    assert caught_mid_write, "no kill landed mid-write; the test did not exercise atomicity"


def test_two_processes_writing_concurrently_lose_nothing(tmp_path: Path):
    root = tmp_path / "shared"
    children = [_child(root, "small", 50, 3) for _ in range(2)]
    pids = {str(c.pid) for c in children}
    for c in children:
        out, _ = c.communicate(timeout=60)
        assert c.returncode == 0 and out.count("done") == 50
    store = ArtifactStore(root)
    steps = store.read("steps", columns=["run_id", "step"])
    assert steps.num_rows == 2 * 50 * 3 and len(parquet_files(store, "steps")) == 100
    run_ids = set(steps["run_id"].to_pylist())
    assert run_ids == {f"{pid}-{b}" for pid in pids for b in range(50)}


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


# -- errors and other filesystems ------------------------------------------------------------


def test_errors_name_the_path(tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = ArtifactStore(blocker / "store")
    with pytest.raises(StoreError, match="a-file/store/runs"):
        store.write([make_run(1)], [])
    good = ArtifactStore(tmp_path / "good")
    good.write([make_run(1)], [])
    (Path(good.table_path("runs")) / "part-corrupt.parquet").write_bytes(b"PAR1 not parquet")
    with pytest.raises(StoreError, match="good/runs"):
        good.read("runs")
    with pytest.raises(StoreError, match="nosuch://bucket/x"):
        ArtifactStore("nosuch://bucket/x").read("steps")
    with pytest.raises(StoreError, match="'jobs'.*'runs', 'steps' or 'pairs'"):
        store.table_path("jobs")  # type: ignore[arg-type]


def test_object_store_writes_final_keys_directly():
    fs = pafs._MockFileSystem()  # an in-memory stand-in for S3: no rename, no temp files
    store = ArtifactStore("bucket/artifacts", filesystem=fs)
    for b in range(3):
        store.write([make_run(b)], make_steps(f"run-{b:05d}"))
    names = [i.base_name for i in fs.get_file_info(pafs.FileSelector("bucket", recursive=True))]
    assert not [n for n in names if n.startswith(".")]
    assert store.compact().files_after == {"runs": 1, "steps": 1, "pairs": 0}
    summary = store.summary()
    assert (summary.runs, summary.steps, summary.files) == (3, 6, {"runs": 1, "steps": 1})
