"""The OrchRM model: a sequence classifier with one output, LoRA through PEFT, scored in batches.

OrchRM (arXiv 2606.13598) scores a plan, optionally with its step outputs, for a question.
Here the backbone is a local causal LM loaded as ``AutoModelForSequenceClassification``
with ``num_labels=1`` (SmolLM2-135M from the local model's dense weight cache by default, or
any HF model directory). Training is TRL's ``RewardTrainer`` (the Bradley-Terry loss,
``center_rewards_coefficient`` exposed); this module builds its model, PEFT config and
``RewardConfig`` and nothing trains by hand.

On 2 CPU cores a training step costs what its backward pass costs, so LoRA goes on the top
``lora_layers`` transformer layers only: gradients then stop there, and a step is about as
cheap as a forward pass. The score head is trained in full (``modules_to_save``).

A trained model is a directory: PEFT's files (adapter and score head) plus ``orchrm.json``
(the base, the token budget of a document, provenance). :func:`load_reward_model` takes
such a directory or a registry URI (``models:/orchrm@champion``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect_conductor.conductor.adapters import Download
from prefect_conductor.conductor.errors import ConductorError
from prefect_conductor.conductor.plan.workflow import Workflow
from prefect_conductor.reward_model.documents import plan_document, raw_plan_document, reward_input
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CHAMPION",
    "MODEL_NAME",
    "RM_META",
    "OrchRM",
    "RewardModelError",
    "RewardModelRequest",
    "RewardModelResult",
    "load_backbone",
    "load_reward_model",
    "lora_config",
    "reward_config",
    "write_rm_meta",
]

MODEL_NAME = "orchrm"
CHAMPION = f"models:/{MODEL_NAME}@champion"
RM_META = "orchrm.json"
DEFAULT_BASE = "smollm2-135m-instruct"


class RewardModelError(ConductorError):
    """A reward model that cannot be found, loaded or trained (one line, no traceback)."""


class RewardModelRequest(BaseModel):
    """``conductor train-rm``: build pairs from the store, train, evaluate, register."""

    model_config = ConfigDict(extra="forbid")

    since: str | None = Field(
        default=None,
        description="Only runs created at or after this date (ISO); default: every run.",
    )
    new_since: str | None = Field(
        default=None,
        description="Count as new only the pairs with a run created at or after this date "
        "(ISO); pairs are still built from every run `since` admits, and trained on. Default: "
        "new = not yet in the pairs table.",
    )
    split: str | None = Field(
        default=None,
        description="Only runs tagged with this dataset split (e.g. train, so that the test "
        "questions stay unseen); default: every run.",
    )
    min_pairs: int = Field(
        default=64, ge=1, description="Train only if at least this many new pairs exist."
    )
    max_steps: int = Field(default=120, ge=1, description="RewardTrainer steps.")
    base: str = Field(
        default=DEFAULT_BASE,
        description="Backbone: smollm2-135m-instruct or an HF model directory.",
    )
    batch_size: int = Field(default=8, ge=1, description="Pairs per step.")
    learning_rate: float = Field(default=3e-4, gt=0)
    lora_r: int = Field(default=16, ge=1)
    lora_alpha: int = Field(default=32, ge=1)
    lora_layers: int = Field(
        default=8, ge=1, description="LoRA on the top N transformer layers (cheap backward)."
    )
    center_rewards_coefficient: float | None = Field(
        default=0.01, ge=0, description="TRL: pushes scores towards mean zero."
    )
    max_tokens: int = Field(default=192, ge=16, description="Token budget of one document.")
    max_per_question: int = Field(default=16, ge=1, description="Pairs per question and source.")
    test_fraction: float = Field(default=0.2, gt=0, lt=1, description="Held-out questions.")
    seed: int = 0
    pool: str | None = Field(default=None, description="Pool YAML; empty for the local pool.")
    artifacts: str | None = Field(default=None, description="Artifact store; default home.")
    output_dir: str | None = Field(
        default=None, description="Where the model goes; default $CONDUCTOR_HOME/training/<run>."
    )
    promote: bool = Field(default=True, description="Promote to champion if it beats it.")


def _on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _backbone_dir(base: str) -> Path:
    """A directory with the base's dense weights (the local cache for SmolLM2)."""
    from prefect_conductor.conductor.home import model_cache_dir
    from prefect_conductor.conductor.providers.local_model import SMOLLM2, load_weights

    if base == SMOLLM2:
        load_weights(SMOLLM2)  # writes the dense cache once (the GGUF cannot be trained)
        return model_cache_dir() / SMOLLM2
    path = Path(base).expanduser()
    if not (path / "config.json").is_file():
        raise RewardModelError(
            f"unknown reward-model base {base!r}: expected {SMOLLM2!r} or an HF model directory"
        )
    return path


def load_backbone(base: str) -> tuple[Any, Any]:
    """``AutoModelForSequenceClassification`` (one label, fp32) and its tokenizer."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = _backbone_dir(base)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "score.weight is newly initialized": it is, on purpose
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, dtype=torch.float32
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _layer_count(model: Any) -> int:
    config = model.config.get_text_config()
    return int(config.num_hidden_layers)


def lora_config(request: RewardModelRequest, model: Any) -> Any:
    from peft import LoraConfig

    layers = _layer_count(model)
    top = list(range(max(0, layers - request.lora_layers), layers))
    return LoraConfig(
        r=request.lora_r,
        lora_alpha=request.lora_alpha,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        layers_to_transform=top,
        modules_to_save=["score"],
        task_type="SEQ_CLS",
    )


def reward_config(request: RewardModelRequest, output_dir: Path, run_name: str) -> Any:
    from trl import RewardConfig

    gpu = _on_gpu()
    return RewardConfig(
        output_dir=str(output_dir),
        run_name=run_name,
        report_to=["mlflow"],
        logging_steps=5,
        save_strategy="no",
        seed=request.seed,
        use_cpu=not gpu,
        bf16=gpu,
        gradient_checkpointing=False,
        max_steps=request.max_steps,
        per_device_train_batch_size=request.batch_size,
        learning_rate=request.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=min(5, request.max_steps // 10),
        center_rewards_coefficient=request.center_rewards_coefficient,
        max_length=2 * request.max_tokens + 256,  # prompt + document; longer pairs are dropped
        dataloader_num_workers=0,
        disable_tqdm=False,
    )


def write_rm_meta(path: Path, *, base: str, max_tokens: int, provenance: dict[str, Any]) -> None:
    meta = {"base": base, "max_tokens": max_tokens, "provenance": provenance}
    (path / RM_META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


PlanLike = Workflow | dict[str, Any] | str
StepOutputs = Sequence[tuple[str, str | None]]


def document(plan: PlanLike, outputs: StepOutputs | None = None) -> str:
    """The text a plan is scored on: the same function builds the training pairs."""
    if isinstance(plan, Workflow):
        plan = plan.to_lists()
    if isinstance(plan, str):
        return raw_plan_document(plan)
    return plan_document(plan, outputs)


@dataclass
class OrchRM:
    """A loaded reward model. :meth:`score` is deterministic and batched."""

    model: Any
    tokenizer: Any
    max_tokens: int
    source: str
    batch_size: int = 16

    def __post_init__(self) -> None:
        self.model.eval()
        self._lock = threading.Lock()

    def _texts(self, question: str, pool_description: str, docs: list[str]) -> list[str]:
        prompt = reward_input(question, pool_description)
        eos = self.tokenizer.eos_token or ""
        out = []
        for doc in docs:
            ids = self.tokenizer(doc, add_special_tokens=False)["input_ids"]
            if len(ids) > self.max_tokens:  # the training budget (pairs were cut the same way)
                doc = self.tokenizer.decode(ids[: self.max_tokens])
            out.append(prompt + doc + eos)
        return out

    def score_texts(self, texts: list[str]) -> list[float]:
        """Scores of full texts (prompt + document + EOS, as RewardTrainer tokenizes them)."""
        import torch

        scores: list[float] = []
        with self._lock, torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(
                    texts[i : i + self.batch_size],
                    return_tensors="pt",
                    padding=True,
                    add_special_tokens=True,
                ).to(self.model.device)
                logits = self.model(**batch).logits.squeeze(-1).float()
                scores.extend(float(x) for x in logits.tolist())
        return scores

    def score(
        self,
        question: str,
        plans: Sequence[PlanLike],
        step_outputs: Sequence[StepOutputs | None] | None = None,
        *,
        pool_description: str | None = None,
    ) -> list[float]:
        """One score per plan (higher is better); ``step_outputs[i]`` adds plan i's outputs.

        ``pool_description`` is :func:`conductor.plan.prompts.describe_workers` of the pool the
        plans are for; default the embedded local pool's.
        """
        if pool_description is None:
            from prefect_conductor.conductor.plan.prompts import describe_workers
            from prefect_conductor.conductor.pool import load_pool

            pool_description = describe_workers(load_pool())
        outputs = list(step_outputs) if step_outputs is not None else [None] * len(plans)
        if len(outputs) != len(plans):
            raise RewardModelError(
                f"{len(plans)} plans but {len(outputs)} step-output lists: they must pair up"
            )
        docs = [document(p, o) for p, o in zip(plans, outputs, strict=True)]
        return self.score_texts(self._texts(question, pool_description, docs))


_LOADED: dict[str, OrchRM] = {}
_LOADING = threading.Lock()


def _resolve(ref: str, download: Download | None) -> Path:
    if ref.startswith("models:/"):
        from prefect_conductor.conductor.adapters import AdapterError

        if download is None:  # the registry is read by the task layer (issue #39)
            raise RewardModelError(
                f"OrchRM {ref}: a model-registry reference; load it through "
                "prefect_conductor.tasks.registry or name a model directory"
            )
        try:
            return download(ref)
        except AdapterError as exc:
            raise RewardModelError(
                f"OrchRM {exc}; train one with `conductor train-rm`, or name a model directory"
            ) from None
    path = Path(ref).expanduser().resolve()
    if not (path / RM_META).is_file():
        raise RewardModelError(f"{ref}: not an OrchRM directory (no {RM_META})")
    return path


def load_reward_model(ref: str, download: Download | None = None) -> OrchRM:
    """A directory, or ``models:/orchrm@ALIAS`` with the task layer's ``download``
    (``prefect_conductor.tasks.registry.download_registered``); loaded once per process."""
    with _LOADING:
        path = _resolve(ref, download)
        key = str(path)
        if key not in _LOADED:
            from peft import PeftModel

            meta = json.loads((path / RM_META).read_text(encoding="utf-8"))
            model, tokenizer = load_backbone(meta["base"])
            model = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
            if _on_gpu():
                model = model.to("cuda")
            _LOADED[key] = OrchRM(model, tokenizer, int(meta["max_tokens"]), source=ref)
        return _LOADED[key]


#: What the improvement loop sets itself in OrchRM's request (its window, pool, promotion).
LOOP_FIELDS = frozenset({"since", "new_since", "pool", "promote"})


def loop_settings(settings: dict[str, Any]) -> RewardModelRequest:
    """OrchRM's request from the improvement loop's ``reward_model`` settings, or one line
    naming the unknown or bad setting (``RewardModelError``)."""
    from pydantic import ValidationError

    known = set(RewardModelRequest.model_fields) - LOOP_FIELDS
    unknown = sorted(set(settings) - known)
    if unknown:
        raise RewardModelError(
            f"reward_model: unknown OrchRM setting {', '.join(unknown)} "
            f"(known: {', '.join(sorted(known))})"
        )
    try:
        return RewardModelRequest(**settings)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(map(str, err["loc"]))
        raise RewardModelError(f"reward_model.{field}: {err['msg']}") from None


class RewardModelResult(BaseModel):
    """What ``conductor train-rm --json`` prints."""

    model_config = ConfigDict(frozen=True)

    run_id: str | None = Field(description="The MLflow run; None when nothing was trained.")
    trained: bool
    message: str
    pairs_train: int
    pairs_test: int
    pairs_new: int
    pairs_by_source: dict[str, int]
    pairs_unreferenced_by_source: dict[str, int] = Field(
        default_factory=dict,
        description="Of pairs_by_source, the pairs neither of whose runs had a reference.",
    )
    pairs_new_by_source: dict[str, int] = Field(
        default_factory=dict, description="The new pairs (pairs_new), by source."
    )
    pairs_new_unreferenced_by_source: dict[str, int] = Field(
        default_factory=dict,
        description="Of pairs_new_by_source, the pairs neither of whose runs had a reference.",
    )
    pairs_truncated: int = 0
    pairs_per_1k_tokens: dict[str, float | None] = Field(default_factory=dict)
    efficiency_vs_correct_over_incorrect: float | None = None
    pairwise_accuracy: float | None = None
    pairwise_accuracy_by_source: dict[str, float] = Field(default_factory=dict)
    champion_accuracy: float | None = None
    scores_per_s: float | None = None
    train_wall_s: float | None = None
    wall_s: float
    promoted: bool = False
    model_uri: str | None = None
    model_dir: str | None = None
