"""OrchRM tasks: pairs from the store, TRL ``RewardTrainer``, held-out accuracy, registry.

The training is one MLflow run in experiment ``train/orchrm``: parameters, TRL's curves
(``report_to="mlflow"``), pair statistics per source, a sample table of held-out pairs with
their scores, and the model, registered as ``orchrm`` (alias ``candidate``; ``champion``
only when it beats the champion on the same held-out pairs).

A tracking server or an object store that is down (issue #19): every MLflow write here, TRL's
callback included, runs under ``tasks.tracking.tracking_server`` (a bounded wait, then one
line), and the tasks that retry do not retry a server that stayed unreachable
(``retry_unless_unreachable``): the write already waited for it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.plan.prompts import describe_workers
from prefect_conductor.conductor.pool import Pool
from prefect_conductor.reward_model.model import (
    MODEL_NAME,
    RewardModelRequest,
    load_backbone,
    load_reward_model,
    lora_config,
    reward_config,
    write_rm_meta,
)
from prefect_conductor.reward_model.pairs import (
    PAIR_RUN_COLUMNS,
    PAIR_STEP_COLUMNS,
    PairConfig,
    build_pairs,
    pairs_table,
    source_counts,
)
from prefect_conductor.tasks.registry import download_registered
from prefect_conductor.tasks.tracking import (
    finish_run,
    mlflow_experiment,
    model_version_by_alias,
    open_run,
    register_version,
    retry_unless_unreachable,
    tracking_server,
    tracking_uri,
)
from prefect_conductor.tasks.training import use_all_cores

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "EXPERIMENT",
    "BuiltPairs",
    "build_reward_pairs",
    "champion_ref",
    "evaluate_reward_model",
    "finish_rm_run",
    "log_pair_stats",
    "pairwise_accuracy",
    "register_reward_model",
    "score_plans",
    "start_rm_run",
    "store_pairs",
    "train_on_pairs",
]

EXPERIMENT = "train/orchrm"
# Held-out pairs scored for the accuracy (a seeded draw, stratified by source when capped).
EVAL_PAIRS = 600
_PAIR_COLUMNS = ["question_id", "input", "chosen", "rejected", "source", "split", "pair_id"]


def _mlflow() -> Any:
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    return mlflow


@dataclass
class BuiltPairs:
    train: list[dict[str, Any]]
    test: list[dict[str, Any]]
    new: int
    stats: dict[str, Any]
    table: Any = field(repr=False, default=None)  # pyarrow table of the new pairs


def _token_counter(base: str) -> Any:
    from prefect_conductor.reward_model.model import _backbone_dir
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(_backbone_dir(base))
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _runs_since(runs: pd.DataFrame, since: str | None) -> pd.DataFrame:
    if since is None:
        return runs
    import pandas as pd

    try:
        start = pd.Timestamp(since)
    except ValueError:
        from prefect_conductor.reward_model.model import RewardModelError

        raise RewardModelError(f"--since {since!r}: expected a date like 2026-11-30") from None
    if start.tzinfo is None:
        start = start.tz_localize("UTC")
    return runs[runs["created_at"] >= start]


@task(cache_policy=NO_CACHE, name="build-pairs", task_run_name="pairs from the artifact store")
def build_reward_pairs(request: RewardModelRequest, pool: Pool, pair_set: str) -> BuiltPairs:
    """Read ``runs`` and ``steps`` (no model calls), build and deduplicate the pairs."""
    store = ArtifactStore(request.artifacts)
    # Only the columns pairs are built from: the reference answers are never even loaded.
    runs = store.read_pandas("runs", columns=[*PAIR_RUN_COLUMNS, "created_at", "tags"])
    runs = _runs_since(runs, request.since)
    if request.split is not None:
        split = runs["tags"].map(lambda t: dict(t if t is not None else ()).get("split"))
        runs = runs[split == request.split]
    steps = store.read_pandas("steps", columns=list(PAIR_STEP_COLUMNS))
    steps = steps[steps["run_id"].isin(set(runs["run_id"]))]
    from prefect_conductor.conductor.providers.local_model import SMOLLM2

    config = PairConfig(
        max_tokens=request.max_tokens,
        max_per_question=request.max_per_question,
        test_fraction=request.test_fraction,
        seed=request.seed,
    )
    built = build_pairs(
        runs,
        steps,
        pool_description=describe_workers(pool),
        config=config,
        count_tokens=_token_counter(request.base),
        base_conductor=f"local/{SMOLLM2}",
    )
    pairs = built.pairs
    stored = store.read("pairs", columns=["pair_id"])["pair_id"].to_pylist()
    fresh = pairs[~pairs["pair_id"].isin(set(stored))]
    new = fresh if request.new_since is None else _touching(pairs, runs, request.new_since)
    verified = set(runs.loc[runs["correct"].notna(), "run_id"])
    rows = pairs[_PAIR_COLUMNS].to_dict("records")
    return BuiltPairs(
        train=[r for r in rows if r["split"] == "train"],
        test=[r for r in rows if r["split"] == "test"],
        new=len(new),
        stats={**built.stats, "new": source_counts(new, verified)},
        table=pairs_table(fresh, pair_set),
    )


def _touching(pairs: pd.DataFrame, runs: pd.DataFrame, since: str) -> pd.DataFrame:
    """The pairs with a run created at or after ``since``: what those runs added."""
    recent = set(_runs_since(runs, since)["run_id"])
    return pairs[pairs["chosen_run_id"].isin(recent) | pairs["rejected_run_id"].isin(recent)]


@task(
    cache_policy=NO_CACHE,
    name="store-pairs",
    retries=2,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_unreachable,  # the store already waited for its server
)
def store_pairs(built: BuiltPairs, artifacts: str | None) -> str | None:
    """Append the new pairs to the store's ``pairs`` table (one atomic file)."""
    return ArtifactStore(artifacts).write_pairs(built.table)


@task(cache_policy=NO_CACHE, name="reward-trainer", task_run_name="RewardTrainer")
def train_on_pairs(
    request: RewardModelRequest, pairs: list[dict[str, Any]], output_dir: Path, run_id: str
) -> tuple[Path, dict[str, float]]:
    """TRL ``RewardTrainer`` (Bradley-Terry) with LoRA on the backbone; returns the model dir."""
    from datasets import Dataset
    from trl import RewardTrainer

    use_all_cores()
    mlflow = _mlflow()
    model, tokenizer = load_backbone(request.base)
    rows = [{"prompt": p["input"], "chosen": p["chosen"], "rejected": p["rejected"]} for p in pairs]
    trainer = RewardTrainer(
        model=model,
        args=reward_config(request, output_dir / "trainer", "orchrm"),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=lora_config(request, model),
    )
    started = time.perf_counter()
    # TRL's callback logs into the active run: a nested one, so the trainer's own parameters
    # never collide with the request's parameters on the parent run.
    with (
        tracking_server("log stage reward-trainer"),
        mlflow.start_run(
            experiment_id=mlflow_experiment(mlflow, EXPERIMENT),
            run_name="reward-trainer",
            nested=True,
            parent_run_id=run_id,
            tags={"stage": "reward-trainer"},
        ),
    ):
        mlflow.log_param("pairs", len(rows))
        result = trainer.train()
    wall = time.perf_counter() - started
    target = output_dir / "model"
    target.mkdir(parents=True, exist_ok=True)
    trainer.model.save_pretrained(str(target))
    config = target / "adapter_config.json"
    data = json.loads(config.read_text())
    data["base_model_name_or_path"] = request.base  # portable: a name, not this machine's path
    config.write_text(json.dumps(data, indent=2) + "\n")
    write_rm_meta(
        target,
        base=request.base,
        max_tokens=request.max_tokens,
        provenance={
            "mlflow_run": run_id,
            "pairs": len(rows),
            "steps": result.global_step,
            "wall_s": round(wall, 1),
        },
    )
    get_run_logger().info(
        "RewardTrainer: %d pairs, %d steps, loss %.3f, %.0f s -> %s",
        len(rows),
        result.global_step,
        result.training_loss,
        wall,
        target,
    )
    return target, {
        "train_wall_s": wall,
        "train_steps": float(result.global_step),
        "train_loss": float(result.training_loss),
    }


def _eval_draw(pairs: list[dict[str, Any]], limit: int, seed: int) -> list[dict[str, Any]]:
    """At most ``limit`` pairs, the same share of each source (seeded)."""
    import random

    if len(pairs) <= limit:
        return pairs
    rng = random.Random(seed)
    by_source: dict[str, list[dict[str, Any]]] = {}
    for p in pairs:
        by_source.setdefault(p["source"], []).append(p)
    out: list[dict[str, Any]] = []
    for group in by_source.values():
        k = max(1, round(limit * len(group) / len(pairs)))
        out.extend(rng.sample(group, min(k, len(group))))
    return sorted(out, key=lambda p: p["pair_id"])


@dataclass(frozen=True)
class Accuracy:
    overall: float | None
    by_source: dict[str, float]
    pairs: int
    scores_per_s: float
    sample: list[dict[str, Any]]


def pairwise_accuracy(model_ref: str, pairs: list[dict[str, Any]]) -> Accuracy:
    """Share of held-out pairs whose chosen side scores higher (ties count as wrong)."""
    rm = load_reward_model(model_ref, download_registered)
    texts = sorted({p["input"] + p[side] for p in pairs for side in ("chosen", "rejected")})
    eos = rm.tokenizer.eos_token or ""
    started = time.perf_counter()
    scores = dict(zip(texts, rm.score_texts([t + eos for t in texts]), strict=True))
    rate = len(texts) / max(time.perf_counter() - started, 1e-9)
    hits: dict[str, list[bool]] = {}
    sample = []
    for p in pairs:
        c, r = scores[p["input"] + p["chosen"]], scores[p["input"] + p["rejected"]]
        hits.setdefault(p["source"], []).append(c > r)
        if len(sample) < 50:
            sample.append({**p, "score_chosen": c, "score_rejected": r})
    flat = [h for v in hits.values() for h in v]
    return Accuracy(
        overall=sum(flat) / len(flat) if flat else None,
        by_source={k: sum(v) / len(v) for k, v in sorted(hits.items())},
        pairs=len(flat),
        scores_per_s=rate,
        sample=sample,
    )


@task(cache_policy=NO_CACHE, name="orchrm-score", task_run_name="OrchRM score")
def score_plans(
    rm_ref: str,
    question: str,
    plans: list[Any],
    step_outputs: list[Any] | None,
    pool_description: str,
) -> list[float]:
    """OrchRM's score of each plan (with its step outputs when given); higher is better."""
    rm = load_reward_model(rm_ref, download_registered)
    return rm.score(question, plans, step_outputs, pool_description=pool_description)


@task(cache_policy=NO_CACHE, name="evaluate-reward-model", task_run_name="held-out pairs · {label}")
def evaluate_reward_model(
    model_ref: str, test: list[dict[str, Any]], seed: int, label: str = "candidate"
) -> Accuracy:
    return pairwise_accuracy(model_ref, _eval_draw(test, EVAL_PAIRS, seed))


def _signature(test: list[dict[str, Any]]) -> str:
    import hashlib

    ids = sorted(p["pair_id"] for p in _eval_draw(test, EVAL_PAIRS, 0))
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Registration:
    version: str
    promoted: bool
    champion_accuracy: float | None


def champion_ref() -> str | None:
    """``models:/orchrm@champion`` if a champion exists, else None."""
    if model_version_by_alias(_mlflow().MlflowClient(), MODEL_NAME, "champion") is None:
        return None
    return f"models:/{MODEL_NAME}@champion"


@task(
    cache_policy=NO_CACHE,
    name="register-orchrm",
    retries=2,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_unreachable,
)
def register_reward_model(
    run_id: str,
    model_dir: Path,
    accuracy: float | None,
    champion_accuracy: float | None,
    has_champion: bool,
    promote: bool,
) -> Registration:
    """Register as ``orchrm`` (alias ``candidate``); ``champion`` only if it beats the
    champion's accuracy on the same held-out pairs (measured in this run). A model without a
    measured accuracy is never promoted."""
    client = _mlflow().MlflowClient()
    tags = {"pairwise_accuracy": "" if accuracy is None else f"{accuracy:.6f}"}
    version = register_version(client, run_id, model_dir, MODEL_NAME, "orchrm", tags)
    promoted = (
        promote
        and accuracy is not None
        and (not has_champion or (champion_accuracy is not None and accuracy > champion_accuracy))
    )
    if promoted:
        with tracking_server(f"promote {MODEL_NAME} version {version.version} to champion"):
            client.set_registered_model_alias(MODEL_NAME, "champion", version.version)
    return Registration(str(version.version), promoted, champion_accuracy)


@task(
    cache_policy=NO_CACHE,
    name="log-pair-stats",
    retries=2,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_unreachable,
)
def log_pair_stats(run_id: str, built: BuiltPairs, accuracy: Accuracy | None) -> None:
    """Pair statistics and the held-out accuracy (overall and per source) into the run."""
    mlflow = _mlflow()
    client = mlflow.MlflowClient()
    stats = built.stats
    metrics: dict[str, float] = {
        "pairs_train": len(built.train),
        "pairs_test": len(built.test),
        "pairs_new": built.new,
        "pairs_truncated": stats.get("truncated", 0),
    }
    for source, n in stats.get("unreferenced", {}).items():
        metrics[f"pairs_unreferenced.{source}"] = n
    for source, n in stats.get("by_source", {}).items():
        metrics[f"pairs.{source}"] = n
    for source, v in stats.get("pairs_per_1k_tokens", {}).items():
        if v is not None:
            metrics[f"pairs_per_1k_tokens.{source}"] = v
    for key in ("all_sources_pairs_per_1k_tokens", "efficiency_vs_correct_over_incorrect"):
        if stats.get(key) is not None:
            metrics[key] = stats[key]
    if accuracy is not None:
        if accuracy.overall is not None:
            metrics["pairwise_accuracy"] = accuracy.overall
        for source, v in accuracy.by_source.items():
            metrics[f"pairwise_accuracy.{source}"] = v
        metrics["scores_per_s"] = accuracy.scores_per_s
    stamp = int(time.time() * 1000)
    table = None
    if accuracy is not None and accuracy.sample:
        keys = ["source", "question_id", "input", "chosen", "rejected"]
        keys += ["score_chosen", "score_rejected"]
        table = {k: [s[k] for s in accuracy.sample] for k in keys}
    with tracking_server(f"log pair statistics to run {run_id}"):
        client.log_batch(
            run_id,
            metrics=[mlflow.entities.Metric(k, float(v), stamp, 0) for k, v in metrics.items()],
        )
        client.log_dict(run_id, stats, "pair_stats.json")
        if table is not None:
            client.log_table(run_id, table, artifact_file="heldout_pairs_scored.json")


@task(
    cache_policy=NO_CACHE,
    name="start-rm-run",
    retries=2,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_unreachable,
)
def start_rm_run(request: RewardModelRequest, tags: dict[str, str]) -> str:
    return open_run(EXPERIMENT, "train-rm", request.model_dump(exclude={"output_dir"}), tags)


@task(
    cache_policy=NO_CACHE,
    name="finish-rm-run",
    retries=2,
    retry_delay_seconds=1,
    retry_condition_fn=retry_unless_unreachable,
)
def finish_rm_run(run_id: str, status: str, metrics: dict[str, float] | None = None) -> None:
    finish_run(run_id, status, dict(metrics or {}))
