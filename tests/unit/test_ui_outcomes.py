"""What the Prefect UI shows of a run and an eval (issue #10): renderers and result storage."""

from __future__ import annotations

import pytest
from prefect.settings import (
    PREFECT_LOCAL_STORAGE_PATH,
    PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK,
    temporary_settings,
)
from prefect_conductor.conductor.plan.requests import EvalResult, RunResult
from prefect_conductor.conductor.plan.workflow import Step, Workflow
from prefect_conductor.tasks.artifacts import answer_markdown, eval_summary_rows, plan_markdown
from prefect_conductor.tasks.workers import step_run_name

from prefect_conductor.runtime.server import result_storage

PLAN = Workflow(
    steps=(
        Step(index=0, worker="smol", instruction="Read | the question"),
        Step(index=1, worker="calculator", instruction="17 + 25"),
        Step(index=2, worker="smol", instruction="State the answer.", access=(0, 1)),
    )
)


def _result(**kw) -> RunResult:
    fields = {
        "run_id": "r1",
        "status": "completed",
        "answer": "The answer is 42.\n\nDone.",
        "workflow": [s.model_dump(mode="json") for s in PLAN.steps],
        "input_tokens": 120,
        "output_tokens": 8,
        "cost_usd": 0.0,
        "wall_s": 1.234,
        "artifacts": "/tmp/a",
        "format_valid": True,
    }
    return RunResult(**(fields | kw))


def test_plan_is_a_table_the_ui_renders_not_mermaid():
    md = plan_markdown(PLAN, "What is 17 + 25?", None)
    assert "mermaid" not in md and "```" not in md
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert rows[0] == "| step | wave | worker | sees | subtask |"
    assert rows[1:] == [
        "| 0 | 0 | smol | - | Read \\| the question |",
        "| 1 | 0 | calculator | - | 17 + 25 |",
        "| 2 | 1 | smol | 0, 1 | State the answer. |",
    ]
    assert "**Question:** What is 17 + 25?" in md
    assert "invalid" in plan_markdown(PLAN, "Q", "no plan found")


def test_answer_block_shows_answer_status_and_verification():
    md = answer_markdown(_result(correct=True, reward=1.0))
    assert md.startswith("## Answer\n\n> The answer is 42.\n>\n> Done.\n")
    header, _, values = [line for line in md.splitlines() if line.startswith("|")]
    cells = dict(zip(header.strip("|").split(" | "), values.strip("|").split(" | "), strict=True))
    assert {k.strip(): v.strip() for k, v in cells.items()} == {
        "status": "completed",
        "correct": "yes",
        "reward": "1.0",
        "steps": "3",
        "tokens in / out": "120 / 8",
        "cost (USD)": "0.000000",
        "wall time (s)": "1.23",
    }


def test_answer_block_of_a_failed_unverified_run_gives_the_reason():
    md = answer_markdown(_result(status="failed", answer=None, reason="step 1 (calc) failed: x"))
    assert "*(no answer)*" in md and "**Failed:** step 1 (calc) failed: x" in md
    assert "| correct" not in md and "| failed |" in md


def test_eval_summary_rows_hold_every_metric_of_the_result():
    result = EvalResult(
        eval_id="e",
        dataset="arithmetic",
        split="test",
        strategy="single:calculator",
        n=200,
        questions=200,
        accuracy=0.665,
        correct=133,
        failed=60,
        mean_input_tokens=12.5,
        mean_output_tokens=3.25,
        mean_cost_usd=None,
        wall_s=9.87654321,
        format_valid_rate=None,
        mlflow_experiment="eval/arithmetic",
        mlflow_run_id="abc123",
        artifacts="/tmp/a",
    )
    rows = {r["metric"]: r["value"] for r in eval_summary_rows(result)}
    assert rows == {
        "strategy": "single:calculator",
        "dataset": "arithmetic (test)",
        "accuracy": 0.665,
        "runs (n)": 200,
        "questions": 200,
        "correct": 133,
        "failed runs": 60,
        "mean input tokens": 12.5,
        "mean output tokens": 3.25,
        "mean cost (USD)": "n/a",
        "wall time (s)": 9.87654,
        "format-valid rate": "n/a",
        "MLflow experiment": "eval/arithmetic",
        "MLflow run id": "abc123",
    }


def test_task_run_names_are_ascii_for_the_run_graph():
    assert step_run_name(PLAN.steps[1]) == "step-1 calculator"
    assert step_run_name(PLAN.steps[0], depth=1) == "d1-step-0 smol"
    assert all(step_run_name(s).isascii() for s in PLAN.steps)


def test_results_live_under_the_conductor_home_unless_prefect_says_otherwise(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path / "home"))
    assert result_storage() == tmp_path / "home" / "results"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONDUCTOR_HOME", "rel")
    assert result_storage() == tmp_path / "rel" / "results"  # absolute, for other processes
    with temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: str(tmp_path / "p")}):
        assert result_storage() is None
    with temporary_settings(updates={PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK: "s3-bucket/r"}):
        assert result_storage() is None


@pytest.mark.parametrize("flow_name", ["orchestrate", "evaluate"])
def test_flows_persist_their_result_as_json(flow_name):
    import importlib

    flow = getattr(importlib.import_module(f"prefect_conductor.flows.{flow_name}"), flow_name)
    assert flow.persist_result is True and flow.result_serializer == "json"
    assert flow.result_storage is None or flow.result_storage.is_absolute()
