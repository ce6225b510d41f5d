"""The Python tool (issue #3): run untrusted code in a subprocess with limits.

``run_python`` writes the code to a file in a fresh temporary directory, which is the child's
cwd and ``HOME`` and is removed afterwards, and runs ``python -I -B -u -X utf8`` on it:

- the environment is built from scratch (``PATH``, ``HOME``, ``LANG`` and two ``PYTHON*``
  variables, which ``-I`` ignores but a shell spawned by the code would see): no API key or
  token of the parent reaches the child;
- rlimits set in the child before exec: address space (``memory_mb``), CPU seconds
  (``ceil(timeout_s) + 1``), file size (10 MB), no core files. ``RLIMIT_NPROC`` is not set: it
  counts every process of the user, so a modest value breaks callers that already run many
  processes as that user, and root ignores it anyway;
- a new session, so the child and anything it forks share one process group, killed as a
  whole on timeout and after the child exits (a forked grandchild does not outlive the call;
  one that calls ``setsid`` itself escapes, which only a container or cgroup would prevent).

stdout and stderr go to anonymous temporary files rather than pipes: a grandchild holding a
pipe open cannot stall the call, and only ``max_output`` characters are read back.

The same sandbox runs the code verifier: ``run_python_tests`` is HumanEval's
``program + tests + check(entry_point)``.
"""

from __future__ import annotations

import ast
import math
import os
import re
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import IO

from conductor.providers.tools import ToolError

__all__ = ["SandboxResult", "run_python", "run_python_tests", "extract_code", "TRUNCATED"]

TRUNCATED = "…[truncated]"
_FILE_LIMIT = 10 * 1024 * 1024


@dataclass(frozen=True)
class SandboxResult:
    """What one run printed and how it ended. ``returncode`` < 0 means killed by a signal."""

    stdout: str
    stderr: str
    returncode: int
    timed_out: bool
    truncated: bool

    @property
    def passed(self) -> bool:
        """The verifier's criterion: exited 0 within the time limit."""
        return self.returncode == 0 and not self.timed_out


def _limits(memory_mb: int, cpu_s: int) -> None:
    """Runs in the child between fork and exec: only ``setrlimit`` calls, no imports."""
    memory = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (_FILE_LIMIT, _FILE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait until ``proc`` exits, without reaping it. False on timeout.

    Not reaping keeps its pid, hence its process group id, from being reused until the
    group has been killed.
    """
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            return bool(select.select([fd], [], [], timeout_s)[0])
        finally:
            os.close(fd)
    deadline, delay = time.monotonic() + timeout_s, 0.001
    while True:  # no pidfd (old kernel): poll
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        if os.waitid(os.P_PID, proc.pid, flags) is not None:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.05)


def _read(handle: IO[bytes], max_output: int) -> tuple[str, bool]:
    size = handle.seek(0, os.SEEK_END)
    handle.seek(0)
    data = handle.read(max_output * 4 + 4)  # utf-8: at most 4 bytes per character
    text = data.decode("utf-8", errors="replace")
    if len(text) > max_output or size > len(data):
        return text[:max_output] + TRUNCATED, True
    return text, False


def run_python(
    code: str,
    *,
    timeout_s: float = 10,
    memory_mb: int = 512,
    max_output: int = 10_000,
    stdin: str | None = None,
) -> SandboxResult:
    """Run ``code`` in a sandboxed interpreter; see the module docstring for the limits."""
    if timeout_s <= 0 or memory_mb <= 0 or max_output <= 0:
        raise ValueError("timeout_s, memory_mb and max_output must be positive")
    cpu_s = math.ceil(timeout_s) + 1
    with (
        tempfile.TemporaryDirectory(
            prefix="conductor-sandbox-", ignore_cleanup_errors=True
        ) as workdir,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryFile() as feed,
    ):
        script = os.path.join(workdir, "main.py")
        with open(script, "w", encoding="utf-8") as fh:
            fh.write(code)
        feed.write((stdin or "").encode("utf-8"))
        feed.seek(0)
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": workdir,
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        # -I: no PYTHON* variables, no user site, no script dir on sys.path (site-packages
        # stay). -B and -X utf8 do what the ignored variables say; -u keeps what was printed
        # before a timeout kill.
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", "-u", "-X", "utf8", "main.py"],
            cwd=workdir,
            env=env,
            stdin=feed if stdin is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            preexec_fn=lambda: _limits(memory_mb, cpu_s),
            close_fds=True,
        )
        try:
            timed_out = not _wait_exit(proc, timeout_s)
        finally:
            try:  # the child leads its own group: this ends it and whatever it forked
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            returncode = proc.wait()
        stdout, cut_out = _read(out, max_output)
        stderr, cut_err = _read(err, max_output)
    return SandboxResult(stdout, stderr, returncode, timed_out, cut_out or cut_err)


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def run_python_tests(
    program: str, tests: str, entry_point: str, timeout_s: float = 10
) -> SandboxResult:
    """HumanEval-style check: ``program``, then ``tests``, then ``check(entry_point)``.

    The result's ``passed`` is the verdict (exit 0, in time).
    """
    if not _IDENTIFIER.match(entry_point):
        raise ToolError(f"python: entry point must be an identifier, got {entry_point!r}")
    return run_python(f"{program}\n{tests}\ncheck({entry_point})\n", timeout_s=timeout_s)


_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The code in an instruction or a response: the last ```python block, else the last
    fenced block, else the whole text if it parses as Python. Nothing is executed here.

    A lone name or constant ("Run", "42") parses but is not taken for code.
    """
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]
    python = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    if python or blocks:
        return (python or [body for _, body in blocks])[-1]
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    trivial = tree is not None and (
        not tree.body
        or (
            len(tree.body) == 1
            and isinstance(tree.body[0], ast.Expr)
            and isinstance(tree.body[0].value, ast.Name | ast.Constant)
        )
    )
    if tree is None or trivial:
        raise ToolError("python: no code in the instruction (expected a ```python block)")
    return text
