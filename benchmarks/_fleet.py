"""The fleet half of ``python -m benchmarks.scale_out`` (issue #19): ``conductor eval
--fan-out`` over 1, 2 and 4 ``conductor serve`` processes, and a worker killed mid-eval.

One local stack (``python -m deployments.stack up``: PostgreSQL, the S3 server, MLflow's and
Prefect's servers) in a temporary directory; host 0 runs the evals, hosts 1..N one serve
process each, every one with its own home (``prefect_conductor.testing.fleet``). The worker
is ``sleepy``, a fake worker of fixed latency (``--latency``, 0.5 s), and each serve process answers
``--serve-limit`` questions at once, so the fleet's capacity grows with the workers and the
eval's in-flight bound (``--concurrency``) is above it.

- ``efficiency``: for N workers, ``q/s(N) / (N * q/s(1))``, each q/s the eval's own
  ``wall_s`` over ``--fleet-questions`` arithmetic test questions (serve processes started and
  warm before the eval begins);
- ``killed_worker``: ``--killed-questions`` questions over 3 workers, one SIGKILLed as soon
  as it runs one of them. ``lost``: questions with no row in the shared runs table or that
  ended as failures; ``duplicated``: rows beyond one per question.

Each scaling row also has ``cores``: the CPU each part of the system used during that eval,
in cores (CPU seconds over the eval's wall time): the eval process (``eval``, from its
rusage), the serve processes together (``serve``), Prefect's server, PostgreSQL, the S3
server and MLflow's server (from ``/proc``, processes alive at both ends of the eval), and
``machine``, every process. A part at about 1.0 is a single-threaded stage at its limit.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.engine_overhead import _busy_cpu_s
from prefect_conductor.testing.fleet import (
    CLI,
    Serve,
    conductor,
    eval_args,
    eval_rows,
    host_env,
    kill_mid_question,
    write_pool,
)

ROOT = Path(__file__).resolve().parent.parent
STACK = [sys.executable, "-m", "deployments.stack"]  # run from ROOT, the repository's root
KILLED_WORKERS = 3
# What each long-lived process of the local stack is, by the words of its command line (path
# parts included): every word of a role's set, else a word that starts with a prefix
# (PostgreSQL's processes rename themselves "postgres: checkpointer", …; MLflow's server
# workers run ``mlflow.server…:app``). First match wins.
_ROLES = (
    ("serve", {"serve", "--pool"}),
    ("prefect server", {"prefect", "server"}),
    ("s3", {"moto.server"}),
)
_PREFIXES = (("postgres", "postgres"), ("mlflow", "mlflow"))


def _role(argv: list[str]) -> str | None:
    words = {w for arg in argv for w in arg.split()}
    words |= {part for arg in argv[:1] for part in arg.split("/")}
    for role, needed in _ROLES:
        if needed <= words:
            return role
    for role, prefix in _PREFIXES:
        if any(w.startswith(prefix) for w in words):
            return role
    return None


def _cpu_by_pid() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of every process of the stack, by pid, from ``/proc``."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        role = _role([a for a in argv if a])
        if role is not None:
            out[int(entry.name)] = (role, (int(stat[11]) + int(stat[12])) / tick)
    return out


def _timed_eval(host: dict[str, Any], argv: list[str]) -> tuple[Any, dict[str, float]]:
    """``conductor(host, *argv)`` and the cores each part of the stack used meanwhile."""
    before, children, busy = (
        _cpu_by_pid(),
        resource.getrusage(resource.RUSAGE_CHILDREN),
        _busy_cpu_s(),
    )
    started = time.monotonic()
    result = conductor(host, *argv)
    wall = time.monotonic() - started
    after, done = _cpu_by_pid(), resource.getrusage(resource.RUSAGE_CHILDREN)
    used: dict[str, float] = {
        "eval": done.ru_utime + done.ru_stime - children.ru_utime - children.ru_stime
    }
    for pid, (role, cpu) in after.items():
        if pid in before and before[pid][0] == role:
            used[role] = used.get(role, 0.0) + cpu - before[pid][1]
    used["machine"] = _busy_cpu_s() - busy
    return result, {role: round(cpu / wall, 2) for role, cpu in used.items()}


def _eval_args(pool: Path, questions: int, concurrency: int) -> list[str]:
    return eval_args("arithmetic", "single:sleepy", pool, questions, concurrency)


def measure(args: Any) -> dict[str, Any]:
    """Scaling and the killed worker, on one local stack; the report's fleet keys."""
    workers = sorted(set(args.workers))
    hosts = 1 + max(max(workers), KILLED_WORKERS)
    with tempfile.TemporaryDirectory(prefix="fleet-") as tmp:
        directory = Path(tmp)
        up = subprocess.run(
            [*STACK, "up", "--dir", str(directory / "stack"), "--hosts", str(hosts)],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=ROOT,
        )
        if up.returncode != 0:
            raise RuntimeError(f"stack.py up failed: {up.stderr[-2000:]}")
        try:
            state = json.loads((directory / "stack" / "stack.json").read_text())
            return _measure(args, state, directory, workers)
        finally:
            subprocess.run(
                [*STACK, "down", "--dir", str(directory / "stack")],
                capture_output=True,
                timeout=300,
                cwd=ROOT,
            )


def _measure(args: Any, state: dict[str, Any], directory: Path, workers: list[int]):
    evaluator, *others = state["hosts"]
    pool = write_pool(directory / "pool.yaml", args.latency)
    serves: list[Serve] = []
    scaling: dict[str, Any] = {}
    try:
        warm = "eval --dataset arithmetic --limit 2 --strategy single:calculator"
        conductor(evaluator, *warm.split())  # the MLflow experiment, the store, imports
        for n in workers:
            while len(serves) < n:
                serves.append(Serve(others[len(serves)], pool, limit=args.serve_limit))
            for serve in serves:
                serve.wait_ready()
            result, cores = _timed_eval(
                evaluator, _eval_args(pool, args.fleet_questions, args.fleet_concurrency)
            )
            scaling[str(n)] = {
                "workers": n,
                "questions": result["n"],
                "failed": result["failed"],
                "wall_s": result["wall_s"],
                "questions_per_s": round(result["n"] / result["wall_s"], 3),
                "cores": cores,
            }
        one = scaling[str(workers[0])]["questions_per_s"] / workers[0]
        for row in scaling.values():
            row["efficiency"] = round(row["questions_per_s"] / (row["workers"] * one), 3)
        killed = _killed_worker(args, state, directory, pool, serves)
    finally:
        for serve in serves:
            serve.stop()
    return {
        "efficiency": {k: v["efficiency"] for k, v in scaling.items() if v["workers"] > 1},
        "fleet_scaling": scaling,
        "killed_worker": killed,
        "fleet_settings": {
            "latency_s": args.latency,
            "serve_limit": args.serve_limit,
            "concurrency": args.fleet_concurrency,
            "hosts": len(state["hosts"]),
        },
    }


def _killed_worker(args: Any, state, directory: Path, pool: Path, serves: list[Serve]):
    evaluator = state["hosts"][0]
    for serve in serves[KILLED_WORKERS:]:
        serve.stop()
    del serves[KILLED_WORKERS:]
    while len(serves) < KILLED_WORKERS:  # ``--workers 1``: the killed eval still has 3
        serves.append(Serve(state["hosts"][1 + len(serves)], pool, limit=args.serve_limit))
    for serve in serves:
        serve.wait_ready()
    victim = serves[-1]
    out = directory / "killed.json"
    started = time.monotonic()
    with out.open("w") as stdout:
        evaluation = subprocess.Popen(
            [sys.executable, "-c", CLI]
            + _eval_args(pool, args.killed_questions, args.fleet_concurrency)
            + ["--json"],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            env=host_env(evaluator),
            cwd=evaluator["home"],
        )
    kill_mid_question(victim, evaluator["env"]["PREFECT_API_URL"], evaluation, 600)
    killed_at = time.monotonic() - started
    _, err = evaluation.communicate(timeout=1800)
    if evaluation.returncode != 0:
        raise RuntimeError(f"the killed-worker eval failed: {err[-3000:]}")
    result = json.loads(out.read_text())
    rows = eval_rows(evaluator, result["eval_id"])
    qids = [r["question_id"] for r in rows]
    return {
        "questions": args.killed_questions,
        "workers": KILLED_WORKERS,
        "killed_at_s": round(killed_at, 1),
        "lost": args.killed_questions - len(set(qids)) + result["failed"],
        "duplicated": len(qids) - len(set(qids)),
        "failed": result["failed"],
        "resent": err.count("sending it again"),
        "wall_s": result["wall_s"],
        "rows": len(rows),
        "served_by_victim": sum(r["served_by"] == victim.id for r in rows),
        # the eval's fan-out warnings (resends, failures): why a question was lost, if one was
        "warnings": [line for line in err.splitlines() if "fan-out:" in line][-20:],
    }


def add_arguments(ap: Any) -> None:
    ap.add_argument("--no-fleet", action="store_true", help="skip the fan-out measurements")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--latency", type=float, default=0.5, help="the fake worker's seconds")
    ap.add_argument("--serve-limit", type=int, default=2, help="questions per serve at once")
    ap.add_argument("--fleet-questions", type=int, default=48)
    ap.add_argument("--fleet-concurrency", type=int, default=16)
    ap.add_argument("--killed-questions", type=int, default=200)


if __name__ == "__main__":  # python -m benchmarks._fleet: the fleet half alone
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--json", action="store_true")
    print(json.dumps(measure(parser.parse_args()), indent=2))
    os._exit(0)
