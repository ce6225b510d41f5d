"""Training tasks for the conductor (issue #8): warm start, GRPO, the MLflow registry.

Each stage is one Prefect task and one MLflow run nested under the training run, in
experiment ``train/conductor``; TRL's own MLflow callback (``report_to="mlflow"``) logs the
stage's curves into it (loss, reward, reward std, completion length, the rewards' own
``format_valid`` and ``accuracy``). The adapters are PEFT directories with
``conductor.json`` (``conductor.adapters``), so serving loads exactly what was trained.

A tracking server that is down (issue #19): every MLflow write here, TRL's callback included,
runs under ``tasks.tracking.tracking_server``, so it waits ``CONDUCTOR_MLFLOW_RETRY_S`` for
the server and then fails in one line; the tasks that retry do not retry that failure
(``retry_unless_unreachable``), which would wait the window again each time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect_conductor.conductor.adapters import write_adapter_meta
from prefect_conductor.conductor.data.datasets import Example
from prefect_conductor.conductor.plan.prompts import conductor_messages
from prefect_conductor.conductor.pool import Pool
from prefect_conductor.conductor.training.config import (
    TrainConductorRequest,
    grpo_config,
    load_trainable_base,
    lora_config,
    sft_config,
    should_promote,
)
from prefect_conductor.conductor.training.ledger import LEDGER_FIELDS, LedgerEntry
from prefect_conductor.conductor.training.recipe import GrpoStage, Recipe, SftSettings
from prefect_conductor.conductor.training.rewards import ExecutedPlanReward, TokenCostPenalty
from prefect_conductor.tasks.tracking import (
    finish_run,
    mlflow_experiment,
    model_version_by_alias,
    open_run,
    register_version,
    retry_unless_unreachable,
    tracking_server,
    tracking_uri,
)

__all__ = [
    "EXPERIMENT",
    "MODEL_NAME",
    "GrpoOutcome",
    "champion_exists",
    "champion_needs_eval",
    "finish_training_run",
    "grpo_train",
    "log_stage",
    "register_conductor",
    "resume_training_run",
    "start_training_run",
    "use_all_cores",
    "warm_start_train",
]

EXPERIMENT = "train/conductor"
MODEL_NAME = "conductor"

if TYPE_CHECKING:
    from prefect_conductor.reward_model.rewards import CheckedOrchRMReward


def _mlflow() -> Any:
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    return mlflow


def use_all_cores() -> None:
    # The local provider leaves a core for Prefect's engine (torch_threads); a training
    # step is one big computation and wants every core.
    import os

    import torch

    if not os.environ.get("OMP_NUM_THREADS") and not torch.cuda.is_available():
        torch.set_num_threads(len(os.sched_getaffinity(0)))


@task(
    cache_policy=NO_CACHE,
    name="start-training-run",
    retries=2,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_unreachable,
)
def start_training_run(request: TrainConductorRequest, tags: dict[str, str]) -> str:
    """Open the MLflow run of this training (experiment ``train/conductor``): the recipe's
    top-level settings as params, the whole recipe (as it runs) as ``recipe.yaml``."""
    recipe = request.recipe
    params = {
        **recipe.model_dump(exclude={"stages", "heldout", "description"}),
        "recipe": recipe.name,
        "stages": ",".join(s.name for s in recipe.stages),
        "heldout": f"{recipe.heldout.dataset or recipe.dataset}/{recipe.heldout.split}/"
        f"{recipe.heldout.limit}",
        "pool": request.pool,
        "promote": request.promote,
        "fan_out": request.fan_out,
    }
    run_id = open_run(EXPERIMENT, f"train-conductor · {recipe.name}", params, tags)
    with tracking_server("log the recipe"):
        _mlflow().MlflowClient().log_text(run_id, recipe.to_yaml(), "recipe.yaml")
    return run_id


@task(
    cache_policy=NO_CACHE,
    name="resume-training-run",
    retries=2,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_unreachable,
)
def resume_training_run(run_id: str) -> None:
    """Mark the MLflow run of a killed training running again: it goes on in the same run.
    The stage runs the kill left RUNNING (an SFT or GRPO stage mid-way) end as KILLED: the
    resumed stage opens a new one."""
    with tracking_server(f"resume run {run_id}"):
        client = _mlflow().MlflowClient()
        run = client.get_run(run_id)
        orphans = client.search_runs(
            [run.info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{run_id}' and attributes.status = 'RUNNING'",
        )
        for orphan in orphans:
            client.set_terminated(orphan.info.run_id, status="KILLED")
        client.update_run(run_id, status="RUNNING")


@task(
    cache_policy=NO_CACHE,
    name="log-ledger",
    retries=2,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_unreachable,
)
def log_stage(run_id: str, entry: LedgerEntry, step: int, scores: dict[str, float | None]) -> None:
    """A stage's ledger (``ledger/<field>`` at step ``step``, and ``<stage>/<field>``) and
    its scores, as metrics of the training run."""
    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    values = {f: getattr(entry, f) for f in LEDGER_FIELDS}
    metrics = [Metric(f"{entry.stage}/{k}", float(v), stamp, 0) for k, v in values.items()]
    metrics += [Metric(f"ledger/{k}", float(v), stamp, step) for k, v in values.items()]
    metrics += [
        Metric(f"{entry.stage}/{k}", float(v), stamp, 0) for k, v in scores.items() if v is not None
    ]
    with tracking_server(f"log stage {entry.stage}"):
        _mlflow().MlflowClient().log_batch(run_id, metrics=metrics)


@task(
    cache_policy=NO_CACHE,
    name="finish-training-run",
    retries=2,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_unreachable,
)
def finish_training_run(run_id: str, metrics: dict[str, float | None], status: str) -> None:
    finish_run(run_id, status, metrics)


def _stage_run(mlflow: Any, stage: str, parent_run_id: str) -> Any:
    """The MLflow run of one stage, nested under the training run; TRL's callback logs into
    the active run, so the trainer's curves land here."""
    return mlflow.start_run(
        experiment_id=mlflow_experiment(mlflow, EXPERIMENT),
        run_name=stage,
        nested=True,
        parent_run_id=parent_run_id,
        tags={"stage": stage},
    )


def _save_adapter(model: Any, directory: Path, recipe: Recipe, **prov: Any) -> None:
    prov = {"recipe": recipe.name, **prov}
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory))
    # PEFT records the base as the local path it was loaded from; the name is portable.
    config = directory / "adapter_config.json"
    data = json.loads(config.read_text())
    data["base_model_name_or_path"] = recipe.base
    config.write_text(json.dumps(data, indent=2) + "\n")
    write_adapter_meta(directory, recipe.base, recipe.prompt, provenance=prov)


@task(cache_policy=NO_CACHE, name="warm-start", task_run_name="{stage} · SFT")
def warm_start_train(
    recipe: Recipe,
    settings: SftSettings,
    examples: list[dict[str, Any]],
    output_dir: Path,
    parent_run_id: str,
    stage: str = "warm-start",
    init_adapter: Path | None = None,
) -> tuple[Path, int]:
    """TRL ``SFTTrainer`` on verified-correct plans; returns the adapter directory
    ``output_dir/stage`` and the trainer's steps. Without ``init_adapter`` it trains a new
    LoRA on the base model; with one (the recipe's start, or the previous stage's adapter)
    it trains that LoRA further (``SftSettings.init``: from the same start each round is
    expert iteration; from the previous adapter it is cheaper and keeps earlier rounds)."""
    from datasets import Dataset
    from peft import PeftModel
    from trl import SFTTrainer

    use_all_cores()
    mlflow = _mlflow()
    model, tokenizer = load_trainable_base(recipe.base)
    peft_config = None
    if init_adapter is not None:
        model = PeftModel.from_pretrained(model, str(init_adapter), is_trainable=True)
    else:
        peft_config = lora_config(recipe)
    rows = [{"prompt": e["prompt"], "completion": e["completion"]} for e in examples]
    trainer = SFTTrainer(
        model=model,
        args=sft_config(settings, recipe.seed, output_dir / "sft", len(rows), stage),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    started = time.perf_counter()
    # TRL's callback logs the curves during train(): a server lost then is one line too.
    with tracking_server(f"log stage {stage}"), _stage_run(mlflow, stage, parent_run_id):
        mlflow.log_param("warm_start_examples", len(rows))
        result = trainer.train()
        mlflow.log_metric("stage_wall_s", time.perf_counter() - started)
    target = output_dir / stage
    _save_adapter(
        trainer.model,
        target,
        recipe,
        stage=stage,
        examples=len(rows),
        steps=result.global_step,
        mlflow_run=parent_run_id,
        continued_from=str(init_adapter) if init_adapter else None,
    )
    get_run_logger().info(
        "%s: %d examples, %d steps, loss %.3f -> %s",
        stage,
        len(rows),
        result.global_step,
        result.training_loss,
        target,
    )
    return target, result.global_step


@dataclass
class GrpoOutcome:
    adapter_dir: Path
    steps: int
    wall_s: float
    rollouts: int
    rewards: list[float] = field(default_factory=list)  # mean plan reward per step


def _grpo_rows(examples: list[Example], pool: Pool) -> list[dict[str, Any]]:
    return [
        {
            "prompt": conductor_messages(e.question, pool),
            "question": e.question,
            "question_id": e.id,
            "reference": e.reference,  # for the verifier inside the reward, never a target
            "kind": e.kind,
            "meta": json.dumps(e.meta),
        }
        for e in examples
    ]


@task(cache_policy=NO_CACHE, name="grpo", task_run_name="{stage.name} · GRPO")
def grpo_train(
    recipe: Recipe,
    stage: GrpoStage,
    pool: Pool,
    examples: list[Example],
    init_adapter: Path | None,
    plan_reward: ExecutedPlanReward | CheckedOrchRMReward,
    output_dir: Path,
    parent_run_id: str,
) -> GrpoOutcome:
    """TRL ``GRPOTrainer`` + LoRA. ``plan_reward`` executes every rollout's plan
    (``reward: executed``) or scores it with OrchRM and executes a fraction to check it
    (``reward: orchrm``)."""
    from datasets import Dataset
    from peft import PeftModel
    from trl import GRPOTrainer

    use_all_cores()
    mlflow = _mlflow()
    model, tokenizer = load_trainable_base(recipe.base)
    peft_config = None
    if init_adapter is not None:
        model = PeftModel.from_pretrained(model, str(init_adapter), is_trainable=True)
    else:
        peft_config = lora_config(recipe)
    reward_funcs: list[Any] = [plan_reward]
    weights = [stage.reward_weights["plan"]]
    if stage.reward_weights.get("token_cost"):  # the recipe allows it with reward: executed
        assert isinstance(plan_reward, ExecutedPlanReward)
        reward_funcs.append(TokenCostPenalty(plan_reward))
        weights.append(stage.reward_weights["token_cost"])
    if stage.reward_weights.get("orchrm"):
        from prefect_conductor.reward_model.model import CHAMPION
        from prefect_conductor.reward_model.rewards import OrchRMReward
        from prefect_conductor.tasks.registry import download_registered

        reward_funcs.append(OrchRMReward(stage.orchrm or CHAMPION, pool, download_registered))
        weights.append(stage.reward_weights["orchrm"])
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=grpo_config(stage, recipe.seed, output_dir / stage.name, weights),
        train_dataset=Dataset.from_list(_grpo_rows(examples, pool)),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    started = time.perf_counter()
    with tracking_server(f"log stage {stage.name}"), _stage_run(mlflow, stage.name, parent_run_id):
        result = trainer.train()
        wall = time.perf_counter() - started
        mlflow.log_metric("stage_wall_s", wall)
        mlflow.log_metric("rollouts_per_s", len(plan_reward.samples) / wall)
        mlflow.log_metric("steps_per_s", result.global_step / wall)
        if plan_reward.samples:
            table = {k: [s[k] for s in plan_reward.samples] for k in plan_reward.samples[0]}
            mlflow.log_table(table, artifact_file="sampled_completions.json")
    per_step: dict[int, list[float]] = {}
    for s in plan_reward.samples:
        if s["reward"] is not None:
            per_step.setdefault(s["step"], []).append(s["reward"])
    rewards = [sum(v) / len(v) for _, v in sorted(per_step.items())]
    target = output_dir / stage.name
    _save_adapter(
        trainer.model,
        target,
        recipe,
        stage=stage.name,
        steps=result.global_step,
        warm_start=str(init_adapter) if init_adapter else None,
        mlflow_run=parent_run_id,
        wall_s=round(wall, 1),
    )
    return GrpoOutcome(target, result.global_step, wall, len(plan_reward.samples), rewards)


@dataclass(frozen=True)
class Registration:
    version: str
    champion_accuracy: float | None
    promoted: bool


def _champion_accuracy(client: Any, signature: str) -> tuple[bool, float | None]:
    """(a champion exists, its held-out accuracy on ``signature``'s questions, if known)."""
    champion = model_version_by_alias(client, MODEL_NAME, "champion")
    if champion is None:
        return False, None
    if champion.tags.get("heldout") != signature:
        return True, None
    return True, float(champion.tags["heldout_accuracy"])


@task(
    cache_policy=NO_CACHE,
    name="register-conductor",
    retries=2,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_unreachable,
)
def register_conductor(
    run_id: str,
    adapter_dir: Path,
    accuracy: float,
    signature: str,
    promote: bool,
    champion_accuracy: float | None = None,
) -> Registration:
    """Log the adapter, register it as ``conductor`` (alias ``candidate``), and promote it
    to ``champion`` only if it beats the incumbent on the same held-out questions.

    ``champion_accuracy`` is the incumbent's accuracy measured in this training run: the
    champion's, when its recorded accuracy was on other questions (``signature`` differs),
    or, while the registry has no champion, the accuracy of the conductor the pool would
    otherwise keep using. Without a figure to beat, nothing is promoted.
    """
    client = _mlflow().MlflowClient()
    exists, recorded = _champion_accuracy(client, signature)
    if champion_accuracy is None:
        champion_accuracy = recorded
    version = register_version(
        client,
        run_id,
        adapter_dir,
        MODEL_NAME,
        "adapter",
        {"heldout": signature, "heldout_accuracy": f"{accuracy:.6f}"},
    )
    # Never promote over an incumbent we could not compare against (issue #18).
    promoted = promote and champion_accuracy is not None
    promoted = promoted and should_promote(accuracy, champion_accuracy)
    if promoted:
        with tracking_server(f"promote {MODEL_NAME} version {version.version} to champion"):
            client.set_registered_model_alias(MODEL_NAME, "champion", version.version)
    return Registration(str(version.version), champion_accuracy, promoted)


def champion_exists() -> bool:
    """Whether the registry has a ``conductor@champion``."""
    return _champion_accuracy(_mlflow().MlflowClient(), "")[0]


def champion_needs_eval(signature: str) -> str | None:
    """``models:/conductor@champion`` if a champion exists whose accuracy on ``signature``'s
    questions is unknown (so the flow must evaluate it), else None."""
    client = _mlflow().MlflowClient()
    exists, recorded = _champion_accuracy(client, signature)
    return f"models:/{MODEL_NAME}@champion" if exists and recorded is None else None
