"""Does the trained conductor beat every single worker of the pool? (issue #8)

Evaluates, on the arithmetic **test** split (all 200 questions by default), in one
invocation and through the same ``evaluate`` flow as ``conductor eval``:

- every single worker of the pool (``single:calculator``, ``single:python``, ``single:smol``):
  the baselines the goal names;
- the trained conductor (``--conductor``, default the adapter shipped in the package), or,
  with ``--recipe NAME|FILE [--set KEY=VALUE ...]``, the conductor a training of this
  invocation registers: ``conductor train-conductor --recipe … --set … --no-promote --json``
  runs first, timed as one command (issue #8's "the default command reaches rows 1-2");
  its wall time and ledger total are printed with the table;
- optionally the base conductor and ``self-consistency:smol:5`` (``--costly``, on the first
  ``--costly-limit`` questions: the base conductor writes 256 tokens per question).

Rows named in ``--reuse`` are not rerun: the latest finished MLflow eval of that strategy on
the same dataset and split is read back instead (marked ``reused``), e.g. the pool's own
conductor that a recipe's ``before`` stage (``{kind: eval, conductor: start}``) evaluated.

Prints one table (accuracy overall and per level, valid plans, tokens per question, wall
time), the goal checks, and the trained conductor's plan diversity per level (distinct
topologies and worker mixes; RL orchestrators are known to collapse onto one topology);
``--json`` prints the same as one object.

    python -m benchmarks.conductor_training [--limit 200] [--conductor embedded] [--json]
    python -m benchmarks.conductor_training --recipe grpo --set dataset=arithmetic [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter, defaultdict
from typing import Any

from benchmarks._training import ledger_total, run_training

SINGLES = ("single:calculator", "single:python", "single:smol")
COSTLY = ("conductor-base", "self-consistency:smol:5")


def _levels(dataset: str, split: str, seed: int) -> dict[str, int]:
    from prefect_conductor.conductor.data.datasets import load_dataset

    return {
        e.id: int(e.meta.get("level", 0)) for e in load_dataset(dataset, split=split, seed=seed)
    }


def _row(name: str, result: Any, runs: Any, levels: dict[str, int], reused: bool) -> dict:
    per_level: dict[int, list[bool]] = defaultdict(list)
    for qid, correct in zip(runs["question_id"], runs["correct"], strict=True):
        per_level[levels.get(qid, 0)].append(bool(correct))
    return {
        "strategy": name,
        "n": result["n"],
        "accuracy": result["accuracy"],
        **{f"level{k}": sum(v) / len(v) for k, v in sorted(per_level.items()) if v},
        "format_valid_rate": result.get("format_valid_rate"),
        "tokens_per_q": round(result["mean_input_tokens"] + result["mean_output_tokens"], 1),
        "failed": result["failed"],
        "wall_s": result["wall_s"],
        "reused": reused,
        "mlflow_run_id": result.get("mlflow_run_id"),
    }


def _runs_of(eval_id: str) -> Any:
    from prefect_conductor.conductor.data.store import ArtifactStore

    runs = ArtifactStore().read_pandas("runs")
    mask = [dict(t).get("eval_id") == eval_id for t in runs["tags"]]
    return runs[mask]


def _evaluate(strategy: str, conductor: str | None, args: argparse.Namespace, limit: int) -> dict:
    from prefect_conductor.conductor.plan.requests import EvalRequest
    from prefect_conductor.flows.evaluate import evaluate

    result = evaluate(
        EvalRequest(
            dataset=args.dataset,
            split=args.split,
            limit=limit,
            strategy=strategy,
            concurrency=args.concurrency,
            seed=args.seed,
            conductor=conductor,
            run_name=f"{strategy}{' · ' + conductor if conductor else ''} (benchmark)",
        )
    )
    return result.model_dump()


def _reused(strategy: str, conductor: str | None, args: argparse.Namespace) -> dict | None:
    import mlflow
    from prefect_conductor.tasks.tracking import tracking_uri

    mlflow.set_tracking_uri(tracking_uri())
    runs = mlflow.search_runs(
        search_all_experiments=True,
        filter_string=(
            f"params.strategy = '{strategy}' and params.dataset = '{args.dataset}' "
            f"and params.split = '{args.split}' and attributes.status = 'FINISHED'"
        ),
        order_by=["attributes.start_time DESC"],
        output_format="list",
    )
    for run in runs:
        if (run.data.params.get("conductor") or None) != conductor:
            continue
        m = run.data.metrics
        return {
            "n": int(m["n"]),
            "accuracy": m["accuracy"],
            "format_valid_rate": m.get("format_valid_rate"),
            "mean_input_tokens": m["mean_input_tokens"],
            "mean_output_tokens": m["mean_output_tokens"],
            "failed": int(m["failed"]),
            "wall_s": round(m["wall_s"], 1),
            "eval_id": run.data.tags.get("eval_id"),
            "mlflow_run_id": run.info.run_id,
        }
    return None


def _diversity(runs: Any, levels: dict[str, int]) -> dict[int, dict[str, Any]]:
    topologies: dict[int, Counter] = defaultdict(Counter)
    mixes: dict[int, Counter] = defaultdict(Counter)
    for qid, lists in zip(runs["question_id"], runs["workflow_json"], strict=True):
        if not lists:
            continue
        plan = json.loads(lists)
        level = levels.get(qid, 0)
        topologies[level][json.dumps(plan["access_list"])] += 1
        mixes[level][" -> ".join(plan["model_id"])] += 1
    return {
        level: {
            "plans": sum(topologies[level].values()),
            "topologies": len(topologies[level]),
            "worker_mixes": len(mixes[level]),
            "top_mix": mixes[level].most_common(1)[0] if mixes[level] else None,
        }
        for level in sorted(topologies)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="arithmetic")
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--conductor", default="embedded", help="The trained conductor.")
    parser.add_argument("--costly", action="store_true", help="Also the base conductor and SC.")
    parser.add_argument("--costly-limit", type=int, default=50)
    parser.add_argument("--reuse", nargs="*", default=[], help="Rows read back from MLflow.")
    parser.add_argument(
        "--recipe", help="Train first (a built-in recipe or a YAML file); measure its conductor."
    )
    parser.add_argument(
        "--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
        help="A recipe override for --recipe (repeatable), e.g. dataset=arithmetic.",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.sets and not args.recipe:
        parser.error("--set overrides a setting of --recipe")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    train = None
    if args.recipe:
        result = run_training(args.recipe, args.sets, ("--no-promote",))
        args.conductor = result["adapter_uri"]
        train = {
            "recipe": result["recipe"],
            "run_id": result["run_id"],
            "command_wall_s": result["command_wall_s"],
            "accuracy_before": result["accuracy_before"],
            "accuracy_after": result["accuracy_after"],
            "ledger_total": ledger_total(result),
        }

    from prefect_conductor.runtime.server import local_run_settings

    levels = _levels(args.dataset, args.split, args.seed)
    plan = [(s, None, args.limit) for s in SINGLES]
    plan.append(("conductor", args.conductor, args.limit))
    for name in COSTLY:  # run with --costly, or read back with --reuse
        if args.costly or name in args.reuse:
            plan.append((name, None, args.costly_limit))
    rows, diversity = [], {}
    started = time.perf_counter()
    with local_run_settings():
        for name, conductor, limit in plan:
            strategy = "conductor" if name == "conductor-base" else name
            label = f"conductor ({conductor})" if conductor else name
            if name in args.reuse:
                result = _reused(strategy, conductor, args)
                if result is None:
                    print(f"no MLflow eval of {label} to reuse; skipped", file=sys.stderr)
                    continue
            else:
                print(f"evaluating {label} on {limit} questions", file=sys.stderr)
                result = _evaluate(strategy, conductor, args, limit)
            runs = _runs_of(result["eval_id"]) if result.get("eval_id") else None
            if runs is None or runs.empty:
                continue
            rows.append(_row(label, result, runs, levels, name in args.reuse))
            if conductor:
                diversity = _diversity(runs, levels)
    singles = [r for r in rows if r["strategy"] in SINGLES]
    best = max(singles, key=lambda r: r["accuracy"]) if singles else None
    trained = next((r for r in rows if r["strategy"].startswith("conductor (")), None)
    goals = {}
    if trained and best:
        goals = {
            "format_valid_ge_95": (trained["format_valid_rate"] or 0) >= 0.95,
            "accuracy_ge_best_single": trained["accuracy"] >= best["accuracy"],
            "moonshot_best_plus_10": trained["accuracy"] >= best["accuracy"] + 0.10,
            "best_single": best["strategy"],
            "margin_points": round(100 * (trained["accuracy"] - best["accuracy"]), 1),
        }
    out = {
        "rows": rows,
        "goals": goals,
        "diversity": diversity,
        "train": train,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    if args.json:
        print(json.dumps(out))
        return
    cols = [
        "strategy",
        "n",
        "accuracy",
        "level1",
        "level2",
        "level3",
        "format_valid_rate",
        "tokens_per_q",
        "failed",
        "wall_s",
        "reused",
    ]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            if isinstance(v, float) and c not in ("tokens_per_q", "wall_s"):
                v = f"{v:.1%}"
            cells.append("–" if v is None else str(v))
        print("| " + " | ".join(cells) + " |")
    print(f"\ngoals: {json.dumps(goals)}")
    if train:
        total = train["ledger_total"] or {}
        print(
            f"training: recipe {train['recipe']} (MLflow run {train['run_id']}), "
            f"{train['command_wall_s'] / 60:.1f} min as one command, "
            f"{total.get('worker_calls', '?')} worker calls, ${total.get('cost_usd', 0):.4f}"
        )
    print("plan diversity of the trained conductor, per level:")
    for level, d in diversity.items():
        print(f"  level {level}: {d}")


if __name__ == "__main__":
    main()
