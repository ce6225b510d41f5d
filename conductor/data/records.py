"""Rows of the intermediate-artifact dataset: a ``RunRecord`` per run, a ``StepRecord`` per step.

The Arrow schemas are the contract of the Parquet tables ``runs``, ``steps`` and ``pairs``.
OrchRM builds its pairs from the first two (arXiv 2606.13598) and stores them in the third,
so columns are added, never renamed.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "StepStatus",
    "RunStatus",
    "StepRecord",
    "RunRecord",
    "STEPS_SCHEMA",
    "RUNS_SCHEMA",
    "PAIRS_SCHEMA",
    "utcnow",
]

StepStatus = Literal["completed", "failed", "skipped"]
RunStatus = Literal["completed", "failed"]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class StepRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    run_id: str
    question_id: str
    step: int
    depth: int = 0
    parent_step: int | None = None
    worker: str
    model: str
    instruction: str
    access: list[int] = Field(default_factory=list)
    messages: str = Field(default="[]", description="The chat messages sent, as JSON.")
    output: str | None = None
    status: StepStatus
    error: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    latency_s: float | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    sandbox: str | None = Field(
        default=None,
        description="How a code-running tool ran this step: isolated or process (issue #17); "
        "null for every other worker, and in files written before the column existed.",
    )


class RunRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    run_id: str
    question_id: str
    question: str
    reference: str | None = None
    conductor_model: str
    conductor_output: str | None = None
    workflow_json: str | None = None
    format_valid: bool
    format_error: str | None = None
    answer: str | None = None
    correct: bool | None = None
    reward: float | None = None
    status: RunStatus
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    wall_s: float
    created_at: datetime = Field(default_factory=utcnow)
    tags: dict[str, str] = Field(default_factory=dict)
    reason: str | None = Field(
        default=None,
        description="One-line reason of a failed run (a failed step, an invalid plan, a "
        "question that could not be asked); null for a completed run, and in files written "
        "before the column existed.",
    )

    def row(self) -> dict[str, Any]:
        d = self.model_dump()
        d["tags"] = list(self.tags.items())
        return d


_TS = pa.timestamp("us", tz="UTC")

STEPS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("question_id", pa.string()),
        ("step", pa.int32()),
        ("depth", pa.int32()),
        ("parent_step", pa.int32()),
        ("worker", pa.string()),
        ("model", pa.string()),
        ("instruction", pa.string()),
        ("access", pa.list_(pa.int32())),
        ("messages", pa.string()),
        ("output", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cost_usd", pa.float64()),
        ("latency_s", pa.float64()),
        ("started_at", _TS),
        ("finished_at", _TS),
        ("sandbox", pa.string()),
    ]
)

RUNS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("question_id", pa.string()),
        ("question", pa.string()),
        ("reference", pa.string()),
        ("conductor_model", pa.string()),
        ("conductor_output", pa.string()),
        ("workflow_json", pa.string()),
        ("format_valid", pa.bool_()),
        ("format_error", pa.string()),
        ("answer", pa.string()),
        ("correct", pa.bool_()),
        ("reward", pa.float64()),
        ("status", pa.string()),
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cost_usd", pa.float64()),
        ("wall_s", pa.float64()),
        ("created_at", _TS),
        ("tags", pa.map_(pa.string(), pa.string())),
        ("reason", pa.string()),
    ]
)

# OrchRM preference pairs (arXiv 2606.13598). ``input``, ``chosen``, ``rejected`` and ``source``
# are the field names of OrchRM's released dataset, so ``datasets`` and pandas load the Parquet
# files as they are; the other columns trace each pair back to its runs and to the build
# (``pair_set``, e.g. an MLflow run id) that wrote it.
PAIRS_SCHEMA = pa.schema(
    [
        ("pair_id", pa.string()),  # sha256(input, chosen, rejected), first 16 hex digits
        ("question_id", pa.string()),
        ("input", pa.string()),  # the prompt the reward model reads before a document
        ("chosen", pa.string()),
        ("rejected", pa.string()),
        ("source", pa.string()),  # how the pair was built, e.g. "correct-over-incorrect"
        ("margin", pa.float64()),  # reward(chosen run) - reward(rejected run); null if unknown
        ("split", pa.string()),  # "train" or "test", by question
        ("chosen_run_id", pa.string()),
        ("rejected_run_id", pa.string()),
        ("truncated", pa.bool_()),  # either document was cut to the token budget
        ("pair_set", pa.string()),
        ("created_at", _TS),
    ]
)
