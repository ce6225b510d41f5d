"""The ``fleet-question`` flow, and ``SERVED_FLOWS``: what ``conductor serve`` hands the
fleet's tasks (``tasks/fleet.py``), which run flows but import none.

A fleet question (``fleet_question``: one question of ``conductor eval --fan-out``, one plan
of ``conductor train-conductor --fan-out``) sent from an eval's flow run runs in that flow run;
sent from anywhere else, it runs in a ``fleet-question`` flow run of its own on the serve
process that took it, so that its step task runs have a flow run to belong to.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner
from prefect_conductor.conductor.plan.requests import OrchestrateRequest
from prefect_conductor.flows.best_of_n import QUESTION_FLOWS
from prefect_conductor.tasks.fleet import ServedFlows, answer_question

__all__ = ["SERVED_FLOWS", "fleet_question_flow"]


@flow(name="fleet-question", task_runner=ThreadPoolTaskRunner(64), log_prints=False)
def fleet_question_flow(request: OrchestrateRequest, run_id: str) -> Any:
    """A fleet question sent from outside a flow run: its ``RunOutcome``, or a best-of-n
    question's chosen ``RunResult``."""
    return answer_question(request, run_id, QUESTION_FLOWS)


#: What ``conductor serve`` hands the fleet's tasks before it serves (``serve_flows``).
SERVED_FLOWS = ServedFlows(questions=QUESTION_FLOWS, fleet_question=fleet_question_flow)
