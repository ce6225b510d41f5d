"""The ``train-conductor`` flow: a training recipe's stages, in order, then the registry.

A recipe (``conductor.training.recipe``, issue #40) lists the stages; each runs here as task
runs of this flow and, in MLflow, as runs nested under the training run of experiment
``train/conductor``:

- ``collect``: each single worker (or a ``teacher`` conductor) answers training questions;
  every run is verified and stored, so the right ones are SFT data;
- ``sft``: TRL ``SFTTrainer`` on the store's verified-correct plans (never a held-out question,
  never a run tagged ``split=test``), balanced over the workers they use, from the recipe's
  start (a new LoRA on the base, or ``init_adapter``) or from the previous stage's adapter;
- ``self-sample``: the current conductor samples ``num_generations`` plans per question
  (hints in the sampling prompt only), every plan runs and is verified, then an SFT;
- ``grpo``: TRL ``GRPOTrainer``: every rollout's plan runs as an ``orchestrate`` run and its
  reward (0 / 0.5 / 1) drives the update;
- ``eval``: the held-out questions, by the conductor training started from or the current one.

Every run is tagged ``train_run`` and ``train_stage``, and after each stage its cost is read
back from the store (``conductor.training.ledger``): worker calls, tokens, cost, conductor
generations, wall time; a metric of the MLflow run, a row of the result's ``ledger`` and of
the Prefect table artifact ``training-ledger``. Progress is written after every stage
(``conductor.training.progress``): the same recipe on the same pool, killed, resumes after its
last finished stage in the same MLflow run.

Then the final adapter is registered as model ``conductor`` (alias ``candidate``) and promoted
to ``champion`` only if it beats the *incumbent* on the held-out questions: the registry's
champion, or, while the registry has none, the pool's own conductor (the embedded adapter for
the local pool). A worse first candidate never becomes champion (issue #18).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from prefect_conductor.conductor.adapters import EMBEDDED_ADAPTER, INCUMBENT
from prefect_conductor.conductor.errors import ConductorError
from prefect_conductor.conductor.plan.requests import EvalResult
from prefect_conductor.conductor.pool import Pool, load_pool
from prefect_conductor.conductor.training.config import (
    StageReport,
    TrainConductorRequest,
    TrainConductorResult,
)
from prefect_conductor.conductor.training.hints import hint_rotations
from prefect_conductor.conductor.training.ledger import LedgerEntry, ledger_total
from prefect_conductor.conductor.training.progress import FinishedStage, Progress
from prefect_conductor.conductor.training.recipe import (
    EvalStage,
    GrpoStage,
    Recipe,
    SelfSampleStage,
    recipe_digest,
)
from prefect_conductor.flows._stages import Training, training_pool
from prefect_conductor.reward_model.model import CHAMPION
from prefect_conductor.tasks.artifacts import ledger_artifact
from prefect_conductor.tasks.assets import model_ref_asset, record_model_version, table_asset
from prefect_conductor.tasks.training import (
    Registration,
    champion_exists,
    champion_needs_eval,
    finish_training_run,
    log_stage,
    register_conductor,
    resume_training_run,
    start_training_run,
)

__all__ = ["train_conductor"]


def _digest(request: TrainConductorRequest, pool: Pool) -> str:
    return recipe_digest(request.recipe, pool=pool.public_dict(), output_dir=request.output_dir)


def _begin(request: TrainConductorRequest, digest: str) -> tuple[Progress, str | None]:
    """This training's progress: a killed one of the same digest, resumed (and the name of
    the stage it resumes at), or a new MLflow run."""
    previous = None if request.restart else Progress.load(digest)
    if previous is not None and not previous.finished:
        resume_training_run(previous.run_id)
        names = [s.name for s in request.recipe.stages]
        at = next((n for n in names if previous.done(n) is None), "registration")
        return previous, at
    run_id = start_training_run(request, {"flow_run_id": str(flow_run.id or ""), "digest": digest})
    progress = Progress(run_id=run_id, digest=digest, recipe=request.recipe.name)
    progress.save()
    return progress, None


@flow(
    name="train-conductor",
    flow_run_name="train conductor · {request.recipe.name}",
    task_runner=ThreadPoolTaskRunner(64),
    log_prints=False,
)
def train_conductor(request: TrainConductorRequest) -> TrainConductorResult:
    """Run a training recipe's stages on the pool; register the conductor, maybe promote it."""
    started = time.perf_counter()
    log = get_run_logger()
    recipe = request.recipe
    pool = training_pool(request)
    for stage in recipe.stages:  # a bad hint file is one clear error before anything runs
        if isinstance(stage, SelfSampleStage) and stage.hints:
            hint_rotations(stage.hints, pool)
    digest = _digest(request, pool)
    progress, resumed_at = _begin(request, digest)
    run_id = progress.run_id
    if resumed_at:
        log.info("resuming training %s (MLflow run %s) at stage %s", digest, run_id, resumed_at)
    training = Training(request, run_id, pool)
    reports: list[StageReport] = []
    ledger: list[LedgerEntry] = []
    status = "FAILED"
    try:
        for i, stage in enumerate(recipe.stages):
            done = progress.done(stage.name)
            if done is not None:  # finished before the kill: not run again
                training.used.update(done.used)
                training.current = Path(done.adapter) if done.adapter else training.current
                reports.append(StageReport.model_validate(done.report))
                ledger.append(done.ledger)
                continue
            t0 = time.perf_counter()
            used_before = set(training.used)
            report = training.run_stage(stage)
            entry = training.ledger(stage.name, time.perf_counter() - t0)
            if report.sampled is not None:  # plans written but never run are generations too
                entry = entry.model_copy(update={"conductor_generations": report.sampled})
            reports.append(report)
            ledger.append(entry)
            log_stage(
                run_id, entry, i, {"accuracy": report.accuracy, "format_valid": report.format_valid}
            )
            progress.stages.append(
                FinishedStage(
                    name=stage.name,
                    report=report.model_dump(mode="json"),
                    ledger=entry,
                    used=sorted(training.used - used_before),
                    adapter=str(training.current) if training.current else None,
                )
            )
            progress.save()
        final = training.current
        if final is None:
            raise ConductorError(
                f"recipe {recipe.name}: no stage trained an adapter (add an sft, self-sample or "
                "grpo stage)"
            )
        after = _after(training, reports)
        before = _before(training, reports)
        signature = (
            f"{training.heldout_dataset}/{recipe.heldout.split}/{recipe.heldout.limit}/"
            f"{recipe.seed}"
        )
        if progress.registration is not None:  # killed after registering: not again
            registration = Registration(**progress.registration)
            ledger += [progress.incumbent] if progress.incumbent else []
        else:
            incumbent_acc = None
            if request.promote:
                t0 = time.perf_counter()
                incumbent_acc = _incumbent_accuracy(training, signature, before)
                if "incumbent" in training.evals:
                    progress.incumbent = training.ledger("incumbent", time.perf_counter() - t0)
                    ledger.append(progress.incumbent)
            registration = register_conductor(
                run_id, final, after.accuracy, signature, request.promote, incumbent_acc
            )
            progress.registration = asdict(registration)
            progress.save()
            record_model_version(
                "conductor",
                registration.version,
                lambda: _upstream(recipe),
                {"mlflow_run": run_id, "recipe": recipe.name,
                 "heldout_accuracy": after.accuracy, "promoted": registration.promoted},
            )  # fmt: skip
        status = "FINISHED"
    finally:
        wall = time.perf_counter() - started
        if status != "FINISHED":
            finish_training_run(run_id, {"wall_s": wall}, status)
    total = ledger_total(ledger)
    ledger_artifact(recipe.name, run_id, [*ledger, total])
    progress.finished = True
    progress.save()
    metrics = {
        "wall_s": wall,
        "accuracy_before": before.accuracy if before else None,
        "accuracy_after": after.accuracy,
        "format_valid_before": before.format_valid_rate if before else None,
        "format_valid_after": after.format_valid_rate,
        "promoted": float(registration.promoted),
        **{f"total/{k}": v for k, v in total.model_dump(exclude={"stage"}).items()},
    }
    finish_training_run(run_id, metrics, "FINISHED")
    log.info(
        "accuracy %s -> %.3f, valid plans %s -> %s; model conductor v%s%s; %d worker calls",
        f"{before.accuracy:.3f}" if before else "-",
        after.accuracy,
        before.format_valid_rate if before else "-",
        after.format_valid_rate,
        registration.version,
        " promoted to champion" if registration.promoted else "",
        total.worker_calls,
    )
    start = recipe.init_adapter or f"{recipe.base} + a new LoRA"
    return TrainConductorResult(
        run_id=run_id,
        recipe=recipe.name,
        wall_s=round(wall, 1),
        accuracy_before=before.accuracy if before else None,
        accuracy_after=after.accuracy,
        format_valid_before=before.format_valid_rate if before else None,
        format_valid_after=after.format_valid_rate,
        adapter_uri=f"models:/conductor/{registration.version}",
        adapter_dir=str(final),
        model_version=registration.version,
        promoted=registration.promoted,
        incumbent_accuracy=registration.champion_accuracy,
        before_conductor=(recipe.init_adapter or f"pool conductor ({pool.conductor.model})")
        if before
        else None,
        started_from=start,
        resumed_at=resumed_at,
        stages=reports,
        ledger=[*ledger, total],
    )


def _upstream(recipe: Recipe) -> list[str]:
    """What a conductor version is made from (its assets' upstream): the runs and steps the
    training stored, the conductor it started from, and every OrchRM that chose its plans or
    gave its reward."""
    upstream = [table_asset("runs"), table_asset("steps")]
    if recipe.init_adapter:
        upstream.append(model_ref_asset(recipe.init_adapter))
    for stage in recipe.stages:
        if isinstance(stage, SelfSampleStage) and stage.guide is not None:
            upstream.append(model_ref_asset(stage.guide.orchrm))
        if isinstance(stage, GrpoStage) and (
            stage.reward == "orchrm" or stage.reward_weights.get("orchrm")
        ):
            upstream.append(model_ref_asset(stage.orchrm or CHAMPION))
    return list(dict.fromkeys(upstream))


def _heldout_eval(training: Training, report: StageReport) -> bool:
    stage = training.recipe.stage(report.stage)
    return isinstance(stage, EvalStage) and not (stage.dataset or stage.split or stage.limit)


def _after(training: Training, reports: list[StageReport]) -> EvalResult:
    """The last eval stage on the held-out questions (a recipe always ends with one)."""
    report = next(r for r in reversed(reports) if _heldout_eval(training, r))
    return training.evals.get(report.stage) or _stored_eval(report)


def _before(training: Training, reports: list[StageReport]) -> EvalResult | None:
    for report in reports:
        stage = training.recipe.stage(report.stage)
        if _heldout_eval(training, report) and stage.conductor == "start":
            return training.evals.get(report.stage) or _stored_eval(report)
    return None


def _stored_eval(report: StageReport) -> Any:
    """A finished eval stage of a resumed training, from its report."""
    from types import SimpleNamespace

    return SimpleNamespace(accuracy=report.accuracy, format_valid_rate=report.format_valid)


def _incumbent_accuracy(
    training: Training, signature: str, before: EvalResult | None
) -> float | None:
    """The held-out accuracy the candidate must beat: the registry's champion (recorded for
    these questions, or evaluated now), else the pool's own conductor (``before`` when it
    measured that conductor, else evaluated now)."""
    champion = champion_needs_eval(signature)
    if champion is not None:
        result = training.evaluate(None, "incumbent", champion)
        training.evals["incumbent"] = result
        return result.accuracy
    if champion_exists():
        return None  # its accuracy on these questions is recorded: register_conductor reads it
    # Without a champion, ``champion`` is the shipped adapter: the local pool's conductor.
    init = training.recipe.init_adapter
    shipped = load_pool(training.request.pool).conductor.model == f"local/{EMBEDDED_ADAPTER}"
    if before is not None and (init is None or (init == INCUMBENT and shipped)):
        return before.accuracy
    result = training.evaluate(None, "incumbent", None)
    training.evals["incumbent"] = result
    return result.accuracy
