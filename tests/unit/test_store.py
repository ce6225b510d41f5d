"""ArtifactStore: round trips, outside readers, the pairs table, errors that name the path.

Concurrent writers and compaction under concurrent readers are ``test_store_concurrency.py``;
writers in several processes (and killed mid-write) are
``tests/integration/test_store_processes.py``, the S3 paths
``tests/integration/test_store_s3.py``. The records all of them write are
``tests/store_records.py``."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from prefect_conductor.conductor.data.records import PAIRS_SCHEMA, RUNS_SCHEMA, STEPS_SCHEMA
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.errors import StoreError

from tests.store_records import T0, make_run, make_steps, parquet_files


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
