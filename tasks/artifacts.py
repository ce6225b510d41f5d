"""Artifact tasks: store a run's rows in the Parquet dataset and show them in the Prefect UI."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from conductor.records import RunRecord, StepRecord
from conductor.store import ArtifactStore
from conductor.workflow import Workflow

__all__ = ["save_run", "publish_plan", "publish_steps"]


@task(
    cache_policy=NO_CACHE,
    name="save-artifacts",
    task_run_name="save artifacts",
    retries=2,
    retry_delay_seconds=1,
)
def save_run(run: RunRecord, steps: list[StepRecord], root: str | None = None) -> str:
    """Append one run and its steps to the dataset in a single batch; returns the root."""
    store = ArtifactStore(root)
    store.write([run], steps)
    return store.root


def _cell(text: str, limit: int = 80) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def publish_plan(workflow: Workflow, question: str, format_error: str | None) -> None:
    """A Markdown artifact with the plan as a table and its DAG as Mermaid source."""
    rows = "\n".join(
        f"| {s.index} | {s.worker} | {', '.join(map(str, s.access)) or '-'} "
        f"| {_cell(s.instruction)} |"
        for s in workflow.steps
    )
    note = (
        f"\n> The conductor's plan was invalid ({_cell(format_error, 200)}); "
        "this is the fallback.\n"
        if format_error
        else ""
    )
    markdown = (
        f"## Plan\n\n**Question:** {_cell(question, 300)}\n{note}\n"
        f"| step | worker | reads | subtask |\n|---|---|---|---|\n{rows}\n\n"
        f"```mermaid\n{workflow.mermaid()}\n```\n"
    )
    create_markdown_artifact(markdown=markdown, key="conductor-plan", description="Conductor plan")


def publish_steps(steps: list[StepRecord]) -> None:
    """A table artifact of the steps: worker, status, tokens, cost, latency."""
    table = [
        {
            "step": s.step,
            "depth": s.depth,
            "worker": s.worker,
            "status": s.status,
            "input_tokens": s.input_tokens,
            "output_tokens": s.output_tokens,
            "cost_usd": s.cost_usd,
            "latency_s": round(s.latency_s, 3) if s.latency_s is not None else None,
            "error": s.error,
        }
        for s in steps
    ]
    create_table_artifact(table=table, key="conductor-steps", description="Conductor steps")
