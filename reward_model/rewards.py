"""OrchRM as a GRPO reward, in TRL's contract ``f(prompts, completions, **kwargs)``.

The score of a completion is OrchRM's score of the plan it writes (scored before execution,
as in best-of-n-plan): parsed and validated against the pool when it parses, else its raw
text, which OrchRM learned to rank below valid plans (``valid-over-invalid`` pairs). Mixed
with the executed-plan reward through GRPO's ``reward_weights`` (``--orchrm-weight``).
"""

from __future__ import annotations

from typing import Any

from prefect_conductor.conductor.adapters import Download
from prefect_conductor.conductor.errors import PlanError
from prefect_conductor.conductor.plan.parse import parse_plan
from prefect_conductor.conductor.plan.prompts import describe_workers
from prefect_conductor.conductor.pool import Pool
from prefect_conductor.conductor.training.rewards import completion_text
from prefect_conductor.reward_model.model import load_reward_model

__all__ = ["OrchRMReward"]


class OrchRMReward:
    """Scores each completion's plan with OrchRM (``rm``: a directory, or ``models:/…`` with
    the task layer's ``download``). A plain TRL reward function once built; no process-wide
    default instance (issue #39)."""

    __name__ = "orchrm"

    def __init__(self, rm: str, pool: Pool, download: Download | None = None):
        self.rm = rm
        self.pool = pool
        # Fails now, in one line, if it does not exist.
        self._model = load_reward_model(rm, download)

    def _plan(self, text: str) -> dict[str, Any] | str:
        try:
            return parse_plan(text, self.pool).to_lists()
        except PlanError:
            return text

    def __call__(
        self, prompts: list[Any], completions: list[Any], **kwargs: Any
    ) -> list[float | None]:
        questions = kwargs.get("question")
        if questions is None or len(questions) != len(completions):
            raise ValueError("OrchRMReward needs the dataset's `question` column")
        scores: list[float | None] = []
        workers = describe_workers(self.pool)
        for question, completion in zip(questions, completions, strict=True):
            plan = self._plan(completion_text(completion))
            scores.extend(self._model.score(question, [plan], pool_description=workers))
        return scores
