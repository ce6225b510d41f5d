"""The plan core: what a conductor writes and how it becomes a validated DAG.

- ``workflow``: ``Workflow`` and ``Step``, the validated plan (networkx checks the DAG);
- ``parse``: extract, parse and validate the conductor's plan text (``parse_plan``);
- ``prompts``: the conductor's and workers' prompts, shared by inference and training;
- ``strategies``: how a question becomes a plan (the conductor or a paper baseline);
- ``policy``: the conductor model call that writes the plan text;
- ``requests``: what goes into an orchestration run and what comes out.

May import: ``conductor.errors``, ``conductor.pool``, ``conductor.adapters`` and
``conductor.providers`` (the policy calls a model). Never ``conductor.data`` or
``prefect_conductor.conductor.training``.

``from conductor.plan import parse_plan`` keeps working: this package re-exports ``parse``.
"""

from prefect_conductor.conductor.plan.parse import (
    MAX_INSTRUCTION_CHARS,
    MAX_PLAN_TEXT_CHARS,
    RawPlan,
    extract_plan,
    parse_plan,
    validate_plan,
)
from prefect_conductor.conductor.plan.workflow import Step, Workflow

__all__ = [
    "MAX_INSTRUCTION_CHARS",
    "MAX_PLAN_TEXT_CHARS",
    "RawPlan",
    "Step",
    "Workflow",
    "extract_plan",
    "parse_plan",
    "validate_plan",
]
