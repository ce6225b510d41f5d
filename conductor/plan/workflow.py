"""The validated plan: a DAG of steps, each with a worker, a subtask and an access list.

Steps are numbered from 0, as in the conductor's own list literals (arXiv 2512.04388):
``access_list[i]`` names earlier step indices. ``Workflow`` is built only by
``conductor.plan.parse.parse_plan`` (or by ``Workflow.single_step`` for the fallback), so every
instance has passed validation.
"""

from __future__ import annotations

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Step", "Workflow", "plan_lines", "step_line"]

LINE_OUTPUT_LIMIT = 80  # characters of a step's output on its progress line


class Step(BaseModel):
    """One node of the plan."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=0, description="Position in the plan, from 0.")
    worker: str = Field(description="Pool name of the worker that runs this step.")
    instruction: str = Field(description="The natural-language subtask.")
    access: tuple[int, ...] = Field(
        default=(), description="Earlier steps whose subtask and response this step sees."
    )


class Workflow(BaseModel):
    """A validated plan. The answer is the last step's output."""

    model_config = ConfigDict(frozen=True)

    steps: tuple[Step, ...]

    @classmethod
    def single_step(cls, worker: str, instruction: str) -> Workflow:
        """The fallback plan: one step on one worker, seeing nothing earlier."""
        return cls(steps=(Step(index=0, worker=worker, instruction=instruction),))

    @property
    def final(self) -> Step:
        return self.steps[-1]

    def graph(self) -> nx.DiGraph:
        """Edges point from a visible step to the step that reads it."""
        g = nx.DiGraph()
        g.add_nodes_from(s.index for s in self.steps)
        g.add_edges_from((j, s.index) for s in self.steps for j in s.access)
        return g

    def layers(self) -> list[list[int]]:
        """Steps grouped by the earliest wave in which they can run."""
        return [sorted(layer) for layer in nx.topological_generations(self.graph())]

    def to_lists(self) -> dict[str, list]:
        """The paper's three-list form, e.g. for storing or showing the plan."""
        return {
            "model_id": [s.worker for s in self.steps],
            "subtasks": [s.instruction for s in self.steps],
            "access_list": [list(s.access) for s in self.steps],
        }


def plan_lines(steps: tuple[Step, ...] | list[Step], format_error: str | None = None) -> list[str]:
    """The plan as the terminal and the run's log show it: a heading, one line per step."""
    head = f"invalid plan ({format_error}); running the fallback:" if format_error else "plan:"
    lines = [head]
    for s in steps:
        reads = ", ".join(map(str, s.access)) or "-"
        lines.append(f"  step {s.index} · {s.worker} reads [{reads}]: {s.instruction[:120]}")
    return lines


def step_line(
    step: Step, status: str, output: str | None = None, latency_s: float | None = None
) -> str:
    """One progress line for a finished step: ✓ with its output, ✗ failed, - skipped.

    A failure's reason is not on this line: the run's reason, said once, is it."""
    if status == "completed":
        text = " ".join((output or "").split())
        if len(text) > LINE_OUTPUT_LIMIT:
            text = text[:LINE_OUTPUT_LIMIT] + "…"
        took = f" · {latency_s:.1f} s" if latency_s is not None else ""
        return f"  ✓ step {step.index} · {step.worker}{took}: {text}"
    mark = "✗" if status == "failed" else "-"
    return f"  {mark} step {step.index} · {step.worker} {status}"
