"""Engine overhead: how much wall time ``orchestrate`` adds over a plan's critical path.

Every step is a fake worker (``fake/sleep-0.5``, ``prefect_conductor.testing.fakes``), so a
plan of depth d takes at best ``critical_s = d * 0.5``. Shapes, each run through the real
``orchestrate`` flow with its plan from the scripted ``fake/plan`` conductor (the paper's three
lists): ``single``, ``chain5`` (step i reads [i-1]), ``fanout8`` (8 independent steps, a join
reading "all"), ``grid16x4`` (16 wide, 4 deep; a step in layer k>0 reads its column's step in
layer k-1).

Reading a row: ``wall_s``, the median wall time around ``orchestrate(...)``; ``run_wall_s``,
the flow's own ``RunResult.wall_s`` (the gap is flow-run start-up and teardown);
``overhead_s = wall_s - critical_s`` (target <= 1.0 s); ``efficiency = critical_s / wall_s``;
``baseline_wall_s``, the same DAG as plain asyncio tasks calling ``litellm.acompletion`` (no
Prefect, litellm's own cost included); ``lag_med_s``/``lag_max_s``, from the stored steps: how
long after its last upstream step finished (or the first root step started) a step started;
inside the flow, ``head_s`` runs from its start to the first worker call, ``tail_s`` from the
last worker call to the run record, ``store_s`` from the run record to the flow's return
(storing the rows while the steps table artifact is published).

The fake worker states its prices in the pool (``PRICES``), as a model in litellm's price
map has them; ``--unpriced`` drops them, and litellm then searches for a price by model name
on every call.

Runs use the CLI's settings (``prefect_conductor.runtime.server.local_run_settings``, no flow-run
heartbeats on
the ephemeral API); ``--heartbeats`` keeps Prefect's default, as a bare ``orchestrate()`` call
has it, where a sync flow run waits up to 1 s at its end for the heartbeat thread. Each run
starts after ``--settle`` quiet seconds: the server records a run's task-run events after the
flow returns. ``--variants`` adds fanout8 and grid16x4 as plain Prefect flows, to tell which
of completion/acompletion overlaps better inside Prefect: ``prefect-sync`` (sync tasks on
``ThreadPoolTaskRunner(max_workers=64)``, ``litellm.completion``), ``prefect-async`` (async
tasks, ``litellm.acompletion``, submitted with ``wait_for``: each runs in a pool thread with
its own event loop) and ``prefect-async-gather`` (the same tasks awaited on the flow's loop).

The runs happen in a child process (``python -m benchmarks.engine_overhead --child``, from the
repository's root); the parent scans its whole stderr, shutdown included, for "database is
locked", "Traceback" and "CancelledError", and notes the load.
``server_start_s`` is the first (trivial) flow's wall time: the ephemeral server's start-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LATENCY_S = 0.5
MODEL = f"fake/sleep-{LATENCY_S}"
TARGET_OVERHEAD_S = 1.0
PROBLEMS = ("database is locked", "Traceback", "CancelledError")
# The child writes this line to stderr before each measured row, so the parent can say in
# which row's time a problem line appeared (``stderr_by_row``); a traceback printed late (at a
# loop's close or at exit) lands in a later row or in "exit".
ROW_MARK = "== engine-overhead row: "
VARIANT_SHAPES = ("fanout8", "grid16x4")
MESSAGES = [{"role": "user", "content": "work"}]
# The fake worker is priced like a model in litellm's map (gpt-4o-mini's prices): litellm
# prices every response while logging it, and a model name it cannot price costs it a fuzzy
# name search of ~4 ms per call on this machine (``--unpriced`` measures that case).
PRICES = {"input_cost_per_token": 1.5e-7, "output_cost_per_token": 6e-7}

Access = list[int] | str  # earlier step indices, or "all"


def _shapes() -> dict[str, list[Access]]:
    grid: list[Access] = [[] if k == 0 else [(k - 1) * 16 + c] for k in range(4) for c in range(16)]
    return {
        "single": [[]],
        "chain5": [[]] + [[i - 1] for i in range(1, 5)],
        "fanout8": [[] for _ in range(8)] + ["all"],
        "grid16x4": grid,
    }


def _deps(access: list[Access]) -> list[list[int]]:
    return [list(range(i)) if a == "all" else list(a) for i, a in enumerate(access)]


def _depth(access: list[Access]) -> int:
    depth: list[int] = []
    for deps in _deps(access):
        depth.append(1 + max((depth[j] for j in deps), default=0))
    return max(depth)


def _plan_text(access: list[Access]) -> str:
    subtasks = [f"subtask {i}" for i in range(len(access))]
    return f"model_id = {[0] * len(access)}\nsubtasks = {subtasks!r}\naccess_list = {access!r}\n"


def _timed(fn: Callable[[], Any], settle: float = 0.0) -> tuple[float, Any]:
    time.sleep(settle)
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _row(shape: str, access: list[Access], walls: list[float], **extra: float) -> dict[str, Any]:
    critical, wall = _depth(access) * LATENCY_S, statistics.median(walls)
    return {
        "shape": shape,
        "steps": len(access),
        "critical_s": critical,
        "wall_s": round(wall, 3),
        "overhead_s": round(wall - critical, 3),
        "efficiency": round(critical / wall, 3),
        **{k: round(v, 3) for k, v in extra.items()},
        "walls": [round(w, 3) for w in walls],
    }


# ---- child: Prefect and litellm are imported here only, after the parent set the environment


def _timeline(root: str) -> tuple[list[float], float, float, float]:
    """From the stored rows: per-step lags, and the flow's time before and after the steps.

    A step's lag is its worker call's start minus the moment it became ready (its last
    upstream step finished, or the first root step started). ``head`` runs from the flow
    function's start to the first worker call (planning, submitting); ``tail`` from the last
    worker call's end to the run record (collecting states, building records). The run
    record's ``wall_s`` is taken when it is built, before it is stored.
    """
    from prefect_conductor.conductor.data.store import ArtifactStore

    store = ArtifactStore(root)
    df = store.read_pandas("steps")
    run = store.read_pandas("runs").iloc[0]
    rows = df.set_index("step").to_dict("index")
    first = min(r["started_at"] for r in rows.values() if len(r["access"]) == 0)
    ready = {
        s: max((rows[j]["finished_at"] for j in r["access"]), default=first)
        for s, r in rows.items()
    }
    lags = [(r["started_at"] - ready[s]).total_seconds() for s, r in rows.items()]
    flow_start = run["created_at"].timestamp() - run["wall_s"]
    head = min(r["started_at"] for r in rows.values()).timestamp() - flow_start
    tail = run["created_at"].timestamp() - max(r["finished_at"] for r in rows.values()).timestamp()
    return lags, head, tail, float(run["wall_s"])


async def _gather_dag(deps: list[list[int]], call: Callable[[int], Awaitable[Any]]) -> None:
    """One asyncio task per step, awaiting its upstream tasks, then ``call(step)``."""
    tasks: list[asyncio.Task[Any]] = []

    async def step(i: int) -> None:
        await asyncio.gather(*(tasks[j] for j in deps[i]))
        await call(i)

    tasks.extend(asyncio.create_task(step(i)) for i in range(len(deps)))
    await asyncio.gather(*tasks)


def _baseline(deps: list[list[int]]) -> None:
    """The DAG without Prefect; it still pays litellm's own cost per call."""
    import litellm

    prices = _prices()
    asyncio.run(
        _gather_dag(deps, lambda i: litellm.acompletion(model=MODEL, messages=MESSAGES, **prices))
    )


def _prices() -> dict[str, float]:
    return {} if os.environ.get("ENGINE_OVERHEAD_UNPRICED") else PRICES


def _variant_flows() -> dict[str, Callable[[list[list[int]]], Any]]:
    import litellm
    from prefect import flow, task
    from prefect.futures import wait
    from prefect.task_runners import ThreadPoolTaskRunner

    @task(name="sync-step")
    def sync_step(i: int) -> None:
        litellm.completion(model=MODEL, messages=MESSAGES, **_prices())

    @task(name="async-step")
    async def async_step(i: int) -> None:
        await litellm.acompletion(model=MODEL, messages=MESSAGES, **_prices())

    def submit_dag(step: Any, deps: list[list[int]]) -> None:
        futures: list[Any] = []
        for i, d in enumerate(deps):
            futures.append(step.submit(i, wait_for=[futures[j] for j in d]))
        wait(futures)

    @flow(name="variant-sync", task_runner=ThreadPoolTaskRunner(max_workers=64))
    def prefect_sync(deps: list[list[int]]) -> None:
        submit_dag(sync_step, deps)

    @flow(name="variant-async", task_runner=ThreadPoolTaskRunner(max_workers=64))
    async def prefect_async(deps: list[list[int]]) -> None:
        submit_dag(async_step, deps)  # each task: a pool thread running its own event loop

    @flow(name="variant-async-gather")
    async def prefect_async_gather(deps: list[list[int]]) -> None:
        await _gather_dag(deps, async_step)  # every task on the flow's own event loop

    return {
        "prefect-sync": prefect_sync,
        "prefect-async": lambda deps: asyncio.run(prefect_async(deps)),
        "prefect-async-gather": lambda deps: asyncio.run(prefect_async_gather(deps)),
    }


def child(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    from prefect.settings import get_current_settings

    from prefect_conductor.runtime.server import local_run_settings

    # By default, the settings `conductor run` uses: no heartbeats on the ephemeral API.
    with nullcontext() if args.heartbeats else local_run_settings():
        heartbeats = get_current_settings().flows.heartbeat_frequency is not None
        return _measure(args, home) | {"heartbeats": heartbeats}


def _measure(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    import litellm
    import yaml
    from prefect import flow
    from prefect_conductor.conductor.plan.requests import OrchestrateRequest
    from prefect_conductor.flows.orchestrate import orchestrate

    from prefect_conductor.runtime.server import wait_until_recorded
    from prefect_conductor.testing.fakes import PLANS, register_fake_provider

    register_fake_provider()
    pool = home / "pool.yaml"
    worker = {"name": "sleepy", "model": MODEL, "retries": 0, **_prices()}
    doc = {"conductor": {"model": "fake/plan"}, "workers": [worker], "max_steps": 64}
    pool.write_text(yaml.safe_dump({**doc, "share_question": True}))

    @flow(name="warm-up")
    def warm_up() -> int:
        return 1

    server_start, _ = _timed(warm_up)
    tiny_flow, _ = _timed(warm_up, args.settle)
    litellm.completion(model=MODEL, messages=MESSAGES, **_prices())  # lazy first-call costs
    _baseline([[]])

    results: list[dict[str, Any]] = []
    for shape in args.shapes:
        access, walls, run_walls, base_walls, lags = _shapes()[shape], [], [], [], []
        heads, tails, stores = [], [], []
        deps = _deps(access)
        PLANS["top"] = _plan_text(access)
        _mark(f"orchestrate {shape}")
        for i in range(args.repeat):
            root = str(home / "artifacts" / f"{shape}-{i}")
            request = OrchestrateRequest(question=f"{shape} #{i}", pool=str(pool), artifacts=root)
            wall, state = _timed(partial(orchestrate, request, return_state=True), args.settle)
            wait_until_recorded(state.state_details.flow_run_id)  # as `conductor run` does
            result = state.result(raise_on_failure=False)
            if getattr(result, "status", None) != "completed":
                raise RuntimeError(f"{shape} run {i} did not complete: {state.message or result}")
            walls.append(wall)
            run_walls.append(result.wall_s)
            step_lags, head, tail, record_wall = _timeline(root)
            lags.extend(step_lags)
            heads.append(head)
            tails.append(tail)
            stores.append(result.wall_s - record_wall)  # storing rows, publishing the table
            base_walls.append(_timed(partial(_baseline, deps))[0])
        extra = {"run_wall_s": statistics.median(run_walls)}
        extra |= {"baseline_wall_s": statistics.median(base_walls)}
        extra |= {"lag_med_s": statistics.median(lags), "lag_max_s": max(lags)}
        extra |= {"head_s": statistics.median(heads), "tail_s": statistics.median(tails)}
        extra |= {"store_s": statistics.median(stores)}
        results.append(_row(shape, access, walls, **extra))

    variants: list[dict[str, Any]] = []
    for name, run in _variant_flows().items() if args.variants else ():
        for shape in VARIANT_SHAPES:
            access = _shapes()[shape]
            deps = _deps(access)
            _mark(f"{name} {shape}")
            walls = [_timed(partial(run, deps), args.settle)[0] for _ in range(args.repeat)]
            variants.append({"variant": name, **_row(shape, access, walls)})
    _mark("exit")
    starts = {"server_start_s": round(server_start, 3), "tiny_flow_s": round(tiny_flow, 3)}
    return {"results": results, "variants": variants, **starts}


def _mark(row: str) -> None:
    print(f"{ROW_MARK}{row}", file=sys.stderr, flush=True)


# ---- parent: spawn the child, scan its stderr, note the load, print ----------------------


def _problems_by_row(stderr: str) -> dict[str, list[str]]:
    """``_problems`` of each stretch of stderr between the child's row marks ("setup" first)."""
    sections, row = {"setup": []}, "setup"
    for line in stderr.splitlines():
        if line.startswith(ROW_MARK):
            row = line.removeprefix(ROW_MARK)
            sections.setdefault(row, [])
        else:
            sections[row].append(line)
    found = {name: _problems("\n".join(lines)) for name, lines in sections.items()}
    return {name: problems for name, problems in found.items() if problems}


def _problems(stderr: str) -> list[str]:
    """Problem lines, counted; a Traceback is shown with its final exception line."""
    lines, seen, found = stderr.splitlines(), set(), Counter[str]()
    for i, line in enumerate(lines):
        if i in seen or not any(p in line for p in PROBLEMS):
            continue
        if line.startswith("Traceback"):
            j = next((k for k in range(i + 1, len(lines)) if lines[k][:1].strip()), i)
            seen.add(j)
            line = f"{line} ... {lines[j]}"
        found[line.strip()[:240]] += 1
    return [f"{n}x {line}" for line, n in found.items()]


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (Linux), all processes."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[k]) for x in cells)) for k, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(x.rjust(w) for x, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def parent(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="engine-overhead-") as tmp:
        env = os.environ | {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
            "CONDUCTOR_HOME": tmp,
        }
        env.pop("CONDUCTOR_ARTIFACTS", None)
        if args.unpriced:
            env["ENGINE_OVERHEAD_UNPRICED"] = "1"
        if "PREFECT_API_URL" not in os.environ:
            # A fresh database: other sessions' runs in ~/.prefect must not skew the timings.
            env["PREFECT_HOME"] = str(Path(tmp) / "prefect")
        cmd = [sys.executable, "-m", "benchmarks.engine_overhead", *sys.argv[1:], "--child"]
        cmd += ["--home", tmp]
        load, busy, t0 = os.getloadavg()[0], _busy_cpu_s(), time.perf_counter()
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        # The child and its server subprocess are reaped, so RUSAGE_CHILDREN counts both.
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
    ok = all(r["overhead_s"] <= TARGET_OVERHEAD_S for r in report["results"])
    report |= {"target_overhead_s": TARGET_OVERHEAD_S, "pass": ok}
    report |= {"stderr_problems": _problems(proc.stderr), "cpus": os.cpu_count()}
    report["stderr_by_row"] = _problems_by_row(proc.stderr)
    report["priced"] = not args.unpriced
    report["load"] = {
        "loadavg_1m_before": round(load, 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "machine_busy_frac": round(busy / (wall * (os.cpu_count() or 1)), 2),
        "ours_cpu_s": round(ours, 1),
        "others_cpu_s": round(max(busy - ours, 0.0), 1),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"server_start_s={report['server_start_s']}  tiny_flow_s={report['tiny_flow_s']}  ", end=""
    )
    print(f"heartbeats={report['heartbeats']}  priced={report['priced']}  ", end="")
    print(f"cpus={report['cpus']}  load={report['load']}")
    print(f"medians of {args.repeat} runs, each after {args.settle} s of quiet\n")
    cols = ["shape", "steps", "critical_s", "wall_s", "overhead_s", "efficiency"]
    extra = ["run_wall_s", "baseline_wall_s", "lag_med_s", "lag_max_s", "head_s", "tail_s"]
    extra += ["store_s"]
    print(_table(report["results"], cols + extra))
    if report["variants"]:
        print("\nplain Prefect variants\n" + _table(report["variants"], ["variant", *cols]))
    print(f"\n{'PASS' if ok else 'FAIL'}: target overhead_s <= {TARGET_OVERHEAD_S} for every shape")
    for row, lines in report["stderr_by_row"].items():
        for line in lines:
            print(f"stderr problem during {row}: {line}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", choices=list(_shapes()), default=list(_shapes()))
    ap.add_argument("--repeat", type=int, default=3, help="runs per shape; the median is shown")
    ap.add_argument("--settle", type=float, default=3.0, help="quiet seconds before each run")
    ap.add_argument("--variants", action="store_true", help="add plain Prefect sync/async rows")
    ap.add_argument(
        "--heartbeats", action="store_true", help="keep Prefect's flow-run heartbeats on"
    )
    ap.add_argument(
        "--unpriced", action="store_true", help="give the fake worker no prices (see PRICES)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    ap.add_argument("--log", help="also write the child's full stderr to this file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--home", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeat < 1 or args.settle < 0:
        ap.error(f"need --repeat >= 1 and --settle >= 0, got {args.repeat} and {args.settle}")
    if not args.child:
        return parent(args)
    report = child(args, Path(args.home))
    Path(args.home, "out.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
