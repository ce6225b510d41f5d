"""Where a recipe's training stands (issue #40): finished stages, so a killed one resumes.

One JSON file per recipe digest (``recipe_digest``: the recipe with its settings and the
pool) under ``$CONDUCTOR_HOME/training/recipes/``: the MLflow run of the training and, per
finished stage, its report, its ledger entry and the questions it used. A training of the
same digest that finds the file unfinished resumes after the last finished stage, in the
same MLflow run; a finished file starts a new training. Written atomically after each stage.
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect_conductor.conductor.home import conductor_home
from prefect_conductor.conductor.training.ledger import LedgerEntry
from pydantic import BaseModel, Field

__all__ = ["FinishedStage", "Progress", "progress_path"]


class FinishedStage(BaseModel):
    name: str
    report: dict = Field(default_factory=dict)  # a StageReport, dumped
    ledger: LedgerEntry
    used: list[str] = Field(default_factory=list, description="Question ids it used.")
    adapter: str | None = Field(default=None, description="The current adapter after it.")


class Progress(BaseModel):
    run_id: str
    digest: str
    recipe: str
    stages: list[FinishedStage] = Field(default_factory=list)
    registration: dict | None = Field(
        default=None,
        description="The registered version (version, champion_accuracy, promoted), once "
        "registered: a training killed after it does not register twice.",
    )
    incumbent: LedgerEntry | None = Field(
        default=None, description="The incumbent's eval, in the ledger, once registered."
    )
    finished: bool = False

    def done(self, name: str) -> FinishedStage | None:
        return next((s for s in self.stages if s.name == name), None)

    def save(self) -> None:
        path = progress_path(self.digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(indent=2))
        os.replace(tmp, path)

    @classmethod
    def load(cls, digest: str) -> Progress | None:
        path = progress_path(digest)
        return cls.model_validate_json(path.read_text()) if path.is_file() else None


def progress_path(digest: str) -> Path:
    return conductor_home() / "training" / "recipes" / f"{digest}.json"
