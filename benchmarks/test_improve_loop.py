"""The cheap parts of ``benchmarks/improve_loop.py``: its settings apply to the ``improve``
recipe, and the table shows every iteration and the shipped one."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.improve_loop import improve_args, markdown, never_worse


def test_the_iterations_settings_are_valid_overrides_of_the_improve_recipe():
    from prefect_conductor.conductor.training.recipe import load_recipe

    ns = argparse.Namespace(questions=16, k=4, heldout=30, rm_steps=40, min_new_runs=20)
    argv = improve_args(ns, Path("pool.yaml"), "/adapters/weak")
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    recipe = load_recipe("improve", sets)
    guided = recipe.stage("guided")
    assert (guided.questions.limit, guided.num_generations) == (16, 4)
    assert recipe.heldout.limit == 30 and recipe.init_adapter == "/adapters/weak"
    assert guided.guide is not None and guided.questions.fresh == "store"
    assert "init_adapter=/adapters/weak" not in improve_args(ns, Path("p"), None)


def test_the_table_has_every_iteration_and_the_shipped_one():
    def it(i, promoted, before, after):
        return {"iteration": i, "runs": 100, "unreferenced": 7, "pairs_new": 50,
                "pairs_by_source": {}, "orchrm_promoted": True, "orchrm_accuracy": 0.9,
                "champion_before": before, "candidate_after": after, "promoted": promoted,
                "worker_calls": 70, "wall_s": 600.0, "stopped": None}  # fmt: skip

    rows = [it(1, True, 0.5, 0.6), it(2, False, 0.6, 0.58)]
    table = markdown({"from_weak": rows, "from_shipped": it(0, False, 0.86, 0.8),
                      "never_worse": never_worse(rows)})  # fmt: skip
    assert "| 1 | 100 (7) | 50 | yes | 50.0% | 60.0% | yes | 70 | 10.0 min |" in table
    assert "| shipped | 100 (7) | 50 | yes | 86.0% | 80.0% | no | 70 | 10.0 min |" in table
    assert table.endswith("Never a worse champion: yes.")
