"""The Python sandbox (issues #3, #17): model-written code runs under kernel isolation.

One entry point, :func:`run_sandboxed`; ``run_python`` and ``run_python_tests`` (HumanEval's
``program + tests + check(entry_point)``) are thin wrappers. Nothing here ``eval``s or
``exec``s model output in this process.

``mode="isolated"`` (the default, and always for the code verifier). A fresh interpreter runs
``_sandbox_init`` (its source goes in with ``-c``; stdlib and ``ctypes`` only), which calls
``unshare(2)`` for new user, mount, network, IPC, UTS and pid namespaces, then:

- user: the sandbox runs as uid 0 *of its own namespace*, with every capability dropped
  (empty bounding set, ``SECBIT_NOROOT`` locked, ``no_new_privs``). When the host user is
  root, namespace uid 0 maps to host root only for the setup; the program runs as namespace
  uid 1 = host ``nobody`` (65534), so it owns no host file and ``RLIMIT_NPROC`` applies (the
  kernel ignores it for host root). Otherwise it is the host user, counted per namespace;
- pid: the program is pid 2 under our init (pid 1); it sees only its own processes, and when
  the init exits (the program ended, the wall clock ran out, or this process died: parent-death
  signals) the kernel kills everything left in the namespace, ``setsid`` grandchildren too;
- network: a fresh namespace with ``lo`` down, so there is no network at all, loopback included;
- mount: a new root built on a tmpfs and entered with ``pivot_root``; the host root is detached.
  It holds read-only binds of ``/usr``, ``/bin``, ``/lib*``, a few files of ``/etc``, the
  interpreter's prefixes and site-packages, five device nodes, a fresh ``/proc`` of the new pid
  namespace, and one size-limited tmpfs for ``/sandbox`` (cwd and ``HOME``) and ``/tmp``,
  ``/var/tmp``, ``/dev/shm``. Nothing else of the host exists: not ``/home``,
  ``/root``, the working tree, ``$CONDUCTOR_HOME``, ``/run`` or ``/sys``;
- rlimits: address space, CPU seconds, file size, processes, open files, no core files;
- an environment built from scratch (``PATH``, ``HOME``, ``LANG`` and two ``PYTHON*``);
- keyrings (issue #38): a fresh, empty session keyring, so the caller's keys are out of reach;
- seccomp (issue #38), installed last: no nested namespaces, no mounts, no keyring calls, no
  bpf/userfaultfd/perf/io_uring; without a memory cgroup also no memfd or SysV shm;
- host memory (issue #38): a memory cgroup per run (``_sandbox_cgroup``) where the engine
  can create one, charging memfd and tmpfs pages that ``RLIMIT_AS`` does not count.

Why ``unshare(2)`` through ``ctypes`` rather than util-linux's ``unshare`` or bubblewrap: it
needs no system package (bubblewrap is not installed by default), it lets a root host map the
program to ``nobody`` (``unshare --map-root-user`` cannot, and without that ``RLIMIT_NPROC``
does nothing for root), and it costs one extra interpreter start, not a chain of helpers.

Fail closed: where isolation cannot be set up (user namespaces disabled by a sysctl, a
container's seccomp or AppArmor profile; a missing helper), :class:`SandboxUnavailable` says
why and how to fix it in one line. There is no silent fallback. ``CONDUCTOR_SANDBOX_HELPER``
names the interpreter that runs the setup (default: this one); tests point it elsewhere.

``mode="process"`` (pool setting ``sandbox: process``) is the rlimit-only runner of issue #3:
a fresh environment, rlimits and its own session, same user and namespaces as the caller. Every
such run logs a warning; the step records ``sandbox = "process"``.

stdout and stderr go to anonymous temporary files rather than pipes: a grandchild holding a
pipe open cannot stall the call, and only ``max_output`` characters are read back.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import logging
import math
import os
import re
import resource
import secrets
import select
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from typing import IO, Literal

from prefect_conductor.conductor.providers.tools import ToolError, _sandbox_init
from prefect_conductor.conductor.providers.tools._sandbox_cgroup import MemoryCgroup, memory_cgroup

__all__ = [
    "HELPER_ENV",
    "SANDBOX_MODES",
    "SandboxMode",
    "SandboxResult",
    "SandboxUnavailable",
    "TRUNCATED",
    "extract_code",
    "run_python",
    "run_python_tests",
    "run_sandboxed",
]

SandboxMode = Literal["isolated", "process"]
SANDBOX_MODES: tuple[SandboxMode, ...] = ("isolated", "process")
HELPER_ENV = "CONDUCTOR_SANDBOX_HELPER"
TRUNCATED = "…[truncated]"
_FILE_LIMIT = 10 * 1024 * 1024
_NPROC = 64  # processes of the sandbox user inside its namespace (a fork storm stops here)
_NOFILE = 256
_SCRATCH_MB = 64
_SETUP_GRACE_S = 10.0  # on top of timeout_s, for the setup; the init enforces timeout_s itself
_HELPER_MB = 64  # the helper's and the init's interpreters, on top of memory + scratch
_HOME = "/sandbox"
_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
_FIX = (
    "or set `sandbox: process` in the pool to run model-written code with rlimits only "
    "(no isolation)"
)
_log = logging.getLogger(__name__)


class SandboxUnavailable(ToolError):
    """Isolation cannot be set up on this machine. Never retryable, never a silent fallback."""


@dataclass(frozen=True)
class SandboxResult:
    """What one run printed and how it ended. ``returncode`` < 0 means killed by a signal."""

    stdout: str
    stderr: str
    returncode: int
    timed_out: bool
    truncated: bool
    mode: SandboxMode = "isolated"
    ran_to_end: bool = True  # run_python_tests: the harness's sentinel came after the tests

    @property
    def passed(self) -> bool:
        """The verifier's criterion: exited 0 within the time limit, and (for
        :func:`run_python_tests`) the tests ran to their end."""
        return self.returncode == 0 and not self.timed_out and self.ran_to_end


def _read(handle: IO[bytes], max_output: int) -> tuple[str, bool]:
    size = handle.seek(0, os.SEEK_END)
    handle.seek(0)
    data = handle.read(max_output * 4 + 4)  # utf-8: at most 4 bytes per character
    text = data.decode("utf-8", errors="replace")
    if len(text) > max_output or size > len(data):
        return text[:max_output] + TRUNCATED, True
    return text, False


def run_sandboxed(
    code: str,
    *,
    mode: SandboxMode = "isolated",
    timeout_s: float = 10,
    memory_mb: int = 512,
    max_output: int = 10_000,
    stdin: str | None = None,
    scratch_mb: int = _SCRATCH_MB,
) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh interpreter; see the module docstring.

    Raises :class:`SandboxUnavailable` when ``mode="isolated"`` cannot be set up.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_output <= 0 or scratch_mb <= 0:
        raise ValueError("timeout_s, memory_mb, max_output and scratch_mb must be positive")
    if mode not in SANDBOX_MODES:
        raise ValueError(f"sandbox mode must be one of {SANDBOX_MODES}, got {mode!r}")
    cpu_s = math.ceil(timeout_s) + 1
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryFile() as feed,
    ):
        feed.write((stdin or "").encode("utf-8"))
        feed.seek(0)
        files = (feed if stdin is not None else subprocess.DEVNULL, out, err)
        if mode == "process":
            _log.warning(
                "sandbox: running model-written code with rlimits only (pool setting "
                "`sandbox: process`): it can read other processes, use the network and write "
                "files as this user"
            )
            returncode, timed_out = _run_process(code, files, timeout_s, memory_mb, cpu_s)
        else:
            limits = {"memory_mb": memory_mb, "cpu_s": cpu_s, "scratch_mb": scratch_mb}
            returncode, timed_out = _run_isolated(code, files, timeout_s, limits)
        stdout, cut_out = _read(out, max_output)
        stderr, cut_err = _read(err, max_output)
    return SandboxResult(stdout, stderr, returncode, timed_out, cut_out or cut_err, mode)


def run_python(
    code: str,
    *,
    timeout_s: float = 10,
    memory_mb: int = 512,
    max_output: int = 10_000,
    stdin: str | None = None,
    mode: SandboxMode = "isolated",
) -> SandboxResult:
    """:func:`run_sandboxed`, kept under its issue-#3 name."""
    return run_sandboxed(
        code,
        mode=mode,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        max_output=max_output,
        stdin=stdin,
    )


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# The harness around a code check (issue #38). Exit status 0 alone can be gamed: a program
# that calls os._exit(0) or sys.exit(0) before the tests, registers an atexit hook that exits
# 0 after a failed assertion, or kills its own interpreter never fails a test. So the last
# line the harness runs, after check(), writes a nonce that only the parent knows, and the
# verdict needs it. The nonce comes in on stdin and fd 0 is closed before the program runs
# (it cannot reread it; it is not in main.py); the write goes through os.write bound before
# the program runs (a patched print or sys.stdout changes nothing). Not covered: a program
# that searches the harness's own memory for the nonce; the sandbox still contains it.
_HARNESS_HEAD = """\
def {done}():
    import os as _os, sys as _sys
    nonce, write = _sys.stdin.readline().strip().encode(), _os.write
    _sys.stdin.close()
    _os.close(0)
    return lambda: write(1, b"\\n" + nonce + b"\\n")
{done} = {done}()
"""


def run_python_tests(
    program: str, tests: str, entry_point: str, timeout_s: float = 10
) -> SandboxResult:
    """HumanEval-style check: ``program``, then ``tests``, then ``check(entry_point)``.

    Always isolated. The result's ``passed`` is the verdict: exit 0, in time, and the
    harness's sentinel written after ``check`` returned (``ran_to_end``); the sentinel is
    removed from ``stdout``.
    """
    if not _IDENTIFIER.match(entry_point):
        raise ToolError(f"python: entry point must be an identifier, got {entry_point!r}")
    nonce, done = secrets.token_hex(16), f"_conductor_done_{secrets.token_hex(4)}"
    head = _HARNESS_HEAD.format(done=done)
    code = f"{head}{program}\n{tests}\ncheck({entry_point})\n{done}()\n"
    result = run_sandboxed(code, mode="isolated", timeout_s=timeout_s, stdin=nonce + "\n")
    body, _, last = result.stdout.rstrip("\n").rpartition("\n")
    ran_to_end = last == nonce
    stdout = body if ran_to_end else result.stdout.replace(nonce, "")
    return dataclasses.replace(result, stdout=stdout, ran_to_end=ran_to_end)


# --- mode "process": rlimits only (issue #3) ---------------------------------------------------


def _limits(memory_mb: int, cpu_s: int) -> None:
    """Runs in the child between fork and exec: only ``setrlimit`` calls, no imports."""
    memory = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (_FILE_LIMIT, _FILE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait until ``proc`` exits, without reaping it (its pid, hence its process group id,
    is not reused until the group has been killed). False on timeout."""
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
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.05)


def _kill_group(proc: subprocess.Popen[bytes]) -> int:
    try:  # the child leads its own group: this ends it and whatever it forked
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.wait()


def _run_process(
    code: str, files: tuple, timeout_s: float, memory_mb: int, cpu_s: int
) -> tuple[int, bool]:
    with tempfile.TemporaryDirectory(
        prefix="conductor-sandbox-", ignore_cleanup_errors=True
    ) as workdir:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as fh:
            fh.write(code)
        # -I: no PYTHON* variables, no user site, no script dir on sys.path (site-packages
        # stay). -B and -X utf8 do what the ignored variables say; -u keeps what was printed
        # before a timeout kill.
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", "-u", "-X", "utf8", "main.py"],
            cwd=workdir,
            env={**_ENV, "HOME": workdir},
            stdin=files[0],
            stdout=files[1],
            stderr=files[2],
            start_new_session=True,
            preexec_fn=lambda: _limits(memory_mb, cpu_s),
            close_fds=True,
        )
        try:
            timed_out = not _wait_exit(proc, timeout_s)
        finally:
            returncode = _kill_group(proc)
    return returncode, timed_out


# --- mode "isolated": namespaces ------------------------------------------------------------


def _python_paths() -> list[str]:
    """Directories the interpreter needs, outermost first, none inside another."""
    paths = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    paths |= {os.path.dirname(os.path.realpath(sys.executable))}
    paths |= {sysconfig.get_path(n) for n in ("stdlib", "platstdlib", "purelib", "platlib")}
    real = sorted({os.path.realpath(p) for p in paths if p and os.path.isdir(p)}, key=len)
    kept: list[str] = []
    for p in real:
        if not any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(p)
    return kept


@functools.cache
def _init_source() -> str:
    """The program the helper interpreter runs: ``_sandbox_init`` (a standalone script)."""
    return inspect.getsource(_sandbox_init)


def _helper() -> str:
    return os.environ.get(HELPER_ENV) or sys.executable


def _run_isolated(
    code: str, files: tuple, timeout_s: float, limits: dict[str, int]
) -> tuple[int, bool]:
    helper = _helper()
    cap = (limits["memory_mb"] + limits["scratch_mb"] + _HELPER_MB) * 1024 * 1024
    with (
        memory_cgroup(cap) as group,
        tempfile.TemporaryDirectory(prefix="conductor-sandbox-") as newroot,
        tempfile.TemporaryFile() as source,
        tempfile.TemporaryFile() as status,
    ):
        source.write(code.encode("utf-8"))
        source.seek(0)
        config = {
            "root": newroot,  # an empty host dir: the new root's tmpfs is mounted on it
            "python": sys.executable,
            "binds": _python_paths(),
            "env": {**_ENV, "HOME": _HOME},
            "home": _HOME,
            "timeout_s": timeout_s,
            "nproc": _NPROC,
            "nofile": _NOFILE,
            "fsize": _FILE_LIMIT,
            "code_fd": source.fileno(),
            "status_fd": status.fileno(),
            "parent": os.getpid(),
            "cgroup_procs": group.procs if group else None,
            "deny_shm": group is None,  # no cgroup to charge memfd/shm pages: refuse them
            **limits,
        }
        try:
            proc = subprocess.Popen(
                [helper, "-I", "-S", "-B", "-c", _init_source(), json.dumps(config)],
                env={"PATH": _ENV["PATH"], "LANG": "C.UTF-8"},
                stdin=files[0],
                stdout=files[1],
                stderr=files[2],
                pass_fds=(source.fileno(), status.fileno()),
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise SandboxUnavailable(
                f"sandbox: cannot start the namespace helper {helper} ({exc.strerror}); "
                f"unset {HELPER_ENV} or point it at a Python 3 interpreter, {_FIX}"
            ) from None
        try:
            done = _wait_exit(proc, timeout_s + _SETUP_GRACE_S)
        finally:
            helper_rc = _kill_group(proc)  # its death kills the namespace (parent-death signal)
        status.seek(0)
        lines = status.read().decode("utf-8", errors="replace").splitlines()
        return _outcome(lines, helper_rc, done, helper, group)


def _outcome(
    lines: list[str], helper_rc: int, done: bool, helper: str, group: MemoryCgroup | None
) -> tuple[int, bool]:
    """Read the init's status file: ``error: …``, ``exit N``, ``signal N`` or ``timeout``."""
    for line in lines:
        if line.startswith("error: "):
            raise SandboxUnavailable(f"sandbox: {line.removeprefix('error: ')}; {_FIX}")
    last = lines[-1].split() if lines else []
    if last[:1] == ["timeout"] or not done:
        return -signal.SIGKILL, True
    if len(last) == 2 and last[0] in ("exit", "signal") and last[1].lstrip("-").isdigit():
        return (int(last[1]) if last[0] == "exit" else -int(last[1])), False
    if group is not None and group.oom_kills():  # the memory bound killed the reporter too
        return -signal.SIGKILL, False
    # The helper died before reporting: not an interpreter, or killed by something else.
    raise SandboxUnavailable(
        f"sandbox: the namespace helper {helper} ended (exit {helper_rc}) without reporting; "
        f"check {HELPER_ENV} or the interpreter, {_FIX}"
    )


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


_SHOWN = "__conductor_shown__"


def show_last_value(code: str) -> str:
    """The code with its last statement's value printed, as a Python prompt or a notebook
    cell shows it: when the last top-level statement is an expression, its value is printed
    with ``repr`` unless it is ``None`` (so ``print(...)`` adds nothing).

    A step whose subtask is ``20 * 22 - 49`` then answers ``391`` instead of ``(no output)``.
    The code is only parsed here (``ast``), and rewritten as text: everything before the last
    statement is kept as written, so line numbers in a traceback stay the user's. Code that
    does not parse is returned unchanged, for the sandbox to report its ``SyntaxError``, and
    so is code whose rewrite would not parse.
    """
    try:
        body = ast.parse(code).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return code
    if not body or not isinstance(body[-1], ast.Expr):
        return code
    last = body[-1]
    lines = code.splitlines(keepends=True)
    # ast offsets are UTF-8 byte columns; slice the encoded line, not the str.
    head = "".join(lines[: last.lineno - 1])
    head += lines[last.lineno - 1].encode()[: last.col_offset].decode()
    expression = ast.get_source_segment(code, last)
    if expression is None:  # pragma: no cover - every parsed statement has positions
        return code
    shown = (
        f"{head}{_SHOWN} = (\n{expression}\n)\n"
        f"if {_SHOWN} is not None:\n    print(repr({_SHOWN}))\n"
    )
    try:  # a rare layout (a line continuation before the statement) breaks the splice
        ast.parse(shown)
    except SyntaxError:
        return code
    return shown
