"""The sandbox's host-memory bound (issue #38): one memory cgroup per sandboxed run.

``RLIMIT_AS`` bounds each process's address space, but not the pages of a ``memfd``, a tmpfs
or SysV shared memory, and not the sum over the sandbox's processes. A memory cgroup charges
all of them, so the sandbox as a whole holds at most ``limit`` bytes of host memory, whatever
it does. The engine creates a child group of its own memory cgroup (cgroup v1's ``memory``
controller, as these machines mount it, or cgroup v2 where ``memory`` is delegated to the
engine's group), the namespace helper joins it before it unshares anything, and the group is
removed when the run ends.

Where no group can be created (not root, no delegation, ``CONDUCTOR_SANDBOX_CGROUP=off``),
:func:`memory_cgroup` yields ``None`` and the init's seccomp filter refuses ``memfd_create``,
``memfd_secret`` and ``shmget`` instead (new mounts and nested namespaces are refused in both
cases), so the only shared memory left is the size-limited scratch tmpfs.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CGROUP_ENV", "MemoryCgroup", "memory_bound", "memory_cgroup"]

CGROUP_ENV = "CONDUCTOR_SANDBOX_CGROUP"  # "auto" (default) or "off"
_PREFIX = "conductor-sandbox-"
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryCgroup:
    """A created group: the file the helper writes its pid to, and how to read its OOM kills."""

    path: Path
    version: int  # 1 or 2

    @property
    def procs(self) -> str:
        return str(self.path / "cgroup.procs")

    def oom_kills(self) -> int:
        """How many processes the kernel killed in this group for exceeding the limit."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            text = (self.path / name).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0


def _own_memory_group() -> tuple[Path, int] | None:
    """This process's memory cgroup directory and the cgroup version, if it has one."""
    try:
        membership = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    groups: dict[str, str] = {}
    for line in membership:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            groups[name] = path
    for line in mounts:
        fields, _, tail = line.partition(" - ")
        parts, rest = fields.split(), tail.split()
        if len(parts) < 5 or len(rest) < 3:
            continue
        root, mount_point, fstype, options = parts[3], parts[4], rest[0], rest[2].split(",")
        if fstype == "cgroup" and "memory" in options and "memory" in groups:
            version, path = 1, groups["memory"]
        elif fstype == "cgroup2" and "" in groups:
            version, path = 2, groups[""]
        else:
            continue
        relative = os.path.relpath(path, root) if path.startswith(root) else path
        directory = Path(mount_point) / relative.lstrip("/")
        if version == 2 and "memory" not in _read(directory / "cgroup.subtree_control"):
            continue  # v2 without the memory controller delegated to our children
        if directory.is_dir():
            return directory, version
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _sweep(parent: Path) -> None:
    """Remove groups left by engines that died mid-run (their pid is in the name)."""
    for stale in parent.glob(_PREFIX + "*"):
        pid = stale.name.removeprefix(_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                stale.rmdir()


def _create(limit_bytes: int) -> MemoryCgroup | None:
    own = _own_memory_group()
    if own is None:
        return None
    parent, version = own
    _sweep(parent)
    path = parent / f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        path.mkdir()
    except OSError:
        return None
    try:
        if version == 1:
            (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
            swap = path / "memory.memsw.limit_in_bytes"  # memory + swap: no escape into swap
            if swap.exists():
                swap.write_text(str(limit_bytes))
        else:
            (path / "memory.max").write_text(str(limit_bytes))
            swap = path / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")
    except OSError as exc:
        _log.debug("sandbox: cannot limit the memory cgroup %s (%s)", path, exc)
        _remove(path)
        return None
    return MemoryCgroup(path, version)


def _remove(path: Path) -> None:
    """rmdir, retried while the namespace's last processes are torn down (EBUSY)."""
    for attempt in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                break
            time.sleep(0.01 * min(attempt + 1, 10))
    _log.debug("sandbox: memory cgroup %s left behind (removed by the next run)", path)


def _enabled() -> bool:
    return os.environ.get(CGROUP_ENV, "auto").strip().lower() not in ("off", "0", "no")


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[MemoryCgroup | None]:
    """A fresh memory cgroup limited to ``limit_bytes``, or ``None`` where none can be made."""
    group = _create(limit_bytes) if _enabled() else None
    try:
        yield group
    finally:
        if group is not None:
            _remove(group.path)


def memory_bound() -> str:
    """Which mechanism bounds the sandbox's shared memory here: ``cgroup v1``, ``cgroup v2``
    or ``seccomp`` (memfd and SysV shm refused). For the docs and the tests."""
    with memory_cgroup(64 * 1024 * 1024) as group:
        return f"cgroup v{group.version}" if group else "seccomp"
