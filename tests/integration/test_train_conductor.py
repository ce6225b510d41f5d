"""Conductor training end to end on the CPU: a tiny random base model, fake workers.

- the executed-plan reward of a recipe's GRPO stage scores 0 / 0.5 / 1 and stores every
  rollout, tagged with the training and the stage;
- GRPO steps (TRL) change the LoRA weights when rewards differ;
- the whole ``train-conductor`` flow on a recipe: warm start from stored runs, GRPO,
  before/after evals, MLflow runs in a temp sqlite store, the registered model and its aliases;
- a saved adapter serves through ``local/<dir>`` and ``--conductor``, and the base model it
  shares still answers as before with the adapter disabled.

Recipes of every stage kind, their ledger and resuming are ``test_recipes.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import litellm
import pytest
import torch
import yaml
from prefect import flow
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.plan.requests import EvalRequest
from prefect_conductor.conductor.pool import load_pool
from prefect_conductor.conductor.providers.local_model import LocalModelRegistry
from prefect_conductor.conductor.training.config import TrainConductorRequest
from prefect_conductor.conductor.training.recipe import SftSettings, recipe_from_dict
from prefect_conductor.conductor.training.rewards import ExecutedPlanReward, Rollout
from safetensors.torch import load_file

from tests.training_world import training_world

pytestmark = pytest.mark.usefixtures("prefect", "fake_provider")

# In both splits: the first two are the held-out questions (heldout.limit 2), so they never
# become training data although the train split holds them too.
QUESTIONS = {"What is 2 + 3?": "5", "What is 10 - 4?": "6", "What is 7 * 6?": "42"}
# Only in the train split: enough training questions outside the held-out ones.
TRAIN_ONLY = {"What is 9 + 9?": "18", "What is 5 * 5?": "25"}
RIGHT = 'model_id = [0]\nsubtasks = ["What is 2 + 3?"]\naccess_list = [[]]'
WRONG = 'model_id = [1]\nsubtasks = ["What is 2 + 3?"]\naccess_list = [[]]'


@pytest.fixture()
def setup(tmp_path, monkeypatch, tiny_base):
    yield training_world(tmp_path, monkeypatch, tiny_base, {**QUESTIONS, **TRAIN_ONLY}, QUESTIONS)
    LocalModelRegistry.remove(str(tiny_base))


# One SFT row in TRL's conversational format, for the SFT stage run directly.
SFT_EXAMPLE = {
    "prompt": [{"role": "user", "content": "Question: What is 2 + 2?"}],
    "completion": [{"role": "assistant", "content": 'model_id = ["oracle"]'}],
}

BEFORE = {"kind": "eval", "name": "before", "conductor": "start"}
WARM_START = {"kind": "sft", "name": "warm-start", "num_train_epochs": 1}


def _grpo(**changes: Any) -> dict[str, Any]:
    """A GRPO stage sized for the tiny model: 2 steps of 2 questions x 2 rollouts."""
    return {
        "kind": "grpo",
        "name": "grpo",
        "max_steps": 2,
        "num_generations": 2,
        "per_device_train_batch_size": 4,
        "max_completion_length": 16,
        "learning_rate": 1e-2,
        **changes,
    }


def _request(
    data, pool, tiny_base, *stages: dict[str, Any], promote: bool = True, **changes: Any
) -> TrainConductorRequest:
    """A recipe of ``stages`` (default: a "before" eval, then GRPO; the final "after" eval is
    the recipe's own) on the mini data set, two held-out questions."""
    recipe = {
        "name": "mini",
        "dataset": str(data),
        "base": str(tiny_base),
        "heldout": {"split": "test", "limit": 2},
        "stages": list(stages) or [BEFORE, _grpo()],
        **changes,
    }
    return TrainConductorRequest(
        recipe=recipe_from_dict(recipe), pool=str(pool), promote=promote, eval_concurrency=2
    )


def _training(request: TrainConductorRequest, run_id: str):
    """The flow's state of one training (``flows._stages.Training``)."""
    from prefect_conductor.flows._stages import Training as _Training

    return _Training(request, run_id, load_pool(request.pool))


def test_executed_reward_scores_invalid_wrong_and_correct_plans_and_stores_them(setup, tiny_base):
    data, pool, _ = setup
    request = _request(data, pool, tiny_base)

    @flow
    def score() -> list[float | None]:
        execute = _training(request, "train-1")._executor(request.recipe.stage("grpo"), str(data))
        reward = ExecutedPlanReward(execute)
        return reward(
            ["p"] * 3,
            [[{"role": "assistant", "content": t}] for t in ("no plan here", WRONG, RIGHT)],
            question=["What is 2 + 3?"] * 3,
            question_id=["train-q0"] * 3,
            reference=["5"] * 3,
            kind=["math"] * 3,
            meta=["{}"] * 3,
            trainer_state=type("S", (), {"global_step": 7})(),
        )

    assert score() == [0.0, 0.5, 1.0]
    runs = ArtifactStore().read_pandas("runs")
    assert len(runs) == 3
    tags = [dict(t) for t in runs["tags"]]
    assert {t["train_run"] for t in tags} == {"train-1"}
    assert {t["train_stage"] for t in tags} == {"grpo"}
    assert {t["train_step"] for t in tags} == {"7"}
    assert {(t["dataset"], t["split"]) for t in tags} == {(str(data), "train")}
    assert set(runs["conductor_model"]) == {"grpo:train-1"}
    assert sorted(runs["format_valid"]) == [False, True, True]
    # The invalid plan ran nothing; the two valid ones ran one step each.
    assert len(ArtifactStore().read_pandas("steps")) == 2


def test_grpo_steps_change_the_adapter_when_rewards_differ(setup, tiny_base, tmp_path):
    """Real TRL GRPOTrainer; the tiny model writes no plan, so half of each group's rollouts
    are swapped for a valid plan before they run: rewards differ, advantages are not 0."""
    from prefect_conductor.tasks.training import grpo_train, start_training_run

    data, pool, _ = setup
    request = _request(data, pool, tiny_base)
    stage = request.recipe.stage("grpo")
    real = _training(request, "train-2")._executor(stage, str(data))

    def execute(rollouts: list[Rollout], step: int):
        swapped = [
            Rollout(r.question, r.question_id, r.reference, r.kind, RIGHT if i % 2 else r.plan_text)
            for i, r in enumerate(rollouts)
        ]
        return real(swapped, step)

    @flow
    def train():
        from prefect_conductor.conductor.data.datasets import load_dataset

        run_id = start_training_run(request, {})
        examples = load_dataset(str(data), split="train")
        return grpo_train(
            request.recipe,
            stage,
            load_pool(pool),
            examples,
            None,
            ExecutedPlanReward(execute),
            tmp_path / "out",
            run_id,
        )

    outcome = train()
    assert outcome.steps == 2 and outcome.rollouts == 8
    assert outcome.adapter_dir == tmp_path / "out" / "grpo"  # named after the stage
    weights = load_file(outcome.adapter_dir / "adapter_model.safetensors")
    lora_b = [t for name, t in weights.items() if "lora_B" in name]
    assert lora_b and any(t.abs().sum() > 0 for t in lora_b)  # B starts at zero in PEFT
    assert json.loads((outcome.adapter_dir / "conductor.json").read_text())["base"] == str(
        tiny_base
    )


def test_train_conductor_flow_tracks_registers_and_serves(setup, tiny_base, monkeypatch):
    import mlflow
    from prefect_conductor.flows.evaluate import evaluate
    from prefect_conductor.flows.train_conductor import train_conductor
    from prefect_conductor.tasks.tracking import tracking_uri

    data, pool, home = setup
    # Verified-correct runs in the store for the warm start: an eval of one worker.
    evaluate(
        EvalRequest(dataset=str(data), split="train", strategy="single:oracle", pool=str(pool))
    )
    result = train_conductor(
        _request(data, pool, tiny_base, BEFORE, WARM_START, _grpo(max_steps=1))
    )
    assert [s.stage for s in result.stages] == ["before", "warm-start", "grpo", "after"]
    by = {s.stage: s for s in result.stages}
    assert by["grpo"].steps == 1
    # The train split holds the three test questions too: the two held-out ones never become
    # warm-start data, so three of the five verified-correct runs remain.
    assert by["warm-start"].examples == 3
    assert result.accuracy_before is not None and result.accuracy_after is not None
    assert result.accuracy_before == by["before"].accuracy
    assert result.accuracy_after == by["after"].accuracy
    # No champion yet: the incumbent is the pool's own conductor, measured as "before"; a
    # first candidate that does not beat it is registered but never promoted (issue #18).
    assert result.before_conductor == f"pool conductor (local/{tiny_base})"
    assert result.started_from == f"{tiny_base} + a new LoRA"
    assert result.resumed_at is None
    assert result.incumbent_accuracy == result.accuracy_before
    assert result.promoted == (result.accuracy_after > result.accuracy_before)
    assert result.adapter_uri == "models:/conductor/1"
    assert Path(result.adapter_dir) == Path(by["grpo"].adapter)
    from prefect_conductor.tasks.training import champion_exists, register_conductor

    assert champion_exists() == result.promoted
    if not result.promoted:  # promote it the way a better candidate is promoted
        better = register_conductor.fn(
            result.run_id, Path(result.adapter_dir), 1.0, "mini/test/2/0", True, 0.5
        )
        assert better.promoted and better.champion_accuracy == 0.5
    champion_version = str(
        __import__("mlflow")
        .MlflowClient(tracking_uri())
        .get_model_version_by_alias("conductor", "champion")
        .version
    )

    mlflow.set_tracking_uri(tracking_uri())
    client = mlflow.MlflowClient()
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["recipe"] == "mini"
    assert run.data.params["stages"] == "before,warm-start,grpo,after"
    assert "accuracy_after" in run.data.metrics
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.name == "train/conductor"
    children = client.search_runs(
        [run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{result.run_id}'"
    )
    assert {c.info.run_name for c in children} >= {"warm-start", "grpo", "before", "after"}
    grpo = next(c for c in children if c.info.run_name == "grpo")
    assert "reward" in grpo.data.metrics  # TRL's own curve, through report_to="mlflow"
    assert str(client.get_model_version_by_alias("conductor", "champion").version) == (
        champion_version
    )

    # Rollouts are stored, tagged with the training run and the stage.
    runs = ArtifactStore().read_pandas("runs")
    tagged = [dict(t) for t in runs["tags"] if dict(t).get("train_run") == result.run_id]
    rollouts = [t for t in tagged if t["train_stage"] == "grpo"]
    assert len(rollouts) == 4  # 1 step x batch 4
    assert {t["train_stage"] for t in tagged} == {"before", "grpo", "after"}  # SFT runs nothing

    # The registered adapter serves through the registry reference.
    from prefect_conductor.tasks.registry import resolve_conductor, with_conductor

    info = resolve_conductor("models:/conductor@champion")
    assert info.base == str(tiny_base)
    served = with_conductor(load_pool(pool), "models:/conductor@champion")
    assert served.conductor.model.startswith("local/")

    # A worse candidate is registered but not promoted.
    worse = register_conductor.fn(
        result.run_id, Path(result.adapter_dir), -1.0, "mini/test/2/0", True
    )
    assert not worse.promoted
    assert str(client.get_model_version_by_alias("conductor", "champion").version) == (
        champion_version
    )
    assert str(client.get_model_version_by_alias("conductor", "candidate").version) == worse.version


def test_train_conductor_on_an_empty_store_collects_the_runs_it_needs(setup, tiny_base):
    from prefect_conductor.conductor.errors import ConductorError
    from prefect_conductor.flows.train_conductor import train_conductor

    data, pool, _ = setup
    with pytest.raises(ConductorError, match="holds no verified-correct run"):
        train_conductor(_request(data, pool, tiny_base, WARM_START, _grpo(max_steps=1)))
    collect = {"kind": "collect", "name": "collect", "questions": {"limit": 3}}
    result = train_conductor(
        _request(data, pool, tiny_base, collect, WARM_START, _grpo(max_steps=1))
    )
    runs = ArtifactStore().read_pandas("runs")
    strategies = [dict(t).get("strategy") for t in runs["tags"]]
    # Each single worker answered three training questions once (the collection) ...
    assert strategies.count("single:oracle") == 3 and strategies.count("single:echo") == 3
    collected = [
        r.question for r in runs.itertuples() if dict(r.tags).get("train_stage") == "collect"
    ]
    # ... never a held-out one (the first two test questions) ...
    assert not set(collected) & set(list(QUESTIONS)[:2])
    by = {s.stage: s for s in result.stages}
    assert (by["collect"].questions, by["collect"].rollouts, by["collect"].right) == (3, 6, 3)
    # ... and the oracle's verified-correct runs became the warm-start data.
    assert by["warm-start"].examples == 3
    assert result.started_from == f"{tiny_base} + a new LoRA"


def test_self_sampling_rounds_run_store_and_retrain_and_each_stage_is_scored(setup, tiny_base):
    """Warm start, one round of self-sampling, no GRPO: the round's plans are sampled by the
    warm-started adapter, run, verified and stored (tagged), a second SFT follows, and an eval
    stage after each one scores its conductor on the held-out questions."""
    from prefect_conductor.flows.train_conductor import train_conductor

    data, pool, _ = setup
    evaluate_oracle = EvalRequest(
        dataset=str(data), split="train", strategy="single:oracle", pool=str(pool)
    )
    from prefect_conductor.flows.evaluate import evaluate

    evaluate(evaluate_oracle)
    round_ = {
        "kind": "self-sample",
        "name": "round",
        "questions": {"limit": 2},
        "num_generations": 2,
        "sft": {"num_train_epochs": 1},
    }
    result = train_conductor(
        _request(
            data,
            pool,
            tiny_base,
            WARM_START,
            {"kind": "eval", "name": "scored"},
            round_,
            {"kind": "eval", "name": "after"},
        )
    )
    assert [s.stage for s in result.stages] == ["warm-start", "scored", "round", "after"]
    assert [s.kind for s in result.stages] == ["sft", "eval", "self-sample", "eval"]
    assert not any(s.kind == "grpo" for s in result.stages)
    by = {s.stage: s for s in result.stages}
    for name, trained in (("scored", "warm-start"), ("after", "round")):
        assert by[name].accuracy is not None and by[name].format_valid is not None
        assert by[name].adapter == by[trained].adapter  # the stage before it is scored
    assert by["round"].rollouts == 4  # 2 questions x 2 samples
    runs = ArtifactStore().read_pandas("runs")
    sampled = [r for r in runs.itertuples() if dict(r.tags).get("train_stage") == "round"]
    assert len(sampled) == 4
    assert sorted(dict(r.tags)["sample"] for r in sampled) == ["0", "0", "1", "1"]
    # Sampled by the warm-started adapter, not by the pool's conductor.
    assert {r.conductor_model for r in sampled} == {
        f"local/{Path(result.adapter_dir).parent}/warm-start"
    }
    # The round's SFT is redone on every verified plan stored (the oracle's here: the tiny
    # model's 16-token plans never verify), and its adapter is the one registered.
    assert not any(r.correct and r.workflow_json for r in sampled)
    assert by["round"].examples == by["warm-start"].examples > 0
    assert Path(result.adapter_dir).name == "round"
    assert (Path(result.adapter_dir) / "adapter_model.safetensors").exists()
    provenance = json.loads((Path(result.adapter_dir) / "conductor.json").read_text())
    assert provenance["provenance"]["continued_from"] is None  # from the base, as the warm start
    # The final adapter is the last stage's: the recipe's own "after" scores it, no second one.
    assert result.accuracy_after == result.stages[-1].accuracy
    evals = ArtifactStore().read_pandas("runs")
    evals = {dict(t).get("eval_id") for t in evals["tags"]}
    # the oracle's, one per eval stage, and the incumbent's (the champion to beat)
    assert len(evals - {None}) == 1 + 2 + 1
    assert [e.stage for e in result.ledger] == [
        "warm-start", "scored", "round", "after", "incumbent", "total"
    ]  # fmt: skip


def test_an_sft_stage_goes_on_training_the_adapter_it_is_given(setup, tiny_base, tmp_path):
    """An SFT stage given ``init_adapter`` trains that LoRA further (not a new one of the
    recipe's rank), and its provenance says what it continued."""
    from prefect_conductor.tasks.training import start_training_run, warm_start_train

    data, pool, _ = setup
    request = _request(data, pool, tiny_base)
    recipe = request.recipe
    settings = SftSettings(num_train_epochs=3)  # warm-up: step 0 has lr 0
    run_id = start_training_run(request, {})
    example = SFT_EXAMPLE
    out = tmp_path / "adapters"
    first, steps = warm_start_train(recipe, settings, [example], out, run_id)
    assert first == out / "warm-start" and steps == 3  # 1 example, 3 epochs
    other_rank = recipe.model_copy(update={"lora_r": 4})  # what a new LoRA would get
    second, _ = warm_start_train(
        other_rank, settings, [example, example], out, run_id, stage="round-1", init_adapter=first
    )
    assert second == out / "round-1"
    rank = [json.loads((d / "adapter_config.json").read_text())["r"] for d in (first, second)]
    assert rank == [recipe.lora_r, recipe.lora_r] != [4, 4]
    before = load_file(first / "adapter_model.safetensors")
    after = load_file(second / "adapter_model.safetensors")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    provenance = json.loads((second / "conductor.json").read_text())["provenance"]
    assert provenance["continued_from"] == str(first)
    assert provenance["examples"] == 2
    assert (
        json.loads((first / "conductor.json").read_text())["provenance"]["continued_from"] is None
    )


def test_grpo_on_the_mixed_set_stores_tagged_rollouts_of_every_domain(setup, tiny_base):
    """The built-in mixed set through GRPO with the tiny model: the four training questions
    (one per domain: every prefix of a split is balanced) are each rolled out, executed on
    the pool and stored, tagged with the run, its step and the dataset (issue #18)."""
    from prefect_conductor.conductor.data.datasets import MIXED_DOMAINS, load_dataset
    from prefect_conductor.flows.train_conductor import train_conductor

    _, pool, _ = setup
    grpo = _grpo(max_steps=2, questions={"limit": 4, "fresh": False})
    result = train_conductor(_request("mixed", pool, tiny_base, grpo, promote=False))
    assert {s.stage: s for s in result.stages}["grpo"].steps == 2
    assert result.accuracy_before is None and not result.promoted
    domain = {ex.id: ex.meta["domain"] for ex in load_dataset("mixed", split="train", limit=4)}
    runs = ArtifactStore().read_pandas("runs")
    rollouts = [
        (r.question_id, dict(r.tags)) for r in runs.itertuples() if "train_step" in dict(r.tags)
    ]
    assert len(rollouts) == 8  # 2 steps x batch 4
    assert {domain[q] for q, _ in rollouts} == set(MIXED_DOMAINS)
    assert all(
        t["train_run"] == result.run_id
        and t["train_stage"] == "grpo"
        and t["dataset"] == "mixed"
        and t["split"] == "train"
        for _, t in rollouts
    )
    assert sorted({t["train_step"] for _, t in rollouts}) == ["0", "1"]


def test_adapter_shares_the_base_and_the_base_answers_unchanged(setup, tiny_base, tmp_path):
    """One base in memory: the adapter applies for the conductor, not for base workers."""
    from peft import LoraConfig, get_peft_model
    from prefect_conductor.conductor.adapters import write_adapter_meta
    from prefect_conductor.conductor.training.config import load_trainable_base

    messages = [{"role": "user", "content": "Plan: what is 2 + 3?"}]
    ask = dict(messages=messages, max_tokens=8, temperature=0)
    base_model = f"local/{tiny_base}"
    before = litellm.completion(model=base_model, **ask).choices[0].message.content

    model, _ = load_trainable_base(str(tiny_base))
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # a non-zero adapter, so it changes the output
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.fill_(0.5)
    adapter = tmp_path / "adapter"
    peft.save_pretrained(adapter)
    write_adapter_meta(adapter, str(tiny_base), "compact")

    tuned = litellm.completion(model=f"local/{adapter}", **ask).choices[0].message.content
    again = litellm.completion(model=base_model, **ask).choices[0].message.content
    assert again == before  # the base answers as before, adapter disabled
    assert tuned != before  # the adapter is applied for the conductor
    shared = LocalModelRegistry.get(str(adapter)).model
    assert shared is LocalModelRegistry.get(str(tiny_base)).model  # one copy of the weights
    LocalModelRegistry.remove(str(adapter))


def _cli(*args: str, cwd: Path, timeout: int = 900):
    import os
    import subprocess
    import sys

    env = {**os.environ, "CONDUCTOR_HOME": str(cwd / "home"), "PREFECT_HOME": str(cwd / "prefect")}
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(
        [sys.executable, "-m", "prefect_conductor.cli.app", "train-conductor", *args],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _recipe_file(tmp_path: Path, **changes: Any) -> Path:
    """A recipe YAML for the CLI: no "before" eval, no warm start, one GRPO step."""
    recipe = {
        "name": "cli",
        "dataset": "arithmetic",
        "heldout": {"split": "test", "limit": 2},
        "stages": [_grpo(max_steps=1, per_device_train_batch_size=2)],
        **changes,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_cli_bad_arguments_get_one_line_and_exit_2(tmp_path):
    recipe = _recipe_file(tmp_path)
    proc = _cli("--recipe", str(recipe), "--set", "stages.grpo.per_device_train_batch_size=3",
                cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: recipe {recipe}: stage 1 (grpo): per_device_train_batch_size (3) must be a "
        "multiple of num_generations (2)"
    ]
    assert not (tmp_path / "home" / "training").exists()  # nothing started
    # No OrchRM trained in this home: one line naming what is missing and how to get it.
    # (The recipe names the plan weight: --set adds orchrm's next to it.)
    weighted = _grpo(max_steps=1, per_device_train_batch_size=2, reward_weights={"plan": 1.0})
    recipe = _recipe_file(tmp_path, stages=[weighted])
    proc = _cli("--recipe", str(recipe), "--set", "stages.grpo.reward_weights.orchrm=1",
                cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "models:/orchrm@champion" in proc.stderr and "conductor train-rm" in proc.stderr


def test_cli_json_is_one_object_on_stdout(setup, tiny_base, tmp_path):
    """The trainers print their logs on stdout; the CLI keeps stdout for the result."""
    data, _, _ = setup
    pool = tmp_path / "mock-pool.yaml"
    pool.write_text(
        yaml.safe_dump(
            {
                "conductor": {"model": "openai/gpt-4o-mini", "params": {"mock_response": "x"}},
                "workers": [
                    {
                        "name": "gpt",
                        "model": "openai/gpt-4o-mini",
                        "retries": 0,
                        "params": {"mock_response": "The answer is 5."},
                    }
                ],
            }
        )
    )
    # The recipe's data set, base and held-out size are overridden by the common options.
    recipe = _recipe_file(tmp_path, stages=[_grpo(max_steps=2, per_device_train_batch_size=2)])
    proc = _cli(
        "--recipe", str(recipe), "--set", "stages.grpo.max_steps=1", "--dataset", str(data),
        "--pool", str(pool), "--base", str(tiny_base), "--eval-limit", "1", "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)  # exactly one JSON document, nothing else
    assert set(result) == {
        "run_id", "recipe", "wall_s", "accuracy_before", "accuracy_after",
        "format_valid_before", "format_valid_after", "adapter_uri", "promoted",
        "incumbent_accuracy", "before_conductor", "started_from", "resumed_at", "stages",
        "ledger",
    }  # fmt: skip
    assert result["recipe"] == "cli" and result["resumed_at"] is None
    assert [(s["stage"], s["steps"]) for s in result["stages"]] == [("grpo", 1), ("after", None)]
    assert result["stages"][-1]["questions"] == 1  # --eval-limit
    assert result["accuracy_before"] is None
    # No "before" eval: the incumbent (the pool's conductor, no champion yet) is measured
    # anyway, on the same held-out question, and labelled as what training did not start from.
    assert result["incumbent_accuracy"] is not None and result["before_conductor"] is None
    assert result["started_from"] == f"{tiny_base} + a new LoRA"
    assert result["promoted"] == (result["accuracy_after"] > result["incumbent_accuracy"])
    assert [e["stage"] for e in result["ledger"]] == ["grpo", "after", "incumbent", "total"]
    assert "loss" in proc.stderr  # the trainer's progress is visible, on stderr


def test_init_adapter_is_continued_by_the_warm_start_and_sampled_without_one(setup, tiny_base):
    """``init_adapter`` (the champion of a weekly retraining) is what training goes on from:
    the warm start continues it, and without a warm start the self-sampling rounds sample it."""
    from prefect_conductor.flows.evaluate import evaluate
    from prefect_conductor.flows.train_conductor import train_conductor
    from prefect_conductor.tasks.training import start_training_run, warm_start_train

    data, pool, _ = setup
    base_request = _request(data, pool, tiny_base)
    example = SFT_EXAMPLE
    champion, _ = warm_start_train(
        base_request.recipe,
        SftSettings(num_train_epochs=1),
        [example],
        setup[2] / "champ",
        start_training_run(base_request, {}),
    )
    evaluate(
        EvalRequest(dataset=str(data), split="train", strategy="single:oracle", pool=str(pool))
    )
    warm = train_conductor(
        _request(data, pool, tiny_base, WARM_START, init_adapter=str(champion), promote=False)
    )
    meta = json.loads((Path(warm.adapter_dir) / "conductor.json").read_text())
    assert Path(warm.adapter_dir).name == "warm-start"
    assert meta["provenance"]["continued_from"] == str(champion)
    assert warm.started_from == str(champion)
    assert {s.stage: s for s in warm.stages}["warm-start"].examples == 3

    round_ = {
        "kind": "self-sample",
        "name": "round",
        "questions": {"limit": 2},
        "num_generations": 1,
        "sft": {"num_train_epochs": 1},
    }
    sampled = train_conductor(
        _request(data, pool, tiny_base, round_, init_adapter=str(champion), promote=False)
    )
    assert [s.stage for s in sampled.stages] == ["round", "after"]
    runs = ArtifactStore().read_pandas("runs")
    mine = [r for r in runs.itertuples() if dict(r.tags).get("train_run") == sampled.run_id]
    rounds = [r for r in mine if dict(r.tags).get("train_stage") == "round"]
    assert len(rounds) == 2
    assert {r.conductor_model for r in rounds} == {f"local/{champion}"}
    # ... and the round's SFT starts from it too, on the store's verified plans.
    meta = json.loads((Path(sampled.adapter_dir) / "conductor.json").read_text())
    assert Path(sampled.adapter_dir).name == "round"
    assert meta["provenance"]["continued_from"] == str(champion)
