"""What goes into an orchestration run and what comes out.

``OrchestrateRequest`` is the parameter model of the ``orchestrate`` flow, so the Prefect UI
renders it as a form; ``RunResult`` is what the flow returns and ``conductor run --json`` prints.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from prefect_conductor.conductor.plan.strategies import STRATEGY_EXAMPLES, STRATEGY_PATTERN
from prefect_conductor.conductor.pool import ConductorHint
from prefect_conductor.conductor.question import QuestionError, check_question
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator
from pydantic_core import PydanticCustomError

__all__ = ["EvalRequest", "EvalResult", "OrchestrateRequest", "RunResult", "StrategyText"]

# The pattern and examples land in the flows' parameter schema, so the Prefect deployment
# form shows the allowed strategies and rejects any other before a run starts.
StrategyText = Annotated[str, StringConstraints(strip_whitespace=True, pattern=STRATEGY_PATTERN)]


def _strategy_field() -> Any:
    return Field(
        default="conductor",
        description="One of: conductor (the conductor writes the plan); single:WORKER (one "
        "step on one worker); self-consistency:WORKER:K (K samples of one worker, majority "
        "vote; K 1-64); random-plan (a random valid plan); best-of-n:N[:PROPOSER] (N plans "
        "run, OrchRM picks one; N 2-64); best-of-n-plan:N[:PROPOSER] (OrchRM picks one of N "
        "plans before running it). PROPOSER: conductor (default) or random-plan.",
        examples=list(STRATEGY_EXAMPLES),
    )


class OrchestrateRequest(BaseModel):
    """One question through one conductor plan."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=20_000, description="The question to answer.")
    pool: str | None = Field(
        default=None, description="Path to a pool YAML file; empty for the embedded local pool."
    )
    on_invalid_plan: Literal["fallback", "error"] = Field(
        default="fallback",
        description="fallback: run a one-step plan on the default worker; error: fail the run.",
    )
    max_steps: int | None = Field(
        default=None, ge=1, le=128, description="Overrides the pool's max_steps."
    )
    strategy: StrategyText = _strategy_field()
    seed: int = Field(default=0, description="Seed of the random-plan strategy.")
    question_id: str | None = Field(default=None, description="Stable id, e.g. from a dataset.")
    reference: str | None = Field(
        default=None, description="Reference answer: the run is verified and rewarded."
    )
    kind: Literal["math", "mc", "code", "text"] = Field(
        default="math", description="How the answer is verified against the reference."
    )
    meta: dict[str, Any] = Field(
        default_factory=dict, description="Verifier data, e.g. entry_point and test for code."
    )
    tags: dict[str, str] = Field(default_factory=dict, description="Stored with the run.")
    artifacts: str | None = Field(
        default=None, description="Dataset root (path or URL); default $CONDUCTOR_HOME/artifacts."
    )
    conductor: str | None = Field(
        default=None,
        description="A trained conductor instead of the pool's: an adapter directory, "
        "models:/conductor@champion, or embedded.",
    )
    plan_text: str | None = Field(
        default=None,
        max_length=100_000,
        description="Run this conductor output instead of asking the conductor (GRPO rollouts).",
    )
    plan_source: str | None = Field(
        default=None, description="Who wrote plan_text; stored as the run's conductor_model."
    )
    rm: str | None = Field(
        default=None,
        description="OrchRM scorer of best-of-n strategies: a directory or "
        "models:/orchrm@champion (the default).",
    )
    conductor_temperature: float | None = Field(
        default=None,
        ge=0.0,
        le=2.0,
        description="Sample the conductor at this temperature (seeded by seed); "
        "default: the pool's setting.",
    )
    conductor_hint: ConductorHint | None = Field(
        default=None,
        description="What the conductor reads besides its question, for this run only (the "
        "worked examples of hinted self-sampling; a plain string is a note after its "
        "instructions); default: the pool's hint.",
    )

    @field_validator("question", mode="before")
    @classmethod
    def _askable(cls, value: Any) -> Any:
        # Before min_length, so that "" is refused in our words as "   " is (issue 38);
        # min_length stays for the schema, i.e. the deployment form.
        if isinstance(value, str):
            try:
                check_question(value)
            except QuestionError as exc:
                raise PydanticCustomError("question", str(exc)) from None
        return value


class RunResult(BaseModel):
    """The outcome of one run, as printed by ``conductor run --json``."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    status: Literal["completed", "failed"]
    answer: str | None
    workflow: list[dict[str, Any]]
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    wall_s: float
    artifacts: str
    format_valid: bool
    format_error: str | None = None
    reason: str | None = Field(default=None, description="One-line reason when the run failed.")
    question_id: str | None = None
    correct: bool | None = Field(default=None, description="Set when a reference was given.")
    reward: float | None = Field(default=None, description="0 / 0.5 / 1 (the Conductor paper).")
    step_outputs: list[tuple[str, str | None]] = Field(
        default_factory=list,
        description="Top-level steps in order: (status, output or error); what OrchRM reads.",
    )
    selection: dict[str, Any] | None = Field(
        default=None, description="Best-of-N: the candidates, their scores and the baselines."
    )


class EvalRequest(BaseModel):
    """One strategy on one dataset (``conductor eval``); the parameters of ``evaluate``."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(description="arithmetic, mixed, humaneval, or a JSONL/Parquet/CSV file.")
    split: str = Field(default="test", description="Dataset split.")
    limit: int | None = Field(default=None, ge=1, description="First N questions only.")
    strategy: StrategyText = _strategy_field()
    samples: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Runs per question (seed + k for random plans; a conductor samples at "
        "temperature 1.0); every run is stored, tagged with its sample index.",
    )
    concurrency: int = Field(default=4, ge=1, le=64, description="Questions run at once.")
    pool: str | None = Field(default=None, description="Pool YAML file; empty for the local pool.")
    seed: int = Field(default=0, description="Seed of generated datasets and random plans.")
    artifacts: str | None = Field(default=None, description="Dataset root; default under home.")
    conductor: str | None = Field(
        default=None,
        description="A trained conductor instead of the pool's: an adapter directory, "
        "models:/conductor@champion, or embedded.",
    )
    rm: str | None = Field(
        default=None,
        description="OrchRM scorer of best-of-n strategies; default models:/orchrm@champion.",
    )
    experiment: str | None = Field(
        default=None, description="MLflow experiment; default eval/<dataset>."
    )
    mlflow_tags: dict[str, str] = Field(
        default_factory=dict, description="Extra MLflow run tags (e.g. mlflow.parentRunId)."
    )
    tags: dict[str, str] = Field(
        default_factory=dict,
        description="Extra tags of every stored run (a training's train_run, train_stage).",
    )
    run_name: str | None = Field(default=None, description="MLflow run name; default the strategy.")
    fan_out: bool = Field(
        default=False,
        description="Hand each question to the fleet: any `conductor serve` on any host "
        "(Prefect background task runs); needs a Prefect server and storage blocks every host "
        "reads (PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK, "
        "PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK).",
    )


class EvalResult(BaseModel):
    """What ``conductor eval --json`` prints."""

    model_config = ConfigDict(frozen=True)

    eval_id: str
    dataset: str
    split: str
    strategy: str
    n: int = Field(description="Runs (questions x samples).")
    questions: int = 0
    samples: int = 1
    pass_at_k: float | None = Field(
        default=None, description="Share of questions with at least one correct run (samples > 1)."
    )
    accuracy: float
    selection: dict[str, float] | None = Field(
        default=None,
        description="Best-of-N: accuracy of majority vote, random pick, oracle and the "
        "plan-only pick on the same candidates.",
    )
    correct: int
    failed: int
    mean_input_tokens: float
    mean_output_tokens: float
    mean_cost_usd: float | None
    wall_s: float
    format_valid_rate: float | None = Field(description="Conductor strategies only.")
    mlflow_experiment: str
    mlflow_run_id: str | None
    artifacts: str
