"""OrchRM (arXiv 2606.13598): a Bradley-Terry reward model learned from stored runs.

- ``reward_model.pairs``: win/lose pairs from the ``runs`` and ``steps`` tables (pure);
- ``reward_model.model``: the model (PEFT LoRA on a sequence classifier), its training
  configuration for TRL's ``RewardTrainer``, loading and batched scoring;
- ``prefect_conductor.reward_model.rewards``: the OrchRM score as a reward in TRL's contract (GRPO).
"""
