"""The accuracy table (docs/benchmarks.md, summarised in the README), read back from MLflow.

``conductor eval`` logs every eval as one MLflow run in experiment ``eval/<dataset>`` with
its per-question results table (``results.json``). This script takes, per dataset and
strategy, the latest finished eval (or the one named by ``--eval-id``), recounts it from its
per-question table, and prints one row per strategy: questions, accuracy, tokens per
question (input + output), cost per question, failed runs, the conductor's format-valid
rate, the eval's wall time, and the accuracy difference to the baseline strategy
(``--baseline``, default ``single:smol``) on the same dataset.

    python -m benchmarks.accuracy_report [--datasets arithmetic humaneval] [--json]

The tracking store is ``MLFLOW_TRACKING_URI``, else ``$CONDUCTOR_HOME/mlflow.db`` (as for
``conductor eval``). Nothing is evaluated here: run the evals first (see docs/evaluation.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

COLUMNS = [
    "dataset",
    "strategy",
    "n",
    "accuracy",
    "vs_baseline",
    "tokens_per_q",
    "input_per_q",
    "output_per_q",
    "cost_per_q_usd",
    "failed",
    "format_valid_rate",
    "wall_s",
]


def _summary(dataset: str, strategy: str, rows: list[dict[str, Any]], run: Any) -> dict[str, Any]:
    n = len(rows)
    costs = [r.get("cost_usd") for r in rows]
    known = [c for c in costs if c is not None]
    tokens_in = sum(r.get("input_tokens") or 0 for r in rows) / n
    tokens_out = sum(r.get("output_tokens") or 0 for r in rows) / n
    conductor = strategy == "conductor"
    correct = sum(bool(r.get("correct")) for r in rows)
    return {
        "dataset": dataset,
        "strategy": strategy,
        "n": n,
        "correct": correct,
        "accuracy": correct / n,
        "input_per_q": round(tokens_in, 1),
        "output_per_q": round(tokens_out, 1),
        "tokens_per_q": round(tokens_in + tokens_out, 1),
        "cost_per_q_usd": sum(known) / n if len(known) == n else None,
        "failed": sum(r.get("status") != "completed" for r in rows),
        "format_valid_rate": (
            sum(bool(r.get("format_valid")) for r in rows) / n if conductor else None
        ),
        "wall_s": round(run.data.metrics.get("wall_s", float("nan")), 1),
        "eval_id": run.data.tags.get("eval_id"),
        "mlflow_run_id": run.info.run_id,
    }


def collect(
    datasets: list[str], eval_ids: set[str], baseline: str, limit: int | None
) -> list[dict[str, Any]]:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow
    from prefect_conductor.tasks.tracking import tracking_uri

    mlflow.set_tracking_uri(tracking_uri())
    out: list[dict[str, Any]] = []
    for dataset in datasets:
        experiment = mlflow.get_experiment_by_name(f"eval/{dataset}")
        if experiment is None:
            print(f"no evals of {dataset!r} in {tracking_uri()}", file=sys.stderr)
            continue
        runs = mlflow.search_runs(
            [experiment.experiment_id],
            filter_string="attributes.status = 'FINISHED'",
            order_by=["attributes.start_time DESC"],
            output_format="list",
        )
        latest: dict[str, Any] = {}
        for run in runs:
            strategy = run.data.params.get("strategy", "?")
            if eval_ids and run.data.tags.get("eval_id") not in eval_ids:
                continue
            if limit is not None and run.data.params.get("limit") != str(limit):
                continue
            latest.setdefault(strategy, run)  # newest first
        rows_by_strategy = {}
        for strategy, run in latest.items():
            table = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/results.json")
            rows = [dict(zip(table["columns"], r, strict=False)) for r in table["data"]]
            if rows:
                rows_by_strategy[strategy] = _summary(dataset, strategy, rows, run)
        base = rows_by_strategy.get(baseline)
        for summary in sorted(rows_by_strategy.values(), key=lambda r: r["strategy"]):
            summary["vs_baseline"] = (
                round(summary["accuracy"] - base["accuracy"], 3) if base else None
            )
            out.append(summary)
    return out


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "–"
    if key in ("accuracy", "format_valid_rate"):
        return f"{value:.1%}"
    if key == "vs_baseline":
        return f"{value * 100:+.1f} pt"
    if key == "cost_per_q_usd":
        return f"{value:.6f}"
    return str(value)


def table(rows: list[dict[str, Any]]) -> str:
    cells = [[_cell(k, r.get(k)) for k in COLUMNS] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(COLUMNS)]
    lines = ["  ".join(k.rjust(w) for k, w in zip(COLUMNS, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["arithmetic", "humaneval"])
    ap.add_argument("--eval-id", action="append", default=[], help="only these evals")
    ap.add_argument("--limit", type=int, help="only evals run with this --limit")
    ap.add_argument("--baseline", default="single:smol", help="strategy compared against")
    ap.add_argument("--json", action="store_true", help="print one JSON list instead")
    args = ap.parse_args()
    rows = collect(args.datasets, set(args.eval_id), args.baseline, args.limit)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(table(rows) if rows else "no evals found")
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
