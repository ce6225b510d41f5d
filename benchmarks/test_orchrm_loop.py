"""The cheap parts of ``benchmarks/orchrm_loop.py``: every arm's recipe validates, the
budgets compare as the issue defines them, and the table prints every arm."""

from __future__ import annotations

from pathlib import Path

from benchmarks._training import write_recipe
from benchmarks.orchrm_loop import arms, calls_to_match, goals, markdown, plot, recipe


def test_every_arm_is_a_valid_recipe_from_the_same_start_on_the_same_questions(tmp_path):
    from prefect_conductor.conductor.training.recipe import load_recipe

    start = str(tmp_path / "adapter")
    loaded = {}
    for name, stage in arms(4, [1, 2], 8).items():
        path = write_recipe(tmp_path / f"{name}.yaml", recipe(name, stage, start, 32, 40))
        loaded[name] = load_recipe(Path(path))
    assert {r.init_adapter for r in loaded.values()} == {start}
    assert {r.heldout.limit for r in loaded.values()} == {40}
    guided = {n: r.stages[0].guide for n, r in loaded.items() if r.stages[0].kind == "self-sample"}
    assert guided["execute-all"] is None
    assert guided["merge-only"].execute == 4 and guided["orchrm-top1"].execute == 1
    grpo = loaded["grpo-orchrm"].stages[0]
    assert grpo.reward == "orchrm" and grpo.fraction_executed == 0.1
    assert loaded["grpo-executed"].stages[0].fraction_executed == 1.0


def test_calls_to_match_needs_execute_alls_accuracy_and_the_table_lists_every_arm():
    results = {
        "execute-all": {"worker_calls": 128, "accuracy": 0.5, "plans_written": 128,
                        "plans_executed": 128, "right": 30},
        "orchrm-top1": {"worker_calls": 40, "accuracy": 0.5, "plans_written": 128,
                        "plans_executed": 32, "right": 12},
        "merge-only": {"worker_calls": 90, "accuracy": 0.45, "plans_written": 128,
                       "plans_executed": 90, "right": 28},
    }  # fmt: skip
    matched = calls_to_match(results)
    assert matched == {"execute-all": 128, "orchrm-top1": 40, "merge-only": None}
    table = markdown({
        "start_accuracy": 0.3, "heldout": 40, "questions": 32, "k": 4,
        "orchrm": {"model_uri": "models:/orchrm/1", "pairwise_accuracy": 0.9},
        "arms": results, "calls_to_match": matched,
        "ratio_to_execute_all": {"execute-all": 1.0, "orchrm-top1": 40 / 128, "merge-only": None},
    })  # fmt: skip
    assert "| orchrm-top1 | 40 | 128 | 32 | 12 | 50.0% | 40 | 0.31x |" in table
    assert "| merge-only | 90 | 128 | 90 | 28 | 45.0% | – | – |" in table


def test_the_goal_rows_and_the_plot_come_from_the_arms(tmp_path):
    results = {
        "execute-all": {"worker_calls": 96, "accuracy": 0.7},
        "merge-only": {"worker_calls": 80, "accuracy": 0.7},
        "orchrm-top1": {"worker_calls": 24, "accuracy": 0.6},
        "orchrm-top2": {"worker_calls": 48, "accuracy": 0.7333},
        "grpo-executed": {"worker_calls": 32, "accuracy": 0.6},
        "grpo-orchrm": {"worker_calls": 4, "accuracy": 0.5667},
    }
    g = goals(results, calls_to_match(results))
    # top1 fell short, so the guided figure is top2's 48 calls: half of 96, 0.6 of 80.
    assert g["guided_vs_execute_all"] == 0.5 and g["guided_vs_merge_only"] == 0.6
    assert not g["guided_met"] and not g["grpo_met"]
    assert g["grpo_orchrm_minus_executed"] == -0.0333
    m = {"start_accuracy": 0.5667, "heldout": 30, "arms": results}
    png = plot(m, tmp_path / "img" / "loop.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
