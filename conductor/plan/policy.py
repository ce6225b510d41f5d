"""The conductor policy: given a question and the pool, write the plan text.

``ConductorPolicy`` is the one-method interface; ``LiteLLMPolicy`` prompts any litellm model
(the embedded default is SmolLM2 on the CPU). The GRPO issue adds a local model with a LoRA
adapter behind the same interface, using the same prompt from ``conductor.plan.prompts``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from prefect_conductor.conductor.plan.prompts import conductor_messages
from prefect_conductor.conductor.pool import Pool
from prefect_conductor.conductor.providers.llm import Completion, complete

__all__ = ["ConductorPolicy", "LiteLLMPolicy"]


@runtime_checkable
class ConductorPolicy(Protocol):
    def write_plan(self, question: str, pool: Pool) -> Completion:
        """Return the raw plan text (with its usage) for ``question``."""
        ...


class LiteLLMPolicy:
    """Prompts the pool's conductor model through litellm."""

    def __init__(self, max_steps: int | None = None):
        self.max_steps = max_steps

    def write_plan(self, question: str, pool: Pool) -> Completion:
        return complete(pool.conductor, conductor_messages(question, pool, self.max_steps))
