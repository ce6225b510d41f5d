"""Eval throughput on one host (issue #19): questions per second through the real eval path.

``questions_per_s_1host``: the 200 arithmetic test questions with ``single:calculator`` (a tool
that answers in microseconds, so every second is the engine's) at ``--concurrency 16``,
through the Python API, ``prefect_conductor.evaluate(...)`` (the flow ``conductor eval``
runs): every question a task run with its step task run, a row in the Parquet
``runs``/``steps`` tables,
the MLflow run, the progress, runs and summary artifacts. The wall time is taken around that
call, after a warm-up eval of ``--warm-up`` questions (the temporary server started, MLflow's
sqlite store created, imports done), as a user's second eval finds it.

``asyncio_questions_per_s``, the baseline, measured in the same process just before and just
after the eval (the mean of the two is shown; each is in ``asyncio_walls_s``): the same
questions as plain ``litellm.acompletion`` calls to the same ``tool/calculator`` provider with
the messages the step task sends, ``--concurrency`` at once on one event loop, no Prefect, no
store. Its ``asyncio_correct`` should equal the eval's ``correct`` (the same work was done).

How to read the rest: ``ratio`` is the baseline's rate over the eval's (the engine's price);
``api_calls_per_question`` counts HTTP requests to the Prefect API during the measured eval
(flow runs, states, artifacts, logs), ``events_per_question`` the events the client emitted
(task-run states, artifacts; the server records task runs from them), and
``parquet_files_per_question`` the files the eval added to ``runs/`` and ``steps/``; each is
divided by the questions. ``load`` is the machine's (this script shares it with whatever else
runs): the 1-minute load average before and after, the busy share of all CPUs, and the CPU
seconds of this benchmark and of everything else. ``stderr_problems`` counts "database is
locked", tracebacks and ``CancelledError`` in the child's stderr.

Then the fleet (``benchmarks/_fleet.py``, skipped with ``--no-fleet``): one local stack
(``python -m deployments.stack``) and ``conductor eval --fan-out`` over 1, 2 and 4 ``conductor
serve`` processes (each its own home) with a 0.5 s fake worker: ``efficiency`` ({"2": .., "4": ..},
``q/s(N) / (N * q/s(1))``, goal >= 0.8), and ``killed_worker`` ({"lost": .., "duplicated":
..}, goal 0 and 0): 200 questions over 3 workers, one SIGKILLed mid-question.

Goal: ``questions_per_s_1host`` >= 5 (about 1.1 before issue #19). ``--root DIR`` measures another
checkout (e.g. an earlier commit unpacked with ``git archive``) under the same conditions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks import _fleet
from benchmarks.engine_overhead import _busy_cpu_s, _problems, _table

ROOT = Path(__file__).resolve().parent.parent

GOAL_QPS = 5.0
DATASET, SPLIT, STRATEGY, WORKER = "arithmetic", "test", "single:calculator", "calculator"
GOAL_EFFICIENCY = 0.8
_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# ---- child: Prefect is imported here only, after the parent set the environment ----------


class _ApiCounter:
    """Counts HTTP requests to the Prefect API (by method and route) and emitted events."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.events: Counter[str] = Counter()
        self._lock = threading.Lock()

    def install(self) -> None:
        import httpx
        from prefect.events.clients import PrefectEventsClient

        counter, send, asend = self, httpx.Client.send, httpx.AsyncClient.send
        emit = PrefectEventsClient._emit

        def count(request: Any) -> None:
            if request.url.path.startswith("/api/"):
                with counter._lock:
                    counter.calls[f"{request.method} {_ID.sub('{id}', request.url.path)}"] += 1

        def sync_send(client: Any, request: Any, *a: Any, **kw: Any) -> Any:
            count(request)
            return send(client, request, *a, **kw)

        async def async_send(client: Any, request: Any, *a: Any, **kw: Any) -> Any:
            count(request)
            return await asend(client, request, *a, **kw)

        async def counted_emit(client: Any, event: Any) -> None:
            with counter._lock:
                counter.events[event.event] += 1
            await emit(client, event)

        httpx.Client.send = sync_send  # type: ignore[method-assign]
        httpx.AsyncClient.send = async_send  # type: ignore[method-assign]
        PrefectEventsClient._emit = counted_emit  # type: ignore[method-assign]

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.events.clear()


def _asyncio_eval(examples: list[Any], concurrency: int) -> tuple[float, int]:
    """The baseline: one ``litellm.acompletion`` per question, ``concurrency`` at once."""
    import litellm
    from prefect_conductor.conductor.data.verify import verify
    from prefect_conductor.conductor.plan.prompts import worker_messages
    from prefect_conductor.conductor.pool import load_pool
    from prefect_conductor.conductor.providers.tools.provider import register

    register()
    pool = load_pool(None)
    spec = pool.worker(WORKER)
    params = {
        "timeout": spec.timeout_s,
        "num_retries": 0,
        "input_cost_per_token": spec.input_cost_per_token or 0.0,
        "output_cost_per_token": spec.output_cost_per_token or 0.0,
        "sandbox": pool.sandbox,
    }

    async def run() -> list[str | None]:
        gate = asyncio.Semaphore(concurrency)

        async def one(ex: Any) -> str | None:
            messages = worker_messages(ex.question, ex.question, [], pool.share_question)
            async with gate:
                try:
                    response = await litellm.acompletion(
                        model=spec.model, messages=messages, **params
                    )
                except Exception:  # noqa: BLE001 - a tool's refusal is an answer here too
                    return None
            return (response.choices[0].message.content or "").strip()

        return await asyncio.gather(*(one(ex) for ex in examples))

    t0 = time.perf_counter()
    answers = asyncio.run(run())
    wall = time.perf_counter() - t0
    pairs = zip(examples, answers, strict=True)
    correct = sum(a is not None and verify(ex, a).correct for ex, a in pairs)
    return wall, correct


def _parquet_files(root: Path) -> int:
    return sum(len(list((root / t).glob("*.parquet"))) for t in ("runs", "steps"))


def child(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    counter = _ApiCounter()
    counter.install()
    from prefect import flow
    from prefect_conductor.conductor.data.datasets import load_dataset

    import prefect_conductor as pc
    from prefect_conductor.runtime.server import local_run_settings

    @flow(name="warm-up")
    def warm_up() -> int:
        return 1

    t0 = time.perf_counter()
    with local_run_settings():  # starts the temporary server (none with PREFECT_API_URL)
        warm_up()
    server_start = time.perf_counter() - t0

    def run_eval(limit: int, artifacts: Path) -> tuple[float, Any]:
        t0 = time.perf_counter()
        result = pc.evaluate(
            DATASET,
            split=SPLIT,
            limit=limit,
            strategy=STRATEGY,
            concurrency=args.concurrency,
            artifacts=str(artifacts),
        )
        return time.perf_counter() - t0, result

    warm_wall, _ = run_eval(args.warm_up, home / "warm-up")
    examples = load_dataset(DATASET, split=SPLIT, limit=args.questions)
    base_before, asyncio_correct = _asyncio_eval(examples, args.concurrency)
    counter.reset()
    wall, result = run_eval(args.questions, home / "artifacts")
    calls, events = sum(counter.calls.values()), sum(counter.events.values())
    base_after, _ = _asyncio_eval(examples, args.concurrency)
    n = result.n
    base = (base_before + base_after) / 2
    return {
        "questions": n,
        "concurrency": args.concurrency,
        "questions_per_s_1host": round(n / wall, 3),
        "asyncio_questions_per_s": round(n / base, 3),
        "ratio": round(wall / base, 2),
        "eval_wall_s": round(wall, 3),
        "eval_result_wall_s": result.wall_s,
        "asyncio_walls_s": [round(base_before, 3), round(base_after, 3)],
        "correct": result.correct,
        "asyncio_correct": asyncio_correct,
        "failed": result.failed,
        "api_calls_per_question": round(calls / n, 3),
        "events_per_question": round(events / n, 3),
        "parquet_files_per_question": round(_parquet_files(home / "artifacts") / n, 3),
        "api_calls": dict(counter.calls.most_common()),
        "events": dict(counter.events.most_common()),
        "server_start_s": round(server_start, 3),
        "warm_up_s": round(warm_wall, 3),
    }


# ---- parent: spawn the child, scan its stderr, note the load, print ----------------------


def parent(args: argparse.Namespace) -> int:
    root = Path(args.root).resolve() if args.root else ROOT
    with tempfile.TemporaryDirectory(prefix="scale-out-") as tmp:
        env = os.environ | {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "CONDUCTOR_HOME": tmp,
            "PYTHONPATH": os.pathsep.join([str(root), str(ROOT)]),
        }
        for key in ("CONDUCTOR_ARTIFACTS", "MLFLOW_TRACKING_URI"):
            env.pop(key, None)
        if "PREFECT_API_URL" not in os.environ:
            # A fresh database: other sessions' runs in ~/.prefect must not skew the timings.
            env["PREFECT_HOME"] = str(Path(tmp) / "prefect")
        # From root, which ``-m`` puts first on the child's sys.path (then PYTHONPATH: root,
        # and this checkout for its benchmarks when root has none).
        cmd = [sys.executable, "-m", "benchmarks.scale_out", *sys.argv[1:], "--child"]
        cmd += ["--home", tmp]
        load, busy, t0 = os.getloadavg()[0], _busy_cpu_s(), time.perf_counter()
        proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        ours, busy = usage.ru_utime + usage.ru_stime, _busy_cpu_s() - busy
        if args.log:
            Path(args.log).write_text(proc.stderr)
        out = Path(tmp) / "out.json"
        if proc.returncode != 0 or not out.exists():
            sys.stderr.write(proc.stderr[-5000:])
            print(f"child failed with exit code {proc.returncode}", file=sys.stderr)
            return 2
        report = json.loads(out.read_text())
    report |= {"goal_questions_per_s": GOAL_QPS, "goal_efficiency": GOAL_EFFICIENCY}
    report["pass"] = report["questions_per_s_1host"] >= GOAL_QPS
    report |= {"efficiency": None, "killed_worker": None}
    if not args.no_fleet:
        fleet_load, fleet_busy, t0 = os.getloadavg()[0], _busy_cpu_s(), time.perf_counter()
        report |= _fleet.measure(args)
        fleet_wall = time.perf_counter() - t0
        report["fleet_load"] = {
            "loadavg_1m_before": round(fleet_load, 2),
            "loadavg_1m_after": round(os.getloadavg()[0], 2),
            "machine_busy_frac": round(
                (_busy_cpu_s() - fleet_busy) / (fleet_wall * (os.cpu_count() or 1)), 2
            ),
        }
        killed = report["killed_worker"]
        report["pass_fleet"] = (
            all(e >= GOAL_EFFICIENCY for e in report["efficiency"].values())
            and killed["lost"] == 0
            and killed["duplicated"] == 0
        )
    report |= {"root": str(root), "stderr_problems": _problems(proc.stderr)}
    report["load"] = {
        "cpus": os.cpu_count(),
        "loadavg_1m_before": round(load, 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "machine_busy_frac": round(busy / (wall * (os.cpu_count() or 1)), 2),
        "ours_cpu_s": round(ours, 1),
        "others_cpu_s": round(max(busy - ours, 0.0), 1),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['questions']} questions, {STRATEGY}, --concurrency {report['concurrency']}")
    print(f"root={report['root']}  load={report['load']}\n")
    rows = [
        {
            "path": "conductor eval",
            "q_per_s": report["questions_per_s_1host"],
            "wall_s": report["eval_wall_s"],
            "correct": report["correct"],
            "api_calls_per_q": report["api_calls_per_question"],
            "events_per_q": report["events_per_question"],
            "parquet_files_per_q": report["parquet_files_per_question"],
        },
        {
            "path": "plain asyncio litellm",
            "q_per_s": report["asyncio_questions_per_s"],
            "wall_s": round(sum(report["asyncio_walls_s"]) / 2, 3),
            "correct": report["asyncio_correct"],
        },
    ]
    cols = ["path", "q_per_s", "wall_s", "correct", "api_calls_per_q", "events_per_q"]
    print(_table(rows, [*cols, "parquet_files_per_q"]))
    print(f"\nAPI calls: {report['api_calls']}\nevents: {report['events']}")
    if report["efficiency"] is not None:
        print(f"\nfleet: {report['fleet_settings']}  load={report['fleet_load']}")
        fleet_cols = ["workers", "questions", "failed", "wall_s", "questions_per_s", "efficiency"]
        print(_table(list(report["fleet_scaling"].values()), fleet_cols))
        for row in report["fleet_scaling"].values():  # where the CPU went, in cores
            print(f"  {row['workers']} workers, cores used: {row.get('cores')}")
        print(f"killed worker: {report['killed_worker']}")
        fleet_verdict = "PASS" if report["pass_fleet"] else "FAIL"
        print(
            f"{fleet_verdict}: efficiency >= {GOAL_EFFICIENCY} per added worker, "
            "0 questions lost, 0 duplicated rows"
        )
    verdict = "PASS" if report["pass"] else "FAIL"
    print(f"\n{verdict}: questions_per_s_1host >= {GOAL_QPS} (ratio to asyncio {report['ratio']}x)")
    for line in report["stderr_problems"]:
        print(f"stderr problem: {line}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=200, help="arithmetic test questions")
    ap.add_argument("--concurrency", type=int, default=16, help="questions at once")
    ap.add_argument("--warm-up", type=int, default=8, help="questions of the warm-up eval")
    ap.add_argument("--root", help="the checkout to measure (default: this one)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    ap.add_argument("--log", help="also write the child's full stderr to this file")
    _fleet.add_arguments(ap)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--home", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.questions < 1 or args.warm_up < 1 or not 1 <= args.concurrency <= 64:
        ap.error("need --questions >= 1, --warm-up >= 1 and 1 <= --concurrency <= 64")
    if not args.child:
        return parent(args)
    report = child(args, Path(args.home))
    Path(args.home, "out.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
