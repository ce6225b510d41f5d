"""Cold start of ``conductor run``: seconds from launching the command to its first worker call.

Each sample is a fresh process, as a user's command is, in these settings:

- ``ephemeral``: no ``PREFECT_API_URL``; Prefect starts a temporary server in the command;
- ``server``: ``PREFECT_API_URL`` points at a ``prefect server start`` that this script starts
  on a free port before the samples and stops at the end (the "keep a local server
  running" setup of docs/deployments.md), each ``conductor run`` a fresh process that runs
  the flow itself;
- ``served``: the same running server plus ``conductor serve`` (started and warmed before
  the samples, not timed in them): ``conductor run`` hands its request to that warm process;
- ``served-whole-prompt`` (on request): ``served`` with ``CONDUCTOR_PREFIX_CACHE=0``, so the
  serving process computes the conductor's whole prompt for every plan: the baseline of
  prompt-prefix reuse (``prefect_conductor.conductor.providers._prefix_cache``).

The first worker call's time is the ``started_at`` of the run's first step in the Parquet
store (``conductor run --json`` names the run and the store). With a running server, where
the seconds go is read back from the Prefect API: when the flow run started, and when its
planning task started and ended (medians, seconds from launch). By default the pool is the
embedded one (the trained conductor plans with SmolLM2, loaded from the converted-weights
cache under ``$CONDUCTOR_HOME/models``, so the figure includes planning). ``--tool-only``
uses a pool whose conductor is a mock-answered litellm model writing a one-step plan for the
calculator: no model is loaded, the figure is the engine's own start-up.

Baseline, in the same invocation and settings: a bare Prefect script (import prefect and
litellm, one flow with one task) timed to the start of its task; ``ratio`` is conductor /
baseline. Samples are interleaved so drift hits both alike; medians of ``--repeat``. Before
the samples, one untimed run of each command per setting creates Prefect's database and the
model cache (a user's second command finds them). ``imports_s`` is how long a fresh process
takes just to import what the command imports before its first worker call. ``PREFECT_HOME``
is a temporary directory. The 1-minute load average is printed with each row: on a shared
2-core machine other work moves these numbers a lot. Goal (issue #10): <= 6 s to the first
worker call with a running server and the model cached.

    python -m benchmarks.cold_start [--repeat 3] [--tool-only] [--settings ephemeral,server,served]
                                    [--home DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
QUESTION = "What is 17 + 25?"
GOAL_S = 6.0
SETTINGS = ("ephemeral", "server", "served", "served-whole-prompt")
TOOL_POOL = """\
conductor:
  model: openai/gpt-4o-mini
  params: {mock_response: "model_id = [0]\\nsubtasks = ['17 + 25']\\naccess_list = [[]]"}
workers:
  - {name: calculator, kind: tool, model: tool/calculator, retries: 0}
"""
BASELINE = """
import sys
from datetime import datetime, timezone
from prefect import flow, task
import litellm

@task
def first():
    print(datetime.now(timezone.utc).timestamp(), file=sys.stderr, flush=True)
    return litellm.completion(model="openai/gpt-4o-mini", mock_response="42",
                              messages=[{"role": "user", "content": "x"}])

@flow
def bare():
    first()

bare()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: Path, prefect_home: Path, api_url: str | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PREFECT_API_", "PREFECT_PROFILE"))
        and k not in {"CONDUCTOR_ARTIFACTS", "PYTHONPATH"}
    }
    env.update(
        CONDUCTOR_HOME=str(home),
        PREFECT_HOME=str(prefect_home),
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        HF_HUB_OFFLINE="1",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
    )
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def _conductor_cmd() -> list[str]:
    script = BIN / "conductor"
    return [str(script)] if script.exists() else [sys.executable, "-m", "prefect_conductor.cli.app"]


def _api(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 - loopback only
        return json.loads(r.read())


def _stamp(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None


def phases(api_url: str, run_id: str, t0: float) -> dict[str, float]:
    """Seconds from launch to the flow run's start and to the planning task's start and end,
    read from the Prefect API (a running server keeps them)."""
    flow_run = _api(f"{api_url}/flow_runs/{run_id}")
    tasks = _api(f"{api_url}/task_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}})
    plan = next((t for t in tasks if t["name"].startswith("plan")), None)
    stamps = {
        "flow_run_start": _stamp(flow_run.get("start_time")),
        "plan_start": _stamp(plan and plan.get("start_time")),
        "plan_end": _stamp(plan and plan.get("end_time")),
    }
    return {name: value - t0 for name, value in stamps.items() if value is not None}


def conductor_sample(
    env: dict[str, str], cwd: Path, pool: Path | None, served: bool = False
) -> tuple[float, float, dict[str, float]]:
    """(seconds to the first worker call, seconds for the whole command, phases)."""
    from prefect_conductor.conductor.data.store import ArtifactStore

    cmd = [*_conductor_cmd(), "run", QUESTION, "--json"]
    if pool is not None:
        cmd += ["--pool", str(pool)]
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    total = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"conductor run failed:\n{proc.stderr[-3000:]}")
    if served != ("via conductor serve" in proc.stderr):
        raise SystemExit(f"conductor run {'did not go' if served else 'went'} through serve")
    result = json.loads(proc.stdout)
    steps = ArtifactStore(result["artifacts"]).read_pandas("steps")
    mine = steps[steps["run_id"] == result["run_id"]]
    if mine.empty:
        raise SystemExit(f"run {result['run_id']} stored no step")
    first = min(mine["started_at"]).to_pydatetime().timestamp()
    api = env.get("PREFECT_API_URL")
    return first - t0, total, phases(api, result["run_id"], t0) if api else {}


def baseline_sample(env: dict[str, str], cwd: Path) -> tuple[float, float]:
    script = cwd / "bare.py"
    script.write_text(BASELINE)
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=cwd, capture_output=True, text=True, timeout=900
    )
    total = time.time() - t0
    stamps = [line for line in proc.stderr.splitlines() if line.replace(".", "").isdigit()]
    if proc.returncode != 0 or not stamps:
        raise SystemExit(f"baseline failed:\n{proc.stderr[-3000:]}")
    return float(stamps[0]) - t0, total


def imports_sample(env: dict[str, str], cwd: Path, tool_only: bool, served: bool) -> float:
    """Seconds for a fresh process to import what ``conductor run`` imports before its first
    worker call (the local model's torch and transformers too, unless tool-only; only the
    client's modules when ``conductor serve`` runs the request)."""
    if served:
        modules = "prefect_conductor.cli.app, prefect_conductor.fleet.serve"
    else:
        modules = "prefect_conductor.cli.app, prefect_conductor.flows.orchestrate" + (
            "" if tool_only else ", prefect_conductor.conductor.providers.local_model"
        )
    t0 = time.time()
    subprocess.run(
        [sys.executable, "-c", f"import {modules}"], env=env, cwd=cwd, check=True, timeout=900
    )
    return time.time() - t0


class LocalServer:
    """``prefect server start`` on a free port, its own PREFECT_HOME; stopped on exit."""

    def __init__(self, prefect_home: Path, log: Path):
        self.port = _free_port()
        self.api = f"http://127.0.0.1:{self.port}/api"
        prefect = shutil.which("prefect", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
        if prefect is None:
            raise SystemExit("the `prefect` CLI is not installed")
        env = _env(prefect_home / "unused-home", prefect_home, None)
        cmd = [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(self.port)]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*cmd, "--no-ui"], env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.log = log

    def wait(self, timeout_s: float = 180) -> float:
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise SystemExit(f"prefect server exited:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.api}/health", timeout=2) as r:  # noqa: S310
                    if r.status == 200:
                        return time.time() - t0
            except OSError:
                pass
            time.sleep(0.25)
        raise SystemExit(f"prefect server not healthy after {timeout_s} s")

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # the group we started: the server alone
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


class Serve:
    """``conductor serve`` against the server, in the conductor home; ready when it has
    written its marker (the pool's local models are loaded by then)."""

    def __init__(self, env: dict[str, str], cwd: Path, pool: Path | None, log: Path):
        cmd = [*_conductor_cmd(), "serve"] + (["--pool", str(pool)] if pool else [])
        self.marker = Path(env["CONDUCTOR_HOME"]) / "serve.json"
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def wait(self, timeout_s: float = 900) -> float:
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise SystemExit(f"conductor serve exited:\n{self.log.read_text()[-3000:]}")
            if self.marker.exists():
                return time.time() - t0
            time.sleep(0.25)
        raise SystemExit(f"conductor serve not ready after {timeout_s} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def _summary(samples: list[tuple[Any, ...]], load: list[float]) -> dict[str, Any]:
    out = {
        "first_call_s": round(statistics.median(s[0] for s in samples), 2),
        "total_s": round(statistics.median(s[1] for s in samples), 2),
        "samples": len(samples),
        "load_1m": round(statistics.mean(load), 2),
    }
    timed = [s[2] for s in samples if len(s) > 2 and s[2]]
    if timed:  # medians of each phase over the samples that have it
        names = sorted({name for t in timed for name in t}, key=lambda n: timed[0].get(n, 0))
        out["phases_s"] = {
            n: round(statistics.median(t[n] for t in timed if n in t), 2) for n in names
        }
    return out


def measure(
    setting: str, args: argparse.Namespace, work: Path, home: Path, pool: Path | None
) -> dict[str, Any]:
    prefect_home = work / f"prefect-{setting}"
    prefect_home.mkdir()
    server = serve = None
    server_start_s = serve_ready_s = None
    served = setting.startswith("served")
    try:
        if setting != "ephemeral":
            server = LocalServer(prefect_home, work / f"server-{setting}.log")
            server_start_s = round(server.wait(), 2)
        env = _env(home, prefect_home, server.api if server else None)
        if setting == "served-whole-prompt":
            env["CONDUCTOR_PREFIX_CACHE"] = "0"
        cwd = work / f"cwd-{setting}"
        cwd.mkdir()
        if served:
            serve = Serve(env, cwd, pool, work / f"serve-{setting}.log")
            serve_ready_s = round(serve.wait(), 2)
        conductor_sample(env, cwd, pool, served)  # warm-up: Prefect's database, the model cache
        baseline_sample(env, cwd)
        rows: dict[str, list[tuple[Any, ...]]] = {"conductor run": [], "bare prefect flow": []}
        load: dict[str, list[float]] = {"conductor run": [], "bare prefect flow": []}
        imports = []
        for _ in range(args.repeat):
            imports.append(imports_sample(env, cwd, args.tool_only, served))
            load["conductor run"].append(os.getloadavg()[0])
            rows["conductor run"].append(conductor_sample(env, cwd, pool, served))
            load["bare prefect flow"].append(os.getloadavg()[0])
            rows["bare prefect flow"].append(baseline_sample(env, cwd))
    finally:
        if serve is not None:
            serve.stop()
        if server is not None:
            server.stop()
    out = {name: _summary(rows[name], load[name]) for name in rows}
    out["ratio"] = round(
        out["conductor run"]["first_call_s"] / out["bare prefect flow"]["first_call_s"], 2
    )
    out["added_s"] = round(
        out["conductor run"]["first_call_s"] - out["bare prefect flow"]["first_call_s"], 2
    )
    out["imports_s"] = round(statistics.median(imports), 2)
    if server_start_s is not None:
        out["server_start_s"] = server_start_s
    if serve_ready_s is not None:
        out["serve_ready_s"] = serve_ready_s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="Samples per command (median).")
    ap.add_argument(
        "--tool-only",
        action="store_true",
        help="A mock conductor and the calculator: no model loads (default: the embedded pool).",
    )
    ap.add_argument(
        "--settings",
        default="ephemeral,server,served",
        help="Any of ephemeral, server, served (a running server and `conductor serve`), "
        "served-whole-prompt (served without prompt-prefix reuse).",
    )
    ap.add_argument(
        "--home",
        type=Path,
        default=None,
        help="CONDUCTOR_HOME to use (its models/ cache saves the first conversion); "
        "default: a temporary one.",
    )
    ap.add_argument("--json", action="store_true", help="Print one JSON object.")
    args = ap.parse_args()
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if not settings or not set(settings) <= set(SETTINGS):
        ap.error(f"--settings takes {', '.join(SETTINGS)} (comma-separated)")

    result: dict[str, Any] = {
        "pool": "tool-only (mock conductor, calculator)" if args.tool_only else "embedded",
        "repeat": args.repeat,
        "goal_s": GOAL_S,
    }
    with tempfile.TemporaryDirectory(prefix="cold-start-") as tmp:
        work = Path(tmp)
        home = (args.home or work / "home").absolute()
        pool = None
        if args.tool_only:
            pool = work / "tool-pool.yaml"
            pool.write_text(TOOL_POOL)
        for setting in settings:
            result[setting] = measure(setting, args, work, home, pool)
    running = [s for s in ("server", "served") if s in result]  # the product as it ships
    if running:  # the goal's setting: a running server; the best way to run against it
        best = min(running, key=lambda s: result[s]["conductor run"]["first_call_s"])
        result["goal_setting"] = best
        result["goal_met"] = result[best]["conductor run"]["first_call_s"] <= GOAL_S
    result["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if args.json:
        print(json.dumps(result))
        return
    print(f"pool: {result['pool']}; median of {args.repeat}; seconds from launch\n")
    print("| setting | command | first worker call | whole command | load (1 min) |")
    print("|---|---|---|---|---|")
    for setting in settings:
        r = result[setting]
        for name in ("conductor run", "bare prefect flow"):
            row = r[name]
            print(
                f"| {setting} | {name} | {row['first_call_s']:.2f} s | {row['total_s']:.2f} s "
                f"| {row['load_1m']:.2f} |"
            )
    print()
    for setting in settings:
        r = result[setting]
        extra = f"; imports alone {r['imports_s']:.2f} s"
        extra += f"; server start {r['server_start_s']:.2f} s" if "server_start_s" in r else ""
        extra += f"; serve ready {r['serve_ready_s']:.2f} s" if "serve_ready_s" in r else ""
        print(f"{setting}: conductor / baseline = {r['ratio']:.2f}x (+{r['added_s']:.2f} s){extra}")
        if "phases_s" in r["conductor run"]:
            p = r["conductor run"]["phases_s"]
            print(
                f"  conductor run phases (s from launch): flow run starts "
                f"{p.get('flow_run_start', float('nan')):.2f}, plan "
                f"{p.get('plan_start', float('nan')):.2f}-{p.get('plan_end', float('nan')):.2f}, "
                f"first worker call {r['conductor run']['first_call_s']:.2f}"
            )
    if "goal_met" in result:
        best = result["goal_setting"]
        first = result[best]["conductor run"]["first_call_s"]
        verdict = "met" if result["goal_met"] else "missed"
        print(f"goal: first worker call <= {GOAL_S:.0f} s with a running server: {verdict} "
              f"({first:.2f} s, {best})")  # fmt: skip


if __name__ == "__main__":
    main()
