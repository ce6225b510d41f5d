"""The ``train-reward-model`` flow: OrchRM from the artifacts already stored (no new rollouts).

Stages (issue #9), each a task run; the whole training is one MLflow run in ``train/orchrm``:

1. read ``runs`` and ``steps`` and build win/lose pairs (``prefect_conductor.reward_model.pairs``);
2. stop with a one-line message, training nothing, when fewer than ``min_pairs`` are new;
3. store the new pairs in the ``pairs`` table (pair set = the MLflow run id);
4. train with TRL's ``RewardTrainer`` (Bradley-Terry) and LoRA;
5. held-out pairwise accuracy, overall and per source (split by question);
6. register model ``orchrm`` (alias ``candidate``) and promote it to ``champion`` only if it
   beats the champion on the same held-out pairs.
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect_conductor.conductor.home import conductor_home
from prefect_conductor.conductor.pool import load_pool
from prefect_conductor.reward_model.model import MODEL_NAME, RewardModelRequest, RewardModelResult
from prefect_conductor.tasks.assets import record_model_version, table_asset, writing
from prefect_conductor.tasks.reward_model import (
    build_reward_pairs,
    champion_ref,
    evaluate_reward_model,
    finish_rm_run,
    log_pair_stats,
    register_reward_model,
    start_rm_run,
    store_pairs,
    train_on_pairs,
)

__all__ = ["train_reward_model"]


def _result(built, started: float, **kw) -> RewardModelResult:
    stats = built.stats
    return RewardModelResult(
        pairs_train=len(built.train),
        pairs_test=len(built.test),
        pairs_new=built.new,
        pairs_by_source=stats.get("by_source", {}),
        pairs_unreferenced_by_source=stats.get("unreferenced", {}),
        pairs_new_by_source=stats.get("new", {}).get("by_source", {}),
        pairs_new_unreferenced_by_source=stats.get("new", {}).get("unreferenced", {}),
        pairs_truncated=stats.get("truncated", 0),
        pairs_per_1k_tokens=stats.get("pairs_per_1k_tokens", {}),
        efficiency_vs_correct_over_incorrect=stats.get("efficiency_vs_correct_over_incorrect"),
        wall_s=round(time.perf_counter() - started, 3),
        **kw,
    )


@flow(name="train-reward-model", flow_run_name="train OrchRM", log_prints=False)
def train_reward_model(request: RewardModelRequest) -> RewardModelResult:
    """Train OrchRM on pairs from the stored runs; evaluate, register, maybe promote."""
    started = time.perf_counter()
    logger = get_run_logger()
    pool = load_pool(request.pool)
    pair_set = str(flow_run.id or time.time_ns())
    built = build_reward_pairs(request, pool, pair_set)
    logger.info(
        "pairs: %d train, %d test, %d new; by source %s",
        len(built.train),
        len(built.test),
        built.new,
        built.stats.get("by_source"),
    )
    if built.new < request.min_pairs or not built.train:
        message = (
            f"{built.new} new pairs, fewer than --min-pairs {request.min_pairs}: nothing trained"
            if built.new < request.min_pairs
            else "no training pairs (every pair fell on the held-out side): nothing trained"
        )
        logger.info(message)
        return _result(built, started, run_id=None, trained=False, message=message)

    run_id = start_rm_run(request, {"prefect_flow_run": pair_set})
    status, metrics = "FAILED", {}
    try:
        runs_tables = [table_asset(t, request.artifacts) for t in ("runs", "steps")]
        pairs_table = table_asset("pairs", request.artifacts)
        writing(store_pairs, [pairs_table], runs_tables)(built, request.artifacts)
        output_dir = Path(request.output_dir or conductor_home() / "training" / run_id).resolve()
        model_dir, train_metrics = train_on_pairs(request, built.train, output_dir, run_id)
        metrics.update(train_metrics)
        accuracy = evaluate_reward_model(str(model_dir), built.test, request.seed)
        champion = champion_ref()
        champion_accuracy = None
        if champion is not None:
            champion_accuracy = evaluate_reward_model(
                champion, built.test, request.seed, label="champion"
            ).overall
        log_pair_stats(run_id, built, accuracy)
        registration = register_reward_model(
            run_id,
            model_dir,
            accuracy.overall,
            champion_accuracy,
            champion is not None,
            request.promote,
        )
        record_model_version(
            MODEL_NAME,
            registration.version,
            lambda: [pairs_table],
            {"mlflow_run": run_id, "pairwise_accuracy": accuracy.overall,
             "promoted": registration.promoted, "pair_set": pair_set},
        )  # fmt: skip
        status = "FINISHED"
        measured = (
            f"pairwise accuracy {accuracy.overall:.3f} on {accuracy.pairs} held-out pairs"
            if accuracy.overall is not None
            else "no held-out pairs to measure it on"
        )
        message = (
            f"OrchRM v{registration.version}: {measured}"
            + (f" (champion {champion_accuracy:.3f})" if champion_accuracy is not None else "")
            + ("; promoted to champion" if registration.promoted else "; not promoted")
        )
        logger.info(message)
        return _result(
            built,
            started,
            run_id=run_id,
            trained=True,
            message=message,
            pairwise_accuracy=accuracy.overall,
            pairwise_accuracy_by_source=accuracy.by_source,
            champion_accuracy=champion_accuracy,
            scores_per_s=accuracy.scores_per_s,
            train_wall_s=train_metrics["train_wall_s"],
            promoted=registration.promoted,
            model_uri=f"models:/{MODEL_NAME}/{registration.version}",
            model_dir=str(model_dir),
        )
    finally:
        finish_rm_run(run_id, status, {**metrics, "wall_s": time.perf_counter() - started})
