"""Sandbox cost (issue #17): what kernel isolation adds to a run of model-written code.

Two measurements, each against the rlimit-only baseline (``sandbox: process``) in the same run:

- per-call latency of a trivial program (``print(1)``) through ``run_sandboxed``, the two modes
  interleaved call by call so that load drifts hit both alike; medians (and p90) over ``--calls``;
  ``overhead_ms = isolated_ms - baseline_ms`` (goal: <= 50 ms);
- step throughput of the ``python`` tool in ``conductor eval --strategy single:python`` on a
  generated dataset of ``--questions`` small "what does this program print" questions (a JSONL
  user file: ``id, question, reference, kind``), one eval per mode, each in a fresh CLI process
  with its own temporary Prefect server; ``steps_per_s = questions / eval wall_s`` (the flow's
  own wall time, server start excluded), and the accuracy, which must be 100 % in both.

    python -m benchmarks.sandbox [--calls 50] [--questions 50] [--concurrency 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from prefect_conductor.conductor.providers.tools.sandbox import run_sandboxed

GOAL_MS = 50.0
TRIVIAL = "print(1)"


def _p90(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.9 * len(xs)))]


def latency(calls: int) -> dict[str, Any]:
    # The rlimit-only mode warns on every run, as it must; not into this table.
    logging.getLogger("prefect_conductor.conductor.providers.tools.sandbox").setLevel(logging.ERROR)
    times: dict[str, list[float]] = {"isolated": [], "process": []}
    for mode in times:  # warm both paths (imports, page cache) before measuring
        run_sandboxed(TRIVIAL, mode=mode)  # type: ignore[arg-type]
    for _ in range(calls):
        for mode in times:
            t0 = time.perf_counter()
            result = run_sandboxed(TRIVIAL, mode=mode)  # type: ignore[arg-type]
            times[mode].append((time.perf_counter() - t0) * 1000)
            if result.stdout != "1\n":
                raise SystemExit(f"{mode}: unexpected output {result.stdout!r} {result.stderr!r}")
    iso, base = statistics.median(times["isolated"]), statistics.median(times["process"])
    return {
        "isolated_ms": round(iso, 1),
        "baseline_ms": round(base, 1),
        "overhead_ms": round(iso - base, 1),
        "isolated_p90_ms": round(_p90(times["isolated"]), 1),
        "baseline_p90_ms": round(_p90(times["process"]), 1),
        "calls": calls,
        "goal_met": iso - base <= GOAL_MS,
    }


def _question(rng: random.Random, i: int) -> dict[str, str]:
    a, b, n = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 6)
    kind = i % 3
    if kind == 0:
        code, answer = f"print({a} * {b} + {n})", a * b + n
    elif kind == 1:
        code, answer = f"print(sum(range({a})) - {b})", sum(range(a)) - b
    else:
        code, answer = f"x = [{a}] * {n}\nprint(len(x) * x[0] % {b})", n * a % b
    question = f"What does this program print?\n```python\n{code}\n```"
    return {"id": f"p{i}", "question": question, "reference": str(answer), "kind": "math"}


def _pool(mode: str) -> dict[str, Any]:
    return {
        "conductor": {"model": "tool/calculator"},  # never asked by single:python
        "sandbox": mode,
        "workers": [{"name": "python", "kind": "tool", "model": "tool/python", "retries": 0}],
    }


def eval_throughput(questions: int, concurrency: int, work: Path) -> dict[str, Any]:
    rng = random.Random(17)
    data = work / "programs.jsonl"
    data.write_text("\n".join(json.dumps(_question(rng, i)) for i in range(questions)) + "\n")
    out: dict[str, Any] = {"questions": questions, "concurrency": concurrency}
    for mode in ("isolated", "process"):
        pool = work / f"pool-{mode}.yaml"
        pool.write_text(yaml.safe_dump(_pool(mode)))
        env = {**os.environ, "CONDUCTOR_HOME": str(work / f"home-{mode}")}
        env["PREFECT_HOME"] = str(work / f"prefect-{mode}")
        env.pop("PREFECT_API_URL", None)
        env.pop("MLFLOW_TRACKING_URI", None)
        cmd = [sys.executable, "-m", "prefect_conductor.cli.app", "eval", "--dataset", str(data)]
        cmd += ["--strategy", "single:python", "--pool", str(pool), "--json"]
        cmd += ["--concurrency", str(concurrency)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, timeout=1800)
        command_s = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"eval ({mode}) failed: {proc.stderr.strip()[-2000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        key = "isolated" if mode == "isolated" else "baseline"
        out[f"{key}_steps_per_s"] = round(questions / result["wall_s"], 2)
        out[f"{key}_eval_wall_s"] = round(result["wall_s"], 2)
        out[f"{key}_command_s"] = round(command_s, 2)
        out[f"{key}_accuracy"] = result["accuracy"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50, help="Trivial calls per mode.")
    ap.add_argument("--questions", type=int, default=50, help="Questions in the eval.")
    ap.add_argument("--concurrency", type=int, default=4, help="Questions run at once.")
    ap.add_argument("--no-eval", action="store_true", help="Latency only.")
    ap.add_argument("--json", action="store_true", help="Print one JSON object.")
    args = ap.parse_args()
    result: dict[str, Any] = {"load_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}
    result |= latency(args.calls)
    if not args.no_eval:
        with tempfile.TemporaryDirectory(prefix="conductor-bench-sandbox-") as work:
            result |= eval_throughput(args.questions, args.concurrency, Path(work))
    if args.json:
        print(json.dumps(result))
        return
    print(f"sandbox per-call latency, print(1), median of {args.calls} (load {result['load_1m']})")
    print(f"{'mode':<22}{'median ms':>10}{'p90 ms':>10}")
    print(f"{'isolated':<22}{result['isolated_ms']:>10}{result['isolated_p90_ms']:>10}")
    print(f"{'process (baseline)':<22}{result['baseline_ms']:>10}{result['baseline_p90_ms']:>10}")
    verdict = "met" if result["goal_met"] else "MISSED"
    print(f"isolation adds {result['overhead_ms']} ms per call (goal <= {GOAL_MS:g} ms: {verdict})")
    if not args.no_eval:
        print(f"\neval single:python, {args.questions} programs, concurrency {args.concurrency}")
        print(f"{'mode':<22}{'steps/s':>10}{'eval s':>10}{'command s':>11}{'accuracy':>10}")
        for key, label in (("isolated", "isolated"), ("baseline", "process (baseline)")):
            print(
                f"{label:<22}{result[f'{key}_steps_per_s']:>10}{result[f'{key}_eval_wall_s']:>10}"
                f"{result[f'{key}_command_s']:>11}{result[f'{key}_accuracy']:>10.0%}"
            )


if __name__ == "__main__":
    main()
