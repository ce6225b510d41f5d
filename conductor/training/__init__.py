"""Training the conductor: stage configs, rewards and warm-start data (TRL + PEFT).

- ``config``: ``TrainConductorRequest``/``Result``, the SFT and GRPO configs, LoRA, the
  trainable base model, the promotion rule;
- ``rewards``: GRPO rewards in TRL's contract ``f(prompts, completions, **kwargs)``;
- ``warm_start``: verified-correct stored runs turned into SFT examples.

May import anything else in ``conductor``; nothing in ``conductor`` imports it.

``from conductor.training import grpo_config`` keeps working: this package re-exports
``config``. The trainers themselves run in ``prefect_conductor.tasks.training``.
"""

from prefect_conductor.conductor.training.config import (
    LORA_TARGETS,
    TrainConductorRequest,
    TrainConductorResult,
    grpo_config,
    load_trainable_base,
    lora_config,
    on_gpu,
    sft_config,
    should_promote,
)

__all__ = [
    "LORA_TARGETS",
    "TrainConductorRequest",
    "TrainConductorResult",
    "grpo_config",
    "load_trainable_base",
    "lora_config",
    "on_gpu",
    "sft_config",
    "should_promote",
]
