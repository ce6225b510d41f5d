"""Conductor training end to end on the CPU: a tiny random base model, fake workers.

- the executed-plan reward scores 0 / 0.5 / 1 and stores every rollout, tagged;
- GRPO steps (TRL) change the LoRA weights when rewards differ;
- the whole ``train-conductor`` flow: warm start from stored runs, GRPO, before/after evals,
  MLflow runs in a temp sqlite store, the registered model and its aliases;
- a saved adapter serves through ``local/<dir>`` and ``--conductor``, and the base model it
  shares still answers as before with the adapter disabled.
"""

from __future__ import annotations

import json
from pathlib import Path

import litellm
import pytest
import torch
import yaml
from prefect import flow
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.plan.requests import EvalRequest
from prefect_conductor.conductor.pool import load_pool
from prefect_conductor.conductor.providers.local_model import LocalModelRegistry, register
from prefect_conductor.conductor.training.config import TrainConductorRequest
from prefect_conductor.conductor.training.rewards import ExecutedPlanReward, Rollout
from safetensors.torch import load_file

from prefect_conductor.testing.fakes import ANSWERS

pytestmark = pytest.mark.usefixtures("prefect", "fake_provider")

QUESTIONS = {"What is 2 + 3?": "5", "What is 10 - 4?": "6", "What is 7 * 6?": "42"}
RIGHT = 'model_id = [0]\nsubtasks = ["What is 2 + 3?"]\naccess_list = [[]]'
WRONG = 'model_id = [1]\nsubtasks = ["What is 2 + 3?"]\naccess_list = [[]]'


@pytest.fixture()
def setup(tmp_path, monkeypatch, tiny_base):
    home = tmp_path / "home"
    monkeypatch.setenv("CONDUCTOR_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("CONDUCTOR_ARTIFACTS", raising=False)
    data = tmp_path / "mini.jsonl"
    rows = [
        {"id": f"q{i}", "question": q, "reference": a, "kind": "math", "split": split}
        for split in ("train", "test")
        for i, (q, a) in enumerate(QUESTIONS.items())
    ]
    for r in rows:
        r["id"] = f"{r['split']}-{r['id']}"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    ANSWERS.clear()
    ANSWERS.update({q: f"The answer is {a}." for q, a in QUESTIONS.items()})
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        yaml.safe_dump(
            {
                # The conductor is the tiny local model; workers are fakes.
                "conductor": {
                    "model": f"local/{tiny_base}",
                    "params": {"temperature": 0.0, "max_tokens": 16},
                },
                "workers": [
                    {"name": "oracle", "model": "fake/lookup", "description": "Knows answers."},
                    {"name": "echo", "model": "fake/echo", "description": "Repeats."},
                ],
            }
        )
    )
    register()
    yield data, pool, home
    LocalModelRegistry.remove(str(tiny_base))


# One SFT row in TRL's conversational format, for the SFT stage run directly.
SFT_EXAMPLE = {
    "prompt": [{"role": "user", "content": "Question: What is 2 + 2?"}],
    "completion": [{"role": "assistant", "content": 'model_id = ["oracle"]'}],
}


def _request(data, pool, tiny_base, **kw) -> TrainConductorRequest:
    defaults = dict(
        dataset=str(data),
        pool=str(pool),
        base=str(tiny_base),
        eval_limit=2,
        eval_concurrency=2,
        max_steps=2,
        num_generations=2,
        batch_size=4,
        max_completion_length=16,
        learning_rate=1e-2,
        warm_start_epochs=1,
        warm_start=False,
        self_sample_rounds=0,
    )
    return TrainConductorRequest(**{**defaults, **kw})


def test_executed_reward_scores_invalid_wrong_and_correct_plans_and_stores_them(setup, tiny_base):
    from prefect_conductor.flows.train_conductor import rollout_executor

    data, pool, _ = setup
    request = _request(data, pool, tiny_base)

    @flow
    def score() -> list[float | None]:
        reward = ExecutedPlanReward(rollout_executor(request, "grpo:test", "train-1"))
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
    assert {t["train_step"] for t in tags} == {"7"}
    assert set(runs["conductor_model"]) == {"grpo:test"}
    assert sorted(runs["format_valid"]) == [False, True, True]
    # The invalid plan ran nothing; the two valid ones ran one step each.
    assert len(ArtifactStore().read_pandas("steps")) == 2


def test_grpo_steps_change_the_adapter_when_rewards_differ(setup, tiny_base, tmp_path):
    """Real TRL GRPOTrainer; the tiny model writes no plan, so half of each group's rollouts
    are swapped for a valid plan before they run: rewards differ, advantages are not 0."""
    from prefect_conductor.flows.train_conductor import rollout_executor
    from prefect_conductor.tasks.training import grpo_train, start_training_run

    data, pool, _ = setup
    request = _request(data, pool, tiny_base)
    real = rollout_executor(request, "grpo:test", "train-2")

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
            request,
            load_pool(pool),
            examples,
            None,
            ExecutedPlanReward(execute),
            tmp_path / "out",
            run_id,
        )

    outcome = train()
    assert outcome.steps == 2 and outcome.rollouts == 8
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
    result = train_conductor(_request(data, pool, tiny_base, warm_start=True, max_steps=1))
    assert result.steps == 1
    # Both splits hold the same three questions here: the two held-out ones (eval_limit=2)
    # never become warm-start data, so one of the three verified-correct runs remains.
    assert result.warm_start_examples == 1
    assert result.accuracy_before is not None and result.accuracy_after is not None
    # No champion yet: the incumbent is the pool's own conductor, measured as "before"; a
    # first candidate that does not beat it is registered but never promoted (issue #18).
    assert result.before_conductor == f"pool conductor (local/{tiny_base})"
    assert result.started_from == f"{tiny_base} + a new LoRA, warm-started on 1 plans"
    assert result.incumbent_accuracy == result.accuracy_before
    assert result.promoted == (result.accuracy_after > result.accuracy_before)
    assert result.adapter_uri == "models:/conductor/1"
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
    assert run.data.params["warm_start"] == "True"
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

    # Rollouts are stored, tagged with the training run.
    runs = ArtifactStore().read_pandas("runs")
    tagged = [dict(t) for t in runs["tags"] if dict(t).get("train_run") == result.run_id]
    assert len(tagged) == 4  # 1 step x batch 4

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
        train_conductor(_request(data, pool, tiny_base, warm_start=True, collect_limit=0))
    result = train_conductor(
        _request(data, pool, tiny_base, warm_start=True, max_steps=1, collect_limit=3)
    )
    runs = ArtifactStore().read_pandas("runs")
    strategies = [dict(t).get("strategy") for t in runs["tags"]]
    # Each single worker answered the three training questions once (the collection) ...
    assert strategies.count("single:oracle") == 3 and strategies.count("single:echo") == 3
    # ... and only the verified-correct runs outside the held-out two became warm-start data.
    assert result.warm_start_examples == 1
    assert result.started_from == f"{tiny_base} + a new LoRA, warm-started on 1 plans"


def test_self_sampling_rounds_run_store_and_retrain_and_each_stage_is_scored(setup, tiny_base):
    """Warm start, one round of self-sampling, no GRPO: the round's plans are sampled by the
    warm-started adapter, run, verified and stored (tagged), a second SFT follows, and with
    eval_stages every stage's conductor is evaluated on the held-out questions."""
    from prefect_conductor.flows.train_conductor import train_conductor

    data, pool, _ = setup
    evaluate_oracle = EvalRequest(
        dataset=str(data), split="train", strategy="single:oracle", pool=str(pool)
    )
    from prefect_conductor.flows.evaluate import evaluate

    evaluate(evaluate_oracle)
    result = train_conductor(
        _request(
            data,
            pool,
            tiny_base,
            warm_start=True,
            max_steps=0,
            self_sample_rounds=1,
            self_sample_questions=2,
            self_sample_k=2,
            eval_stages=True,
            eval_before=False,
        )
    )
    assert result.steps == 0
    assert [s.stage for s in result.stages] == ["warm-start", "round-1"]
    assert all(s.accuracy is not None and s.format_valid is not None for s in result.stages)
    assert result.stages[1].rollouts == 4  # 2 questions x 2 samples
    runs = ArtifactStore().read_pandas("runs")
    sampled = [r for r in runs.itertuples() if dict(r.tags).get("self_sample_round") == "1"]
    assert len(sampled) == 4
    assert sorted(dict(r.tags)["sample"] for r in sampled) == ["0", "0", "1", "1"]
    # Sampled by the warm-started adapter, not by the pool's conductor.
    assert {r.conductor_model for r in sampled} == {
        f"local/{Path(result.adapter_dir).parent}/warm-start"
    }
    # The round's SFT is redone on every verified plan stored (the oracle's here: the tiny
    # model's 16-token plans never verify), and its adapter is the one registered.
    assert not any(r.correct and r.workflow_json for r in sampled)
    assert result.stages[1].examples == result.stages[0].examples > 0
    assert Path(result.adapter_dir).name == "round-1"
    assert (Path(result.adapter_dir) / "adapter_model.safetensors").exists()
    provenance = json.loads((Path(result.adapter_dir) / "conductor.json").read_text())
    assert provenance["provenance"]["continued_from"] is None  # from the base, as the warm start
    # The final adapter is the last stage's: its eval is "after", not run a second time.
    assert result.accuracy_after == result.stages[-1].accuracy
    evals = ArtifactStore().read_pandas("runs")
    evals = {dict(t).get("eval_id") for t in evals["tags"] if "self_sample_round" not in dict(t)}
    # the oracle's, one per stage, and the incumbent's (the champion to beat): no "after"
    assert len(evals - {None}) == 1 + 2 + 1


def test_an_sft_stage_goes_on_training_the_adapter_it_is_given(setup, tiny_base, tmp_path):
    """An SFT stage given ``init_adapter`` trains that LoRA further (not a new one of the
    request's rank), and its provenance says what it continued."""
    from prefect_conductor.tasks.training import start_training_run, warm_start_train

    data, pool, _ = setup
    request = _request(data, pool, tiny_base, warm_start_epochs=3)  # warm-up: step 0 has lr 0
    run_id = start_training_run(request, {})
    example = SFT_EXAMPLE
    out = tmp_path / "adapters"
    first = warm_start_train(request, [example], out, run_id)
    other_rank = request.model_copy(update={"lora_r": 4})  # what a new LoRA would get
    second = warm_start_train(
        other_rank, [example, example], out, run_id, stage="round-1", init_adapter=first
    )
    assert second == out / "round-1"
    rank = [json.loads((d / "adapter_config.json").read_text())["r"] for d in (first, second)]
    assert rank == [request.lora_r, request.lora_r] != [4, 4]
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
    result = train_conductor(
        _request("mixed", pool, tiny_base, limit=4, max_steps=2, eval_before=False, promote=False)
    )
    assert result.steps == 2
    domain = {ex.id: ex.meta["domain"] for ex in load_dataset("mixed", split="train", limit=4)}
    runs = ArtifactStore().read_pandas("runs")
    rollouts = [
        (r.question_id, dict(r.tags)) for r in runs.itertuples() if "train_step" in dict(r.tags)
    ]
    assert len(rollouts) == 8  # 2 steps x batch 4
    assert {domain[q] for q, _ in rollouts} == set(MIXED_DOMAINS)
    assert all(
        t["train_run"] == result.run_id and t["dataset"] == "mixed" and t["split"] == "train"
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


def test_cli_bad_arguments_get_one_line_and_exit_2(tmp_path):
    proc = _cli("--batch-size", "3", "--num-generations", "2", cwd=tmp_path)
    assert proc.returncode == 2
    assert "batch_size (3) must be a multiple of num_generations (2)" in proc.stderr
    assert "Traceback" not in proc.stderr
    # No OrchRM trained in this home: one line naming what is missing and how to get it.
    proc = _cli("--orchrm-weight", "1", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
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
    proc = _cli(
        "--dataset", str(data), "--pool", str(pool), "--base", str(tiny_base),
        "--max-steps", "1", "--batch-size", "2", "--num-generations", "2",
        "--max-completion-length", "16", "--eval-limit", "1", "--no-eval-before", "--no-warm-start", "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)  # exactly one JSON document, nothing else
    assert set(result) == {
        "run_id", "steps", "wall_s", "warm_start_examples", "reward_first", "reward_last",
        "format_valid_before", "format_valid_after", "accuracy_before", "accuracy_after",
        "adapter_uri", "promoted", "incumbent_accuracy", "before_conductor", "started_from",
        "stages",
    }  # fmt: skip
    assert result["steps"] == 1 and result["accuracy_before"] is None
    # --no-eval-before: the incumbent (the pool's conductor, no champion yet) is measured
    # anyway, on the same held-out question, and labelled as what training did not start from.
    assert result["incumbent_accuracy"] is not None and result["before_conductor"] is None
    assert result["started_from"] == f"{tiny_base} + a new LoRA"
    assert result["promoted"] == (result["accuracy_after"] > result["incumbent_accuracy"])
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
    champion = warm_start_train(
        base_request, [example], setup[2] / "champ", start_training_run(base_request, {})
    )
    evaluate(
        EvalRequest(dataset=str(data), split="train", strategy="single:oracle", pool=str(pool))
    )
    warm = train_conductor(
        _request(
            data,
            pool,
            tiny_base,
            init_adapter=str(champion),
            warm_start=True,
            max_steps=0,
            eval_before=False,
            promote=False,
        )
    )
    meta = json.loads((Path(warm.adapter_dir) / "conductor.json").read_text())
    assert Path(warm.adapter_dir).name == "warm-start"
    assert meta["provenance"]["continued_from"] == str(champion)
    assert warm.started_from == f"{champion}, warm-started on 1 plans"

    sampled = train_conductor(
        _request(
            data,
            pool,
            tiny_base,
            init_adapter=str(champion),
            warm_start=False,
            max_steps=0,
            self_sample_rounds=1,
            self_sample_questions=2,
            self_sample_k=1,
            eval_before=False,
            promote=False,
        )
    )
    assert [s.stage for s in sampled.stages] == ["round-1"]
    runs = ArtifactStore().read_pandas("runs")
    mine = [r for r in runs.itertuples() if dict(r.tags).get("train_run") == sampled.run_id]
    rounds = [r for r in mine if dict(r.tags).get("self_sample_round") == "1"]
    assert len(rounds) == 2
    assert {r.conductor_model for r in rounds} == {f"local/{champion}"}
    # ... and the round's SFT starts from it too, on the store's verified plans.
    meta = json.loads((Path(sampled.adapter_dir) / "conductor.json").read_text())
    assert Path(sampled.adapter_dir).name == "round-1"
    assert meta["provenance"]["continued_from"] == str(champion)
