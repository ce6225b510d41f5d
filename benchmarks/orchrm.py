"""OrchRM against its goals (issue #9): pair efficiency, held-out accuracy, best-of-N, tokens.

In one invocation, on the artifact store and the MLflow registry of ``$CONDUCTOR_HOME``:

1. **pairs**: built from the stored runs of the training split (as ``train-rm --split train``
   builds them, with the real tokenizer): count per source and pairs per 1k rollout tokens,
   all sources against ``correct-over-incorrect`` alone;
2. **the model** (``--rm``, default the champion): held-out pairwise accuracy overall and per
   source (recomputed here on the test-side pairs, by question), training wall time from its
   MLflow run, scoring throughput batched against one plan at a time (the baseline);
3. **best-of-N** on the arithmetic **test** split: ``best-of-n:N:random-plan`` runs all N
   random proposals and reports, on those same N runs, OrchRM's pick (plan + outputs), its
   plan-only pick, majority vote, a random pick and the oracle; ``best-of-n-plan:N:random-plan``
   then runs only the plan OrchRM picks before execution, for its real token cost.

Prints a table and the goal checks; ``--json`` prints one object. Evals named in ``--reuse``
are read back from the latest finished MLflow eval instead of run again.

    python -m benchmarks.orchrm [--n 8] [--limit 50] [--rm models:/orchrm@champion] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any


def _pairs(split: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from prefect_conductor.conductor.pool import load_pool
    from prefect_conductor.reward_model.model import RewardModelRequest
    from prefect_conductor.tasks.reward_model import build_reward_pairs

    built = build_reward_pairs.fn(RewardModelRequest(split=split), load_pool(), "benchmark")
    return built.stats, built.test


def _model_run(rm: str) -> dict[str, Any]:
    """Training figures of the registered model behind ``rm`` (from its MLflow run)."""
    import mlflow
    from prefect_conductor.tasks.tracking import tracking_uri

    if not rm.startswith("models:/"):
        meta = json.loads((Path(rm) / "orchrm.json").read_text())
        return {"source": rm, **meta.get("provenance", {})}
    client = mlflow.MlflowClient(tracking_uri())
    name, alias = rm.removeprefix("models:/").split("@")
    version = client.get_model_version_by_alias(name, alias)
    run = client.get_run(version.run_id)
    m = run.data.metrics
    return {
        "source": f"{rm} (version {version.version})",
        "mlflow_run": version.run_id,
        "train_wall_s": m.get("train_wall_s"),
        "train_steps": m.get("train_steps"),
        "pairs_train": m.get("pairs_train"),
        "recorded_pairwise_accuracy": m.get("pairwise_accuracy"),
    }


def _throughput(rm: str, questions: int = 16, n: int = 8) -> dict[str, float]:
    """Plans scored per second: batched (16 per forward) against one at a time."""
    from prefect_conductor.conductor.data.datasets import load_dataset
    from prefect_conductor.conductor.plan.prompts import describe_workers
    from prefect_conductor.conductor.plan.strategies import random_plan
    from prefect_conductor.conductor.pool import load_pool
    from prefect_conductor.reward_model.model import load_reward_model
    from prefect_conductor.tasks.registry import download_registered

    pool, model = load_pool(), load_reward_model(rm, download_registered)
    workers = describe_workers(pool)
    examples = load_dataset("arithmetic", split="test", limit=questions)
    rng = random.Random(0)
    batches = [
        (e.question, [random_plan(pool, rng.randrange(10**9), e.question) for _ in range(n)])
        for e in examples
    ]
    out = {}
    for label, size in (("batched", 16), ("one_at_a_time", 1)):
        model.batch_size = size
        started = time.perf_counter()
        for question, plans in batches:
            model.score(question, plans, pool_description=workers)
        out[f"plans_per_s_{label}"] = round(questions * n / (time.perf_counter() - started), 1)
    model.batch_size = 16
    return out


def _evaluate(strategy: str, args: argparse.Namespace) -> dict[str, Any]:
    from prefect_conductor.conductor.plan.requests import EvalRequest
    from prefect_conductor.flows.evaluate import evaluate

    return evaluate(
        EvalRequest(
            dataset="arithmetic",
            split="test",
            limit=args.limit,
            strategy=strategy,
            concurrency=args.concurrency,
            rm=args.rm,
            run_name=f"{strategy} (benchmark)",
        )
    ).model_dump()


def _reused(strategy: str, args: argparse.Namespace) -> dict[str, Any] | None:
    import mlflow
    from prefect_conductor.tasks.tracking import tracking_uri

    mlflow.set_tracking_uri(tracking_uri())
    runs = mlflow.search_runs(
        search_all_experiments=True,
        filter_string=(
            f"params.strategy = '{strategy}' and params.dataset = 'arithmetic' "
            f"and params.split = 'test' and params.limit = '{args.limit}' "
            "and attributes.status = 'FINISHED'"
        ),
        order_by=["attributes.start_time DESC"],
        output_format="list",
    )
    if not runs:
        return None
    m = runs[0].data.metrics
    keys = ("majority_accuracy", "random_accuracy", "oracle_accuracy", "plan_pick_accuracy")
    return {
        "n": int(m["n"]),
        "accuracy": m["accuracy"],
        "mean_input_tokens": m["mean_input_tokens"],
        "mean_output_tokens": m["mean_output_tokens"],
        "wall_s": round(m["wall_s"], 1),
        "selection": {k: m[k] for k in keys if k in m} or None,
        "mlflow_run_id": runs[0].info.run_id,
        "reused": True,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8, help="Proposals per question.")
    parser.add_argument("--limit", type=int, default=50, help="Test questions.")
    parser.add_argument("--rm", default="models:/orchrm@champion")
    parser.add_argument("--train-split", default="train", help="Split the pairs come from.")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--reuse", nargs="*", default=[], help="Evals read back from MLflow.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    from prefect_conductor.tasks.reward_model import pairwise_accuracy

    from prefect_conductor.runtime.server import local_run_settings

    started = time.perf_counter()
    stats, test_pairs = _pairs(args.train_split)
    accuracy = pairwise_accuracy(args.rm, test_pairs)
    model = _model_run(args.rm) | _throughput(args.rm)
    evals = {}
    with local_run_settings():
        for kind in ("best-of-n", "best-of-n-plan"):
            strategy = f"{kind}:{args.n}:random-plan"
            result = _reused(strategy, args) if strategy in args.reuse else None
            if result is None:
                print(f"evaluating {strategy} on {args.limit} test questions", file=sys.stderr)
                result = _evaluate(strategy, args)
            evals[kind] = result

    full, plan_only = evals["best-of-n"], evals["best-of-n-plan"]
    sel = full.get("selection") or {}

    def tokens(r: dict[str, Any]) -> float:
        return round(r["mean_input_tokens"] + r["mean_output_tokens"], 1)

    rows = [
        {
            "selection": f"OrchRM, plan only (best-of-n-plan:{args.n})",
            "accuracy": plan_only["accuracy"],
            "tokens_per_q": tokens(plan_only),
            "runs_per_q": 1,
        },  # noqa: E501
        {
            "selection": "OrchRM, plan only, on the all-N runs",
            "accuracy": sel.get("plan_pick_accuracy"),
            "tokens_per_q": None,
            "runs_per_q": None,
        },  # noqa: E501
        {
            "selection": f"OrchRM, plan + outputs (best-of-n:{args.n})",
            "accuracy": full["accuracy"],
            "tokens_per_q": tokens(full),
            "runs_per_q": args.n,
        },  # noqa: E501
        {
            "selection": "majority vote",
            "accuracy": sel.get("majority_accuracy"),
            "tokens_per_q": tokens(full),
            "runs_per_q": args.n,
        },  # noqa: E501
        {
            "selection": "random pick",
            "accuracy": sel.get("random_accuracy"),
            "tokens_per_q": round(tokens(full) / args.n, 1),
            "runs_per_q": 1,
        },  # noqa: E501
        {
            "selection": f"oracle (any of {args.n})",
            "accuracy": sel.get("oracle_accuracy"),
            "tokens_per_q": tokens(full),
            "runs_per_q": args.n,
        },  # noqa: E501
    ]
    majority, rand = sel.get("majority_accuracy"), sel.get("random_accuracy")
    efficiency = stats.get("efficiency_vs_correct_over_incorrect")
    goals = {
        "pairs_efficiency_ge_10x": efficiency is not None and efficiency >= 10,
        "pairwise_accuracy_ge_0_80": (accuracy.overall or 0) >= 0.80,
        "plan_pick_ge_majority_plus_5": majority is not None
        and plan_only["accuracy"] >= majority + 0.05,
        "plan_pick_ge_random_plus_20": rand is not None and plan_only["accuracy"] >= rand + 0.20,
        "tokens_le_quarter_of_majority": tokens(plan_only) <= tokens(full) / 4,
    }
    out = {
        "pairs": stats,
        "pairwise_accuracy": accuracy.overall,
        "pairwise_accuracy_by_source": accuracy.by_source,
        "heldout_pairs": accuracy.pairs,
        "model": model,
        "best_of_n": rows,
        "evals": {
            k: {kk: v.get(kk) for kk in ("n", "wall_s", "mlflow_run_id", "reused")}
            for k, v in evals.items()
        },  # noqa: E501
        "goals": goals,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    if args.json:
        print(json.dumps(out, default=str))
        return
    print("pairs (training split):")
    print("| source | pairs | pairs per 1k rollout tokens | held-out accuracy |")
    print("|---|---|---|---|")
    for source, count in stats["by_source"].items():
        per_k = stats["pairs_per_1k_tokens"].get(source)
        acc = accuracy.by_source.get(source)
        print(
            f"| {source} | {count} | {'–' if per_k is None else f'{per_k:.1f}'} | "
            f"{'–' if acc is None else f'{acc:.3f}'} |"
        )
    print(
        f"| all | {stats['pairs']} | {stats['all_sources_pairs_per_1k_tokens']:.1f} | "
        f"{accuracy.overall:.3f} ({accuracy.pairs} pairs) |"
    )
    print(f"\nmodel: {json.dumps(model)}")
    print(f"\nbest-of-{args.n} on {full['n']} test questions:")
    print("| selection | accuracy | tokens/q | runs/q |")
    print("|---|---|---|---|")
    for r in rows:
        acc = "–" if r["accuracy"] is None else f"{r['accuracy']:.1%}"
        print(
            f"| {r['selection']} | {acc} | {r['tokens_per_q'] or '–'} | {r['runs_per_q'] or '–'} |"
        )
    print(f"\ngoals: {json.dumps(goals)}")


if __name__ == "__main__":
    main()
