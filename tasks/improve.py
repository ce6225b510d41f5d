"""Tasks of the improvement loop (issue #41): the runs of an iteration's window, and the
iteration's MLflow run (experiment ``improve``)."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.training.improve import ImproveIteration, RunCounts
from prefect_conductor.conductor.training.ledger import LEDGER_FIELDS
from prefect_conductor.tasks.tracking import finish_run, open_run

__all__ = ["EXPERIMENT", "finish_iteration_run", "start_iteration_run", "window_runs"]

EXPERIMENT = "improve"


@task(cache_policy=NO_CACHE, name="window-runs", task_run_name="runs stored since {since}")
def window_runs(since: str | None, until: str) -> RunCounts:
    """The runs stored in ``[since, until)``: all, verified (``correct`` set) and not."""
    import pandas as pd

    runs = ArtifactStore().read_pandas("runs", columns=["created_at", "correct"])
    end = pd.Timestamp(until)
    window = runs[runs["created_at"] < end]
    if since is not None:
        window = window[window["created_at"] >= pd.Timestamp(since)]
    verified = int(window["correct"].notna().sum())
    return RunCounts(total=len(window), referenced=verified, unreferenced=len(window) - verified)


@task(cache_policy=NO_CACHE, name="start-iteration-run")
def start_iteration_run(iteration: ImproveIteration, recipe: str) -> str:
    return open_run(
        EXPERIMENT,
        f"iteration {iteration.iteration}",
        {"iteration": iteration.iteration, "since": iteration.since, "until": iteration.until,
         "recipe": recipe},
        {"iteration": str(iteration.iteration)},
    )  # fmt: skip


@task(cache_policy=NO_CACHE, name="finish-iteration-run")
def finish_iteration_run(iteration: ImproveIteration) -> None:
    """The iteration's counts, OrchRM's and the conductor's scores and its ledger total
    (``total/<field>``) as metrics; ``stopped`` as a tag-like metric of 1."""
    assert iteration.mlflow_run_id is not None
    total = next((e for e in iteration.ledger if e.stage == "total"), None)
    metrics: dict[str, float | None] = {
        "runs": iteration.runs.total,
        "runs_referenced": iteration.runs.referenced,
        "runs_unreferenced": iteration.runs.unreferenced,
        "pairs_new": iteration.pairs_new,
        **{f"pairs/{source}": n for source, n in iteration.pairs_by_source.items()},
        **{
            f"pairs_unreferenced/{source}": n
            for source, n in iteration.pairs_unreferenced_by_source.items()
        },
        "orchrm_accuracy": iteration.orchrm_accuracy,
        "orchrm_promoted": float(iteration.orchrm_promoted),
        "accuracy_before": iteration.accuracy_before,
        "accuracy_after": iteration.accuracy_after,
        "conductor_promoted": float(iteration.conductor_promoted),
        "stopped": float(iteration.stopped is not None),
    }
    if total is not None:
        metrics.update({f"total/{f}": float(getattr(total, f)) for f in LEDGER_FIELDS})
    finish_run(iteration.mlflow_run_id, "FINISHED", metrics)
