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

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from prefect_conductor.conductor.plan.requests import OrchestrateRequest
from prefect_conductor.conductor.training.rewards import Rollout
from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:
    from prefect_conductor.conductor.data.datasets import Example

__all__ = [
    "LORA_TARGETS",
    "TrainConductorRequest",
    "StageScore",
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
    """``conductor train-conductor``: warm start (optional), GRPO, evaluation, registry."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(default="arithmetic", description="Training questions (name or file).")
    split: str = Field(default="train", description="Split the rollouts are drawn from.")
    limit: int | None = Field(default=None, ge=1, description="First N training questions.")
    eval_split: str = Field(default="test", description="Held-out split: before/after eval.")
    eval_limit: int | None = Field(
        default=50, ge=1, description="Held-out questions evaluated before and after."
    )
    eval_before: bool = Field(default=True, description="Evaluate the starting conductor.")
    eval_concurrency: int = Field(default=16, ge=1, le=64, description="Eval questions at once.")
    pool: str | None = Field(default=None, description="Pool YAML; empty for the local pool.")
    base: str = Field(
        default="smollm2-135m-instruct",
        description="Local model the adapter trains on: smollm2-135m-instruct or an HF dir.",
    )
    init_adapter: str | None = Field(
        default=None, description="Continue from this conductor (directory or models:/…)."
    )
    prompt: Literal["full", "compact"] = Field(
        default="compact", description="Prompt style trained with and served with."
    )
    warm_start: bool = Field(default=True, description="SFT on verified-correct runs first.")
    warm_start_examples: int = Field(
        default=160,
        ge=1,
        description="At most this many verified-correct plans (a seeded draw, balanced over "
        "the workers the plans use).",
    )
    collect_limit: int = Field(
        default=100,
        ge=0,
        description="When the store holds no verified-correct run for the warm start: first "
        "run each single worker on this many training questions (0: never collect).",
    )
    warm_start_epochs: float = Field(default=2.0, gt=0, description="SFT epochs.")
    warm_start_lr: float = Field(default=1e-3, gt=0, description="SFT learning rate.")
    warm_start_batch_size: int = Field(default=4, ge=1, description="SFT examples per step.")
    self_sample_rounds: int = Field(
        default=1,
        ge=0,
        description="Rounds of verified self-sampling after the warm start: the conductor "
        "samples plans at `temperature` on fresh training questions, every plan runs and is "
        "verified, and the SFT is redone on the store's verified-correct plans.",
    )
    self_sample_questions: int = Field(
        default=100, ge=1, description="Training questions per self-sampling round."
    )
    self_sample_k: int = Field(default=4, ge=1, le=16, description="Plans sampled per question.")
    self_sample_temperature: float | None = Field(
        default=None,
        gt=0,
        description="Sampling temperature of the self-sampling rounds (None: `temperature`, "
        "the GRPO one). Lower keeps more plans right once the conductor is partly trained.",
    )
    self_sample_hints: str | None = Field(
        default=None,
        description="Worked examples the conductor reads while it self-samples, never in a "
        "training prompt: a YAML file or a built-in name (word-problems); see "
        "conductor/training/hints.py.",
    )
    eval_stages: bool = Field(
        default=False,
        description="Also evaluate every intermediate conductor (warm start, each round) on "
        "the held-out questions, to see which stage mattered.",
    )
    max_steps: int = Field(default=24, ge=0, description="GRPO steps (0: no GRPO stage).")
    num_generations: int = Field(default=4, ge=2, description="Rollouts per question (G).")
    batch_size: int = Field(
        default=4, ge=2, description="Rollouts per step (a multiple of num_generations)."
    )
    max_completion_length: int = Field(
        default=192,
        ge=16,
        description="Plan tokens at most (a program copied into a subtask needs ~120).",
    )
    learning_rate: float = Field(default=5e-5, gt=0, description="GRPO learning rate.")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature (paper).")
    beta: float = Field(default=0.0, ge=0, description="KL coefficient (paper: 0).")
    loss_type: str = Field(default="grpo", description="TRL loss_type: grpo, dapo, dr_grpo, …")
    lr_scheduler_type: str = Field(default="cosine", description="Paper: cosine.")
    lora_r: int = Field(default=16, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(default=32, ge=1, description="LoRA alpha.")
    token_penalty_weight: float = Field(
        default=0.0, ge=0, description="Weight of minus tokens/1k spent by the executed plan."
    )
    orchrm_weight: float = Field(
        default=0.0, ge=0, description="Weight of the OrchRM score of each plan (0: unused)."
    )
    orchrm: str | None = Field(
        default=None,
        description="The OrchRM of orchrm_weight: a directory or models:/orchrm@champion "
        "(the default).",
    )
    rollout_concurrency: int = Field(default=16, ge=1, le=64, description="Rollouts at once.")
    fan_out: bool = Field(
        default=False,
        description="Execute every plan (self-sampling, GRPO rollouts, evals) on the fleet: "
        "background task runs that any `conductor serve` on any host answers (needs a "
        "Prefect server and shared result storage, as `conductor eval --fan-out`).",
    )
    seed: int = Field(default=0, description="Seed of data order, sampling and the dataset.")
    output_dir: str | None = Field(
        default=None, description="Where adapters go; default $CONDUCTOR_HOME/training/<run>."
    )
    promote: bool = Field(default=True, description="Promote to champion if it beats it.")

    @field_validator("batch_size")
    @classmethod
    def _multiple(cls, v: int, info: Any) -> int:
        g = info.data.get("num_generations", 4)
        if v % g:
            raise ValueError(f"batch_size ({v}) must be a multiple of num_generations ({g})")
        return v


class StageScore(BaseModel):
    """One stage's conductor on the held-out questions."""

    model_config = ConfigDict(frozen=True)

    stage: str
    examples: int | None = Field(default=None, description="SFT examples of this stage.")
    rollouts: int | None = Field(default=None, description="Plans executed by this stage.")
    accuracy: float | None = None
    format_valid: float | None = None


class TrainConductorResult(BaseModel):
    """What ``conductor train-conductor --json`` prints."""

    model_config = ConfigDict(frozen=True)

    run_id: str = Field(description="The MLflow run of the training.")
    steps: int
    wall_s: float
    warm_start_examples: int | None
    reward_first: float | None
    reward_last: float | None
    format_valid_before: float | None
    format_valid_after: float | None
    accuracy_before: float | None
    accuracy_after: float | None
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
    stages: list[StageScore] = Field(
        default_factory=list,
        description="Each stage's conductor on the held-out questions (with eval_stages).",
    )


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def lora_config(request: TrainConductorRequest) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=request.lora_r,
        lora_alpha=request.lora_alpha,
        lora_dropout=0.0,
        target_modules=list(LORA_TARGETS),
        task_type="CAUSAL_LM",
    )


def _common(request: TrainConductorRequest, output_dir: Path, run_name: str) -> dict[str, Any]:
    gpu = on_gpu()
    return {
        "output_dir": str(output_dir),
        "run_name": run_name,
        "report_to": ["mlflow"],
        "logging_steps": 1,
        "save_strategy": "no",
        "seed": request.seed,
        # CPU: fp32 and no checkpointing (TRL on CPU); GPU: bf16.
        "use_cpu": not gpu,
        "bf16": gpu,
        "gradient_checkpointing": False,
        "lr_scheduler_type": request.lr_scheduler_type,
        "dataloader_num_workers": 0,
    }


def sft_config(
    request: TrainConductorRequest, output_dir: Path, examples: int, stage: str = "warm-start"
) -> Any:
    from trl import SFTConfig

    batch = min(request.warm_start_batch_size, max(1, examples))
    return SFTConfig(
        **_common(request, output_dir, stage),
        num_train_epochs=request.warm_start_epochs,
        per_device_train_batch_size=batch,
        learning_rate=request.warm_start_lr,
        warmup_steps=2,
        max_length=1024,
        completion_only_loss=True,
    )


def grpo_config(
    request: TrainConductorRequest, output_dir: Path, reward_weights: list[float]
) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(
        **_common(request, output_dir, "grpo"),
        max_steps=request.max_steps,
        per_device_train_batch_size=request.batch_size,
        num_generations=request.num_generations,
        max_completion_length=request.max_completion_length,
        learning_rate=request.learning_rate,
        temperature=request.temperature,
        beta=request.beta,
        loss_type=request.loss_type,
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
    request: TrainConductorRequest, item: Example | Rollout, tags: dict[str, str], **fields: Any
) -> OrchestrateRequest:
    """The ``orchestrate`` request of one plan run during training: ``item`` (a dataset
    question, or a sampled rollout with its plan) on the training pool, tagged with ``tags``
    and the dataset and split it was drawn from; ``fields`` set the rest (``plan_text``,
    ``conductor``, ``seed``, ...). An invalid plan is an error, never a fallback: it scores 0
    and nothing runs.

    >>> rollout = Rollout("What is 2 + 3?", "q1", "5", "math", "plan text")
    >>> r = rollout_request(TrainConductorRequest(), rollout, {"rollout": "0"}, plan_text="p")
    >>> r.question_id, r.plan_text, r.on_invalid_plan, r.tags["split"]
    ('q1', 'p', 'error', 'train')
    """
    return OrchestrateRequest(
        question=item.question,
        pool=request.pool,
        question_id=item.question_id if isinstance(item, Rollout) else item.id,
        reference=item.reference,
        kind=item.kind,  # type: ignore[arg-type]  # a rollout's kind is a plain str
        meta=item.meta,
        on_invalid_plan="error",
        tags={**tags, "dataset": request.dataset, "split": request.split},
        **fields,
    )
