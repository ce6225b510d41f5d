"""What :class:`~prefect_conductor.conductor.data.store.ArtifactStore` needs on an object store: an
``S3FileSystem`` built from the standard settings, the errors a retry may cure, object names
that never collide, and the local spool of files that could not be sent.

The spool is ``$CONDUCTOR_HOME/spool/<store>/<table>/``: a file that could not be sent waits
there under its final object name (written locally with a temp file, fsync and rename, so a
killed process leaves no partial one); once sent it leaves a ``.sent-<digest>`` marker holding
that name for a day, so that a retry of the same batch (a Prefect task retry after the error)
is recognised and not written a second time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import time
import uuid
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs
from prefect_conductor.conductor.home import conductor_home

__all__ = [
    "HOST",
    "Spool",
    "fsync_dir",
    "object_name",
    "reason",
    "s3_filesystem",
    "stamp",
    "transient",
    "vanished",
]

#: This host in object names (letters and digits only).
HOST = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"
_SENT_KEEP_S = 86400.0  # how long a sent file's name is remembered
# Failures worth retrying: the server is down, slow or overloaded (pyarrow/AWS SDK wording).
_TRANSIENT = re.compile(
    r"NETWORK_CONNECTION|curlCode|connect to server|Connection reset|timed out|Timeout|"
    r"SLOW_DOWN|SERVICE_UNAVAILABLE|INTERNAL_FAILURE|REQUEST_TIMEOUT|HTTP status 5\d\d"
)

# A key that is not there (the AWS SDK says either, depending on whether the 404 has a body).
_GONE = re.compile(r"NO_SUCH_KEY|RESOURCE_NOT_FOUND")


def transient(e: BaseException) -> bool:
    """An error a retry may cure (the server is unreachable or overloaded), as opposed to a
    missing file, a missing bucket or a refused credential."""
    return (
        isinstance(e, (OSError, pa.ArrowException))
        and not isinstance(e, FileNotFoundError)
        and bool(_TRANSIENT.search(str(e)))
    )


def vanished(e: BaseException) -> bool:
    """A file that was listed is gone (a compaction deleted it): locally a
    ``FileNotFoundError``; on S3 a read of a key whose size the listing gave fails without one."""
    return isinstance(e, FileNotFoundError) or (
        isinstance(e, (OSError, pa.ArrowException)) and bool(_GONE.search(str(e)))
    )


def reason(e: BaseException) -> str:
    """The useful part of an AWS SDK message, on one line."""
    text = " ".join(str(e).split())
    found = re.search(r"AWS Error (.*?)(?:; Details: (.*))?$", text)
    if found:
        text = f"{found[1]} ({found[2]})" if found[2] else found[1]
    return text[:300]


def stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")


def object_name(prefix: str, body: bytes) -> tuple[str, str]:
    """``<prefix>-<utc>-<host>-<digest>.parquet`` and the digest (of the file's bytes): unique
    across hosts and processes, and the same bytes always carry the same digest."""
    digest = hashlib.sha256(body).hexdigest()[:32]
    return f"{prefix}-{stamp()}-{HOST}-{digest}.parquet", digest


def s3_filesystem(bucket: str) -> tuple[pafs.S3FileSystem, str | None]:
    """A ``pyarrow.fs.S3FileSystem`` from the standard settings, and the endpoint URL (None:
    AWS itself).

    ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (``http://host:port`` for MinIO or moto) is
    passed as ``endpoint_override`` and ``scheme`` explicitly: pyarrow's own reading of those
    variables is unreliable (apache/arrow#49643). ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``
    and ``AWS_SESSION_TOKEN`` when set (else the AWS SDK's usual chain: profile, instance role);
    ``AWS_REGION`` or ``AWS_DEFAULT_REGION`` (with an endpoint and neither set: ``us-east-1``;
    on AWS with neither set, the bucket's region is looked up).
    """
    env = os.environ.get
    kw: dict[str, Any] = {
        "allow_delayed_open": True,  # a file under the part size is one PutObject, not three calls
        "connect_timeout": 3.0,
        "request_timeout": 30.0,
        # No inner retries: ArtifactStore's own loop backs off, and says what is down.
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=1),
    }
    if env("AWS_ACCESS_KEY_ID") and env("AWS_SECRET_ACCESS_KEY"):
        kw.update(
            access_key=env("AWS_ACCESS_KEY_ID"),
            secret_key=env("AWS_SECRET_ACCESS_KEY"),
            session_token=env("AWS_SESSION_TOKEN") or None,
        )
    endpoint = env("AWS_ENDPOINT_URL_S3") or env("AWS_ENDPOINT_URL") or None
    region = env("AWS_REGION") or env("AWS_DEFAULT_REGION")
    if endpoint:
        url = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        kw.update(endpoint_override=url.netloc + url.path.rstrip("/"), scheme=url.scheme)
        region = region or "us-east-1"
    elif not region:
        region = pafs.resolve_s3_region(bucket)
    return pafs.S3FileSystem(region=region, **kw), endpoint


def fsync_dir(path: str) -> None:
    """Make a rename in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    """The local spool of one store (``root``), under this process's ``$CONDUCTOR_HOME``."""

    def __init__(self, root: str):
        key = hashlib.sha256(root.encode()).hexdigest()[:12]
        label = re.sub(r"[^A-Za-z0-9._-]+", "_", root.split("://")[-1])[-60:]
        self.dir = os.path.join(conductor_home(), "spool", f"{label}-{key}")

    def _table(self, table: str) -> str:
        return os.path.join(self.dir, table)

    def pending(self, table: str) -> list[str]:
        """Names of the files waiting to be sent, oldest first."""
        try:
            names = os.listdir(self._table(table))
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n.endswith(".parquet") and not n.startswith("."))

    def find(self, table: str, digest: str) -> str | None:
        """The name of a file with these bytes that is waiting or was sent lately, if any."""
        with contextlib.suppress(FileNotFoundError):
            with open(os.path.join(self._table(table), f".sent-{digest}")) as f:
                return f.read().strip() or None
        return next((n for n in self.pending(table) if n.endswith(f"-{digest}.parquet")), None)

    def was_sent(self, table: str, digest: str) -> bool:
        return os.path.exists(os.path.join(self._table(table), f".sent-{digest}"))

    def hold(self, table: str, name: str, body: bytes) -> None:
        """Keep a file that could not be sent, atomically (temp file, fsync, rename)."""
        directory = self._table(table)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
        with open(tmp, "xb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(directory, name))
        fsync_dir(directory)

    def read(self, table: str, name: str) -> bytes | None:
        """A waiting file's bytes; None when another process of this home sent it already."""
        try:
            with open(os.path.join(self._table(table), name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def sent(self, table: str, name: str) -> None:
        """Record that ``name`` reached the store, and drop it from the spool."""
        directory = self._table(table)
        digest = name.rsplit("-", 1)[-1].removesuffix(".parquet")
        with open(os.path.join(directory, f".sent-{digest}"), "w") as f:
            f.write(name)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(directory, name))
        old = time.time() - _SENT_KEEP_S
        for entry in os.scandir(directory):
            if entry.name.startswith(".sent-"):
                with contextlib.suppress(FileNotFoundError):
                    if entry.stat().st_mtime < old:
                        os.remove(entry.path)

    def count(self, tables: tuple[str, ...]) -> int:
        return sum(len(self.pending(t)) for t in tables)
