"""The sandbox (issue #17): hostile programs through the real ``python`` tool.

Each program is what a model could write. After each: the canary is in no output, the
listener saw nothing, no file appeared or vanished outside the scratch space, this process
(and a sentinel process of ours) is alive. Tests whose program would harm the machine if
isolation failed (signalling every visible process, an unbounded fork storm) first check that
isolation holds, and are skipped loudly if it does not.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prefect_conductor.conductor.data.records import STEPS_SCHEMA, StepRecord
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.errors import PoolConfigError, WorkerError
from prefect_conductor.conductor.plan.workflow import Step
from prefect_conductor.conductor.pool import WorkerSpec, pool_from_dict
from prefect_conductor.conductor.providers.llm import complete
from prefect_conductor.conductor.providers.tools import ToolError
from prefect_conductor.conductor.providers.tools.provider import run_tool
from prefect_conductor.conductor.providers.tools.sandbox import (
    HELPER_ENV,
    SandboxUnavailable,
    run_python_tests,
    run_sandboxed,
)

CANARY = "canary-7f3a9c1e"
PYTHON = WorkerSpec(name="python", kind="tool", model="tool/python", retries=0)


def _ask(code: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Run this:\n```python\n{code}\n```"}]


def tool(code: str, timeout_s: float = 5) -> str:
    """The answer of the real ``python`` tool, as a step would get it."""
    return run_tool("tool/python", _ask(code), timeout_s=timeout_s)


@pytest.fixture(autouse=True)
def _canary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_API_KEY", CANARY)
    monkeypatch.delenv(HELPER_ENV, raising=False)


PROBE = """
import json, os, socket
procs = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')]
lo = open('/sys/class/net/lo/operstate').read().strip() if os.path.exists('/sys') else 'absent'
try:
    socket.create_connection(('127.0.0.1', 9), timeout=1); net = 'up'
except OSError as e:
    net = e.errno
print(json.dumps({'pid': os.getpid(), 'procs': procs, 'caps': caps, 'net': net,
                  'root': sorted(os.listdir('/')), 'cwd': os.getcwd()}))
"""


def isolation_report() -> dict:
    return json.loads(run_sandboxed(PROBE).stdout)


@pytest.fixture()
def isolated() -> dict:
    """Skips, loudly, a test that would harm the machine if isolation did not hold."""
    try:
        report = isolation_report()
    except SandboxUnavailable as exc:
        pytest.skip(f"ISOLATION UNAVAILABLE, harmful test not run: {exc}")
    if report["procs"] != [1, 2] or report["caps"] != ["0000000000000000"]:
        pytest.skip(f"ISOLATION DOES NOT HOLD, harmful test not run: {report}")
    return report


def test_isolation_holds() -> None:
    report = isolation_report()
    assert report["pid"] == 2 and report["procs"] == [1, 2]  # own pid namespace, our init
    assert report["caps"] == ["0000000000000000"]  # no capability, even as namespace root
    assert report["net"] == 101  # ENETUNREACH: lo is down, no interface at all
    assert report["cwd"] == "/sandbox"
    assert not {"home", "run", "sys", "mnt", "opt", "srv"} & set(report["root"])


# --- secrets --------------------------------------------------------------------------------


def test_no_process_environment_leaks() -> None:
    host = os.getpid()
    code = f"""
import os
for pid in [p for p in os.listdir('/proc') if p.isdigit()] + ['{host}', 'self', '1']:
    for name in ('environ', 'cmdline'):
        try:
            print(pid, name, open(f'/proc/{{pid}}/{{name}}', 'rb').read())
        except OSError as e:
            print(pid, name, e)
print(dict(os.environ))
"""
    answer = tool(code)
    assert "environ" in answer and "HOME" in answer  # the program ran and printed
    assert CANARY not in answer
    assert "FAKE_API_KEY" not in answer


def test_home_and_working_tree_are_absent() -> None:
    here = Path.cwd()
    code = f"""
import os
for p in ('/root/.ssh', '/home', {str(here)!r} + '/pyproject.toml', '/etc/shadow', '/run'):
    print(p, os.path.exists(p))
"""
    answer = tool(code)
    assert answer.count("False") == 5, answer


# --- network --------------------------------------------------------------------------------


def test_no_connection_reaches_a_local_listener() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    port, uport = listener.getsockname()[1], udp.getsockname()[1]
    code = f"""
import socket
for family, host in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::1')):
    try:
        socket.create_connection((host, {port}), timeout=1); print('connected')
    except OSError as e:
        print('tcp', e.errno)
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {uport}))
    print('sent')
except OSError as e:
    print('udp', e.errno)
"""
    try:
        answer = tool(code)
        time.sleep(0.2)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody knocked
        with pytest.raises(BlockingIOError):
            udp.recv(16)
    finally:
        listener.close()
        udp.close()
    assert "connected" not in answer and "sent" not in answer
    assert "tcp 101" in answer and "udp 101" in answer


# --- filesystem -----------------------------------------------------------------------------


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_writes_and_deletes_outside_scratch_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("CONDUCTOR_HOME", str(home))
    store = ArtifactStore(str(home / "artifacts"))
    store.write([], [StepRecord(run_id="r", question_id="q", step=0, worker="w", model="m",
                                instruction="i", status="completed")])  # fmt: skip
    (home / "mlflow.db").write_bytes(b"sqlite")
    marker = f"conductor-hostile-{os.getpid()}"
    before = _tree(tmp_path)
    code = f"""
import os, shutil
home = {str(home)!r}
for path in (home + '/artifacts', home + '/mlflow.db', home):
    try:
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path); print('deleted', path)
    except OSError as e:
        print('kept', path, e.errno)
for path in (home + '/evil', '/tmp/{marker}', '/var/tmp/{marker}', '/dev/shm/{marker}',
             {str(tmp_path)!r} + '/{marker}', os.getcwd() + '/ok'):
    try:
        open(path, 'w').write('x'); print('wrote', path)
    except OSError as e:
        print('refused', path, e.errno)
"""
    answer = tool(code)
    assert "deleted" not in answer
    # Writes land in the sandbox's own tmpfs (its /tmp, /var/tmp, /dev/shm, cwd) or fail.
    assert f"refused {home}/evil" in answer and f"refused {tmp_path}/{marker}" in answer
    assert f"wrote /tmp/{marker}" in answer  # its private /tmp, not the host's
    assert _tree(tmp_path) == before
    assert store.read("steps").num_rows == 1
    for place in ("/tmp", "/var/tmp", "/dev/shm"):
        assert not Path(place, marker).exists()


def test_disk_filling_loop_stops_at_the_scratch_limit() -> None:
    code = """
i = 0
try:
    while True:
        with open(f'f{i}', 'wb') as fh:
            fh.write(b'x' * (1 << 20))
        i += 1
except OSError as e:
    print('stopped after', i, 'MB, errno', e.errno)
"""
    free = shutil.disk_usage("/tmp").free
    answer = tool(code, timeout_s=10)
    assert "errno 28" in answer  # ENOSPC: the scratch tmpfs is full
    assert int(answer.split()[2]) < 100  # MB: the 64 MB scratch space, not the host's disk
    assert shutil.disk_usage("/tmp").free > free - 50 * (1 << 20)


def test_memory_bomb_is_refused() -> None:
    answer = tool("x = bytearray(4 * 1024**3)\nprint('allocated')")
    assert "MemoryError" in answer and "allocated" not in answer


# --- processes ------------------------------------------------------------------------------


@pytest.fixture()
def sentinel():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_signalling_the_parent_and_everyone(isolated: dict, sentinel: subprocess.Popen) -> None:
    code = """
import os, signal
for target in (os.getppid(), 1, -1):
    try:
        os.kill(target, signal.SIGKILL); print('sent', target)
    except OSError as e:
        print('refused', target, e.errno)
os.system('kill -9 -1')
print('survived')
"""
    answer = tool(code)
    assert sentinel.poll() is None  # a process of ours outside the sandbox is still alive
    assert "sent" in answer or "refused" in answer  # the program did run


def _host_processes(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    found.append(int(entry.name))
        except OSError:
            continue
    return [p for p in found if p != os.getpid()]


def test_setsid_grandchild_writing_late_leaves_nothing(tmp_path: Path) -> None:
    marker = f"77.{os.getpid()}"
    late = tmp_path / "late.txt"
    code = f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        if os.fork() == 0:
            os.execv('/bin/sleep', ['sleep', '{marker}'])
        time.sleep(1)
        for path in ({str(late)!r}, '/tmp/late-{marker}'):
            try:
                open(path, 'w').write('late')
            except OSError:
                pass
    os._exit(0)
print('parent exits')
"""
    assert tool(code) == "parent exits"
    time.sleep(2)
    assert not late.exists() and not Path(f"/tmp/late-{marker}").exists()
    assert _host_processes(marker) == []


def test_unbounded_fork_storm_is_contained(isolated: dict, sentinel: subprocess.Popen) -> None:
    marker = f"88.{os.getpid()}"
    code = f"""
import os
os.environ['X'] = '{marker}'
n = 0
try:
    while True:
        if os.fork() == 0:
            try:
                os.execv('/bin/sleep', ['sleep', '{marker}'])
            finally:
                os._exit(0)
        n += 1
except OSError as e:
    print('forks stopped at', n, 'errno', e.errno)
"""
    answer = tool(code, timeout_s=5)
    assert "forks stopped at" in answer and "errno 11" in answer  # EAGAIN: RLIMIT_NPROC
    assert int(answer.split()[3]) < 100
    assert sentinel.poll() is None
    assert _host_processes(marker) == []  # all of them died with the namespace


def test_timeout_kills_the_whole_namespace() -> None:
    marker = f"99.{os.getpid()}"
    code = f"import os, time\nif os.fork() == 0:\n    os.execv('/bin/sleep', ['sleep', '{marker}'])\ntime.sleep(60)"
    result = run_sandboxed(code, timeout_s=1)
    assert result.timed_out and result.returncode < 0
    assert _host_processes(marker) == []


# --- fail closed ----------------------------------------------------------------------------


def test_missing_helper_fails_closed_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HELPER_ENV, "/nonexistent/python")
    with pytest.raises(SandboxUnavailable) as info:
        run_sandboxed("print(1)")
    message = str(info.value)
    assert "\n" not in message and message.startswith("sandbox: cannot start")
    assert "sandbox: process" in message and HELPER_ENV in message
    assert not info.value.retryable
    with pytest.raises(ToolError):  # the tool does not fall back either
        tool("print(1)")
    with pytest.raises(WorkerError) as through_litellm:
        complete(PYTHON, _ask("print(1)"))
    assert not through_litellm.value.retryable and "sandbox:" in str(through_litellm.value)


def test_helper_that_is_not_python_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HELPER_ENV, "/bin/true")
    with pytest.raises(SandboxUnavailable, match="without reporting"):
        run_sandboxed("print(1)")


def test_disabled_user_namespaces_fail_closed(tmp_path: Path) -> None:
    """A real refusal: user.max_user_namespaces=0 inside a namespace of our own."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("util-linux unshare is not installed: cannot disable user namespaces here")
    script = "from prefect_conductor.conductor.providers.tools.sandbox import run_sandboxed\nrun_sandboxed('print(1)')\n"
    shell = f'echo 0 > /proc/sys/user/max_user_namespaces && exec {sys.executable} -c "$0"'
    probe = subprocess.run(
        [unshare, "--user", "--map-root-user", "sh", "-c", shell, script],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    if "max_user_namespaces" in probe.stderr and "ermission" in probe.stderr:
        pytest.skip(f"cannot lower user.max_user_namespaces here: {probe.stderr.strip()}")
    assert probe.returncode != 0
    last = probe.stderr.strip().splitlines()[-1]
    assert "SandboxUnavailable: sandbox: cannot create user namespaces" in last
    assert "sandbox: process" in last


# --- modes, the pool setting, the step record ----------------------------------------------


def test_process_mode_warns_every_run(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="prefect_conductor.conductor.providers.tools.sandbox"):
        first = run_sandboxed("import os; print(os.getpid())", mode="process")
        run_sandboxed("print(2)", mode="process")
        run_sandboxed("print(3)")
    warnings = [r for r in caplog.records if "rlimits only" in r.getMessage()]
    assert len(warnings) == 2
    assert first.mode == "process" and int(first.stdout) > 2  # a host pid: no pid namespace


def test_pool_sandbox_setting_is_validated() -> None:
    base = {"conductor": {"model": "m"}, "workers": [{"name": "python", "kind": "tool",
                                                      "model": "tool/python"}]}  # fmt: skip
    assert pool_from_dict(base).sandbox == "isolated"
    assert pool_from_dict({**base, "sandbox": "process"}).sandbox == "process"
    with pytest.raises(PoolConfigError, match=r"sandbox: Input should be 'isolated' or 'process'"):
        pool_from_dict({**base, "sandbox": "none"})


@pytest.mark.parametrize("mode", ["isolated", "process"])
def test_step_records_the_sandbox_mode(mode: str) -> None:
    from prefect_conductor.tasks.workers import run_step

    pool = pool_from_dict(
        {
            "conductor": {"model": "m"},
            "sandbox": mode,
            "workers": [
                {"name": "python", "kind": "tool", "model": "tool/python", "retries": 0},
                {"name": "calc", "kind": "tool", "model": "tool/calculator", "retries": 0},
            ],
        }
    )
    code = "import os\nprint(os.getpid() == 2)"
    ran = run_step.fn("q", Step(index=0, worker="python", instruction=f"```python\n{code}\n```"),
                      [], [], pool)  # fmt: skip
    assert ran.sandbox == mode
    assert ran.output == ("True" if mode == "isolated" else "False")
    calc = run_step.fn("q", Step(index=0, worker="calc", instruction="6 * 7"), [], [], pool)
    assert calc.sandbox is None and calc.output == "42"
    assert StepRecord(run_id="r", question_id="q", step=0, worker="python", model=ran.model,
                      instruction="i", status="completed", **ran.fields()).sandbox == mode  # fmt: skip


def test_steps_written_before_the_sandbox_column_read_as_null(tmp_path: Path) -> None:
    store = ArtifactStore(str(tmp_path))
    row = StepRecord(run_id="old", question_id="q", step=0, worker="w", model="m",
                     instruction="i", status="completed")  # fmt: skip
    store.write([], [row.model_copy(update={"run_id": "new", "sandbox": "process"})])
    old = pa.Table.from_pylist([row.model_dump()], schema=STEPS_SCHEMA).drop_columns(["sandbox"])
    pq.write_table(old, Path(store.table_path("steps")) / "part-old.parquet")
    got = {r["run_id"]: r["sandbox"] for r in store.read("steps").to_pylist()}
    assert got == {"old": None, "new": "process"}


# --- the verifier ----------------------------------------------------------------------------


def test_humaneval_check_runs_isolated_and_still_passes() -> None:
    program = "def add(a, b):\n    return a + b\n"
    tests = (
        "import os\ndef check(candidate):\n    assert candidate(2, 3) == 5\n"
        "    assert os.getpid() == 2  # inside the pid namespace\n"
    )
    result = run_python_tests(program, tests, "add")
    assert result.passed and result.mode == "isolated"
    assert not run_python_tests(program.replace("+", "-"), tests, "add").passed


def test_an_engine_interpreter_under_tmp_is_isolated_too(tmp_path: Path) -> None:
    """A virtualenv in /tmp (CI's fresh clone) lives under a scratch place of the sandbox:
    its read-only bind must sit on the private /tmp, not collide with it."""
    import sysconfig

    venv = tmp_path / "venv"  # tmp_path is under /tmp
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    repo = Path(__file__).resolve().parents[2]
    # That interpreter does not read this environment's editable install: lay the one import
    # name out for it, the core folder linked under it.
    layout = tmp_path / "layout" / "prefect_conductor"
    layout.mkdir(parents=True)
    (layout / "__init__.py").write_text("")
    (layout / "conductor").symlink_to(repo / "conductor")
    paths = f"{layout.parent}:{sysconfig.get_path('purelib')}"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": paths}
    probe = (
        "from prefect_conductor.conductor.providers.tools.sandbox import run_python\n"
        "r = run_python('import os, sys; print(sys.prefix, os.getpid(), len(os.listdir(\"/tmp\")))')\n"
        "print(r.stdout.strip(), r.returncode)\n"
    )
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", probe], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    prefix, pid, _entries, rc = proc.stdout.split()
    assert prefix == str(venv) and pid == "2" and rc == "0"  # ran isolated, from that venv


# --- the red team's findings (issue #38) -----------------------------------------------------

KEYCTL, ADD_KEY = 250, 248  # x86_64
_KEYRING_HOST = """
import ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
if libc.syscall(250, 1, b"conductor-test-session") <= 0:  # a session keyring, as under ssh
    print(json.dumps({"skip": f"no session keyring here (errno {ctypes.get_errno()})"}))
    sys.exit()
key = libc.syscall(248, b"user", b"rt-secret", b"TOPSECRET-PAYLOAD", 17, -3)
from prefect_conductor.conductor.providers.tools.sandbox import run_sandboxed
result = run_sandboxed(sys.stdin.read().replace("KEY", str(key)))
buf = ctypes.create_string_buffer(64)
libc.syscall(250, 11, key, buf, 64)  # KEYCTL_READ: still ours, not revoked
planted = libc.syscall(250, 10, -3, b"user", b"planted", 0)  # KEYCTL_SEARCH in our keyring
print(json.dumps({"out": result.stdout + result.stderr, "read": buf.value.decode(),
                  "planted": planted}))
"""
_KEYRING_PROGRAM = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
buf = ctypes.create_string_buffer(64)
found = libc.syscall(250, 10, -3, b"user", b"rt-secret", 0)  # KEYCTL_SEARCH in @s
print("found", found, libc.syscall(250, 11, found, buf, 64), buf.value)
print("read", libc.syscall(250, 11, KEY, buf, 64), buf.value)  # the host key by serial
print("planted", libc.syscall(248, b"user", b"planted", b"x", 1, -3))
print("revoked", libc.syscall(250, 3, KEY))
try:
    print(open("/proc/keys").read())
except OSError as exc:
    print(exc)
"""


def test_the_callers_session_keyring_is_out_of_reach() -> None:
    """The engine under ssh or systemd holds a session keyring: the program can neither read
    its keys, nor plant one in it, nor revoke one."""
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("KEYRING TEST NOT RUN: syscall numbers are x86_64's")
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", _KEYRING_HOST], input=_KEYRING_PROGRAM,
                          capture_output=True, text=True, timeout=120, cwd=repo)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    if "skip" in report:
        pytest.skip(f"KEYRING TEST NOT RUN: {report['skip']}")
    assert "TOPSECRET" not in report["out"] and "rt-secret" not in report["out"]
    assert "planted -1" in report["out"] and "revoked -1" in report["out"]
    assert report["read"] == "TOPSECRET-PAYLOAD" and report["planted"] == -1


_MEMFD = """
import os
held = 0
for i in range(40):
    try:
        fd = os.memfd_create(f"m{i}")
        os.posix_fallocate(fd, 0, 10 * 1024 * 1024)
    except OSError as exc:
        print("refused", exc.errno, flush=True)
        break
    held += 10
    print("held", held, flush=True)
"""


@pytest.mark.parametrize("cgroup", ["auto", "off"])
def test_shared_memory_stays_within_the_bound(cgroup: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """40 memfds of 10 MB each with memory_mb=128: RLIMIT_AS does not count their pages. The
    memory cgroup charges them (the program is killed at its limit); without one, seccomp
    refuses memfd_create."""
    from prefect_conductor.conductor.providers.tools._sandbox_cgroup import CGROUP_ENV, memory_bound

    monkeypatch.setenv(CGROUP_ENV, cgroup)
    bound = memory_bound()
    result = run_sandboxed(_MEMFD, memory_mb=128)
    held = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("held")]
    cap_mb = 128 + 64 + 64  # memory_mb + the scratch space + the helpers' interpreters
    assert max(held, default=0) < cap_mb < 400, result
    if bound == "seccomp":
        assert held == [] and "refused 1" in result.stdout  # EPERM from the filter
    else:
        assert result.returncode == -9 and not result.timed_out  # the cgroup's OOM kill


def test_the_run_leaves_no_memory_cgroup_behind() -> None:
    from prefect_conductor.conductor.providers.tools import _sandbox_cgroup

    own = _sandbox_cgroup._own_memory_group()
    if own is None or _sandbox_cgroup.memory_bound() == "seccomp":
        pytest.skip("NO MEMORY CGROUP HERE: the seccomp bound is tested instead")
    before = set(own[0].glob("conductor-sandbox-*"))
    assert run_sandboxed("print(1)").stdout == "1\n"
    assert set(own[0].glob("conductor-sandbox-*")) <= before


def test_nested_namespaces_and_mounts_are_refused_but_processes_work() -> None:
    code = """
import ctypes, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
print("unshare", libc.unshare(0x10000000 | 0x00020000), ctypes.get_errno())
print("mount", libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, b"size=500m"), ctypes.get_errno())
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork", os.waitpid(pid, 0)[1] >> 8)
box = []
thread = threading.Thread(target=box.append, args=("thread",))
thread.start(); thread.join()
print(box[0], subprocess.run(["echo", "child"], capture_output=True, text=True).stdout.strip())
"""
    out = run_sandboxed(code).stdout.splitlines()
    assert out == ["unshare -1 1", "mount -1 1", "fork 7", "thread child"]


def test_seccomp_filter_refuses_shared_memory_only_without_a_cgroup() -> None:
    from prefect_conductor.conductor.providers.tools._sandbox_init import (
        _NS_SYSCALLS,
        _ns_seccomp_program,
    )

    memfd = _NS_SYSCALLS["x86_64"]["shm"]["memfd_create"]
    refused = {
        deny: {row[3] for row in _ns_seccomp_program("x86_64", deny) if row[0] == 0x15}
        for deny in (True, False)
    }
    assert memfd in refused[True] and memfd not in refused[False]
    keyctl, unshare = (_NS_SYSCALLS["x86_64"]["deny"][n] for n in ("keyctl", "unshare"))
    assert {keyctl, unshare} <= refused[False]
    with pytest.raises(OSError, match="unsupported machine"):
        _ns_seccomp_program("sparc", True)


# The code verifier passes only when the tests ran to their end.
_ADD = "def add(a, b):\n    return a - b\n"  # wrong: every check below would fail
_CHECK = "def check(candidate):\n    assert candidate(2, 3) == 5\n    print('checked')\n"
_GAMES = {
    "os._exit": "import os\nos._exit(0)\n",
    "sys.exit": "import sys\nsys.exit(0)\n",
    "atexit after the failed assert": "import atexit, os\natexit.register(os._exit, 0)\n",
    "excepthook": "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\n",
    "patched print and stdout": (
        "import builtins, io, sys\nbuiltins.print = lambda *a, **k: None\nsys.stdout = io.StringIO()\n"
    ),
    "kills the harness": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "reads the nonce": "import sys\nprint(sys.stdin.read())\nsys.exit(0)\n",
    "rereads stdin": "import os\nos.lseek(0, 0, 0)\nprint(os.read(0, 100).decode())\nos._exit(0)\n",
}


@pytest.mark.parametrize("game", sorted(_GAMES))
def test_the_code_verifier_cannot_be_gamed(game: str) -> None:
    result = run_python_tests(_GAMES[game] + _ADD, _CHECK, "add")
    assert not result.passed and not result.ran_to_end, result


def test_the_code_verifier_still_passes_honest_programs_that_print() -> None:
    program = "def add(a, b):\n    print('adding', a, b)\n    return a + b\n"
    result = run_python_tests(program, _CHECK, "add")
    assert result.passed and result.stdout.splitlines() == ["adding 2 3", "checked"]
