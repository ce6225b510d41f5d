"""Training the conductor (issue #8): the request, the stage configs, the trainable model.

One request (``TrainConductorRequest``, the parameters of the ``train-conductor`` flow and so
a form in the Prefect UI) and one config per stage, built here and nowhere else:

- warm start: TRL ``SFTConfig`` on verified-correct runs (``conductor.training.warm_start``);
- GRPO: TRL ``GRPOConfig``. The Conductor paper's settings (arXiv 2512.04388) are the
  defaults where they transfer: temperature 1.0, KL coefficient ``beta=0``, a cosine
  schedule. Where we depart, and why: LoRA (PEFT) instead of full fine-tuning, so the
  learning rate is 5e-5 rather than 1e-6; groups of 4 rollouts rather than 64 and plans of
  at most 128 tokens rather than 1,024, since a step costs tens of seconds on 2 CPU cores;
  the compact prompt (``prefect_conductor.conductor.plan.prompts``) for the same reason.

The trainable base is built from dequantized weights: transformers refuses to train a model
loaded with ``gguf_file=`` (it is marked GGUF-quantized), so SmolLM2 comes from the local
model's weight cache, written by the same code that serves ``local/smollm2-135m-instruct``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_conductor.conductor.plan.requests import OrchestrateRequest
from prefect_conductor.conductor.training.ledger import LedgerEntry
from prefect_conductor.conductor.training.recipe import GrpoStage, Recipe, SftSettings
from prefect_conductor.conductor.training.rewards import Rollout
from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from prefect_conductor.conductor.data.datasets import Example

__all__ = [
    "LORA_TARGETS",
    "TrainConductorRequest",
    "StageReport",
    "TrainConductorResult",
    "grpo_config",
    "load_trainable_base",
    "lora_config",
    "on_gpu",
    "rollout_request",
    "sft_config",
    "should_promote",
]

# Attention projections only: the adapter stays small enough to ship in the package
# (r=16 on SmolLM2-135M: 1.8M parameters, about 7.4 MB in fp32).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


class TrainConductorRequest(BaseModel):
    """``conductor train-conductor``: a recipe (``conductor.training.recipe``) on a pool.

    ``recipe`` is a recipe object, or a built-in name or YAML file (loaded as it is; the CLI
    applies ``--set`` first), so a deployment's parameters can say ``recipe: default``."""

    model_config = ConfigDict(extra="forbid")

    # ``| str``: the JSON schema of the deployment's form accepts a name (``recipe: grpo``);
    # the validator below always leaves a Recipe here.
    recipe: Recipe | str = Field(
        description="The stages: a built-in name (`conductor recipes`), a YAML file, or the "
        "recipe itself."
    )
    pool: str | None = Field(default=None, description="Pool YAML; empty for the local pool.")
    promote: bool = Field(default=True, description="Promote to champion if it beats it.")
    restart: bool = Field(
        default=False,
        description="Start over even if a killed training of the same recipe can resume.",
    )
    fan_out: bool = Field(
        default=False,
        description="Execute every plan (sampling, GRPO rollouts, evals) on the fleet: "
        "background task runs that any `conductor serve` on any host answers (needs a "
        "Prefect server and shared result storage, as `conductor eval --fan-out`).",
    )
    eval_concurrency: int = Field(default=16, ge=1, le=64, description="Eval questions at once.")
    rollout_concurrency: int = Field(default=16, ge=1, le=64, description="Plans run at once.")
    output_dir: str | None = Field(
        default=None, description="Where adapters go; default $CONDUCTOR_HOME/training/<run>."
    )

    overrides: list[str] = Field(
        default_factory=list,
        description="KEY=VALUE settings applied to the recipe, as `--set` (e.g. "
        "stages.grpo.max_steps=0, heldout.limit=200).",
    )

    @model_validator(mode="before")
    @classmethod
    def _load(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "recipe" not in data:
            return data
        from prefect_conductor.conductor.training.recipe import (
            RecipeError,
            apply_overrides,
            load_recipe,
            recipe_from_dict,
        )

        recipe, overrides = data["recipe"], list(data.get("overrides") or [])
        try:
            if isinstance(recipe, (str, Path)):
                recipe = load_recipe(recipe, overrides)
            elif overrides or isinstance(recipe, dict):
                raw = recipe.model_dump(mode="json") if isinstance(recipe, Recipe) else recipe
                recipe = recipe_from_dict(
                    apply_overrides(copy.deepcopy(raw), overrides, "(request)")
                )
        except RecipeError as exc:
            raise ValueError(str(exc)) from None
        return {**data, "recipe": recipe}


class StageReport(BaseModel):
    """What one stage did: questions, plans executed and right, SFT examples, its score."""

    model_config = ConfigDict(frozen=True)

    stage: str
    kind: str
    questions: int | None = None
    sampled: int | None = Field(
        default=None, description="Plans written (guided sampling: more than executed)."
    )
    rollouts: int | None = Field(default=None, description="Plans executed.")
    right: int | None = Field(default=None, description="Executed plans verified correct.")
    examples: int | None = Field(default=None, description="SFT examples.")
    steps: int | None = Field(default=None, description="Trainer steps.")
    accuracy: float | None = None
    format_valid: float | None = None
    adapter: str | None = Field(default=None, description="The adapter the stage wrote.")
    orchrm_agreement: float | None = Field(
        default=None,
        description="GRPO with reward: orchrm: how often OrchRM orders two executed rollouts "
        "as their outcomes do (0.5 is chance).",
    )


class TrainConductorResult(BaseModel):
    """What ``conductor train-conductor --json`` prints."""

    model_config = ConfigDict(frozen=True)

    run_id: str = Field(description="The MLflow run of the training.")
    recipe: str
    wall_s: float = Field(description="This command's wall time (a resumed one: since resuming).")
    accuracy_before: float | None
    accuracy_after: float | None
    format_valid_before: float | None
    format_valid_after: float | None
    adapter_uri: str
    adapter_dir: str
    model_version: str | None
    promoted: bool
    incumbent_accuracy: float | None = Field(
        default=None,
        description="Held-out accuracy of the conductor the candidate had to beat (the "
        "champion, else the pool's conductor).",
    )
    before_conductor: str | None = Field(
        default=None, description="What the 'before' accuracy measured."
    )
    started_from: str | None = Field(default=None, description="What training started from.")
    resumed_at: str | None = Field(
        default=None, description="The stage a killed training resumed at (None: a new one)."
    )
    stages: list[StageReport] = Field(default_factory=list)
    ledger: list[LedgerEntry] = Field(
        default_factory=list, description="What each stage spent (issue #40), then 'total'."
    )


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def lora_config(recipe: Recipe) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=recipe.lora_r,
        lora_alpha=recipe.lora_alpha,
        lora_dropout=0.0,
        target_modules=list(LORA_TARGETS),
        task_type="CAUSAL_LM",
    )


def _common(seed: int, output_dir: Path, run_name: str, scheduler: str) -> dict[str, Any]:
    gpu = on_gpu()
    return {
        "output_dir": str(output_dir),
        "run_name": run_name,
        "report_to": ["mlflow"],
        "logging_steps": 1,
        "save_strategy": "no",
        "seed": seed,
        # CPU: fp32 and no checkpointing (TRL on CPU); GPU: bf16.
        "use_cpu": not gpu,
        "bf16": gpu,
        "gradient_checkpointing": False,
        "lr_scheduler_type": scheduler,
        "dataloader_num_workers": 0,
    }


def sft_config(
    settings: SftSettings, seed: int, output_dir: Path, examples: int, stage: str = "warm-start"
) -> Any:
    from trl import SFTConfig

    batch = min(settings.per_device_train_batch_size, max(1, examples))
    return SFTConfig(
        **_common(seed, output_dir, stage, "cosine"),
        num_train_epochs=settings.num_train_epochs,
        per_device_train_batch_size=batch,
        learning_rate=settings.learning_rate,
        warmup_steps=2,
        max_length=1024,
        completion_only_loss=True,
    )


def grpo_config(stage: GrpoStage, seed: int, output_dir: Path, reward_weights: list[float]) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(
        **_common(seed, output_dir, stage.name, stage.lr_scheduler_type),
        max_steps=stage.max_steps,
        per_device_train_batch_size=stage.per_device_train_batch_size,
        num_generations=stage.num_generations,
        max_completion_length=stage.max_completion_length,
        learning_rate=stage.learning_rate,
        temperature=stage.temperature,
        beta=stage.beta,
        loss_type=stage.loss_type,
        reward_weights=reward_weights,
        num_iterations=1,
        shuffle_dataset=True,
        log_completions=False,
    )


def load_trainable_base(name: str) -> tuple[Any, Any]:
    """The base model (fp32, dense weights) and tokenizer that an adapter trains on."""
    from prefect_conductor.conductor.providers.local_model import load_weights

    model, tokenizer = load_weights(name)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def should_promote(candidate: float, champion: float | None) -> bool:
    """Promote only a candidate that beats the champion on the same held-out questions.

    >>> should_promote(0.7, None), should_promote(0.7, 0.7), should_promote(0.71, 0.7)
    (True, False, True)
    """
    return champion is None or candidate > champion


def rollout_request(
    pool: str | None,
    item: Example | Rollout,
    tags: dict[str, str],
    dataset: str,
    split: str,
    **fields: Any,
) -> OrchestrateRequest:
    """The ``orchestrate`` request of one plan run during training: ``item`` (a dataset
    question, or a sampled rollout with its plan) on the training ``pool``, tagged with
    ``tags`` and the dataset and split it was drawn from; ``fields`` set the rest
    (``plan_text``, ``conductor``, ``seed``, ...). An invalid plan is an error, never a
    fallback: it scores 0 and nothing runs.

    >>> rollout = Rollout("What is 2 + 3?", "q1", "5", "math", "plan text")
    >>> r = rollout_request(None, rollout, {"rollout": "0"}, "mixed", "train", plan_text="p")
    >>> r.question_id, r.plan_text, r.on_invalid_plan, r.tags["split"]
    ('q1', 'p', 'error', 'train')
    """
    return OrchestrateRequest(
        question=item.question,
        pool=pool,
        question_id=item.question_id if isinstance(item, Rollout) else item.id,
        reference=item.reference,
        kind=item.kind,  # type: ignore[arg-type]  # a rollout's kind is a plain str
        meta=item.meta,
        on_invalid_plan=fields.pop("on_invalid_plan", "error"),
        tags={**tags, "dataset": dataset, "split": split},
        **fields,
    )
