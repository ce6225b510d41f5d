"""Regenerate the README's pictures of the Prefect UI and the MLflow UI (issue #10).

Starts a real ``prefect server`` (with its UI) on a free port and its own ``PREFECT_HOME``,
registers the deployments with ``deployments/register.sh``, starts a process worker, runs
``orchestrate`` (the embedded pool: the trained conductor plans, the calculator answers) and
two ``evaluate`` runs through the API as the UI's Run button does, starts ``mlflow ui`` on the
conductor home's store, and captures each page with headless Chromium (Debian's
``chromium`` package). Not part of CI: it needs Chromium and takes a few minutes.

    python docs/screenshots.py [--home DIR] [--out docs/img] [--chromium /usr/bin/chromium]

``--home`` is the conductor home of the deployments (default: a temporary directory; pass
one with a converted model cache, such as ``.conductor``, to skip the half-minute
conversion). Pictures: ``deployment-form.png``, ``flow-run.png``, ``plan-artifact.png``,
``answer-artifact.png``, ``eval-run.png``, ``eval-summary.png``, ``eval-progress.png``,
``mlflow-compare.png``.

``--lineage HOME [HOME…]`` instead pictures the lineage that conductor homes' trainings
recorded (issue #41): a Prefect server with its UI on a copy of a home's Prefect database, the
newest ``conductor`` version's materialisation event and the newest ``orchrm`` version's (each
from the first home that has one), with the assets it was made from
(``lineage-conductor.png``, ``lineage-orchrm.png``). Prefect 3.9's open-source UI has no
asset graph; an asset's lineage is its materialisation event in the Event Feed (the V2 UI's
Raw tab shows it whole).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _process(cmd: list[str], env: dict[str, str], cwd: Path, log: Path) -> Iterator[None]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def _wait_http(url: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"error: {url} did not answer within {timeout_s:.0f} s")


class Api:
    def __init__(self, base: str) -> None:
        self.base = base

    def __call__(self, method: str, path: str, body: Any = None) -> Any:
        response = httpx.request(method, self.base + path, json=body, timeout=60)
        response.raise_for_status()
        return response.json() if response.content else None

    def run(self, deployment: str, request: dict[str, Any], timeout_s: float = 900) -> dict:
        """A flow run of ``flow/name`` created as the UI does, followed to its final state."""
        dep = self("GET", f"/deployments/name/{deployment}")
        run = self(
            "POST",
            f"/deployments/{dep['id']}/create_flow_run",
            {"parameters": {"request": request}},
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = self("GET", f"/flow_runs/{run['id']}")
            if run["state"] and run["state"]["type"] in FINAL:
                print(f"  {deployment}: {run['name']} {run['state']['type']}", file=sys.stderr)
                return run
            time.sleep(2)
        raise SystemExit(f"error: {deployment} run {run['id']} not final after {timeout_s:.0f} s")

    def artifact(self, flow_run_id: str, key: str) -> dict:
        found = self(
            "POST",
            "/artifacts/filter",
            {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}, "key": {"any_": [key]}}},
        )
        if not found:
            raise SystemExit(f"error: flow run {flow_run_id} has no artifact {key!r}")
        return found[0]


def _shoot(chromium: str, url: str, path: Path, size: str = "1400,900") -> None:
    """One page, rendered by headless Chromium after its scripts have settled."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--window-size={size}",
                "--virtual-time-budget=20000",
                f"--screenshot={path}",
                url,
            ],
            check=True,
            capture_output=True,
            timeout=180,
        )
    print(f"  {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, default=None, help="Conductor home (default: temp).")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--limit", type=int, default=10, help="Questions of each eval.")
    parser.add_argument(
        "--lineage", type=Path, nargs="+", default=None, help="Picture these homes' lineage."
    )
    args = parser.parse_args(argv)
    if not Path(args.chromium).exists():
        raise SystemExit("error: Chromium not found; apt-get install chromium, or --chromium PATH")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.lineage is not None:
        todo = ["conductor", "orchrm"]
        for home in args.lineage:
            todo = _lineage(home.absolute(), args.out, args.chromium, todo)
        if todo:
            raise SystemExit(f"error: no {' or '.join(todo)} version was materialised there")
        return 0

    with tempfile.TemporaryDirectory(prefix="conductor-shots-") as tmp:
        base = Path(tmp)
        home = (args.home or base / "home").absolute()
        port, mlflow_port = _free_port(), _free_port()
        api = f"http://127.0.0.1:{port}/api"
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PREFECT_API_", "PREFECT_UI_", "PREFECT_PROFILE"))
            and k not in {"CONDUCTOR_ARTIFACTS", "MLFLOW_TRACKING_URI"}
        }
        env.update(
            PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            PREFECT_HOME=str(base / "prefect"),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_UI_API_URL=api,  # a non-default port: the UI must be told where the API is
            CONDUCTOR_HOME=str(home),
        )
        client = {**env, "PREFECT_API_URL": api}
        server = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port"]
        print(f"prefect server on :{port}, conductor home {home}", file=sys.stderr)
        with _process([*server, str(port)], env, base, base / "server.log"):
            _wait_http(f"{api}/health")
            subprocess.run(
                ["bash", str(ROOT / "deployments" / "register.sh")],
                env=client,
                cwd=base,
                check=True,
                capture_output=True,
            )
            worker = [str(BIN / "prefect"), "worker", "start", "--pool", "conductor-process"]
            with _process(worker, client, base, base / "worker.log"):
                _capture(Api(api), f"http://127.0.0.1:{port}", args, home, mlflow_port, env, base)
    return 0


def newest_materialisation(api: Api, model: str) -> dict[str, Any] | None:
    """The newest ``prefect.asset.materialization.succeeded`` event of a ``model`` version."""
    body = {
        "filter": {
            "occurred": {"since": "2000-01-01T00:00:00Z"},
            "event": {"name": ["prefect.asset.materialization.succeeded"]},
        },
        "limit": 50,
    }
    page = api("POST", "/events/filter", body)
    found = []
    while True:
        found += [
            e for e in page["events"] if f"/models/{model}/" in e["resource"]["prefect.resource.id"]
        ]
        if not page.get("next_page"):
            break
        page = httpx.get(page["next_page"], timeout=60).raise_for_status().json()
    return max(found, key=lambda e: e["occurred"], default=None)


def _lineage(home: Path, out: Path, chromium: str, models: list[str]) -> list[str]:
    """Pictures of the newest materialisation of each of ``models`` in ``home``; the rest."""
    database = home / "prefect" / "prefect.db"
    if not database.is_file():
        raise SystemExit(f"error: {home} has no Prefect database ({database})")
    with tempfile.TemporaryDirectory(prefix="conductor-lineage-") as tmp:
        base = Path(tmp)
        copy = base / "prefect.db"
        import sqlite3

        with sqlite3.connect(database) as src, sqlite3.connect(copy) as dst:
            src.backup(dst)  # the WAL's pages too, and the home's server may keep running
        port = _free_port()
        api_url = f"http://127.0.0.1:{port}/api"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(
            PREFECT_HOME=str(base / "prefect"),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_UI_API_URL=api_url,
            PREFECT_SERVER_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{copy}",
        )
        server = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port"]
        with _process([*server, str(port)], env, base, base / "server.log"):
            _wait_http(f"{api_url}/health")
            api = Api(api_url)
            left = []
            for model in models:
                event = newest_materialisation(api, model)
                if event is None:
                    left.append(model)
                    continue
                day = event["occurred"][:10]
                # The Raw tab: the Details tab of the V2 UI shows a related key only after its
                # last dot (`…/mlflow.db/models/orchrm/1` reads `db/models/orchrm/1`).
                url = f"http://127.0.0.1:{port}/v2/events/event/{day}/{event['id']}?tab=raw"
                _shoot(chromium, url, out / f"lineage-{model}.png", size="1400,800")
    return left


def _capture(
    api: Api, ui: str, args: argparse.Namespace, home: Path, mlflow_port: int, env: dict, base: Path
) -> None:
    out, shoot = args.out, lambda url, name, **kw: _shoot(args.chromium, url, out / name, **kw)
    dep = api("GET", "/deployments/name/orchestrate/orchestrate")
    shoot(f"{ui}/deployments/deployment/{dep['id']}/run", "deployment-form.png", size="1400,1250")

    print(
        "running orchestrate and two evals (the first local run converts the model)",
        file=sys.stderr,
    )
    run = api.run("orchestrate/orchestrate", {"question": "What is 17 + 25?"})
    shoot(f"{ui}/runs/flow-run/{run['id']}", "flow-run.png")
    for key, name in (
        ("conductor-plan", "plan-artifact.png"),
        ("conductor-answer", "answer-artifact.png"),
    ):
        artifact = api.artifact(run["id"], key)
        shoot(f"{ui}/artifacts/artifact/{artifact['id']}", name, size="1400,700")

    common = {"dataset": "arithmetic", "split": "test", "limit": args.limit, "concurrency": 4}
    api.run("evaluate/evaluate", {**common, "strategy": "single:calculator"})
    ev = api.run("evaluate/evaluate", {**common, "strategy": "conductor"})
    shoot(f"{ui}/runs/flow-run/{ev['id']}?tab=Artifacts", "eval-run.png")
    summary = api.artifact(ev["id"], "eval-summary")
    shoot(f"{ui}/artifacts/artifact/{summary['id']}", "eval-summary.png", size="1400,1150")
    progress = api.artifact(ev["id"], "eval-progress")
    shoot(f"{ui}/artifacts/artifact/{progress['id']}", "eval-progress.png", size="1400,500")

    store = f"sqlite:///{home / 'mlflow.db'}"
    mlflow_cmd = [
        str(BIN / "mlflow"),
        "ui",
        "--backend-store-uri",
        store,
        "--port",
        str(mlflow_port),
    ]
    with _process(mlflow_cmd, env, base, base / "mlflow.log"):
        mlflow_ui = f"http://127.0.0.1:{mlflow_port}"
        _wait_http(mlflow_ui)
        import mlflow

        client = mlflow.MlflowClient(store)
        experiment = client.get_experiment_by_name("eval/arithmetic")
        runs = client.search_runs([experiment.experiment_id], order_by=["start_time DESC"])[:2]
        ids = json.dumps([r.info.run_id for r in runs])
        experiments = json.dumps([experiment.experiment_id])
        query = urllib.parse.urlencode({"runs": ids, "experiments": experiments})
        shoot(f"{mlflow_ui}/#/compare-runs?{query}", "mlflow-compare.png", size="1800,2200")


if __name__ == "__main__":
    raise SystemExit(main())
