"""The step task: one Prefect task run per plan step, calling its worker through litellm.

Retries happen here, in Prefect, and only on retryable errors (rate limit, timeout,
connection, 5xx): ``WorkerError.retryable`` decides. Fallback workers from the pool are tried
in order inside one attempt. Deterministic calls (temperature 0, ``cache: true``) are cached
through a Prefect cache key built from model + messages + params only.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE, CachePolicy
from prefect.context import TaskRunContext
from prefect.tasks import exponential_backoff
from prefect_conductor.conductor.data.records import StepRecord, utcnow
from prefect_conductor.conductor.errors import WorkerError
from prefect_conductor.conductor.plan.prompts import worker_messages
from prefect_conductor.conductor.plan.workflow import Step
from prefect_conductor.conductor.pool import Pool, WorkerSpec
from prefect_conductor.conductor.providers.llm import Completion, complete
from prefect_conductor.conductor.providers.tools import SANDBOXED_MODELS
from prefect_conductor.tasks.secrets import prefect_secrets
from pydantic import BaseModel, ConfigDict

__all__ = ["StepOutcome", "run_step", "step_messages", "step_run_name", "step_task_for"]


class StepOutcome(BaseModel):
    """What a finished step hands to its dependents and to the artifact store."""

    model_config = ConfigDict(frozen=True)

    output: str
    model: str
    messages: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    latency_s: float
    started_at: datetime
    finished_at: datetime
    children: tuple[StepRecord, ...] = ()  # nested steps of a recursion round
    sandbox: str | None = None  # the pool's sandbox mode, for steps that ran model-written code

    @staticmethod
    def now() -> datetime:
        return utcnow()

    @classmethod
    def build(
        cls, output: str, model: str, messages: str, started_at: datetime, **fields: Any
    ) -> StepOutcome:
        finished = utcnow()
        return cls(
            output=output,
            model=model,
            messages=messages,
            started_at=started_at,
            finished_at=finished,
            latency_s=fields.pop("latency_s", (finished - started_at).total_seconds()),
            **fields,
        )

    def fields(self) -> dict[str, Any]:
        """The columns this outcome fills in a ``StepRecord``."""
        return self.model_dump(exclude={"model", "children"})


def step_messages(
    question: str, step: Step, visible: list[StepOutcome], instructions: list[str], pool: Pool
) -> list[dict[str, str]]:
    pairs = [(inst, out.output) for inst, out in zip(instructions, visible, strict=True)]
    system = pool.worker(step.worker).system
    return worker_messages(question, step.instruction, pairs, pool.share_question, system)


def call_with_fallbacks(
    worker: WorkerSpec, pool: Pool, messages: list[dict[str, str]]
) -> Completion:
    """Try the worker, then each of its fallbacks; raise the first error if all fail."""
    errors: list[WorkerError] = []
    for spec in (worker, *(pool.worker(n) for n in worker.fallbacks)):
        # Tools get the pool's sandbox setting (issue #17); the calculator ignores it.
        extra = {"sandbox": pool.sandbox} if spec.kind == "tool" else {}
        try:
            with prefect_secrets():
                return complete(spec, messages, **extra)
        except WorkerError as exc:
            errors.append(exc)
    first = errors[0]
    if len(errors) == 1:
        raise first
    rest = "; ".join(str(e) for e in errors[1:])
    raise WorkerError(
        f"{first} (fallbacks failed too: {rest})",
        retryable=any(e.retryable for e in errors),
        worker=worker.name,
    )


def _retry_if_retryable(task: Any, task_run: Any, state: Any) -> bool:
    try:
        state.result()
    except WorkerError as exc:
        return exc.retryable
    except Exception:  # noqa: BLE001 - anything else is a bug or a user error: don't retry
        return False
    return False


def _cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    """Key on model + messages + params only; ``None`` (no caching) unless deterministic."""
    pool: Pool = parameters["pool"]
    step: Step = parameters["step"]
    worker = pool.worker(step.worker)
    if not worker.cache or worker.temperature != 0:
        return None
    messages = step_messages(
        parameters["question"], step, parameters["visible"], parameters["instructions"], pool
    )
    blob = json.dumps([worker.model, worker.api_base, messages, worker.params], sort_keys=True)
    return "conductor-step-" + hashlib.sha256(blob.encode()).hexdigest()


@task(cache_policy=NO_CACHE, name="step", retry_condition_fn=_retry_if_retryable, log_prints=False)
def run_step(
    question: str,
    step: Step,
    visible: list[StepOutcome],
    instructions: list[str],
    pool: Pool,
) -> StepOutcome:
    """Run one LLM or tool step. ``visible`` are the outcomes of ``step.access``, in order."""
    worker = pool.worker(step.worker)
    messages = step_messages(question, step, visible, instructions, pool)
    started = utcnow()
    result = call_with_fallbacks(worker, pool, messages)
    return StepOutcome.build(
        result.text,
        result.model,
        json.dumps(messages, ensure_ascii=False),
        started,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        cost_usd=result.cost_usd,
        latency_s=result.latency_s,
        sandbox=pool.sandbox if result.model in SANDBOXED_MODELS else None,
    )


# Task-run names are ASCII: the Prefect UI's run graph drops characters such as ``·``.
STEP_RUN_NAME = "step-{step.index} {step.worker}"


def step_run_name(step: Step, depth: int = 0) -> str:
    """``step-{i} {worker}``; nested steps get a ``d{depth}-`` prefix."""
    return (f"d{depth}-" if depth else "") + STEP_RUN_NAME.format(step=step)


def step_task_for(worker: WorkerSpec, depth: int = 0) -> Any:
    """``run_step`` configured for one worker: run name, retries, backoff, caching.

    One task object serves every step of that worker at that depth (the run name is a
    template over the ``step`` parameter), so a wide plan does not copy the task per step.
    """
    prefix = f"d{depth}-" if depth else ""
    options: dict[str, Any] = {
        "task_run_name": prefix + STEP_RUN_NAME,
        "retries": worker.retries,
        "retry_delay_seconds": exponential_backoff(worker.retry_backoff_s)(worker.retries)
        if worker.retries
        else 0,
    }
    if worker.cache and worker.temperature == 0:
        options["cache_policy"] = CachePolicy.from_cache_key_fn(_cache_key)
    return run_step.with_options(**options)
