"""The lock that keeps two compactions of one table apart: a small file ``.compact.lock``
in the table's folder holding the holder's token.

Locally ``O_CREAT | O_EXCL`` makes taking it exclusive. Object stores have no exclusive
create: there the lock is written, then read back a moment later (the last PUT wins, so of
two racers at most one sees its own token), and a compactor checks it again just before
publishing (:func:`holder`). Two compactors can then both proceed only if one stalls for
longer than a whole compaction between its check and its PUT; the store's reads make even
that harmless (a compact file whose sources another one's include is ignored).

Errors of the filesystem are raised as they are: the store decides what a retry may cure.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid

import pyarrow.fs as pafs

__all__ = ["LOCK", "acquire", "holder", "release"]

LOCK = ".compact.lock"
STALE_LOCK_S = 600.0  # a compaction holding the lock longer than this is presumed dead
SETTLE_S = 0.2  # object stores: wait, then read the lock back (the last PUT wins)


def holder(fs: pafs.FileSystem, lock: str) -> str | None:
    """The token of whoever holds ``lock``; None when nobody does."""
    try:
        with fs.open_input_stream(lock) as f:
            return f.read().decode()
    except FileNotFoundError:
        return None


def acquire(fs: pafs.FileSystem, lock: str) -> str | None:
    """Take ``lock``: our token, or None while a live compaction holds it. A lock older than
    ``STALE_LOCK_S`` belonged to a compactor that died, and is taken over."""
    token = uuid.uuid4().hex
    local = isinstance(fs, pafs.LocalFileSystem)
    if not isinstance(fs, pafs.S3FileSystem):  # S3 keys need no folder (nor markers)
        fs.create_dir(lock.rsplit("/", 1)[0], recursive=True)
    info = fs.get_file_info(lock)
    if info.type != pafs.FileType.NotFound:
        if info.mtime is None or time.time() - info.mtime.timestamp() < STALE_LOCK_S:
            return None
        with contextlib.suppress(FileNotFoundError):  # stale: its holder died
            fs.delete_file(lock)
    if not local:
        with fs.open_output_stream(lock) as out:
            out.write(token.encode())
        time.sleep(SETTLE_S)
        return token if holder(fs, lock) == token else None
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:  # another compactor won the race
        return None
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return token


def release(fs: pafs.FileSystem, lock: str, token: str) -> None:
    """Drop ``lock`` if ``token`` still holds it (a compactor that was presumed dead must not
    remove its successor's lock)."""
    if holder(fs, lock) == token:
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(lock)
