"""The intermediate-artifact dataset: Parquet tables ``runs/``, ``steps/`` and ``pairs/`` under
one root (``pairs`` holds OrchRM's preference pairs, built from the other two).

The root is a local path (default :func:`prefect_conductor.conductor.home.artifacts_location`), an
``s3://bucket/prefix`` URL (any S3 API: AWS, MinIO, Ceph, moto; endpoint and credentials from
the standard ``AWS_*`` settings, see :func:`conductor.data.object_store.s3_filesystem`) or any
other URL that ``pyarrow.fs`` can write. Each :meth:`ArtifactStore.write` adds at most one
immutable ``part-…parquet`` per table (:meth:`ArtifactStore.write_pairs` one in ``pairs``),
so plain ``pandas.read_parquet``, ``pyarrow.dataset`` and DuckDB
``read_parquet('<root>/steps/*.parquet')`` read it directly.

- Locally a file is written to a hidden ``.tmp-<uuid>.inprogress`` (skipped by dataset discovery
  and ``*.parquet`` globs), fsynced, then renamed into place: a killed writer never leaves a
  partial visible file. On object stores the final key is written in one request (a PUT, or a
  multipart upload above pyarrow's part size, completed in one request), which is atomic: no
  temp key, no rename.
- Names never collide between hosts: ``part-<utc>-<uuid>`` locally, ``part-<utc>-<host>-<sha256
  of the bytes>`` on object stores, so a retried write of the same rows is the same object.
- :meth:`ArtifactStore.compact` merges a table's files into one ``compact-…`` file whose
  Parquet metadata ``conductor.replaces`` lists the files it replaces, publishes it, then
  deletes those files. :meth:`ArtifactStore.read` drops every file a present compact file
  replaces (and a compact file whose sources another one's include: two compactions that raced
  past the object-store lock) and retries when a file vanishes under it, so it always sees each
  row exactly once. Raw readers (pandas, DuckDB) may see duplicates or a missing file during
  that short window.
- Object-store outages: every operation retries with backoff for ``CONDUCTOR_ARTIFACTS_RETRY_S``
  seconds (default 15), then raises one :class:`~conductor.errors.StoreUnavailableError` line
  naming the store and its endpoint. A batch that could not be written is kept first in a local
  spool (``$CONDUCTOR_HOME/spool/``, :class:`~conductor.data.object_store.Spool`) under its
  final name; the next write or compaction from
  this home sends it (:meth:`ArtifactStore.flush`), and a retry of the same batch is not
  written twice. Readers see spooled rows once they are sent.

The tables' names, schemas and result types are in :mod:`conductor.data._tables`, the
compaction lock in :mod:`conductor.data._compaction_lock`, the object-store helpers in
:mod:`prefect_conductor.conductor.data.object_store`; this module is the store itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from prefect_conductor.conductor.data import _compaction_lock
from prefect_conductor.conductor.data._tables import (
    SCHEMAS,
    SORT,
    TABLES,
    CompactResult,
    StoreSummary,
    TableName,
    conform_pairs,
)
from prefect_conductor.conductor.data.object_store import (
    Spool,
    fsync_dir,
    object_name,
    reason,
    s3_filesystem,
    stamp,
    transient,
    vanished,
)
from prefect_conductor.conductor.data.records import RunRecord, StepRecord
from prefect_conductor.conductor.errors import StoreError, StoreUnavailableError
from prefect_conductor.conductor.home import artifacts_location

if TYPE_CHECKING:  # pyarrow imports pandas itself in to_pandas(); importing it costs 0.6 s
    import pandas as pd

__all__ = [
    "ArtifactStore",
    "StoreSummary",
    "CompactResult",
    "TableName",
    "TABLES",
    "s3_filesystem",
]

Filter = pc.Expression | list[Any] | None

_REPLACES = b"conductor.replaces"
_STALE_TMP_S = 3600.0  # a .tmp- file this old belongs to a killed writer
_READ_ATTEMPTS = 60
_RETRY_S = 15.0  # default budget of retries while an object store is unreachable
T = TypeVar("T")


def _reraise(e: Exception, message: str) -> NoReturn:
    """Raise ``e`` itself when a retry may cure it (the caller's :meth:`ArtifactStore._retry`
    handles it), else a :class:`StoreError` with ``message``."""
    if transient(e):
        raise e
    raise StoreError(f"{message}: {e}") from e


def _parquet_bytes(data: pa.Table) -> bytes:
    buf = pa.BufferOutputStream()
    pq.write_table(data, buf)
    return buf.getvalue().to_pybytes()


class ArtifactStore:
    """Append-only Parquet tables ``runs``, ``steps`` and ``pairs`` with atomic writes and safe
    compaction.

    ``filesystem`` (optional) is a ready ``pyarrow.fs.FileSystem``, e.g. an ``S3FileSystem`` with
    explicit credentials; ``root`` is then a path inside it.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        filesystem: Any = None,
        retry_s: float | None = None,
    ):
        given = str(root) if root is not None else artifacts_location()
        self._fs: pafs.FileSystem | None = filesystem
        self._endpoint: str | None = None
        if filesystem is not None or "://" in given:
            self._root = self._base = given.rstrip("/") or given
        else:
            self._root = self._base = os.path.abspath(os.path.expanduser(given))
            self._fs = pafs.LocalFileSystem()
        if retry_s is None:
            raw = os.environ.get("CONDUCTOR_ARTIFACTS_RETRY_S", "").strip()
            try:
                retry_s = float(raw) if raw else _RETRY_S
            except ValueError:
                raise StoreError(
                    f"CONDUCTOR_ARTIFACTS_RETRY_S must be a number of seconds, got {raw!r}"
                ) from None
        self._retry_s = max(0.0, retry_s)
        self._replaces_cache: dict[tuple[str, str], frozenset[str]] = {}
        self._spool_at: Spool | None = None
        self._sizes: dict[str, int | None] = {}  # files are immutable: a path keeps its size

    @property
    def root(self) -> str:
        return self._root

    @property
    def fs(self) -> pafs.FileSystem:
        """The filesystem, opened on first use (opening an ``s3://`` URL may touch the network)."""
        if self._fs is None:
            try:
                if self._root.startswith("s3://"):
                    self._base = self._root[len("s3://") :]
                    self._fs, self._endpoint = s3_filesystem(self._base.split("/", 1)[0])
                else:
                    self._fs, self._base = pafs.FileSystem.from_uri(self._root)
            except (pa.ArrowException, OSError, ValueError) as e:
                raise StoreError(f"cannot open artifact store {self._root!r}: {e}") from e
        return self._fs

    @property
    def _local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def _mkdir(self, path: str) -> None:
        if not isinstance(self.fs, pafs.S3FileSystem):  # S3 keys need no folder (nor markers)
            self.fs.create_dir(path, recursive=True)

    def _retry(self, what: str, call: Callable[..., T], *args: Any) -> T:
        """``call()``, retried with backoff while the store is unreachable; after
        ``retry_s`` seconds one :class:`StoreUnavailableError` naming the store and endpoint."""
        deadline, delay = time.monotonic() + self._retry_s, 0.2
        while True:
            try:
                return call(*args)
            except (OSError, pa.ArrowException) as e:
                if not transient(e):
                    raise StoreError(f"cannot {what} in {self._root}: {e}") from e
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    at = self._endpoint or ("AWS S3" if self._root.startswith("s3://") else "")
                    raise StoreUnavailableError(
                        f"artifact store {self._root} unreachable{f' at {at}' if at else ''} "
                        f"({what}; retried {self._retry_s:g} s): {reason(e)}"
                    ) from e
            time.sleep(min(delay, remaining))  # the last try is at the deadline
            delay = min(delay * 2, 5.0)

    def table_path(self, table: TableName) -> str:
        if table not in SCHEMAS:
            raise StoreError(
                f"unknown table {table!r} in {self._root}: expected 'runs', 'steps' or 'pairs'"
            )
        return f"{self._root}/{table}"

    def _dir(self, table: str) -> str:
        self.table_path(table)  # validates the name
        _ = self.fs  # resolves self._base for URLs
        return f"{self._base}/{table}"

    def write(self, runs: Sequence[RunRecord], steps: Sequence[StepRecord]) -> list[str]:
        """Write one batch: at most one new file per table. Returns the paths written."""
        batch = []
        for table, rows in (
            ("runs", [r.row() for r in runs]),
            ("steps", [s.model_dump() for s in steps]),
        ):
            if rows:
                data = pa.Table.from_pylist(rows, schema=SCHEMAS[table]).sort_by(SORT[table])
                batch.append((table, data))
        return self._publish(batch)

    def write_pairs(self, table: pa.Table) -> str | None:
        """Write OrchRM pairs as one new file of ``pairs``; the path, or None when ``table`` is
        empty.

        ``table`` must have exactly the columns of :data:`conductor.data.records.PAIRS_SCHEMA`, in
        any order and of any type that casts safely (``reward_model.pairs.pairs_table`` builds
        one); the text columns and ``split`` ("train"/"test") must not be null.
        """
        data = conform_pairs(table, f"cannot write pairs to {self.table_path('pairs')}")
        if data.num_rows == 0:
            return None
        return self._publish([("pairs", data.sort_by(SORT["pairs"]))])[0]

    def _put(
        self, table: str, data: pa.Table, prefix: str, check: Callable[[], None] | None = None
    ) -> str:
        """Make ``data`` visible as one new file, atomically; ``check()`` runs just before.
        On an object store an unreachable server raises the raw error, for :meth:`_retry`."""
        if not self._local:
            body = _parquet_bytes(data)
            name = object_name(prefix, body)[0]
            if check:
                check()
            return self._put_bytes(table, name, body)
        directory, name = self._dir(table), f"{prefix}-{stamp()}-{uuid.uuid4().hex}.parquet"
        try:
            os.makedirs(directory, exist_ok=True)
            tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}.inprogress")
            try:
                with open(tmp, "xb") as f:
                    pq.write_table(data, f)
                    f.flush()
                    os.fsync(f.fileno())
                if check:
                    check()
                os.replace(tmp, os.path.join(directory, name))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.remove(tmp)
                raise
            fsync_dir(directory)  # the rename is durable before any source is deleted
        except (OSError, pa.ArrowException) as e:
            raise StoreError(f"cannot write {self.table_path(table)}/{name}: {e}") from e
        return f"{self.table_path(table)}/{name}"

    def _put_bytes(self, table: str, name: str, body: bytes) -> str:
        """One object, written in one request (atomic on object stores: no temp key)."""
        try:
            self._mkdir(self._dir(table))
            with self.fs.open_output_stream(f"{self._dir(table)}/{name}") as out:
                out.write(body)
        except (OSError, pa.ArrowException) as e:
            _reraise(e, f"cannot write {self.table_path(table)}/{name}")
        return f"{self.table_path(table)}/{name}"

    # -- object stores: retried writes and the local spool ---------------------------------

    def _publish(self, batch: list[tuple[str, pa.Table]]) -> list[str]:
        """One new ``part`` file per ``(table, data)``. On an object store each is sent with
        retries; if any cannot be, every unsent one stays in the local spool under its final
        name (a batch is kept whole), and the error says where."""
        if self._local:
            return [self._put(table, data, "part") for table, data in batch]
        files, known = [], set()  # known: sent from the spool already, or waiting there
        for table, data in batch:
            body = _parquet_bytes(data)
            name, digest = object_name("part", body)
            held = self._spool.find(table, digest)  # a retry of a batch an earlier write kept
            if held:
                known.add(len(files))
            files.append((table, held or name, body))
        sent: set[int] = set()
        try:
            self.flush()  # earlier batches first (waiting files of this batch among them)
            for i, (table, name, body) in enumerate(files):
                if i not in known:
                    self._retry(f"write {table}", self._put_bytes, table, name, body)
                    sent.add(i)
        except StoreError as e:
            for i, (table, name, body) in enumerate(files):
                if i not in known | sent:
                    self._spool.hold(table, name, body)
            raise type(e)(
                f"{e}; {self._spool.count(TABLES)} unsent file(s) kept in {self._spool.dir}, "
                "sent by the next write or compaction"
            ) from e
        return [f"{self.table_path(table)}/{name}" for table, name, _ in files]

    @property
    def _spool(self) -> Spool:
        if self._spool_at is None:
            self._spool_at = Spool(self._root)
        return self._spool_at

    def flush(self) -> int:
        """Send the files that earlier writes from this home kept in the spool (the store was
        unreachable); returns how many were sent. :meth:`write` and :meth:`compact` call it.

        A spooled file keeps the name it was first sent under, so sending it again (two
        processes flushing at once, or a write that reached the store before its error) puts
        the same bytes under the same key: no row is ever counted twice.
        """
        if self._local:
            return 0
        sent = 0
        for table in TABLES:
            for name in self._spool.pending(table):
                body = self._spool.read(table, name)
                if body is not None:
                    self._retry(f"write {table}", self._put_bytes, table, name, body)
                    self._spool.sent(table, name)
                    sent += 1
        return sent

    def _files(self, table: str) -> list[pafs.FileInfo]:
        """Every file in the table's folder, hidden ones included; [] if it does not exist."""
        selector = pafs.FileSelector(self._dir(table), allow_not_found=True)
        for attempt in range(_READ_ATTEMPTS):
            try:
                infos = self.fs.get_file_info(selector)
                return [i for i in infos if i.type == pafs.FileType.File]
            except FileNotFoundError:
                # A file vanished between readdir and stat (a compaction or a writer's rename
                # under us): list again.
                time.sleep(min(0.001 * 2**attempt, 0.05))
            except (OSError, pa.ArrowException) as e:
                _reraise(e, f"cannot list {self.table_path(table)}")
        raise StoreError(f"cannot list {self.table_path(table)}: files kept vanishing under it")

    def _list(self, table: str) -> list[str]:
        """Visible data files, as pyarrow and DuckDB globs see them."""
        if len(self._sizes) > 100_000:  # sizes of long-gone files
            self._sizes.clear()
        names = []
        for info in self._files(table):
            name = info.base_name
            if name.endswith(".parquet") and not name.startswith((".", "_")):
                names.append(name)
                self._sizes[info.path] = info.size
        return sorted(names)

    def _replaces(self, table: str, name: str) -> frozenset[str]:
        """Names a compact file replaces (read once from its footer; files are immutable)."""
        if not name.startswith("compact-"):
            return frozenset()
        key = (table, name)
        if key not in self._replaces_cache:
            if len(self._replaces_cache) > 1024:  # names of long-gone files
                self._replaces_cache.clear()
            meta = pq.read_metadata(f"{self._dir(table)}/{name}", filesystem=self.fs).metadata
            self._replaces_cache[key] = frozenset(json.loads((meta or {}).get(_REPLACES, b"[]")))
        return self._replaces_cache[key]

    def _live(self, table: str, names: list[str]) -> list[str]:
        covers = {n: self._replaces(table, n) for n in names if n.startswith("compact-")}
        replaced = set().union(*covers.values())
        # Two compactions that raced past the lock (object stores have no exclusive create):
        # one whose sources the other's include is redundant (equal sources: the first name
        # wins), and the next compaction deletes it.
        replaced.update(
            n
            for n, mine in covers.items()
            if mine
            and any(
                m != n and (mine < theirs or (mine == theirs and m < n))
                for m, theirs in covers.items()
            )
        )
        return [n for n in names if n not in replaced]

    def _load(self, table: str, names: list[str], columns: Any, expr: Any) -> pa.Table:
        # An explicit schema: files written before a column was added read it as null.
        # Sizes from the listing spare one stat (a HEAD request on S3) per file.
        fmt, paths = ds.ParquetFileFormat(), [f"{self._dir(table)}/{n}" for n in names]
        fragments = [fmt.make_fragment(p, self.fs, file_size=self._sizes.get(p)) for p in paths]
        dataset = ds.FileSystemDataset(fragments, SCHEMAS[table], fmt, self.fs)
        return dataset.to_table(columns=columns, filter=expr)

    def _settled(self, table: str, seen: set[str]) -> bool:
        """False when a compaction that straddles our listing landed (a torn listing may have
        missed one of its sources): a new compact file replaces some files we saw, not all."""
        new = (self._replaces(table, n) for n in self._list(table) if n not in seen)
        return not any(replaced & seen and not replaced <= seen for replaced in new)

    def _read(
        self, table: str, columns: Any = None, filter: Filter = None
    ) -> tuple[pa.Table, list[str]]:
        expr = pq.filters_to_expression(filter) if isinstance(filter, list) else filter
        return self._retry(f"read {table}", self._view, table, columns, expr)

    def _view(self, table: str, columns: Any, expr: Any) -> tuple[pa.Table, list[str]]:
        last: Exception | None = None
        for attempt in range(_READ_ATTEMPTS):
            try:
                names = self._list(table)
                live = self._live(table, names)
                data = self._load(table, live, columns, expr)
                if self._settled(table, set(names)):
                    return data, live
            except (OSError, pa.ArrowException) as e:
                if not vanished(e):
                    _reraise(e, f"cannot read {self.table_path(table)}")
                last = e  # a compaction deleted a file under us: re-list
            time.sleep(min(0.001 * 2**attempt, 0.05))
        raise StoreError(
            f"no consistent view of {self.table_path(table)} after {_READ_ATTEMPTS} attempts "
            f"(files keep being replaced by compactions; last error: {last})"
        )

    def read(
        self, table: TableName, *, columns: Sequence[str] | None = None, filter: Filter = None
    ) -> pa.Table:
        """All rows of ``table`` as one consistent view; empty (with the schema) if none.

        ``filter`` is a ``pyarrow.compute`` expression or DNF list ``[("status", "=", "failed")]``.
        """
        return self._read(table, list(columns) if columns is not None else None, filter)[0]

    def read_pandas(self, table: TableName, **kw: Any) -> pd.DataFrame:
        """:meth:`read` as a DataFrame: ``columns`` and ``filter`` go to :meth:`read`, the other
        keywords to ``pyarrow.Table.to_pandas``."""
        data = self.read(table, columns=kw.pop("columns", None), filter=kw.pop("filter", None))
        return data.to_pandas(**kw)

    def summary(self) -> StoreSummary:
        tokens = ["status", "input_tokens", "output_tokens", "cost_usd"]
        runs, run_files = self._read("runs", tokens)
        steps, step_files = self._read("steps", ["status"])

        def count(t: pa.Table, status: str) -> int:
            return int(pc.sum(pc.equal(t["status"], status)).as_py() or 0)

        cost = pc.sum(runs["cost_usd"]).as_py()  # null when every cost is unknown
        return StoreSummary(
            runs=runs.num_rows,
            steps=steps.num_rows,
            failed_runs=count(runs, "failed"),
            failed_steps=count(steps, "failed"),
            skipped_steps=count(steps, "skipped"),
            input_tokens=int(pc.sum(runs["input_tokens"]).as_py() or 0),
            output_tokens=int(pc.sum(runs["output_tokens"]).as_py() or 0),
            cost_usd=None if cost is None else float(cost),
            files={"runs": len(run_files), "steps": len(step_files)},
        )

    def compact(self, table: TableName | None = None, *, min_files: int = 2) -> CompactResult:
        """Merge each table's live files into one when there are at least ``min_files``."""
        if min_files < 1:
            raise StoreError(f"min_files must be at least 1, got {min_files}")
        self.flush()
        before, after, rows, busy = {}, {}, {}, []
        for t in TABLES if table is None else (table,):
            lock = f"{self._dir(t)}/{_compaction_lock.LOCK}"
            token = self._retry(f"lock {t} to compact it", self._acquire, lock)
            if token is None:
                busy.append(t)
                continue
            try:
                before[t], after[t], rows[t] = self._retry(
                    f"compact {t}", self._compact_table, t, min_files, lock, token
                )
            finally:
                self._retry(f"unlock {t}", self._release, lock, token)
        return CompactResult(before, after, rows, tuple(busy))

    def _compact_table(self, table: str, min_files: int, lock: str, token: str) -> tuple[int, ...]:
        names = self._list(table)
        live = self._live(table, names)
        # Leftovers of a compaction killed after its rename (covered, so invisible to read())
        # and temp files of writers killed long ago.
        stale = time.time() - _STALE_TMP_S
        tmp = [i for i in self._files(table) if i.base_name.startswith(".tmp-") and i.mtime]
        old = [n for n in names if n not in live] + [
            i.base_name for i in tmp if i.mtime.timestamp() < stale
        ]
        self._remove([f"{self._dir(table)}/{n}" for n in old])
        if len(live) < min_files:
            return len(live), len(live), 0
        try:
            data = self._load(table, live, None, None).sort_by(SORT[table])
        except (OSError, pa.ArrowException) as e:
            _reraise(e, f"cannot read {self.table_path(table)} to compact it")
        data = data.replace_schema_metadata({_REPLACES: json.dumps(live).encode()})

        def still_ours() -> None:
            if self._token(lock) != token:
                raise StoreError(f"compaction lock {lock} was taken over; nothing was replaced")

        self._put(table, data, "compact", still_ours)
        self._remove([f"{self._dir(table)}/{n}" for n in live])
        return len(live), 1, data.num_rows

    def _remove(self, paths: list[str]) -> None:
        def remove(path: str) -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.delete_file(path)

        if self._local or len(paths) < 2:
            for path in paths:
                remove(path)
            return
        # An object-store delete is a few requests (pyarrow checks the key, and keeps the
        # folder marker): several at once.
        with ThreadPoolExecutor(max_workers=min(8, len(paths))) as pool:
            list(pool.map(remove, paths))

    # The compaction lock (conductor.data._compaction_lock), as methods a test can replace.

    def _token(self, lock: str) -> str | None:
        return _compaction_lock.holder(self.fs, lock)

    def _acquire(self, lock: str) -> str | None:
        """Take a table's compaction lock; None while a live compaction holds it."""
        try:
            return _compaction_lock.acquire(self.fs, lock)
        except (OSError, pa.ArrowException) as e:
            _reraise(e, f"cannot take compaction lock {lock}")

    def _release(self, lock: str, token: str) -> None:
        if self._token(lock) == token:
            self._remove([lock])
