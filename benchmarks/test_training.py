"""How the benchmarks train (issue #40): the ``train-conductor --recipe`` command they run
(``benchmarks/_training.py``) and the recipe ``python -m benchmarks.exploration --train``
writes, which must load as a valid recipe and stop after the warm start."""

from __future__ import annotations

import doctest

import pytest
from prefect_conductor.conductor.training.recipe import CollectStage, RecipeError, SftStage

import benchmarks._training as training
from benchmarks.exploration import warm_start_recipe


def test_the_helpers_examples_hold():
    assert doctest.testmod(training).failed == 0


def test_the_command_is_the_recipe_cli_with_every_set_in_order():
    cmd = training.train_command("shipped", ["heldout.limit=40", "seed=1"], "--no-promote")
    assert cmd[1:4] == ["train-conductor", "--recipe", "shipped"]
    assert cmd[4:] == ["--set", "heldout.limit=40", "--set", "seed=1", "--no-promote", "--json"]


def test_exploration_trains_collect_then_a_warm_start_and_nothing_after(tmp_path):
    path = training.write_recipe(tmp_path / "r.yaml", warm_start_recipe(64, seed=3))
    from prefect_conductor.conductor.training.recipe import load_recipe

    recipe = load_recipe(path)
    kinds = [(s.kind, s.name) for s in recipe.stages]
    assert kinds == [("collect", "collect"), ("sft", "warm-start"), ("eval", "after")]
    collect = recipe.stages[0]
    assert isinstance(collect, CollectStage) and collect.questions.limit == 64
    assert isinstance(recipe.stages[1], SftStage) and recipe.seed == 3
    assert recipe.dataset == "mixed" and recipe.heldout.split == "test"


def test_a_bad_recipe_the_benchmark_writes_fails_before_anything_runs(tmp_path):
    bad = warm_start_recipe(64, seed=0)
    bad["stages"][1]["num_train_epochs"] = 0
    with pytest.raises(RecipeError, match="warm-start"):
        training.write_recipe(tmp_path / "bad.yaml", bad)
