"""The fleet's tasks: what a ``conductor serve`` process runs for other processes and hosts.

- ``served_request`` (``conductor-request``): one ``conductor run`` request, as its own
  ``orchestrate`` (or ``best-of-n``) flow run in the warm serving process (issue #10;
  ``prefect_conductor.fleet.serve``);
- ``fleet_question`` (``fleet-question``, its run named ``question <id> on <worker id>``):
  one question of ``conductor eval --fan-out`` or one plan of ``conductor train-conductor
  --fan-out`` (issue #19; ``prefect_conductor.fleet.fanout``).

Both are background task runs (``Task.delay``) that the Prefect server hands to a serve
process (``prefect.task_worker.serve``), and both run flows. ``tasks/`` imports no ``flows/``,
and a background task's parameters cross the task-scheduling storage as data (JSON for
``served_request``), so they cannot carry a flow as the question tasks' do
(``tasks/questions.py``): ``conductor serve`` hands the flows over once, before it serves
(``serve_flows``; ``flows/fleet_question.py`` builds them, ``SERVED_FLOWS``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from prefect.runtime import task_run
from prefect_conductor.conductor.errors import ConductorError
from prefect_conductor.conductor.plan.requests import OrchestrateRequest, RunResult
from prefect_conductor.conductor.plan.strategies import parse_strategy

if TYPE_CHECKING:  # its RunOutcome's records import pyarrow, which `conductor run` never needs
    from prefect_conductor.tasks.questions import QuestionFlows

__all__ = [
    "ServeError",
    "ServedFlows",
    "answer_question",
    "fleet_question",
    "serve_flows",
    "served_request",
    "worker_id",
    "worker_of",
]

_ON = " on "  # a fleet question's task run name: "question <question id> on <worker id>"


class ServeError(ConductorError):
    """``conductor serve`` cannot start, or the serving process did not answer."""


@dataclass(frozen=True)
class ServedFlows:
    """What the fleet's tasks run, handed over by ``conductor serve`` (``serve_flows``)."""

    questions: QuestionFlows  # ``orchestrate``, ``best-of-n``, and ``run_unstored``
    #: The ``fleet-question`` flow: a fleet question sent from outside a flow run, in a flow
    #: run of its own, ``(request, run_id) -> answer_question(...)``.
    fleet_question: Callable[[OrchestrateRequest, str], Any]


_served: ServedFlows | None = None


def serve_flows(flows: ServedFlows) -> None:
    """Hand the fleet's tasks the flows they run (``conductor serve`` does, before serving)."""
    global _served
    _served = flows


def _served_flows(what: str) -> ServedFlows:
    if _served is None:
        raise ServeError(
            f"{what} runs the flows that `conductor serve` hands it "
            "(prefect_conductor.tasks.fleet.serve_flows); serve it with `conductor serve`"
        )
    return _served


def worker_id() -> str:
    """This process's id as the Prefect server lists it: ``TaskWorker.client_id``."""
    return f"{socket.gethostname()}-{os.getpid()}"


def worker_of(run_name: str) -> str | None:
    """The worker id in a fleet question's task run name, if a worker has started it."""
    return run_name.rsplit(_ON, 1)[1] if _ON in run_name else None


@task(
    name="conductor-request",
    cache_policy=NO_CACHE,
    persist_result=True,
    result_serializer="json",
)
def served_request(request: dict[str, Any], best_of: bool = False) -> dict[str, Any]:
    """Run one ``conductor run`` request in this (warm) process; the RunResult as JSON."""
    flows = _served_flows("conductor-request").questions
    flow = flows.best_of_n if best_of else flows.orchestrate
    state = flow(OrchestrateRequest.model_validate(request), return_state=True)
    result = state.result(raise_on_failure=False)
    if isinstance(result, RunResult):
        return result.model_dump(mode="json")
    message = str(result).strip().splitlines()[0] if isinstance(result, BaseException) else ""
    raise ServeError(message or state.message or "the run crashed")


def answer_question(request: OrchestrateRequest, run_id: str, flows: QuestionFlows) -> Any:
    """A fleet question in the calling run, tagged ``served_by`` this worker: the
    ``RunOutcome`` (result and unstored rows) of ``run_unstored``, or a best-of-n question's
    chosen ``RunResult`` (its flow stores its candidates itself)."""
    request = request.model_copy(update={"tags": {**request.tags, "served_by": worker_id()}})
    if parse_strategy(request.strategy).best_of:
        state = flows.best_of_n(request, return_state=True)
        result = state.result(raise_on_failure=False)
        if isinstance(result, BaseException):
            raise result
        return result
    return flows.run_unstored(request, run_id)


def _run_name() -> str:
    request = (task_run.parameters or {}).get("request")
    qid = getattr(request, "question_id", None) or "?"
    return f"question {qid}{_ON}{worker_id()}"


@task(
    name="fleet-question",
    task_run_name=_run_name,
    cache_policy=NO_CACHE,
    persist_result=True,  # the outcome travels through the result storage (every host's)
)
def fleet_question(request: OrchestrateRequest, run_id: str) -> Any:
    """One eval question on this serve process: the ``RunOutcome`` (result and unstored
    rows) of ``run_unstored``, or a best-of-n question's chosen ``RunResult``.

    Sent from an eval's flow run, it runs in that flow run's context (its steps are the
    eval's task runs); sent from anywhere else, in a ``fleet-question`` flow run of its own.
    """
    flows = _served_flows("fleet-question")
    if FlowRunContext.get() is None:
        return flows.fleet_question(request, run_id)
    return answer_question(request, run_id, flows.questions)
