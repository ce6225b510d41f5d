"""The ``evaluate`` flow: one strategy over a dataset, every question a tracked run.

Each question is a ``question`` task run of the eval (``tasks.questions.eval_question``): the
same plan, step task runs and verification as an ``orchestrate`` run, at most ``concurrency``
at once, without a flow run or artifacts of its own. Its run lands in the artifact store, tagged
with the eval id and strategy; the eval stores finished runs in batches (``RunBatch``), one
Parquet part per table for up to 50 runs. A best-of-n question is its ``best-of-n`` subflow.
The eval as a whole is one MLflow run in experiment ``eval/<dataset>``, so the paper's
comparisons (conductor, single worker, self-consistency, random plan; arXiv 2512.04388 §5)
sit side by side in the MLflow UI.

In the Prefect UI an eval is the run ``eval · <dataset> · <strategy>``: its ``eval-progress``
artifact moves as runs finish (a tqdm bar too, only when stderr is a terminal), its
``eval-runs`` table has one row per run, its ``eval-summary`` table holds the metrics, and its
result (persisted) is the ``EvalResult``.

A question that cannot be asked (longer than a request allows, blank, a row without a text
question) fails alone (issue #38): it is stored as a failed run whose ``reason`` says why,
counts as wrong, and the other questions run.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from functools import partial
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.futures import PrefectFuture
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from prefect_conductor.conductor.data.datasets import DatasetError, Example, load_dataset
from prefect_conductor.conductor.data.records import RunRecord
from prefect_conductor.conductor.errors import ConductorError
from prefect_conductor.conductor.home import artifacts_location
from prefect_conductor.conductor.plan.requests import (
    EvalRequest,
    EvalResult,
    OrchestrateRequest,
    RunResult,
)
from prefect_conductor.conductor.plan.strategies import parse_strategy
from prefect_conductor.conductor.pool import load_pool
from prefect_conductor.flows.best_of_n import QUESTION_FLOWS
from prefect_conductor.flows.orchestrate import TASK_RUNNER_WORKERS
from prefect_conductor.tasks.artifacts import (
    EvalProgress,
    RunBatch,
    publish_eval_runs,
    publish_eval_summary,
)
from prefect_conductor.tasks.questions import RunOutcome, eval_question
from prefect_conductor.tasks.tracking import log_eval
from pydantic import ValidationError

__all__ = ["evaluate"]

# A conductor sampled several times per question (``--samples``) samples at this temperature
# (the Conductor paper's rollout temperature).
SAMPLED_CONDUCTOR_TEMPERATURE = 1.0
# Question tasks wait for their steps in the eval's own thread pool: it holds at most
# ``EvalRequest.concurrency`` (<= 64) waiting questions plus a plan runner's worth of steps.
MAX_CONCURRENCY = 64
# While it waits for questions, the eval looks this often whether a batch of rows is due.
POLL_S = 1.0


def _tags(req: EvalRequest, eval_id: str, sample: int) -> dict[str, str]:
    tags = {**req.tags, "eval_id": eval_id, "dataset": req.dataset, "split": req.split}
    if req.samples > 1:
        tags["sample"] = str(sample)
    return tags


def _request(
    ex: Example, req: EvalRequest, eval_id: str, strategy: str, sample: int = 0
) -> OrchestrateRequest:
    """The question's request; raises ``ValidationError`` or a ``ConductorError`` for a
    question that cannot be asked."""
    if ex.invalid:
        raise DatasetError(ex.invalid)
    tags = _tags(req, eval_id, sample)
    return OrchestrateRequest(
        question=ex.question,
        pool=req.pool,
        strategy=strategy,
        seed=req.seed + sample,
        question_id=ex.id,
        reference=ex.reference,
        kind=ex.kind,
        meta=ex.meta,
        tags=tags,
        artifacts=req.artifacts,
        conductor=req.conductor,
        rm=req.rm,
        conductor_temperature=(
            SAMPLED_CONDUCTOR_TEMPERATURE if req.samples > 1 and strategy == "conductor" else None
        ),
    )


def _not_asked_reason(ex: Example, exc: Exception) -> str:
    """One line: why ``ex`` was not asked, e.g. ``question 'q3' not asked: question: String
    should have at most 20000 characters (it has 25,000)``."""
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        text = f"{'.'.join(map(str, err['loc']))}: {err['msg'].removeprefix('Value error, ')}"
        if err["type"] == "string_too_long" and tuple(err["loc"]) == ("question",):
            text += f" (it has {len(ex.question):,})"
    else:
        lines = str(exc).strip().splitlines()
        text = lines[0] if lines else type(exc).__name__
    return f"question {ex.id!r} not asked: {text}"


def _not_asked(
    ex: Example,
    req: EvalRequest,
    eval_id: str,
    strategy: str,
    sample: int,
    reason: str,
) -> RunOutcome:
    """A question that could not be asked, as a failed run: no plan, no steps, wrong."""
    run = RunRecord(
        run_id=str(uuid.uuid4()),
        question_id=ex.id,
        question=ex.question,  # as the dataset has it, however long
        reference=ex.reference,
        conductor_model=f"({strategy})",  # nobody planned
        format_valid=False,
        correct=False,
        reward=0.0,
        status="failed",
        cost_usd=0.0,
        wall_s=0.0,
        tags={**_tags(req, eval_id, sample), "strategy": strategy},
        reason=reason,
    )
    result = RunResult(
        run_id=run.run_id,
        status="failed",
        answer=None,
        workflow=[],
        input_tokens=0,
        output_tokens=0,
        cost_usd=0.0,
        wall_s=0.0,
        artifacts=req.artifacts or artifacts_location(),
        format_valid=False,
        reason=reason,
        question_id=ex.id,
        correct=False,
        reward=0.0,
    )
    return RunOutcome(result, run, [])


_SELECTION = ("majority_correct", "random_correct", "oracle_correct", "plan_pick_correct")


def _selection_row(r: RunResult | None) -> dict[str, object]:
    """A best-of-n run's baselines on the same candidates (empty for other strategies)."""
    if r is None or not r.selection:
        return {}
    return {k: r.selection.get(k) for k in _SELECTION if r.selection.get(k) is not None}


def _selection_metrics(rows: list[dict[str, object]]) -> dict[str, float]:
    """Accuracy of each baseline over the questions that have it."""
    out = {}
    for key in _SELECTION:
        known = [bool(r[key]) for r in rows if r.get(key) is not None]
        if known:
            out[key.replace("_correct", "_accuracy")] = sum(known) / len(known)
    return out


def _mean(values: list[float | int | None]) -> float | None:
    known = [v for v in values if v is not None]
    if len(known) < len(values) or not values:
        return None
    return sum(known) / len(known)


def _dataset_name(dataset: str) -> str:
    """``arithmetic`` for a built-in dataset, the file's stem for a file."""
    return Path(dataset).stem if Path(dataset).suffix else dataset


def _run_name() -> str:
    """``eval · arithmetic · single:calculator``."""
    req = (flow_run.parameters or {}).get("request") or {}
    if isinstance(req, EvalRequest):
        dataset, strategy = req.dataset, req.strategy
    else:
        dataset, strategy = str(req.get("dataset", "")), str(req.get("strategy", "conductor"))
    return f"eval · {_dataset_name(dataset)} · {strategy}"


def _said(result: EvalResult) -> str:
    """``single:calculator on arithmetic: accuracy 67.0% (134/200), 0 failed``."""
    return (
        f"{result.strategy} on {result.dataset}: accuracy {result.accuracy:.1%} "
        f"({result.correct}/{result.n}), {result.failed} failed"
    )


def _drain(finished: queue.SimpleQueue[PrefectFuture], wait_s: float) -> list[PrefectFuture]:
    """The futures of questions that finished, waiting up to ``wait_s`` for the first."""
    done = []
    try:
        done.append(finished.get(timeout=wait_s) if wait_s else finished.get_nowait())
    except queue.Empty:
        return done
    while not finished.empty():
        done.append(finished.get_nowait())
    return done


@flow(
    name="evaluate",
    flow_run_name=_run_name,
    task_runner=ThreadPoolTaskRunner(TASK_RUNNER_WORKERS + MAX_CONCURRENCY),
    log_prints=False,
    persist_result=True,
    result_serializer="json",
)
def evaluate(request: EvalRequest) -> EvalResult:
    """Run ``request.strategy`` on every question of the dataset; track it in MLflow."""
    started = time.perf_counter()
    started_at = time.time()  # the MLflow run spans the eval's real start and end
    pool = load_pool(request.pool)
    strategy = str(parse_strategy(request.strategy, pool))
    examples = load_dataset(
        request.dataset,
        split=request.split,
        limit=request.limit,
        seed=request.seed,
        bad_questions="keep",  # such a question fails alone, below
    )
    eval_id = str(flow_run.id or time.time_ns())

    # At most ``concurrency`` questions at once. Each finished question releases the gate
    # and posts its future to ``finished``; this thread alone moves the progress artifact
    # (API calls) and hands the finished runs' rows to the batch.
    gate = threading.Semaphore(request.concurrency)
    finished: queue.SimpleQueue[PrefectFuture] = queue.SimpleQueue()
    jobs = [(ex, k) for ex in examples for k in range(request.samples)]
    progress = EvalProgress(len(jobs), f"eval {strategy}")
    batch = RunBatch(request.artifacts)

    def settle(wait_s: float = 0.0) -> None:
        done = _drain(finished, wait_s)
        for future in done:
            outcome = future.result(raise_on_failure=False)
            if isinstance(outcome, RunOutcome):
                batch.add(outcome.run, outcome.steps)
        progress.advance(len(done))
        batch.flush_if_due()

    futures: list[PrefectFuture | RunOutcome] = []  # a RunOutcome: a question not asked
    submit = partial(eval_question.submit, flows=QUESTION_FLOWS)
    if request.fan_out:  # fan-out hook (issue #19): the questions run on the fleet
        from prefect_conductor.fleet.fanout import Fleet

        submit = Fleet(request.concurrency).submit
    for ex, k in jobs:
        try:
            question = _request(ex, request, eval_id, strategy, k)
        except (ValidationError, ConductorError) as exc:
            reason = _not_asked_reason(ex, exc)
            get_run_logger().warning(reason)
            outcome = _not_asked(ex, request, eval_id, strategy, k, reason)
            batch.add(outcome.run, outcome.steps)
            progress.advance(1)
            futures.append(outcome)
            continue
        while not gate.acquire(timeout=POLL_S):
            settle()
        settle()
        future = submit(question)
        future.add_done_callback(lambda f: (finished.put(f), gate.release()))
        futures.append(future)
    while progress.done < len(jobs):
        settle(POLL_S)
    batch.close()
    progress.close()
    results: list[RunResult | None] = []
    for future in futures:
        outcome = (
            future if isinstance(future, RunOutcome) else future.result(raise_on_failure=False)
        )
        if isinstance(outcome, RunOutcome):
            outcome = outcome.result
        results.append(outcome if isinstance(outcome, RunResult) else None)

    rows = []
    for (ex, k), r in zip(jobs, results, strict=True):
        rows.append(
            {
                "question_id": ex.id,
                "sample": k,
                "question": ex.question,
                "reference": ex.reference,
                "answer": r.answer if r else None,
                "correct": bool(r and r.correct),
                "reward": r.reward if r else None,
                "status": r.status if r else "crashed",
                "format_valid": r.format_valid if r else False,
                "input_tokens": r.input_tokens if r else 0,
                "output_tokens": r.output_tokens if r else 0,
                "cost_usd": r.cost_usd if r else None,
                "run_id": r.run_id if r else None,
                "reason": r.reason if r else None,
                **_selection_row(r),
            }
        )
    n = len(rows)
    correct = sum(r["correct"] for r in rows)
    metrics = {
        "n": n,
        "correct": correct,
        "accuracy": correct / n if n else 0.0,
        "mean_input_tokens": sum(r["input_tokens"] for r in rows) / n if n else 0.0,
        "mean_output_tokens": sum(r["output_tokens"] for r in rows) / n if n else 0.0,
        "mean_cost_usd": _mean([r["cost_usd"] for r in rows]),
        "failed": sum(r["status"] != "completed" for r in rows),
        "format_valid_rate": (
            sum(r["format_valid"] for r in rows) / n if n and strategy == "conductor" else None
        ),
    }
    publish_eval_runs(rows, strategy)
    selection = _selection_metrics(rows) or None
    metrics.update(selection or {})
    solved = {r["question_id"] for r in rows if r["correct"]}
    pass_at_k = len(solved) / len(examples) if examples and request.samples > 1 else None
    if pass_at_k is not None:
        metrics[f"pass_at_{request.samples}"] = pass_at_k
    metrics["wall_s"] = time.perf_counter() - started
    experiment = request.experiment or f"eval/{_dataset_name(request.dataset)}"
    result = EvalResult(
        eval_id=eval_id,
        dataset=request.dataset,
        split=request.split,
        strategy=strategy,
        n=n,
        questions=len(examples),
        samples=request.samples,
        pass_at_k=pass_at_k,
        selection=selection,
        correct=correct,
        accuracy=metrics["accuracy"],
        failed=metrics["failed"],
        mean_input_tokens=metrics["mean_input_tokens"],
        mean_output_tokens=metrics["mean_output_tokens"],
        mean_cost_usd=metrics["mean_cost_usd"],
        wall_s=round(metrics["wall_s"], 3),
        format_valid_rate=metrics["format_valid_rate"],
        mlflow_experiment=experiment,
        mlflow_run_id=None,
        artifacts=request.artifacts or artifacts_location(),
    )
    try:
        mlflow_run_id = log_eval(
            experiment,
            request.run_name or strategy,
            params={
                "pool": request.pool or "embedded:local",
                "strategy": strategy,
                "dataset": request.dataset,
                "split": request.split,
                "limit": request.limit,
                "concurrency": request.concurrency,
                "samples": request.samples,
                "seed": request.seed,
                "conductor": request.conductor,
                "rm": request.rm,
            },
            metrics=metrics,
            rows=rows,
            tags={"eval_id": eval_id, **request.mlflow_tags},
            started_at=started_at,
            ended_at=time.time(),
        )
    except Exception as exc:
        # MLflow down (issue #19): the runs are stored and the eval-runs table published;
        # the summary (without an MLflow run id) is kept too, then the eval fails as it must.
        publish_eval_summary(result)
        get_run_logger().warning(f"{_said(result)}; not logged to MLflow: {exc}")
        raise
    result = result.model_copy(
        update={
            "mlflow_run_id": mlflow_run_id,
            "wall_s": round(time.perf_counter() - started, 3),
        }
    )
    publish_eval_summary(result)
    get_run_logger().info(f"{_said(result)}; MLflow run {mlflow_run_id}")
    return result
