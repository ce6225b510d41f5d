"""Training recipes (issue #40): loading, validation in one line, ``--set``, the ledger's
arithmetic and the progress file a killed training resumes from."""

from __future__ import annotations

import pandas as pd
import pytest
from prefect_conductor.conductor.training.config import TrainConductorRequest
from prefect_conductor.conductor.training.ledger import ledger_total, stage_ledger, tagged_runs
from prefect_conductor.conductor.training.progress import FinishedStage, Progress
from prefect_conductor.conductor.training.recipe import (
    GrpoStage,
    RecipeError,
    list_recipes,
    load_recipe,
    recipe_digest,
    recipe_from_dict,
)


def test_every_built_in_recipe_validates_and_ends_with_a_held_out_eval():
    names = list_recipes()
    assert {"default", "shipped", "grpo", "teacher"} <= set(names)
    for name, line in names.items():
        recipe = load_recipe(name)
        assert recipe.name == name and line  # listed with its description's first line
        last = recipe.stages[-1]
        assert last.kind == "eval" and last.conductor == "current"
        assert len({s.name for s in recipe.stages}) == len(recipe.stages)


def test_rounds_expand_into_one_stage_each_and_an_after_eval_is_added():
    recipe = recipe_from_dict(
        {"stages": [{"kind": "sft"}, {"kind": "self-sample", "name": "r", "rounds": 3}]}
    )
    assert [s.name for s in recipe.stages] == ["sft", "r-1", "r-2", "r-3", "after"]
    assert all(s.rounds == 1 for s in recipe.stages[1:4])


def test_an_sft_names_the_stages_whose_plans_it_learns_a_round_name_covering_its_rounds():
    recipe = recipe_from_dict(
        {"stages": [
            {"kind": "collect"},
            {"kind": "self-sample", "name": "easy", "rounds": 2, "sft": {"stages": ["easy"]}},
            {"kind": "self-sample", "name": "hard", "sft": {"stages": ["easy", "hard"]}},
            {"kind": "sft", "name": "mix", "stages": ["collect", "easy-2", "easy"]},
        ]}
    )  # fmt: skip
    sft = {s.name: (s.sft if s.kind == "self-sample" else s).stages for s in recipe.stages[1:5]}
    assert sft == {
        "easy-1": ["easy-1"],  # its own round: its rounds *so far*
        "easy-2": ["easy-1", "easy-2"],
        "hard": ["easy-1", "easy-2", "hard"],
        "mix": ["collect", "easy-2", "easy-1"],  # in the order named, each once
    }
    assert recipe.stages[0].kind == "collect"  # an SFT that names nothing keeps ``data``
    with pytest.raises(RecipeError) as caught:
        recipe_from_dict({"stages": [{"kind": "sft", "stages": ["later"]}, {"kind": "collect"}]})
    text = str(caught.value)
    assert "\n" not in text
    assert "stage sft: stages: 'later' is not this stage or an earlier one (sft)" in text
    with pytest.raises(RecipeError, match="stage r: sft.stages: 'r-2' is not this stage"):
        recipe_from_dict(
            {"stages": [{"kind": "self-sample", "name": "r", "sft": {"stages": ["r-2"]}}]}
        )


def test_tagged_runs_keeps_the_named_stages_of_this_training_only():
    runs, _ = _tables()
    assert list(tagged_runs(runs, "T", stages=["s2"])["run_id"]) == ["b", "c"]
    assert list(tagged_runs(runs, "T", stages=["s1", "s2"])["run_id"]) == ["a", "b", "c"]
    assert tagged_runs(runs, "T", stages=["s3"]).empty


def test_set_overrides_a_stage_by_name_or_index_with_yaml_values():
    recipe = load_recipe(
        "grpo",
        ["stages.grpo.max_steps=0", "stages.1.questions.limit=7", "heldout.limit=200",
         "stages.grpo.reward_weights={plan: 1, token_cost: 0.5}", "seed=3"],
    )  # fmt: skip
    grpo = recipe.stage("grpo")
    assert isinstance(grpo, GrpoStage) and grpo.max_steps == 0
    assert grpo.reward_weights == {"plan": 1.0, "token_cost": 0.5}
    assert recipe.stages[1].questions.limit == 7
    assert recipe.heldout.limit == 200 and recipe.seed == 3
    assert load_recipe("grpo").stage("grpo").max_steps == 24  # the built-in is untouched


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["stages.grpo.max_stepz=0"], "stage 5 (grpo): max_stepz: Extra inputs are not permitted"),
        (["stages.grpo.max_steps=x"], "stage 5 (grpo): max_steps: Input should be a valid integer"),
        (["stages.nope.max_steps=0"], "no stage named 'nope' (stages: before, collect,"),
        (["stages.9.max_steps=0"], "no stage 9 (6 stages)"),
        (["max_steps"], "expected KEY=VALUE"),
        (["stages.grpo.per_device_train_batch_size=6"], "must be a multiple of num_generations"),
        (["stages.collect.kind=bogus"], "stage 2 (collect): Input tag 'bogus' found using"),
        (["heldout.limit=0"], "heldout.limit: Input should be greater than or equal to 1"),
        (["stages.grpo.execute_fraction=0.1"], "execute_fraction needs reward: orchrm"),
        (
            ["stages.grpo.reward=orchrm", "stages.grpo.reward_weights.token_cost=0.1"],
            "reward_weights token_cost need every plan executed",
        ),
        (["stages.grpo.reward=judge"], "reward: Input should be 'executed' or 'orchrm'"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_recipe_stage_and_field(overrides, message):
    with pytest.raises(RecipeError) as caught:
        load_recipe("grpo", overrides)
    text = str(caught.value)
    assert "\n" not in text and text.startswith("recipe grpo (built-in): ")
    assert message in text


def test_a_recipe_file_names_itself_in_its_errors(tmp_path):
    bad = tmp_path / "mine.yaml"
    bad.write_text("stages:\n  - kind: sft\n    num_train_epochs: -1\n")
    with pytest.raises(RecipeError, match=r"recipe .*mine.yaml: stage 1 \(sft\): num_train_epochs"):
        load_recipe(bad)
    bad.write_text("stages: [\n")
    with pytest.raises(RecipeError, match=r"mine.yaml: not valid YAML \(line 2\)"):
        load_recipe(bad)
    with pytest.raises(RecipeError, match="not a built-in .*default.* and no such file"):
        load_recipe("no-such-recipe")
    with pytest.raises(RecipeError, match="no such file"):
        load_recipe(tmp_path / "missing.yaml")
    dup = tmp_path / "dup.yaml"
    dup.write_text("stages: [{kind: sft}, {kind: sft}]\n")
    with pytest.raises(RecipeError, match="two stages are named 'sft'"):
        load_recipe(dup)


def test_the_request_loads_a_named_recipe_with_overrides_and_round_trips():
    """What a deployment's parameters say (``recipe: grpo``, ``overrides: [...]``) and what
    Prefect stores and validates again."""
    request = TrainConductorRequest(recipe="grpo", overrides=["stages.grpo.max_steps=3"])
    assert request.recipe.stage("grpo").max_steps == 3
    again = TrainConductorRequest.model_validate(request.model_dump(mode="json"))
    assert again.recipe == request.recipe
    with pytest.raises(ValueError, match="max_stepz"):
        TrainConductorRequest(recipe="grpo", overrides=["stages.grpo.max_stepz=3"])


def test_the_digest_names_the_recipe_with_its_settings_and_context():
    a = load_recipe("default")
    assert recipe_digest(a, pool="x") == recipe_digest(load_recipe("default"), pool="x")
    assert recipe_digest(a, pool="x") != recipe_digest(a, pool="y")
    b = load_recipe("default", ["stages.collect.questions.limit=5"])
    assert recipe_digest(a, pool="x") != recipe_digest(b, pool="x")


def _tables():
    runs = pd.DataFrame(
        [
            {"run_id": "a", "tags": [("train_run", "T"), ("train_stage", "s1")],
             "conductor_output": None},
            {"run_id": "b", "tags": [("train_run", "T"), ("train_stage", "s2")],
             "conductor_output": "plan"},
            {"run_id": "c", "tags": [("train_run", "T"), ("train_stage", "s2")],
             "conductor_output": "plan"},
            {"run_id": "d", "tags": [("train_run", "OTHER"), ("train_stage", "s2")],
             "conductor_output": "plan"},
        ]
    )  # fmt: skip
    steps = pd.DataFrame(
        [
            {"run_id": "a", "status": "completed", "input_tokens": 10, "output_tokens": 2,
             "cost_usd": 0.5},
            {"run_id": "b", "status": "completed", "input_tokens": 7, "output_tokens": 3,
             "cost_usd": None},
            {"run_id": "b", "status": "failed", "input_tokens": None, "output_tokens": None,
             "cost_usd": None},
            {"run_id": "b", "status": "skipped", "input_tokens": 99, "output_tokens": 99,
             "cost_usd": 9.0},
            {"run_id": "d", "status": "completed", "input_tokens": 1000, "output_tokens": 1000,
             "cost_usd": 1.0},
        ]
    )  # fmt: skip
    return runs, steps


def test_a_stage_ledger_counts_its_own_worker_calls_tokens_cost_and_plans():
    runs, steps = _tables()
    s1 = stage_ledger(runs, steps, "T", "s1", 1.04)
    s2 = stage_ledger(runs, steps, "T", "s2", 2.0)
    assert (s1.worker_calls, s1.input_tokens, s1.output_tokens, s1.cost_usd) == (1, 10, 2, 0.5)
    assert s1.conductor_generations == 0 and s1.wall_s == 1.0
    # a skipped step called nobody; another training's runs are not this one's
    assert (s2.worker_calls, s2.input_tokens, s2.output_tokens, s2.cost_usd) == (2, 7, 3, 0.0)
    assert s2.conductor_generations == 2
    empty = stage_ledger(runs, steps, "T", "none", 0.0)
    assert empty.worker_calls == 0 and empty.conductor_generations == 0
    total = ledger_total([s1, s2, empty])
    assert total.stage == "total" and total.worker_calls == 3 and total.input_tokens == 17


def test_progress_is_saved_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path))
    runs, steps = _tables()
    progress = Progress(run_id="R", digest="abc", recipe="default")
    progress.stages.append(
        FinishedStage(name="s1", ledger=stage_ledger(runs, steps, "T", "s1", 1.0), used=["q1"])
    )
    progress.save()
    back = Progress.load("abc")
    assert back == progress and back.done("s1").used == ["q1"] and back.done("s2") is None
    assert Progress.load("other") is None


def test_set_on_a_nested_field_keeps_the_mappings_other_defaults():
    """``reward_weights.orchrm=1`` on a recipe that never spells out reward_weights keeps
    ``plan: 1``; ``questions.split`` keeps the stage's own question defaults."""
    recipe = load_recipe(
        "grpo", ["stages.grpo.reward_weights.orchrm=0.5", "stages.grpo.questions.split=dev"]
    )
    grpo = recipe.stage("grpo")
    assert grpo.reward_weights == {"plan": 1.0, "orchrm": 0.5}
    assert (grpo.questions.split, grpo.questions.limit, grpo.questions.fresh) == (
        "dev",
        1000,
        False,
    )
    sampled = load_recipe("default", ["stages.round.questions.where={domain: word}"])
    assert sampled.stage("round-1").questions.limit == 64  # the file's, not the model's 100
    heldout = load_recipe("default", ["heldout.split=dev"]).heldout
    assert (heldout.split, heldout.limit) == ("dev", 50)
    with pytest.raises(RecipeError, match="max_steps is not a mapping"):
        load_recipe("grpo", ["stages.grpo.max_steps.x=1"])


def test_a_self_sample_stage_can_be_guided_by_orchrm():
    recipe = load_recipe("default", ["stages.round.guide={execute: 2}"])
    guide = recipe.stage("round-1").guide
    assert guide.execute == 2 and guide.orchrm == "models:/orchrm@champion"
    assert load_recipe("default").stage("round-1").guide is None  # every plan runs
    with pytest.raises(RecipeError, match=r"stage 4 \(round\): guide.execute: Input should be"):
        load_recipe("default", ["stages.round.guide={execute: 0}"])


def test_grpo_with_the_orchrm_reward_executes_a_tenth_unless_told():
    recipe = load_recipe("grpo", ["stages.grpo.reward=orchrm"])
    grpo = next(s for s in recipe.stages if s.kind == "grpo")
    assert grpo.fraction_executed == 0.1
    told = load_recipe("grpo", ["stages.grpo.reward=orchrm", "stages.grpo.execute_fraction=0.5"])
    assert next(s for s in told.stages if s.kind == "grpo").fraction_executed == 0.5
    assert next(s for s in load_recipe("grpo").stages if s.kind == "grpo").fraction_executed == 1
