"""End to end: one eval with the real local model on 3 arithmetic questions (issue #3)."""

from __future__ import annotations

import json

import pytest

from tests.local_cli import run_cli

pytestmark = pytest.mark.e2e


def test_eval_three_arithmetic_questions_with_the_local_model(tmp_path):
    proc = run_cli(
        tmp_path,
        "eval",
        "--dataset",
        "arithmetic",
        "--limit",
        "3",
        "--strategy",
        "single:smol",
        "--concurrency",
        "3",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    result = json.loads(proc.stdout)
    assert result["n"] == 3 and result["failed"] == 0
    assert 0.0 <= result["accuracy"] <= 1.0
    assert result["accuracy"] == result["correct"] / 3
    assert result["mean_output_tokens"] > 0
    assert (tmp_path / "home" / "mlflow.db").exists()

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}")
    run = mlflow.get_run(result["mlflow_run_id"])
    assert run.data.metrics["accuracy"] == pytest.approx(result["accuracy"])
    assert run.data.params["strategy"] == "single:smol"
