"""The cost ledger of a training (issue #40): what each stage spent, read from the store.

Every run a training makes is tagged ``train_run`` (its MLflow run) and ``train_stage``; a
stage's entry is computed from the artifact store's own rows, so the ledger and the ``steps``
table cannot disagree: ``worker_calls`` is the stage's step rows that called a worker (a step
skipped because an earlier one failed called nobody), tokens and cost are those rows' sums
(cost from the pool's prices, as each step stored it), ``conductor_generations`` the stage's
runs whose plan a conductor wrote. A stage that was killed and rerun counts both attempts:
both were spent. Pure: pandas in, numbers out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LEDGER_FIELDS", "LedgerEntry", "ledger_total", "stage_ledger", "tagged_runs"]

LEDGER_FIELDS = (
    "worker_calls",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "conductor_generations",
    "wall_s",
)


class LedgerEntry(BaseModel):
    """What one stage spent."""

    model_config = ConfigDict(frozen=True)

    stage: str
    worker_calls: int = Field(description="Steps that called a worker (rows of `steps`).")
    input_tokens: int = Field(description="Workers' input tokens.")
    output_tokens: int = Field(description="Workers' output tokens.")
    cost_usd: float = Field(description="Workers' cost from the pool's prices.")
    conductor_generations: int = Field(description="Plans a conductor wrote (runs).")
    wall_s: float


def _tags(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    return dict(value.items() if isinstance(value, dict) else value)


def tagged_runs(
    runs: pd.DataFrame, train_run: str, stages: Iterable[str] | None = None
) -> pd.DataFrame:
    """The rows of ``runs`` tagged with this training (and one of ``stages``)."""
    if runs.empty:
        return runs
    tags = runs["tags"].map(_tags)
    keep = tags.map(lambda t: t.get("train_run") == train_run)
    if stages is not None:
        wanted = set(stages)
        keep &= tags.map(lambda t: t.get("train_stage") in wanted)
    return runs[keep]


def stage_ledger(
    runs: pd.DataFrame, steps: pd.DataFrame, train_run: str, stage: str, wall_s: float
) -> LedgerEntry:
    """``stage``'s entry from the ``runs`` (``run_id``, ``tags``, ``conductor_output``) and
    ``steps`` (``run_id``, ``status``, tokens, ``cost_usd``) tables."""
    mine = tagged_runs(runs, train_run, [stage])
    ids = set(mine["run_id"]) if not mine.empty else set()
    called = steps[steps["run_id"].isin(ids) & (steps["status"] != "skipped")] if ids else steps[:0]

    def total(column: str) -> float:
        return float(pd.to_numeric(called[column], errors="coerce").fillna(0).sum())

    generations = int(mine["conductor_output"].notna().sum()) if not mine.empty else 0
    return LedgerEntry(
        stage=stage,
        worker_calls=len(called),
        input_tokens=int(total("input_tokens")),
        output_tokens=int(total("output_tokens")),
        cost_usd=round(total("cost_usd"), 6),
        conductor_generations=generations,
        wall_s=round(wall_s, 1),
    )


def ledger_total(entries: list[LedgerEntry]) -> LedgerEntry:
    """One entry, ``stage="total"``, summing ``entries``."""
    return LedgerEntry(
        stage="total",
        worker_calls=sum(e.worker_calls for e in entries),
        input_tokens=sum(e.input_tokens for e in entries),
        output_tokens=sum(e.output_tokens for e in entries),
        cost_usd=round(sum(e.cost_usd for e in entries), 6),
        conductor_generations=sum(e.conductor_generations for e in entries),
        wall_s=round(sum(e.wall_s for e in entries), 1),
    )
