"""ArtifactStore writers in several processes: a writer SIGKILLed mid-write leaves no partial
file any reader sees, and two processes writing at once lose nothing. Writers in threads of one
process, and compaction under readers, are ``tests/unit/test_store_concurrency.py``; the
records are ``tests/store_records.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
from prefect_conductor.conductor.data.store import ArtifactStore

from tests.store_records import REPO, parquet_files

_CHILD = textwrap.dedent(
    """
    import os, sys
    from prefect_conductor.conductor.data.records import StepRecord
    from prefect_conductor.conductor.data.store import TABLES, ArtifactStore, TableName

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
