"""The validated plan: a DAG of steps, each with a worker, a subtask and an access list.

Steps are numbered from 0, as in the conductor's own list literals (arXiv 2512.04388):
``access_list[i]`` names earlier step indices. ``Workflow`` is built only by
``conductor.plan.parse.parse_plan`` (or by ``Workflow.single_step`` for the fallback), so every
instance has passed validation.
"""

from __future__ import annotations

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Step", "Workflow"]


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
