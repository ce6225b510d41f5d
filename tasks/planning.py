"""Planning tasks: ask the conductor for plan text (top level or a nested round)."""

from __future__ import annotations

import json

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect_conductor.conductor.plan.policy import ConductorPolicy, LiteLLMPolicy
from prefect_conductor.conductor.plan.prompts import recursion_messages
from prefect_conductor.conductor.plan.workflow import Workflow
from prefect_conductor.conductor.pool import Pool
from prefect_conductor.conductor.providers.llm import Completion, complete
from prefect_conductor.tasks.secrets import prefect_secrets

__all__ = ["write_plan", "write_nested_plan"]


@task(cache_policy=NO_CACHE, name="plan", task_run_name="plan (conductor)", retries=0)
def write_plan(
    question: str, pool: Pool, max_steps: int | None = None, policy: ConductorPolicy | None = None
) -> Completion:
    """The conductor's raw plan text for ``question``."""
    with prefect_secrets():
        return (policy or LiteLLMPolicy(max_steps)).write_plan(question, pool)


@task(
    cache_policy=NO_CACHE, name="plan-nested", task_run_name="plan (conductor, nested)", retries=0
)
def write_nested_plan(
    question: str,
    pool: Pool,
    parent: Workflow,
    instruction: str,
    last_response: str | None,
    max_steps: int | None = None,
) -> tuple[Completion, str]:
    """A recursion round: returns the completion and the messages sent (JSON)."""
    messages = recursion_messages(question, pool, parent, instruction, last_response, max_steps)
    with prefect_secrets():
        completion = complete(pool.conductor, messages)
    return completion, json.dumps(messages, ensure_ascii=False)
