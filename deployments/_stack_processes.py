"""Processes of the local stack (``deployments/stack.py``): free ports, services started in
process groups of their own, waits for them to answer, and stops that leave nothing behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "OFFLINE",
    "StackError",
    "answers",
    "base_env",
    "free_ports",
    "members",
    "spawn",
    "stop_processes",
    "wait",
]

# The product's offline defaults (prefect_conductor.runtime.quiet.OFFLINE_DEFAULTS; nothing imports
# flows/).
OFFLINE = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
}
# Client settings of the calling shell that must not leak into the servers.
_CLIENT_SETTINGS = ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "PREFECT_PROFILE")
_GRACE_S = 15.0


class StackError(Exception):
    """One line for the user: what did not start or stop, and where its log is."""


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def members(pgid: int, parent: int | None = None) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, and children of ``parent``
    (PostgreSQL's backends each start a session of their own), from ``/proc``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        state, ppid, pgrp = fields[0], int(fields[1]), int(fields[2])
        if state != "Z" and (pgrp == pgid or (parent is not None and ppid == parent)):
            found.append(int(entry.name))
    return found


def stop_processes(pgid: int, parent: int | None = None, grace_s: float = _GRACE_S) -> list[int]:
    """SIGTERM the group (and ``parent``'s children), SIGKILL what is left after
    ``grace_s``; returns the pids still alive."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        alive = members(pgid, parent)
        if not alive:
            return []
        for pid in alive:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while members(pgid, parent) and time.monotonic() < deadline:
            time.sleep(0.1)
    return members(pgid, parent)


def spawn(cmd: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(  # noqa: S603 - our own fixed command lines
            cmd,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: down stops the whole tree
        )


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - http://127.0.0.1
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def wait(name: str, ready: Callable[[], bool], proc: Any, deadline: float, log: Path) -> None:
    while not ready():
        code = proc.poll() if proc is not None else None
        if code is not None:
            raise StackError(f"{name} exited with code {code} while starting (log: {log})")
        if time.monotonic() > deadline:
            raise StackError(f"{name} did not answer in time (log: {log})")
        time.sleep(0.25)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CLIENT_SETTINGS}
    for key, value in OFFLINE.items():
        env.setdefault(key, value)
    return env
