"""GRPO rewards for the conductor, in TRL's contract ``f(prompts, completions, **kwargs)``.

Each returns one ``float | None`` per completion (``None``: no opinion, e.g. a rollout whose
execution crashed for reasons outside the plan), so each plugs straight into
``trl.GRPOTrainer(reward_funcs=[...])``, mixed by ``GRPOConfig.reward_weights``.

- :class:`ExecutedPlanReward` is the Conductor paper's reward (arXiv 2512.04388): 0 when the
  plan text does not parse or validate, 0.5 when it is valid but the answer is wrong, 1 when
  the answer is correct. The answer comes from *executing* the plan, through an injected
  ``execute`` callable: the training flow passes one that runs every rollout of a batch
  concurrently through the same ``orchestrate`` flow as ``conductor run`` and stores it.
- :class:`TokenCostPenalty` charges the tokens those executions spent (an optional extra).
- :func:`plan_format_reward` scores the text alone (0 or 0.5), for probes and tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefect_conductor.conductor.errors import PlanError
from prefect_conductor.conductor.plan.parse import parse_plan
from prefect_conductor.conductor.pool import Pool

__all__ = [
    "ExecutedPlanReward",
    "Rollout",
    "RolloutOutcome",
    "TokenCostPenalty",
    "completion_text",
    "plan_format_reward",
    "rollouts_of",
    "trainer_step",
]


def completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string, or a conversational list of messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence):
        return "".join(str(m.get("content") or "") for m in completion if isinstance(m, dict))
    return str(completion)


@dataclass(frozen=True)
class Rollout:
    """One sampled plan for one question, ready to execute."""

    question: str
    question_id: str
    reference: str
    kind: str
    plan_text: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RolloutOutcome:
    """What executing a rollout gave: the run's reward and what it cost."""

    reward: float | None
    format_valid: bool
    correct: bool
    tokens: int = 0
    run_id: str | None = None
    answer: str | None = None


Execute = Callable[[list[Rollout], int], list[RolloutOutcome | None]]


def _column(kwargs: dict[str, Any], name: str, n: int) -> list[Any]:
    values = kwargs.get(name)
    if values is None:
        raise ValueError(
            f"reward needs the dataset column {name!r}; the training dataset has "
            f"{sorted(k for k in kwargs if k not in ('trainer_state', 'log_extra', 'log_metric'))}"
        )
    if len(values) != n:
        raise ValueError(f"column {name!r} has {len(values)} values for {n} completions")
    return list(values)


def rollouts_of(completions: list[Any], kwargs: dict[str, Any]) -> list[Rollout]:
    """The rollouts of a batch: each completion with its row's dataset columns."""
    n = len(completions)
    questions = _column(kwargs, "question", n)
    ids = _column(kwargs, "question_id", n)
    references = _column(kwargs, "reference", n)
    kinds = _column(kwargs, "kind", n)
    metas = kwargs.get("meta") or [None] * n
    return [
        Rollout(q, i, r, k, completion_text(c), _meta(m))
        for q, i, r, k, c, m in zip(
            questions, ids, references, kinds, completions, metas, strict=True
        )
    ]


def trainer_step(kwargs: dict[str, Any]) -> int:
    """The trainer's global step, from the ``trainer_state`` TRL passes to rewards."""
    return int(getattr(kwargs.get("trainer_state"), "global_step", 0) or 0)


def _meta(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value:
        return json.loads(value)
    return {}


class ExecutedPlanReward:
    """0 / 0.5 / 1 from executing each completion's plan (the Conductor paper's reward).

    Needs the dataset columns ``question``, ``question_id``, ``reference`` and ``kind``
    (``meta``, a JSON string, is optional). ``last`` keeps the outcomes of the latest batch
    (for :class:`TokenCostPenalty`), ``samples`` every scored completion (for MLflow).

    >>> def execute(rollouts, step):
    ...     return [RolloutOutcome(1.0 if "42" in r.plan_text else 0.5, True, "42" in r.plan_text)
    ...             for r in rollouts]
    >>> reward = ExecutedPlanReward(execute)
    >>> reward(["p", "p"], ["x 42", "x 41"], question=["q", "q"], question_id=["1", "1"],
    ...        reference=["42", "42"], kind=["math", "math"])
    [1.0, 0.5]
    """

    __name__ = "plan_reward"

    def __init__(self, execute: Execute) -> None:
        self.execute = execute
        self.last: list[RolloutOutcome | None] = []
        self.samples: list[dict[str, Any]] = []

    def __call__(
        self, prompts: list[Any], completions: list[Any], **kwargs: Any
    ) -> list[float | None]:
        n = len(completions)
        rollouts = rollouts_of(completions, kwargs)
        step = trainer_step(kwargs)
        self.last = list(self.execute(rollouts, step))
        if len(self.last) != n:
            raise RuntimeError(f"execute returned {len(self.last)} outcomes for {n} rollouts")
        log_metric = kwargs.get("log_metric")
        done = [o for o in self.last if o is not None]
        if log_metric is not None and done:
            log_metric("format_valid", sum(o.format_valid for o in done) / len(done))
            log_metric("accuracy", sum(o.correct for o in done) / len(done))
        for rollout, outcome in zip(rollouts, self.last, strict=True):
            self.samples.append(
                {
                    "step": step,
                    "question": rollout.question,
                    "completion": rollout.plan_text,
                    "reward": outcome.reward if outcome else None,
                    "answer": outcome.answer if outcome else None,
                    "run_id": outcome.run_id if outcome else None,
                }
            )
        return [o.reward if o is not None else None for o in self.last]


class TokenCostPenalty:
    """Minus the tokens each executed rollout spent, per 1,000 (weight it in reward_weights).

    Reads the outcomes that ``plan_reward`` just computed, so it must come after it in
    ``reward_funcs`` (TRL calls synchronous rewards in order).
    """

    __name__ = "token_cost"

    def __init__(self, plan_reward: ExecutedPlanReward) -> None:
        self.plan_reward = plan_reward

    def __call__(
        self, prompts: list[Any], completions: list[Any], **kwargs: Any
    ) -> list[float | None]:
        last = self.plan_reward.last
        if len(last) != len(completions):
            raise RuntimeError("token_cost must follow plan_reward in reward_funcs")
        return [-o.tokens / 1000 if o is not None else None for o in last]


def plan_format_reward(pool: Pool, max_steps: int | None = None) -> Callable[..., list[float]]:
    """A text-only reward: 0.5 for a plan that parses and validates against ``pool``, else 0.

    >>> from prefect_conductor.conductor.pool import load_pool
    >>> fmt = plan_format_reward(load_pool())
    >>> fmt([], ["model_id = [1]\\nsubtasks = ['2 + 2']\\naccess_list = [[]]", "4"])
    [0.5, 0.0]
    """

    def plan_format(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        scores = []
        for c in completions:
            try:
                parse_plan(completion_text(c), pool, max_steps=max_steps)
                scores.append(0.5)
            except PlanError:
                scores.append(0.0)
        return scores

    return plan_format
