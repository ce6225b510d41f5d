"""Recursion (paper §4): the plan step whose worker is the conductor itself.

``conductor_step`` (task ``conductor-step``, its run named ``step-{i} {worker}`` by the flow
that submits it) is one nested planning round: the conductor sees the question, the parent
plan, the step's instruction and the last visible response (``write_nested_plan``). Three
empty lists accept that response; any other plan runs at ``depth + 1`` as a
``conductor-round`` subflow under this task run, whose own conductor steps may plan again
until the pool's ``max_depth``.

That subflow is ``flows/orchestrate.py``'s, and ``tasks/`` imports no ``flows/``: the flow
that submits the step hands it over (``nested_round``). ``RunIds`` and ``Execution`` are what
the round and that flow share: the run a step belongs to, and what running a plan gave.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect_conductor.conductor.data.records import StepRecord
from prefect_conductor.conductor.errors import PlanError, WorkerError
from prefect_conductor.conductor.plan.parse import extract_plan, validate_plan
from prefect_conductor.conductor.plan.workflow import Step, Workflow
from prefect_conductor.conductor.pool import Pool
from prefect_conductor.tasks.planning import write_nested_plan
from prefect_conductor.tasks.workers import StepOutcome

__all__ = ["Execution", "NestedRound", "NestedRoundError", "RunIds", "conductor_step"]


@dataclass(frozen=True)
class RunIds:
    """The run a step belongs to: its ids, its question and its plans' step limit."""

    run_id: str
    question_id: str
    question: str
    max_steps: int


@dataclass
class Execution:
    """A plan's execution: its step records, the final step's answer, and why it failed."""

    records: list[StepRecord] = field(default_factory=list)
    answer: str | None = None
    reason: str | None = None


#: Runs a nested plan: ``(workflow, pool, ids, depth, parent step) -> Execution``.
NestedRound = Callable[[Workflow, Pool, RunIds, int, int], Execution]


class NestedRoundError(WorkerError):
    """A nested plan failed; carries its step records so completed work is still stored."""

    def __init__(self, message: str, records: list[StepRecord]):
        super().__init__(message, retryable=False)
        self.records = records


@task(cache_policy=NO_CACHE, name="conductor-step")
def conductor_step(
    step: Step,
    visible: list[StepOutcome],
    instructions: list[str],
    pool: Pool,
    parent: Workflow,
    ids: RunIds,
    depth: int,
    nested_round: NestedRound,
) -> StepOutcome:
    """A step whose worker is the conductor itself: one nested planning round, its plan run
    by ``nested_round`` (the ``conductor-round`` subflow)."""
    last = visible[-1].output if visible else None
    started = StepOutcome.now()
    completion, messages = write_nested_plan(
        ids.question, pool, parent, step.instruction, last, ids.max_steps
    )
    usage = {
        "input_tokens": completion.input_tokens,
        "output_tokens": completion.output_tokens,
        "cost_usd": completion.cost_usd,
    }
    try:
        raw = extract_plan(completion.text)
        accept = raw.is_empty
        nested = (
            None
            if accept
            else validate_plan(
                raw,
                pool,
                max_steps=ids.max_steps,
                allow_conductor=depth + 1 < pool.conductor.max_depth,
            )
        )
    except PlanError:
        # Like the top level's fallback: an unusable nested plan keeps what we have.
        accept, nested = True, None
    if accept or nested is None:
        if last is None:
            raise WorkerError(
                f"step {step.index}: the nested conductor accepted, but it sees no response"
            )
        return StepOutcome.build(last, pool.conductor.model, messages, started, **usage)
    result = nested_round(nested, pool, ids, depth + 1, step.index)
    if result.reason is not None:
        raise NestedRoundError(f"nested plan of step {step.index}: {result.reason}", result.records)
    return StepOutcome.build(
        result.answer or "",
        pool.conductor.model,
        messages,
        started,
        children=tuple(result.records),
        **usage,
    )
