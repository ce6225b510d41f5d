"""A fleet of ``conductor serve`` processes on the local stack, for tests and benchmarks
(issue #19): ``tests/integration/test_fanout.py`` and ``python -m benchmarks.scale_out``.

Each process is one "host": the environment of that host's env file from
``python -m deployments.stack up`` (its own ``CONDUCTOR_HOME`` and ``PREFECT_HOME``, the shared
services' URLs) and nothing else of ours. ``CLI`` runs ``conductor …`` with the fake litellm
provider of :mod:`prefect_conductor.testing.fakes` registered (the ``fake/sleep-…`` workers),
offline first, as ``conductor`` itself is, before litellm is imported. The package is
installed, so a host's process imports it from anywhere: no ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx

__all__ = [
    "CLI",
    "READY_S",
    "Serve",
    "conductor",
    "eval_args",
    "eval_rows",
    "host_env",
    "kill_mid_question",
    "on_host",
    "running_on",
    "subscribed_workers",
    "tagged_rows",
    "write_pool",
]

READY_S = 180  # a serve process's start on a loaded 2-core machine

CLI = (
    "import sys; from prefect_conductor.runtime.quiet import offline_defaults; offline_defaults(); "
    "from prefect_conductor.testing.fakes import register_fake_provider; "
    "register_fake_provider(); "
    "from prefect_conductor.cli.app import main; sys.argv = ['conductor', *sys.argv[1:]]; main()"
)


def host_env(host: dict[str, Any], **extra: str) -> dict[str, str]:
    """A host's environment: this process's, with the host's env file on top."""
    env = {**os.environ, **host["env"], **extra}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env.pop("PREFECT_PROFILE", None)
    return env


def _run(host: dict[str, Any], argv: list[str], timeout: float) -> str:
    """Run ``argv`` (after ``python``) as ``host``; its stdout, or an error with its stderr."""
    done = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=host_env(host),
        cwd=host["home"],
    )
    if done.returncode != 0:
        raise RuntimeError(f"{argv[-1][:80]!r} on {host['home']}: {done.stderr[-3000:]}")
    return done.stdout


def conductor(host: dict[str, Any], *args: str, timeout: float = 600) -> Any:
    """``conductor ARGS --json`` as ``host``: its JSON output."""
    return json.loads(_run(host, ["-c", CLI, *args, "--json"], timeout))


def on_host(host: dict[str, Any], code: str, timeout: float = 300) -> Any:
    """Run ``code`` as ``host``; it prints one JSON line, returned."""
    return json.loads(_run(host, ["-c", textwrap.dedent(code)], timeout).strip().splitlines()[-1])


def eval_args(
    dataset: str, strategy: str, pool: Path, limit: int, concurrency: int = 8
) -> list[str]:
    """``conductor eval`` over the fleet: ``--fan-out`` and these options."""
    return [
        "eval",
        *("--dataset", dataset, "--strategy", strategy, "--pool", str(pool)),
        *("--limit", str(limit), "--concurrency", str(concurrency), "--fan-out"),
    ]


def eval_rows(host: dict[str, Any], eval_id: str) -> list[dict[str, Any]]:
    """An eval's runs as ``host`` reads them from the shared artifact store."""
    return tagged_rows(host, "eval_id", eval_id)


def tagged_rows(host: dict[str, Any], tag: str, value: str) -> list[dict[str, Any]]:
    """The runs tagged ``tag=value``, as ``host`` reads them from the shared artifact store."""
    return on_host(
        host,
        f"""
        import json, os
        from prefect_conductor.conductor.data.store import ArtifactStore

        runs = ArtifactStore(os.environ["CONDUCTOR_ARTIFACTS"]).read_pandas("runs")
        rows = []
        for run_id, qid, tags, correct, valid in zip(
            runs["run_id"], runs["question_id"], runs["tags"], runs["correct"],
            runs["format_valid"],
        ):
            tags = dict(tags)
            if tags.get("{tag}") == "{value}":
                rows.append({{"run_id": run_id, "question_id": qid, "correct": bool(correct),
                              "format_valid": bool(valid), "served_by": tags.get("served_by"),
                              "tags": tags}})
        print(json.dumps(rows))
        """,
    )


def running_on(api_url: str, worker: str) -> int:
    """How many task runs are Running on ``worker`` (``question <id> on <worker>``), from the
    Prefect server's REST API."""
    filters = {
        "task_runs": {
            "name": {"like_": f" on {worker}"},
            "state": {"type": {"any_": ["RUNNING"]}},
        }
    }
    answer = httpx.post(f"{api_url}/task_runs/filter", json=filters, timeout=30)
    answer.raise_for_status()
    return len(answer.json())


def subscribed_workers(api_url: str) -> list[str]:
    """The task workers holding an open subscription on the Prefect server (Prefect's
    client id, ``<hostname>-<pid>``)."""
    answer = httpx.post(f"{api_url}/task_workers/filter", json={}, timeout=30)
    answer.raise_for_status()
    return [w.get("identifier") for w in answer.json()]


def subscribed(api_url: str, worker: str) -> bool:
    """Whether ``worker``'s task worker holds an open subscription on the Prefect server."""
    return worker in subscribed_workers(api_url)


class Serve:
    """One ``conductor serve`` process of the fleet."""

    def __init__(self, host: dict[str, Any], pool: Path, home: Path | None = None, limit: int = 4):
        extra = {"CONDUCTOR_HOME": str(home)} if home else {}
        home = home or Path(host["home"])
        home.mkdir(parents=True, exist_ok=True)
        self.log = home / f"serve-{time.monotonic_ns()}.log"
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-c", CLI, "serve", "--pool", str(pool), "--limit", str(limit)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=host_env(host, **extra),
                cwd=home,
                start_new_session=True,
            )
        self.id = (
            f"{socket.gethostname()}-{self.process.pid}"  # prefect_conductor.fleet.fanout.worker_id
        )
        self.api_url = host_env(host)["PREFECT_API_URL"]

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_S
        while "ready in" not in self.log.read_text():
            if self.process.poll() is not None:
                raise RuntimeError(f"serve exited: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"serve not ready: {self.log.read_text()[-2000:]}")
            time.sleep(0.5)
        # "ready in" is printed before the task worker's subscription is open; a question
        # sent before it is open goes to the other serve (all 16 once, on a loaded machine).
        while not subscribed(self.api_url, self.id):
            if self.process.poll() is not None:
                raise RuntimeError(f"serve exited: {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"serve never subscribed: {self.log.read_text()[-2000:]}")
            time.sleep(0.5)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def kill_mid_question(victim: Serve, api_url: str, evaluation: subprocess.Popen, timeout: float):
    """SIGKILL ``victim`` as soon as it runs one of the eval's questions."""
    deadline = time.monotonic() + timeout
    while running_on(api_url, victim.id) == 0:
        if evaluation.poll() is not None:
            raise RuntimeError("the eval ended before the victim took a question")
        if time.monotonic() > deadline:
            raise RuntimeError("the victim never ran a question")
        time.sleep(0.3)
    victim.kill()  # mid-question: its task runs stay Running on the server


def write_pool(path: Path, latency_s: float) -> Path:
    """A pool of the calculator (the real tool) and ``sleepy``, a fake worker that answers
    after ``latency_s`` seconds."""
    import yaml

    pool = {
        "conductor": {"model": "fake/plan"},
        "default_worker": "calculator",
        "workers": [
            {"name": "calculator", "kind": "tool", "model": "tool/calculator"},
            {"name": "sleepy", "model": f"fake/sleep-{latency_s}", "retries": 0},
        ],
    }
    path.write_text(yaml.safe_dump(pool))
    return path
