"""The question tasks: one task run per question, which runs the question's flow.

- ``run_question`` (``question {id}``): a question as its own ``orchestrate`` (or
  ``best-of-n``) flow run, which stores it (GRPO's rollouts, ``flows/train_conductor.py``);
- ``eval_question`` (``question {id}``): an eval's question inside its own task run, its rows
  left to the eval to store (``flows/evaluate.py``);
- ``run_candidate`` (``candidate {index}``): one executed plan of a best-of-n selection, an
  ``orchestrate`` subflow (``flows/best_of_n.py``).

A question task runs flows, and ``tasks/`` imports no ``flows/`` (CONTRIBUTING, "Where a
change goes"): the flow that submits one hands it the flows to run as a parameter
(``QuestionFlows``; ``flows/best_of_n.py`` builds the one every flow passes,
``QUESTION_FLOWS``). A question is retried only when the Prefect API failed it
(``_api_failure``); failures of the question's own run are in its ``RunResult``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import PrefectHTTPStatusError
from prefect.runtime import task_run
from prefect.states import State
from prefect_conductor.conductor.data.records import RunRecord, StepRecord
from prefect_conductor.conductor.plan.requests import OrchestrateRequest, RunResult
from prefect_conductor.conductor.plan.strategies import parse_strategy

__all__ = [
    "QUESTION_RETRIES",
    "QuestionFlows",
    "RunOutcome",
    "eval_question",
    "run_candidate",
    "run_question",
]

QUESTION_RETRIES = 2


@dataclass
class RunOutcome:
    """A finished run: what it returns, and its rows for the artifact store (not yet stored)."""

    result: RunResult
    run: RunRecord
    steps: list[StepRecord]


@dataclass(frozen=True)
class QuestionFlows:
    """What a question task runs, handed over by the flow that submits it.

    ``orchestrate`` and ``best_of_n`` are the flows of those names (called with
    ``return_state=True``); ``run_unstored(request, run_id)`` is ``orchestrate``'s work in the
    calling task run, with no flow run of its own and nothing stored (``RunOutcome``).
    """

    orchestrate: Callable[..., State]
    best_of_n: Callable[..., State]
    run_unstored: Callable[[OrchestrateRequest, str], RunOutcome]

    def flow_for(self, request: OrchestrateRequest) -> Callable[..., State]:
        """The flow that answers ``request``: ``best-of-n`` for a best-of-n strategy."""
        return self.best_of_n if parse_strategy(request.strategy).best_of else self.orchestrate


def _api_failure(task: object, task_run: object, state: State) -> bool:
    """Retry a question whose run the Prefect API failed (a 5xx, a dropped connection).

    A loaded ephemeral server can answer 503 when its SQLite database is busy; the question
    itself is fine and runs again. Failures of the question's own run are in its RunResult.
    """
    try:
        state.result()
    except PrefectHTTPStatusError as exc:
        return exc.response.status_code >= 500
    except httpx.TransportError:
        return True
    except Exception:  # noqa: BLE001 - anything else is not the API's doing
        return False
    return False


def _finished(state: State, what: str) -> RunResult:
    result = state.result(raise_on_failure=False)
    if isinstance(result, RunResult):
        return result
    if isinstance(result, BaseException):
        raise result  # as is, so the retry condition sees a Prefect API 5xx for what it is
    raise RuntimeError(f"{what}: {result}")


# Both kinds of question task: one task run per question, retried only when the Prefect API
# failed it (``_api_failure``).
_QUESTION_TASK: dict[str, Any] = {
    "cache_policy": NO_CACHE,
    "name": "question",
    "task_run_name": "question {request.question_id}",
    "retries": QUESTION_RETRIES,
    "retry_delay_seconds": 2,
    "retry_condition_fn": _api_failure,
}


@task(**_QUESTION_TASK)
def run_question(request: OrchestrateRequest, flows: QuestionFlows) -> RunResult:
    """One question through its flow (best-of-n or orchestrate); a failed run still returns
    its result."""
    state = flows.flow_for(request)(request, return_state=True)
    return _finished(state, f"question {request.question_id}")


@task(**_QUESTION_TASK, persist_result=False)  # the rows go to the store, the summary to the eval
def eval_question(request: OrchestrateRequest, flows: QuestionFlows) -> RunOutcome | RunResult:
    """An eval's question, in this task run (its id is the run id, the same on a retry): the
    plan's steps are task runs under it, and its rows come back unstored for the eval to
    store in batches. A best-of-n question runs its ``best-of-n`` flow, which stores its
    candidates itself, and returns the chosen run."""
    if parse_strategy(request.strategy).best_of:
        state = flows.best_of_n(request, return_state=True)
        return _finished(state, f"question {request.question_id}")
    return flows.run_unstored(request, str(task_run.id))


@task(cache_policy=NO_CACHE, name="candidate", task_run_name="candidate {index}")
def run_candidate(request: OrchestrateRequest, index: int, flows: QuestionFlows) -> RunResult:
    """One candidate plan of a best-of-n selection, as an ``orchestrate`` subflow."""
    return _finished(flows.orchestrate(request, return_state=True), f"candidate {index}")
