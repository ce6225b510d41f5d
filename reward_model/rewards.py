"""OrchRM as a GRPO reward, in TRL's contract ``f(prompts, completions, **kwargs)``.

The score of a completion is OrchRM's score of the plan it writes (scored before execution,
as in best-of-n-plan): parsed and validated against the pool when it parses, else its raw
text, which OrchRM learned to rank below valid plans (``valid-over-invalid`` pairs). Mixed
with the executed-plan reward through GRPO's ``reward_weights`` (``reward_weights.orchrm``).

:class:`CheckedOrchRMReward` is the other use (issue #41): OrchRM's score *is* the reward, so
the rollouts cost no worker call, and a seeded fraction of them is executed anyway, only to
check OrchRM against the executed outcome (its agreement is logged; a reward model that the
policy learns to fool shows as a falling agreement).
"""

from __future__ import annotations

import math
import random
from typing import Any

from prefect_conductor.conductor.adapters import Download
from prefect_conductor.conductor.errors import PlanError
from prefect_conductor.conductor.plan.parse import parse_plan
from prefect_conductor.conductor.plan.prompts import describe_workers
from prefect_conductor.conductor.pool import Pool
from prefect_conductor.conductor.training.rewards import (
    Execute,
    RolloutOutcome,
    completion_text,
    rollouts_of,
    trainer_step,
)
from prefect_conductor.reward_model.model import load_reward_model

__all__ = ["CheckedOrchRMReward", "OrchRMReward", "agreement_warning", "order_agreement"]


class OrchRMReward:
    """Scores each completion's plan with OrchRM (``rm``: a directory, or ``models:/…`` with
    the task layer's ``download``). A plain TRL reward function once built; no process-wide
    default instance (issue #39)."""

    __name__ = "orchrm"

    def __init__(self, rm: str, pool: Pool, download: Download | None = None):
        self.rm = rm
        self.pool = pool
        # Fails now, in one line, if it does not exist.
        self.model = load_reward_model(rm, download)

    def plan(self, text: str) -> dict[str, Any] | str:
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
            plan = self.plan(completion_text(completion))
            scores.extend(self.model.score(question, [plan], pool_description=workers))
        return scores


def order_agreement(checks: list[tuple[float, float]]) -> float | None:
    """How often OrchRM orders two executed rollouts as their executed rewards do: over every
    pair of ``(orchrm, executed)`` checks whose executed rewards differ, the share OrchRM
    ranks the same way (ties count half); ``None`` without such a pair. 1 is perfect, 0.5
    is chance (the area under OrchRM's ROC curve when the rewards are right or wrong).

    >>> order_agreement([(0.9, 1.0), (0.2, 0.5), (0.4, 0.5)])
    1.0
    >>> order_agreement([(0.1, 1.0), (0.8, 0.5)])
    0.0
    >>> order_agreement([(0.3, 1.0)]) is None
    True
    """
    agree = pairs = 0.0
    for i, (score_i, reward_i) in enumerate(checks):
        for score_j, reward_j in checks[i + 1 :]:
            if reward_i == reward_j:
                continue
            pairs += 1
            same = (score_i - score_j) * (reward_i - reward_j)
            agree += 1.0 if same > 0 else 0.5 if same == 0 else 0.0
    return agree / pairs if pairs else None


def agreement_warning(stage: str, checks: list[tuple[float, float]]) -> str | None:
    """One line for a GRPO stage whose OrchRM ordered its checked rollouts worse than chance
    (the reward it trained on may be misleading), else ``None``.

    >>> agreement_warning("grpo", [(0.1, 1.0), (0.8, 0.5), (0.9, 0.5)])[:55]
    'grpo: OrchRM ordered the checked rollouts worse than ch'
    >>> agreement_warning("grpo", [(0.9, 1.0), (0.1, 0.5)]) is None
    True
    """
    agreement = order_agreement(checks)
    if agreement is None or agreement >= 0.5:
        return None
    return (
        f"{stage}: OrchRM ordered the checked rollouts worse than chance (orchrm_agreement "
        f"{agreement:.2f} over {len(checks)} checked); its reward may mislead this conductor: "
        "raise execute_fraction or retrain OrchRM"
    )


class CheckedOrchRMReward:
    """GRPO's reward from OrchRM alone, checked on a fraction of executed rollouts.

    Each completion's reward is ``sigmoid(OrchRM's score of its plan)`` when the plan parses
    and validates, 0 when it does not (the Conductor paper's 0 needs no execution), so it
    lies in [0, 1] as the executed reward does. Of all the rollouts, ``fraction`` are
    executed (a running budget: over the stage, ``round(fraction * rollouts)`` of them,
    chosen by a seeded draw in each batch), through the same ``execute`` as
    :class:`~conductor.training.rewards.ExecutedPlanReward`; their outcomes never change a
    reward. They give the logged ``executed_reward`` and ``orchrm_agreement``
    (:func:`order_agreement` over every check so far). ``samples`` keeps every scored
    completion with its executed reward, if it ran.
    """

    __name__ = "plan_reward"

    def __init__(self, scorer: OrchRMReward, execute: Execute, fraction: float, seed: int = 0):
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], not {fraction}")
        self.scorer = scorer
        self.execute = execute
        self.fraction = fraction
        self.rng = random.Random(seed)
        self.owed = 0.0
        self.checks: list[tuple[float, float]] = []
        self.samples: list[dict[str, Any]] = []

    @property
    def executed(self) -> int:
        return sum(1 for s in self.samples if s["executed"])

    def __call__(
        self, prompts: list[Any], completions: list[Any], **kwargs: Any
    ) -> list[float | None]:
        rollouts = rollouts_of(completions, kwargs)
        step = trainer_step(kwargs)
        rewards: list[float] = []
        workers = describe_workers(self.scorer.pool)
        for rollout in rollouts:
            plan = self.scorer.plan(rollout.plan_text)
            if isinstance(plan, str):
                rewards.append(0.0)
            else:
                (score,) = self.scorer.model.score(
                    rollout.question, [plan], pool_description=workers
                )
                rewards.append(1 / (1 + math.exp(-score)))
        self.owed += self.fraction * len(rollouts)
        k = min(len(rollouts), int(self.owed + 1e-9))
        self.owed -= k
        chosen = sorted(self.rng.sample(range(len(rollouts)), k))
        outcomes: dict[int, RolloutOutcome | None] = {}
        if chosen:
            ran = list(self.execute([rollouts[i] for i in chosen], step))
            if len(ran) != len(chosen):
                raise RuntimeError(f"execute returned {len(ran)} outcomes for {len(chosen)}")
            outcomes = dict(zip(chosen, ran, strict=True))
        for i, outcome in outcomes.items():
            if outcome is not None and outcome.reward is not None:
                self.checks.append((rewards[i], outcome.reward))
        log_metric = kwargs.get("log_metric")
        done = [o for o in outcomes.values() if o is not None and o.reward is not None]
        if log_metric is not None:
            log_metric("executed_share", len(chosen) / len(rollouts))
            if done:
                log_metric("executed_reward", sum(o.reward for o in done) / len(done))
            agreement = order_agreement(self.checks)
            if agreement is not None:
                log_metric("orchrm_agreement", agreement)
        for i, (rollout, reward) in enumerate(zip(rollouts, rewards, strict=True)):
            outcome = outcomes.get(i)
            self.samples.append(
                {
                    "step": step,
                    "question": rollout.question,
                    "completion": rollout.plan_text,
                    "reward": reward,
                    "executed": i in outcomes,
                    "executed_reward": outcome.reward if outcome else None,
                    "answer": outcome.answer if outcome else None,
                    "run_id": outcome.run_id if outcome else None,
                }
            )
        return rewards
