"""Artifact tasks: store a run's rows in the Parquet dataset and show them in the Prefect UI.

Everything published here renders in the Prefect UI as is: Markdown tables and block quotes
(the UI shows Mermaid source as raw text, so a plan is a table whose ``sees`` column is its
DAG), table artifacts, and a progress artifact. Keys (a new version per run):

- ``conductor-plan``: the plan, published while its first steps run;
- ``conductor-answer``: the answer, the run's status and, after verification, correct/reward;
- ``conductor-steps``: one row per executed step (status, tokens, cost, latency, error);
- ``eval-progress``: the share of an eval's runs that have finished;
- ``eval-runs``: an eval's runs, one row each (an eval's questions publish none of the above);
- ``eval-summary``: an eval's metrics, one row each.

An eval stores its runs' rows in batches (``RunBatch``: one Parquet part per table for up to
``BATCH_RUNS`` runs, or what finished within ``BATCH_WAIT_S``) instead of two files per run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from prefect import task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect_conductor.conductor.data.records import RunRecord, StepRecord
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.plan.requests import EvalResult, RunResult
from prefect_conductor.conductor.plan.workflow import Workflow
from prefect_conductor.tasks.assets import table_asset, writing
from prefect_conductor.tasks.tracking import retry_unless_unreachable
from tqdm import tqdm

__all__ = [
    "BATCH_RUNS",
    "BATCH_WAIT_S",
    "EvalProgress",
    "RunBatch",
    "answer_markdown",
    "eval_summary_rows",
    "plan_markdown",
    "publish_answer",
    "publish_eval_runs",
    "publish_eval_summary",
    "publish_plan",
    "publish_steps",
    "save_run",
    "save_runs",
    "store_root",
]

# An answer longer than this is cut in the artifact; the full text is in the run's result.
ANSWER_LIMIT = 10_000
# An eval writes one Parquet part per table for this many finished runs, or sooner once the
# oldest unwritten run has waited BATCH_WAIT_S (so a killed eval loses at most that window).
BATCH_RUNS = 50
BATCH_WAIT_S = 5.0


@task(
    cache_policy=NO_CACHE,
    name="save-artifacts",
    task_run_name="save artifacts",
    retries=2,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_unreachable,  # an object store that stayed down: once
)
def save_run(run: RunRecord, steps: list[StepRecord], root: str | None = None) -> str:
    """Append one run and its steps to the dataset in a single batch; returns the root."""
    store = ArtifactStore(root)
    store.write([run], steps)
    return store.root


@task(
    cache_policy=NO_CACHE,
    name="save-artifacts",
    task_run_name="save artifacts ({n} runs)",
    retries=2,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_unreachable,
)
def save_runs(
    runs: Sequence[RunRecord], steps: Sequence[StepRecord], root: str | None, n: int
) -> str:
    """Append several runs and their steps in a single batch (one file per table)."""
    store = ArtifactStore(root)
    store.write(runs, steps)
    return store.root


def run_tables(root: str | None) -> list[str]:
    """The assets ``save_run`` and ``save_runs`` write: the ``runs`` and ``steps`` tables."""
    return [table_asset("runs", root), table_asset("steps", root)]


def store_root(root: str | None = None) -> str:
    """The root ``save_run`` reports for ``root``, without writing anything."""
    return ArtifactStore(root).root


class RunBatch:
    """Finished runs of an eval waiting to be stored together (see ``BATCH_RUNS``).

    Each run is stored once, by run id, however often it is added (a retried question's
    outcome, offered twice, adds no second row). Call ``flush_if_due`` now and then and
    ``close`` at the end, from one thread; writes run as ``save_runs`` task runs."""

    def __init__(self, root: str | None, size: int | None = None, max_wait_s: float | None = None):
        self.root = root
        self.size = size or BATCH_RUNS
        self.max_wait_s = BATCH_WAIT_S if max_wait_s is None else max_wait_s
        self._runs: list[RunRecord] = []
        self._steps: list[StepRecord] = []
        self._seen: set[str] = set()
        self._oldest: float | None = None
        self._writes: list[Any] = []

    def add(self, run: RunRecord, steps: Sequence[StepRecord]) -> None:
        if run.run_id in self._seen:
            return
        self._seen.add(run.run_id)
        self._runs.append(run)
        self._steps.extend(steps)
        if self._oldest is None:
            self._oldest = time.monotonic()
        if len(self._runs) >= self.size:
            self.flush()

    def flush_if_due(self) -> None:
        if self._oldest is not None and time.monotonic() - self._oldest >= self.max_wait_s:
            self.flush()

    def flush(self) -> None:
        if not self._runs:
            return
        runs, steps = self._runs, self._steps
        self._runs, self._steps, self._oldest = [], [], None
        writer = writing(save_runs, run_tables(self.root))
        self._writes.append(writer.submit(runs, steps, self.root, len(runs)))

    def close(self) -> int:
        """Store what is left and wait for every write (a failed one raises); the number of
        runs stored."""
        self.flush()
        for write in self._writes:
            write.result()
        return len(self._seen)


def _cell(text: str, limit: int = 80) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def plan_markdown(workflow: Workflow, question: str, format_error: str | None) -> str:
    """The plan as a Markdown table; ``sees`` (the access list) is the DAG, ``wave`` the
    earliest round in which a step can run (steps of one wave run in parallel)."""
    wave = {i: n for n, layer in enumerate(workflow.layers()) for i in layer}
    rows = "\n".join(
        f"| {s.index} | {wave[s.index]} | {s.worker} | {', '.join(map(str, s.access)) or '-'} "
        f"| {_cell(s.instruction)} |"
        for s in workflow.steps
    )
    note = (
        f"\n> The conductor's plan was invalid ({_cell(format_error, 200)}); "
        "this is the fallback.\n"
        if format_error
        else ""
    )
    return (
        f"## Plan\n\n**Question:** {_cell(question, 300)}\n{note}\n"
        f"| step | wave | worker | sees | subtask |\n|---|---|---|---|---|\n{rows}\n\n"
        f"The answer is the output of step {workflow.final.index}.\n"
    )


def publish_plan(workflow: Workflow, question: str, format_error: str | None) -> None:
    """A Markdown artifact with the plan (see ``plan_markdown``)."""
    create_markdown_artifact(
        markdown=plan_markdown(workflow, question, format_error),
        key="conductor-plan",
        description="Conductor plan",
    )


def _quote(text: str) -> str:
    if len(text) > ANSWER_LIMIT:
        text = text[:ANSWER_LIMIT] + " … (cut; the full answer is the run's result)"
    return "\n".join(f"> {line}" if line.strip() else ">" for line in text.strip().splitlines())


def answer_markdown(result: RunResult) -> str:
    """The answer block: the answer quoted, then status, verification and usage."""
    lines = ["## Answer", ""]
    lines.append(_quote(result.answer) if result.answer else "*(no answer)*")
    lines.append("")
    if result.reason:
        lines += [f"**Failed:** {_cell(result.reason, 500)}", ""]
    if result.format_error:
        lines += [f"The conductor's plan was invalid ({_cell(result.format_error, 200)}).", ""]
    cost = "n/a" if result.cost_usd is None else f"{result.cost_usd:.6f}"
    columns = {"status": result.status}
    if result.correct is not None:  # verified against a reference
        columns["correct"] = "yes" if result.correct else "no"
        columns["reward"] = f"{result.reward}"
    columns |= {
        "steps": str(len(result.workflow)),
        "tokens in / out": f"{result.input_tokens} / {result.output_tokens}",
        "cost (USD)": cost,
        "wall time (s)": f"{result.wall_s:.2f}",
    }
    lines += [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        "| " + " | ".join(columns.values()) + " |",
    ]
    return "\n".join(lines) + "\n"


def publish_answer(result: RunResult) -> None:
    """A Markdown artifact with the run's outcome (see ``answer_markdown``)."""
    summary = _cell(result.answer or "(no answer)", 120)
    create_markdown_artifact(
        markdown=answer_markdown(result),
        key="conductor-answer",
        description=f"{result.status}: {summary}",
    )


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


def _value(v: object) -> object:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return float(f"{v:.6g}")
    return v


def eval_summary_rows(result: EvalResult) -> list[dict[str, Any]]:
    """One ``{"metric", "value"}`` row per metric of the eval (``n/a``: not measured)."""
    rows: list[tuple[str, object]] = [
        ("strategy", result.strategy),
        ("dataset", f"{result.dataset} ({result.split})"),
        ("accuracy", result.accuracy),
        ("runs (n)", result.n),
        ("questions", result.questions),
        ("correct", result.correct),
        ("failed runs", result.failed),
        ("mean input tokens", result.mean_input_tokens),
        ("mean output tokens", result.mean_output_tokens),
        ("mean cost (USD)", result.mean_cost_usd),
        ("wall time (s)", result.wall_s),
        ("format-valid rate", result.format_valid_rate),
    ]
    if result.pass_at_k is not None:
        rows.append((f"pass@{result.samples}", result.pass_at_k))
    rows += sorted((result.selection or {}).items())
    rows.append(("MLflow experiment", result.mlflow_experiment))
    rows.append(("MLflow run id", result.mlflow_run_id))
    return [{"metric": k, "value": _value(v)} for k, v in rows]


EVAL_RUN_COLUMNS = ("question_id", "sample", "status", "correct", "reward", "answer", "run_id")


def publish_eval_runs(rows: Sequence[dict[str, Any]], strategy: str) -> None:
    """One table artifact of an eval's runs (the eval's view of what single runs publish as
    ``conductor-answer``); answers cut to 80 characters, the rest is in the store."""
    table = [
        {
            k: _cell(str(r[k])) if k == "answer" and r.get(k) is not None else r.get(k)
            for k in EVAL_RUN_COLUMNS
        }
        for r in rows
    ]
    create_table_artifact(
        table=table, key="eval-runs", description=f"{strategy}: {len(table)} runs"
    )


def ledger_artifact(recipe: str, run_id: str, entries: Sequence[Any]) -> None:
    """The ``training-ledger`` table artifact: one row per stage (a ``LedgerEntry``) and the
    total, what a training spent (issue #40)."""
    table = [e.model_dump() for e in entries]
    total = table[-1] if table else {}
    create_table_artifact(
        table=table,
        key="training-ledger",
        description=f"{recipe} (MLflow run {run_id}): {total.get('worker_calls', 0)} worker "
        f"calls, ${total.get('cost_usd', 0):.4f}",
    )


def publish_eval_summary(result: EvalResult) -> None:
    """A table artifact of the eval's metrics (see ``eval_summary_rows``)."""
    create_table_artifact(
        table=eval_summary_rows(result),
        key="eval-summary",
        description=f"{result.strategy}: accuracy {result.accuracy:.1%} "
        f"({result.correct}/{result.n}), {result.failed} failed",
    )


class EvalProgress:
    """The ``eval-progress`` artifact (0-100 %) over ``total`` runs, updated as they finish,
    plus a tqdm bar when stderr is a terminal (a worker's log is not)."""

    def __init__(self, total: int, label: str):
        self.total = total
        self.done = 0
        self._shown = 0.0
        self._id = create_progress_artifact(
            progress=0.0 if total else 100.0, key="eval-progress", description=self._describe()
        )
        self._bar = tqdm(
            total=total, file=sys.stderr, desc=label, unit="run", disable=not sys.stderr.isatty()
        )

    def _describe(self) -> str:
        return f"{self.done} of {self.total} runs finished"

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more finished runs; the artifact moves in whole percents."""
        if n <= 0:
            return
        self.done = min(self.total, self.done + n)
        self._bar.update(n)
        percent = float(100 * self.done // self.total)
        if percent > self._shown:
            self._shown = percent
            update_progress_artifact(self._id, percent, description=self._describe())

    def close(self) -> None:
        self._bar.close()
