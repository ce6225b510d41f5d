"""The sandbox through the engine (issue #17): ``single:python`` on a dataset of hostile programs.

The eval runs in this process (the engine), through the real ``python`` tool: afterwards this
process and a sentinel process of ours are alive, every question is recorded, and the canary
set in our environment is in no stored row. The fail-closed path goes through the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.plan.requests import EvalRequest
from prefect_conductor.conductor.providers.tools.sandbox import HELPER_ENV, run_sandboxed

from tests.integration.test_cli import assert_clean, cli_env, conductor

CANARY = "canary-eval-51d2"

HOSTILE = {
    "environ": "import os\nfor p in os.listdir('/proc'):\n    try: print(open(f'/proc/{{p}}/environ').read())\n    except OSError: pass\nprint(dict(os.environ))",  # noqa: E501
    "parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('sent')",
    "everyone": "import os\nos.system('kill -9 -1')\nprint('after kill -1')",
    "network": "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)",
    "home": "import shutil\nshutil.rmtree({home!r})",
    "tmp": "open('/tmp/{marker}', 'w').write('x')\nprint('wrote')",
    "forks": "import os\nwhile True:\n    os.fork()",
    "memory": "x = bytearray(4 * 1024**3)",
    "disk": "while True:\n    open(f'f{{id(object())}}', 'wb').write(b'x' * (1 << 20))",
    "late": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(1)\n    open({late!r}, 'w').write('late')\nprint('bye')",  # noqa: E501
    # issue #38: the caller's session keyring (the fixture puts the canary in it), and host
    # memory past every rlimit through memfds
    "keyring": "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.syscall.restype = ctypes.c_long\nbuf = ctypes.create_string_buffer(64)\nkey = libc.syscall(250, 10, -3, b'user', b'rt-secret', 0)\nprint(key, libc.syscall(250, 11, key, buf, 64), buf.value)",  # noqa: E501
    "memfd": "import os\nfds = [os.memfd_create('m') for _ in range(80)]\nfor fd in fds: os.posix_fallocate(fd, 0, 10 << 20)\nprint('held 800 MB')",  # noqa: E501
    "fine": "print(317 * 331)",
}
# What only "fine" prints: a number no path, port or pid in the others' tracebacks can hold
# (a tmp dir named pytest-42 once made the "home" traceback verify as 42).
FINE = "104927"


def _session_key(payload: str) -> None:
    """Join a fresh session keyring (as an engine under ssh or systemd holds one) and put
    ``payload`` in it, or skip loudly where this kernel has no keyrings."""
    import ctypes
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("KEYRING PROGRAM NOT RUN: syscall numbers are x86_64's")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(250, 1, b"conductor-eval-session") <= 0:
        pytest.skip(f"KEYRING PROGRAM NOT RUN: no session keyring (errno {ctypes.get_errno()})")
    data = payload.encode()
    assert libc.syscall(248, b"user", b"rt-secret", data, len(data), -3) > 0


@pytest.fixture()
def hostile_eval(tmp_path, monkeypatch):
    import socket

    _session_key(CANARY)
    monkeypatch.setenv("FAKE_API_KEY", CANARY)
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(HELPER_ENV, raising=False)
    report = json.loads(
        run_sandboxed("import os, json; print(json.dumps(os.listdir('/proc')))").stdout
    )
    if sorted(p for p in report if p.isdigit()) != ["1", "2"]:
        pytest.skip(f"ISOLATION DOES NOT HOLD, hostile eval not run: /proc lists {report}")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    marker = f"conductor-eval-hostile-{os.getpid()}"
    art = tmp_path / "art"
    values = {"port": listener.getsockname()[1], "home": str(art), "marker": marker}
    values["late"] = str(tmp_path / "late.txt")
    rows = [
        {"id": name, "question": f"What does this print?\n```python\n{code.format(**values)}\n```",
         "reference": FINE, "kind": "math"}
        for name, code in HOSTILE.items()
    ]  # fmt: skip
    data = tmp_path / "hostile.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        yaml.safe_dump(
            {
                "conductor": {"model": "tool/calculator"},
                "workers": [
                    {"name": "python", "kind": "tool", "model": "tool/python", "retries": 0}
                ],
            }
        )
    )
    sentinel = subprocess.Popen(["sleep", "120"])
    yield data, pool, art, listener, sentinel, values
    sentinel.kill()
    sentinel.wait()
    listener.close()


@pytest.mark.usefixtures("prefect")
def test_hostile_programs_through_eval(hostile_eval, tmp_path):
    import time

    from prefect_conductor.flows.evaluate import evaluate

    data, pool, art, listener, sentinel, values = hostile_eval
    request = EvalRequest(dataset=str(data), strategy="single:python", pool=str(pool),
                          concurrency=4, artifacts=str(art))  # fmt: skip
    result = evaluate(request)
    assert result.n == len(HOSTILE) and result.correct == 1  # only "fine" prints FINE
    time.sleep(1.5)  # the "late" grandchild would have written by now
    assert sentinel.poll() is None  # signals reached nothing outside the sandbox
    with pytest.raises(BlockingIOError):
        listener.accept()
    assert not (tmp_path / "late.txt").exists()
    assert not os.path.exists(f"/tmp/{values['marker']}")
    store = ArtifactStore(str(art))  # "home" tried to delete it: still there, every question in
    runs = store.read("runs").to_pylist()
    steps = store.read("steps").to_pylist()
    assert sorted(r["question_id"] for r in runs) == sorted(HOSTILE)
    assert len(steps) == len(HOSTILE) and {s["sandbox"] for s in steps} == {"isolated"}
    assert CANARY not in json.dumps(runs + steps, default=str)
    assert not any("held 800 MB" in (s["output"] or "") for s in steps)  # 512 MB + scratch


def test_missing_helper_fails_closed_through_the_cli(tmp_path):
    plan = "model_id = [0]\nsubtasks = ['```python\\nprint(6 * 7)\\n```']\naccess_list = [[]]"
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        yaml.safe_dump(
            {
                "conductor": {"model": "openai/gpt-4o-mini", "params": {"mock_response": plan}},
                "workers": [
                    {"name": "python", "kind": "tool", "model": "tool/python", "retries": 0}
                ],
            }
        )
    )
    env = cli_env(tmp_path, **{HELPER_ENV: "/nonexistent/python"})
    proc = conductor("run", "Run it.", "--pool", str(pool), "--in-process", cwd=tmp_path, env=env)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "sandbox: cannot start the namespace helper" in errors[0]
    assert "sandbox: process" in errors[0]
    assert_clean(proc.stderr)
    # Nothing is lost: the failed step is stored, with the sandbox it was to run in.
    (step,) = ArtifactStore(str(tmp_path / "home" / "artifacts")).read("steps").to_pylist()
    assert step["status"] == "failed" and step["sandbox"] == "isolated"
    assert "cannot start the namespace helper" in step["error"]
