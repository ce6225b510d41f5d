"""The improvement loop's request, report and state (issue #41).

One iteration of ``improve``: the runs stored since the last iteration (evaluations and
everyday ``orchestrate`` runs alike) become OrchRM's win/lose pairs; OrchRM is retrained on
them (promoted only if it ranks held-out pairs better); an OrchRM-guided round of sampling
runs from the champion conductor (the ``improve`` recipe); the candidate is promoted only if
it beats the champion on the same held-out questions.

The state is one JSON file, ``$CONDUCTOR_HOME/improve/state.json``: every iteration with its
window of runs and the parts it finished, so a killed iteration resumes (the same window, the
reward model not trained twice; the conductor's training resumes at its stage by itself).
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect_conductor.conductor.home import conductor_home
from prefect_conductor.conductor.training.ledger import LedgerEntry
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ImproveIteration", "ImproveRequest", "ImproveState", "state_path"]


class ImproveRequest(BaseModel):
    """``conductor improve``: one iteration of the loop."""

    model_config = ConfigDict(extra="forbid")

    recipe: str = Field(
        default="improve",
        description="The conductor's round: a built-in recipe or a YAML file (its seed is "
        "the iteration's number, so each iteration samples other questions).",
    )
    overrides: list[str] = Field(
        default_factory=list, description="KEY=VALUE settings applied to the recipe (`--set`)."
    )
    pool: str | None = Field(default=None, description="Pool YAML; empty for the local pool.")
    min_new_runs: int = Field(
        default=50,
        ge=1,
        description="Fewer runs stored since the last iteration: say so and stop.",
    )
    reward_model: dict = Field(
        default_factory=dict,
        description="Settings of OrchRM's training (`conductor train-rm`'s request fields, "
        "e.g. {max_steps: 60, min_pairs: 20}); `since` and `pool` are the loop's.",
    )
    promote: bool = Field(default=True, description="Promote what beats its champion.")


class RunCounts(BaseModel):
    """The runs of an iteration's window, by what they can teach."""

    total: int = 0
    referenced: int = Field(default=0, description="Verified against a reference.")
    unreferenced: int = Field(
        default=0, description="No reference (everyday runs): label-free pairs only."
    )


class ImproveIteration(BaseModel):
    """What one iteration did (``conductor improve --json``)."""

    iteration: int
    since: str | None = Field(description="The window's start: the last iteration's end.")
    until: str = Field(description="The window's end: when this iteration started.")
    mlflow_run_id: str | None = None
    runs: RunCounts = Field(default_factory=RunCounts)
    stopped: str | None = Field(default=None, description="Why nothing was trained, if so.")
    pairs_by_source: dict[str, int] = Field(default_factory=dict)
    pairs_unreferenced_by_source: dict[str, int] = Field(
        default_factory=dict, description="Of those, the pairs from runs without a reference."
    )
    pairs_new: int = 0
    orchrm_trained: bool = False
    orchrm_promoted: bool = False
    orchrm_accuracy: float | None = None
    orchrm_champion_accuracy: float | None = None
    orchrm_uri: str | None = None
    orchrm_wall_s: float | None = Field(
        default=None, description="OrchRM's step, once it finished (resume skips it)."
    )
    conductor_run_id: str | None = None
    accuracy_before: float | None = Field(
        default=None, description="The champion conductor's held-out accuracy."
    )
    accuracy_after: float | None = None
    conductor_promoted: bool = False
    conductor_uri: str | None = None
    ledger: list[LedgerEntry] = Field(default_factory=list)
    finished: bool = False


class ImproveState(BaseModel):
    iterations: list[ImproveIteration] = Field(default_factory=list)

    def save(self) -> None:
        path = state_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(indent=2))
        os.replace(tmp, path)

    @classmethod
    def load(cls) -> ImproveState:
        path = state_path()
        return cls.model_validate_json(path.read_text()) if path.is_file() else cls()

    def window_start(self) -> str | None:
        """Where the next iteration's window starts: the last trained iteration's end (an
        iteration stopped for too little data leaves its runs to the next one)."""
        trained = [i for i in self.iterations if i.finished and i.stopped is None]
        return trained[-1].until if trained else None


def state_path() -> Path:
    return conductor_home() / "improve" / "state.json"
