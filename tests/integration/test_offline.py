"""Nothing leaves the machine in the offline default (issue #17): no library phones home.

The commands run as a user runs them (a subprocess with its own temporary Prefect server),
with every process of the tree recording attempted outbound connections (tests.netguard).
"""

from __future__ import annotations

import subprocess
import sys

from tests.integration.test_cli import cli_env, write_tool_pool
from tests.netguard import guard


def test_the_guard_sees_an_outbound_attempt(tmp_path):
    """The check itself could fail: a lookup of a remote name is recorded."""
    env, log = guard(cli_env(tmp_path), tmp_path)
    code = "import socket\ntry:\n    socket.getaddrinfo('example.invalid', 443)\nexcept OSError:\n    pass\n"
    subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True, timeout=60)
    assert "getaddrinfo 'example.invalid'" in log.read_text()


def test_run_and_eval_make_no_outbound_connection_attempt(tmp_path):
    env, log = guard(cli_env(tmp_path), tmp_path)
    pool = write_tool_pool(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "prefect_conductor.cli.app", "run", "What is 17 + 25?", "--pool", str(pool)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    evaluation = subprocess.run(
        [sys.executable, "-m", "prefect_conductor.cli.app", "eval", "--dataset", "arithmetic",
         "--strategy", "single:calculator", "--limit", "2", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert evaluation.returncode == 0, evaluation.stderr
    assert log.read_text() == ""
    server_log = (tmp_path / "home" / "logs" / "prefect-server.log").read_text()
    assert "telemetry" not in server_log.lower()
