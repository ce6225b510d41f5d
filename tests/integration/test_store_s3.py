"""ArtifactStore on a real S3 API (moto's server mode on a free local port, no network): the
standard settings, atomic publish, writers in several processes, compaction during reads and
racing compactions, and outages (one clear error, nothing lost, nothing counted twice)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from prefect_conductor.conductor.data.store import ArtifactStore, s3_filesystem
from prefect_conductor.conductor.errors import StoreError, StoreUnavailableError

from tests.store_records import (
    REPO,
    make_run,
    make_steps,
    read_while_a_compaction_deletes_its_files,
    reading_all_the_time,
)

moto_server = pytest.importorskip("moto.server")

BUCKET = "conductor-test"
KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """A moto S3 server that can be stopped and started again on the same port. moto keeps its
    objects in this process, so they survive a restart, as a real server's do."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: moto_server.ThreadedMotoServer | None = None

    def start(self) -> None:
        self._server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=self.port)
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def filesystem(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(
            endpoint_override=f"127.0.0.1:{self.port}",
            scheme="http",
            region="us-east-1",
            access_key=KEYS["AWS_ACCESS_KEY_ID"],
            secret_key=KEYS["AWS_SECRET_ACCESS_KEY"],
            allow_bucket_creation=True,
        )


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = S3Server()
    server.start()
    server.filesystem().create_dir(BUCKET)
    yield server
    server.stop()


def _settings(monkeypatch: pytest.MonkeyPatch, server: S3Server, home: Path) -> None:
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CONDUCTOR_HOME", str(home))  # the spool of this test alone
    monkeypatch.setenv("CONDUCTOR_ARTIFACTS_RETRY_S", "1")


@pytest.fixture
def root(s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    _settings(monkeypatch, s3, tmp_path / "home")
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/artifacts"


@pytest.fixture
def store(root: str) -> ArtifactStore:
    return ArtifactStore(root)


def keys(server: S3Server, root: str) -> list[str]:
    """Every object under ``root``, as the server lists it (folder markers left out)."""
    selector = pafs.FileSelector(root.removeprefix("s3://"), recursive=True, allow_not_found=True)
    infos = server.filesystem().get_file_info(selector)
    return sorted(i.path for i in infos if i.type == pafs.FileType.File)


def run_ids(store: ArtifactStore) -> list[str]:
    return sorted(store.read("runs", columns=["run_id"])["run_id"].to_pylist())


# -- settings and round trip -----------------------------------------------------------------


def test_endpoint_and_credentials_come_from_the_standard_settings(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    _settings(monkeypatch, s3, tmp_path)
    # The S3-specific endpoint wins over the general one (which points at nothing here).
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    fs, endpoint = s3_filesystem(BUCKET)
    assert endpoint == s3.url and fs.region == "eu-west-3"
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert s3_filesystem(BUCKET)[0].region == "us-west-2"
    store = ArtifactStore(f"s3://{BUCKET}/settings")
    store.write([make_run(1)], make_steps("run-00001"))
    assert run_ids(store) == ["run-00001"]


def test_round_trip_writes_final_keys_only(s3: S3Server, store: ArtifactStore, root: str):
    runs = [make_run(i, cost_usd=0.5) for i in range(3)]
    store.write(runs, [s for r in runs for s in make_steps(r.run_id)])
    store.write([make_run(7)], [])
    assert store.read("runs").to_pylist() == ArtifactStore(store.root).read("runs").to_pylist()
    summary = store.summary()
    assert (summary.runs, summary.steps, summary.cost_usd) == (4, 6, 1.5)
    assert summary.files == {"runs": 2, "steps": 1}
    names = [k.rsplit("/", 1)[1] for k in keys(s3, root)]
    assert len(names) == 3 and all(n.startswith("part-") for n in names)  # no temp key, no lock
    # Outside readers: plain pyarrow over the same keys.
    table = pq.read_table(store.table_path("steps").removeprefix("s3://"), filesystem=store.fs)
    assert table.num_rows == 6


# -- atomic publish ----------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import os, sys
    from prefect_conductor.conductor.data.records import RunRecord, StepRecord
    from prefect_conductor.conductor.data.store import ArtifactStore

    root, mode, batches, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store, tag = ArtifactStore(root), str(os.getpid())
    for b in range(batches if batches > 0 else 10**9):
        run = RunRecord(run_id=f"{tag}-{b}", question_id="q", question="?",
                        conductor_model="m", format_valid=True, status="completed", wall_s=0.1)
        steps = [
            StepRecord(run_id=f"{tag}-{b}", question_id="q", step=j, worker="w", model="m",
                       instruction="go", status="completed",
                       output=os.urandom(4096).hex() if mode == "big" else "ok")
            for j in range(size)
        ]
        store.write([run] if mode == "small" else [], steps)
        print("done", flush=True)
    """
)


def _child(root: str, mode: str, batches: int, size: int) -> subprocess.Popen[str]:
    args = [sys.executable, "-c", _CHILD, root, mode, str(batches), str(size)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=REPO)


def _open_uploads(server: S3Server, root: str) -> int:
    """Unfinished multipart uploads under this test's root only: the server is shared by the
    module, and another test's upload finishing (or starting) must not move the count."""
    import boto3  # moto's own dependency

    client = boto3.client("s3", endpoint_url=server.url, region_name="us-east-1", **_boto_keys())
    prefix = root.removeprefix(f"s3://{BUCKET}/")
    found = client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])
    return len(found)


def _boto_keys() -> dict[str, str]:
    return {
        "aws_access_key_id": KEYS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": KEYS["AWS_SECRET_ACCESS_KEY"],
    }


def test_atomic_publish_a_reader_never_sees_a_half_written_part(s3: S3Server, root: str):
    """Parts of ~15 MB go up as multipart uploads (several requests); a reader polling all the
    while, and a SIGKILL in the middle of an upload, never show a partial part."""
    size, fs, seen, partial = 1800, s3.filesystem(), set(), []
    steps_dir = f"{root.removeprefix('s3://')}/steps"
    child = _child(root, "big", 0, size)
    assert child.stdout is not None
    uploads_before = _open_uploads(s3, root)
    try:
        assert child.stdout.readline() == "done\n"  # one complete part, then read while it writes
        deadline = time.monotonic() + 60
        mid_upload = False  # seen by the look that ends the wait (a second look could miss it)
        while time.monotonic() < deadline:
            if _open_uploads(s3, root) > uploads_before:
                mid_upload = True
                break
            for info in fs.get_file_info(pafs.FileSelector(steps_dir, allow_not_found=True)):
                if info.path not in seen and info.type == pafs.FileType.File:
                    seen.add(info.path)
                    if pq.read_metadata(info.path, filesystem=fs).num_rows != size:
                        partial.append(info.path)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert mid_upload, "no upload was in flight when the writer was killed"
    assert not partial, partial
    store = ArtifactStore(root)
    visible = [k for k in keys(s3, root) if "/steps/" in k]
    assert len(visible) >= 1 and seen <= set(visible)
    assert all(pq.read_metadata(k, filesystem=fs).num_rows == size for k in visible)
    assert store.read("steps", columns=["run_id"]).num_rows == size * len(visible)
    assert _open_uploads(s3, root) > uploads_before  # the killed upload exists, unfinished, unseen


# -- concurrent writers ------------------------------------------------------------------------


def test_writers_in_several_processes_never_collide(s3: S3Server, store: ArtifactStore):
    batches, size = 10, 2
    children = [_child(store.root, "small", batches, size) for _ in range(3)]
    pids = {str(c.pid) for c in children}
    for c in children:
        out, _ = c.communicate(timeout=180)
        assert c.returncode == 0 and out.count("done") == batches
    expected = sorted(f"{pid}-{b}" for pid in pids for b in range(batches))
    assert run_ids(store) == expected  # every row, once
    steps = store.read("steps", columns=["run_id", "step"]).to_pylist()
    assert len(steps) == len({(s["run_id"], s["step"]) for s in steps}) == 3 * batches * size
    assert store.summary().files == {"runs": 3 * batches, "steps": 3 * batches}


def test_threads_and_stores_writing_at_once_lose_nothing(store: ArtifactStore):
    def writer(k: int) -> None:
        mine = ArtifactStore(store.root)  # a store object per "host"
        for b in range(10):
            mine.write([make_run(100 * k + b)], make_steps(f"run-{100 * k + b:05d}", 1))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert run_ids(store) == sorted(f"run-{100 * k + b:05d}" for k in range(4) for b in range(10))
    assert store.summary().steps == 40


# -- compaction --------------------------------------------------------------------------------


def test_compaction_during_reads_never_loses_or_duplicates(s3: S3Server, store: ArtifactStore):
    with reading_all_the_time(store.root) as counts:
        for cycle in range(8):
            store.write([make_run(10 * cycle + i) for i in range(3)], [])
            store.write([make_run(10 * cycle + 5)], [])
            result = store.compact("runs")
            assert result.busy == () and result.files_after == {"runs": 1}
    assert len(counts) > 8 and counts[-1] == len(run_ids(store)) == 32
    names = [k.rsplit("/", 1)[1] for k in keys(s3, store.root)]
    assert [n[:8] for n in names] == ["compact-"]  # sources deleted, lock released


def test_read_retries_when_a_compaction_deletes_files_under_it(
    store: ArtifactStore, monkeypatch: pytest.MonkeyPatch
):
    # On S3 a deleted key whose size the listing gave reads as NO_SUCH_KEY, not "not found".
    read_while_a_compaction_deletes_its_files(store, monkeypatch)


def test_racing_compactions_are_harmless_to_readers(
    s3: S3Server, store: ArtifactStore, monkeypatch: pytest.MonkeyPatch
):
    """Two compactors that both got past the lock (an object store has no exclusive create):
    A merges parts 1-3 while B, listing later, merges parts 1-4. A's file is redundant."""
    for i in range(3):
        store.write([make_run(i)], [])
    a, b = ArtifactStore(store.root), ArtifactStore(store.root)
    for c in (a, b):  # both "hold" the lock
        monkeypatch.setattr(c, "_acquire", lambda lock: "token")
        monkeypatch.setattr(c, "_token", lambda lock: "token")
        monkeypatch.setattr(c, "_release", lambda lock, token: None)
    load = a._load

    def load_while_b_compacts(*args: object) -> pa.Table:
        data = load(*args)  # type: ignore[arg-type]
        store.write([make_run(3)], [])
        assert b.compact("runs").rows == {"runs": 4}  # deletes the parts A is merging
        return data

    monkeypatch.setattr(a, "_load", load_while_b_compacts)
    assert a.compact("runs").rows == {"runs": 3}
    names = [k.rsplit("/", 1)[1] for k in keys(s3, store.root)]
    assert len(names) == 2 and all(n.startswith("compact-") for n in names)  # both landed
    expected = [f"run-{i:05d}" for i in range(4)]
    assert run_ids(store) == expected and store.summary().files == {"runs": 1, "steps": 0}
    store.compact("runs")  # the next compaction deletes the redundant file
    assert len(keys(s3, store.root)) == 1 and run_ids(store) == expected


def test_object_store_lock_admits_one_of_several_racing_compactors(store: ArtifactStore):
    lock, barrier, tokens = f"{store._dir('runs')}/.compact.lock", threading.Barrier(4), []

    def race() -> None:
        barrier.wait()
        tokens.append(store._acquire(lock))

    threads = [threading.Thread(target=race) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [t for t in tokens if t is not None]
    assert len(tokens) == 4 and len(winners) <= 1  # the last PUT wins; the others back off
    if winners:
        assert store._token(lock) == winners[0]


# -- outages -----------------------------------------------------------------------------------


@pytest.fixture
def own_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[S3Server]:
    """A server of this test alone, to stop and start (moto's objects live in this process,
    so the bucket of the module's server is there too)."""
    server = S3Server()
    server.start()
    server.filesystem().create_dir(BUCKET)
    _settings(monkeypatch, server, tmp_path / "home")
    yield server
    server.stop()


def _spooled(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "spool").rglob("part-*.parquet"))


def _count_sends(
    store: ArtifactStore,
    monkeypatch: pytest.MonkeyPatch,
    before_try: Callable[[int], object] = lambda n: None,
) -> list[str]:
    """The names ``store`` tries to send, one entry per try (the sends themselves are real);
    ``before_try(n)`` runs before the n-th try (from 1)."""
    put, tries = store._put_bytes, []

    def counted(table: str, name: str, body: bytes) -> str:
        tries.append(name)
        before_try(len(tries))
        return put(table, name, body)

    monkeypatch.setattr(store, "_put_bytes", counted)
    return tries


def test_outage_one_clear_error_rows_kept_and_written_when_back(
    own_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    home, root = tmp_path / "home", f"s3://{BUCKET}/outage"
    store = ArtifactStore(root)
    store.write([make_run(0)], make_steps("run-00000"))
    batch = ([make_run(1)], make_steps("run-00001"))
    own_server.stop()
    tries = _count_sends(store, monkeypatch)
    with pytest.raises(StoreUnavailableError) as down:
        store.write(*batch)
    message = str(down.value)
    assert "\n" not in message and message.startswith(
        f"artifact store {root} unreachable at {own_server.url} (write runs; retried 1 s): "
    )
    assert "2 unsent file(s) kept in" in message and str(home / "spool") in message
    assert len(tries) >= 3 and len(set(tries)) == 1  # retried with backoff, under one name
    assert len(_spooled(home)) == 2  # the whole batch: its run and its steps
    with pytest.raises(StoreUnavailableError, match="retried 1 s"):
        store.write(*batch)  # a task retry of the same batch
    assert len(_spooled(home)) == 2  # held once, not twice
    with pytest.raises(StoreUnavailableError, match=f"{root} unreachable .*read runs"):
        store.read("runs")
    own_server.start()
    store.write([make_run(2)], [])  # the next write sends the spool first
    assert _spooled(home) == []
    assert run_ids(store) == ["run-00000", "run-00001", "run-00002"]
    store.write(*batch)  # a late retry of the batch the spool has sent: not written again
    assert run_ids(store) == ["run-00000", "run-00001", "run-00002"]
    assert store.summary().steps == 4


def test_a_brief_outage_is_ridden_out_by_the_retries(
    own_server: S3Server, monkeypatch: pytest.MonkeyPatch
):
    store = ArtifactStore(f"s3://{BUCKET}/blip", retry_s=60)
    store.write([make_run(0)], [])
    own_server.stop()
    # The server comes back before the third try of the run file.
    tries = _count_sends(store, monkeypatch, lambda n: n == 3 and own_server.start())
    store.write([make_run(1)], make_steps("run-00001"))  # no error: back within the budget
    # The run file was tried until the server came back, then the steps file once.
    assert len(tries) == 4 and tries[0] == tries[1] == tries[2] != tries[3]
    assert run_ids(store) == ["run-00000", "run-00001"] and store.summary().steps == 2


def test_a_write_that_landed_before_its_error_is_not_counted_twice(
    s3: S3Server, store: ArtifactStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    put, calls = store._put_bytes, []

    def put_then_lose_the_answer(table: str, name: str, body: bytes) -> str:
        path = put(table, name, body)
        calls.append(name)
        if len(calls) == 1:  # the object is there, but the client never hears back
            raise OSError("AWS Error NETWORK_CONNECTION during PutObject operation: timed out")
        return path

    monkeypatch.setattr(store, "_put_bytes", put_then_lose_the_answer)
    store._retry_s = 0
    with pytest.raises(StoreUnavailableError, match="1 unsent file"):
        store.write([make_run(1)], [])
    store.write([make_run(2)], [])  # sends the held file again: the same key, the same bytes
    assert calls[0] == calls[1]  # one name for both sends
    assert run_ids(store) == ["run-00001", "run-00002"]
    assert _spooled(tmp_path / "home") == []


def test_a_refused_write_fails_at_once_and_keeps_the_batch(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    _settings(monkeypatch, s3, tmp_path)
    store = ArtifactStore("s3://no-such-bucket-here/x", retry_s=600)
    tries = _count_sends(store, monkeypatch)
    with pytest.raises(StoreError, match="NO_SUCH_BUCKET.*1 unsent file") as refused:
        store.write([make_run(1)], [])
    assert not isinstance(refused.value, StoreUnavailableError)
    assert len(tries) == 1  # a missing bucket is not an outage: no retries
    assert len(_spooled(tmp_path)) == 1
