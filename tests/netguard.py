"""Record every attempted outbound connection of a subprocess tree (issue #17).

``guard(env, tmp_path)`` puts a ``sitecustomize`` first on ``PYTHONPATH``: it installs an
audit hook (PEP 578) in every Python process of the tree, the Prefect server subprocess
included, that appends to a log each ``socket.connect`` to an address that is not loopback
and each name lookup of a host that is not local. The offline default must leave it empty.
"""

from __future__ import annotations

import os
from pathlib import Path

_SITECUSTOMIZE = """
import os, socket, sys

_LOG = os.environ["CONDUCTOR_TEST_NET_LOG"]
_LOCAL = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "", None}


def _local(host):
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    return host in _LOCAL or (isinstance(host, str) and host.startswith("127."))


def _note(what):
    with open(_LOG, "a") as f:
        f.write(f"{os.getpid()} {sys.argv[:3]} {what}\\n")


def _hook(event, args):
    if event == "socket.connect":
        sock, address = args[0], args[1]
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
            _note(f"connect {address!r}")
    elif event == "socket.getaddrinfo" and not _local(args[0]):
        _note(f"getaddrinfo {args[0]!r}")


sys.addaudithook(_hook)
"""


def guard(env: dict[str, str], tmp_path: Path) -> tuple[dict[str, str], Path]:
    """``env`` with the hook on; returns it and the log of attempts (created empty)."""
    hook_dir = tmp_path / "netguard"
    hook_dir.mkdir(exist_ok=True)
    (hook_dir / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    log = tmp_path / "outbound.log"
    log.write_text("")
    path = os.pathsep.join(p for p in (str(hook_dir), env.get("PYTHONPATH", "")) if p)
    return env | {"PYTHONPATH": path, "CONDUCTOR_TEST_NET_LOG": str(log)}, log
