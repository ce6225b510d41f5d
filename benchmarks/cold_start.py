"""Cold start of ``conductor run``: seconds from process start to the first worker call.

Each sample is a fresh process, as a user's command is. The pool's conductor and worker are
litellm models answered by litellm's ``mock_response``, so the figure is the engine's own
start-up (imports, Prefect's ephemeral server, planning, compiling), not a model's speed.
The first worker call's time is read from the ``started_at`` of step 0 in the Parquet store.

Baseline, in the same invocation: a bare Prefect script (import prefect + litellm, one flow
with one task, ephemeral server) timed to the start of its task. The difference is what
prefect-conductor adds.

    python benchmarks/cold_start.py [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POOL = """\
conductor:
  model: openai/gpt-4o-mini
  params: {mock_response: "model_id = [0]\\nsubtasks = ['answer']\\naccess_list = [[]]"}
workers:
  - {name: gpt, model: openai/gpt-4o-mini, params: {mock_response: "42"}}
"""
BASELINE = """
import time, sys
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


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "CONDUCTOR_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    env.update(
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
    )
    return env


def conductor_sample(workdir: Path) -> tuple[float, float]:
    """(seconds to the first worker call, seconds for the whole command)."""
    from conductor.store import ArtifactStore

    home = Path(tempfile.mkdtemp(dir=workdir))
    pool = home / "pool.yaml"
    pool.write_text(POOL)
    t0 = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "run",
            "What is 17 + 25?",
            "--pool",
            str(pool),
            "--json",
        ],
        env=_env(home),
        cwd=home,
        capture_output=True,
        text=True,
        timeout=600,
    )
    total = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"conductor run failed:\n{proc.stderr[-2000:]}")
    steps = ArtifactStore(json.loads(proc.stdout)["artifacts"]).read_pandas("steps")
    first = min(steps["started_at"]).to_pydatetime().timestamp()
    return first - t0, total


def baseline_sample(workdir: Path) -> tuple[float, float]:
    home = Path(tempfile.mkdtemp(dir=workdir))
    script = home / "bare.py"
    script.write_text(BASELINE)
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=_env(home),
        cwd=home,
        capture_output=True,
        text=True,
        timeout=600,
    )
    total = time.time() - t0
    stamps = [line for line in proc.stderr.splitlines() if line.replace(".", "").isdigit()]
    if proc.returncode != 0 or not stamps:
        raise SystemExit(f"baseline failed:\n{proc.stderr[-2000:]}")
    return float(stamps[0]) - t0, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = {"conductor run": [], "bare prefect flow": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):  # interleaved, so drift hits both alike
            rows["conductor run"].append(conductor_sample(Path(tmp)))
            rows["bare prefect flow"].append(baseline_sample(Path(tmp)))
    result = {
        name: {
            "first_call_s": round(statistics.median(s[0] for s in samples), 2),
            "total_s": round(statistics.median(s[1] for s in samples), 2),
            "samples": len(samples),
        }
        for name, samples in rows.items()
    }
    result["added_s"] = round(
        result["conductor run"]["first_call_s"] - result["bare prefect flow"]["first_call_s"], 2
    )
    result["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if args.json:
        print(json.dumps(result))
        return
    print(f"{'command':<20} {'first call (s)':>15} {'whole command (s)':>18}")
    for name in rows:
        r = result[name]
        print(f"{name:<20} {r['first_call_s']:>15.2f} {r['total_s']:>18.2f}")
    print(
        f"conductor adds {result['added_s']:.2f} s before the first worker call "
        f"(median of {args.repeat})"
    )


if __name__ == "__main__":
    main()
