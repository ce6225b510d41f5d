"""End to end through the CLI with the real local model (issue #9): an eval with --samples,
``train-rm`` for a few steps on SmolLM2, then ``best-of-n-plan`` with the trained model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.local_cli import run_cli

pytestmark = pytest.mark.e2e


def _cli(tmp_path: Path, *args: str) -> dict:
    proc = run_cli(tmp_path, *args, "--json", timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


def test_samples_then_train_rm_then_best_of_n_plan(tmp_path):
    common = ["--dataset", "arithmetic", "--split", "train", "--limit", "3"]
    sampled = _cli(tmp_path, "eval", *common, "--strategy", "random-plan", "--samples", "3")
    assert (sampled["n"], sampled["questions"], sampled["samples"]) == (9, 3, 3)
    calculator = _cli(tmp_path, "eval", *common, "--strategy", "single:calculator")
    assert calculator["correct"] >= 1  # a correct run to pair with the wrong random plans

    trained = _cli(
        tmp_path, "train-rm", "--min-pairs", "1", "--max-steps", "2", "--batch-size", "2"
    )
    assert trained["trained"] and trained["run_id"]
    assert trained["pairs_by_source"]["correct-over-incorrect"] > 0
    assert trained["pairs_train"] + trained["pairs_test"] == sum(
        trained["pairs_by_source"].values()
    )
    assert trained["model_uri"] == "models:/orchrm/1"
    assert (Path(trained["model_dir"]) / "orchrm.json").is_file()

    picked = _cli(
        tmp_path,
        "eval",
        *common[:-1],
        "2",
        "--strategy",
        "best-of-n-plan:2:random-plan",
        "--rm",
        trained["model_uri"],
    )
    assert picked["n"] == 2 and picked["strategy"] == "best-of-n-plan:2:random-plan"

    from prefect_conductor.conductor.data.store import ArtifactStore

    runs = ArtifactStore(tmp_path / "home" / "artifacts").read_pandas("runs")
    tags = runs["tags"].map(dict)
    chosen = runs[tags.map(lambda t: t.get("selection") == "best-of-n-plan:2:random-plan")]
    assert len(chosen) == 2  # one executed plan per question, not two
    assert set(chosen["tags"].map(lambda t: dict(t)["selected"])) == {"true"}
