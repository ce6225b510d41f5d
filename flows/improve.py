"""The ``improve`` flow: one iteration of the loop that improves the conductor from stored
runs (issue #41; ``conductor.training.improve`` says what an iteration is).

1. the runs stored since the last iteration (its window ends now); too few: say so, stop;
2. OrchRM retrained (``train-reward-model``) on the pairs of every stored run, the window's
   runs adding the new ones (``new_since`` = the window's start; unreferenced runs give only
   the label-free sources), promoted only if it ranks the same held-out pairs better than the
   champion. Trained on the window's pairs alone, the loop's second OrchRM learned from 15
   pairs and replaced one trained on 540 after ranking 7 held-out pairs better (7 of 7
   against 5 of 7);
3. the ``improve`` recipe from the champion conductor (``train-conductor``: OrchRM-guided
   sampling, SFT, held-out eval), promoted only if it beats the champion on the same
   held-out questions;
4. the iteration's counts, scores and ledger as an MLflow run of experiment ``improve``.

A killed iteration resumes: the same window, OrchRM not trained again once it was, the
conductor's training at the stage it was in.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect_conductor.conductor.data.records import utcnow
from prefect_conductor.conductor.training.config import TrainConductorRequest
from prefect_conductor.conductor.training.improve import (
    ImproveIteration,
    ImproveRequest,
    ImproveState,
)
from prefect_conductor.conductor.training.ledger import LedgerEntry, ledger_total
from prefect_conductor.flows.train_conductor import train_conductor
from prefect_conductor.flows.train_reward_model import train_reward_model
from prefect_conductor.reward_model.model import RewardModelRequest, loop_settings
from prefect_conductor.tasks.improve import (
    finish_iteration_run,
    start_iteration_run,
    window_runs,
)
from prefect_conductor.tasks.reward_model import champion_ref

__all__ = ["improve"]


def _begin(request: ImproveRequest, state: ImproveState) -> ImproveIteration:
    """The unfinished iteration (resumed), or a new one whose window ends now."""
    last = state.iterations[-1] if state.iterations else None
    if last is not None and not last.finished:
        return last
    iteration = ImproveIteration(
        iteration=len(state.iterations) + 1,
        since=state.window_start(),
        until=utcnow().isoformat(),
    )
    state.iterations.append(iteration)
    return iteration


def _stop(state: ImproveState, iteration: ImproveIteration, why: str) -> ImproveIteration:
    get_run_logger().info("iteration %d: %s", iteration.iteration, why)
    iteration.stopped = why
    if iteration.mlflow_run_id is not None:
        finish_iteration_run(iteration)
    iteration.finished = True
    state.save()
    return iteration


@flow(name="improve", flow_run_name="improve the conductor", log_prints=False)
def improve(request: ImproveRequest | None = None) -> ImproveIteration:
    """One iteration: stored runs → pairs → OrchRM → an OrchRM-guided round → promotion."""
    request = request or ImproveRequest()
    loop_settings(request.reward_model)  # a bad setting: one line, before anything runs
    log = get_run_logger()
    state = ImproveState.load()
    iteration = _begin(request, state)
    if iteration.mlflow_run_id is None:  # a new iteration
        iteration.runs = window_runs(iteration.since, iteration.until)
        if iteration.runs.total < request.min_new_runs:
            since = iteration.since or "the first run"
            return _stop(
                state,
                iteration,
                f"too little new data: {iteration.runs.total} runs stored since {since}, "
                f"fewer than min_new_runs {request.min_new_runs}; nothing trained",
            )
        iteration.mlflow_run_id = start_iteration_run(iteration, request.recipe)
        state.save()
    else:
        log.info("resuming iteration %d (MLflow run %s)", iteration.iteration,
                 iteration.mlflow_run_id)  # fmt: skip

    if iteration.orchrm_wall_s is None:
        rm = train_reward_model(
            RewardModelRequest(
                **{
                    **request.reward_model,
                    "since": None,  # pairs from every stored run: the window adds to them
                    "new_since": iteration.since,
                    "pool": request.pool,
                    "promote": request.promote,
                }
            )
        )
        iteration.pairs_by_source = rm.pairs_new_by_source
        iteration.pairs_unreferenced_by_source = rm.pairs_new_unreferenced_by_source
        iteration.pairs_new = rm.pairs_new
        iteration.orchrm_trained = rm.trained
        iteration.orchrm_promoted = rm.promoted
        iteration.orchrm_accuracy = rm.pairwise_accuracy
        iteration.orchrm_champion_accuracy = rm.champion_accuracy
        iteration.orchrm_uri = rm.model_uri
        iteration.orchrm_wall_s = rm.wall_s
        state.save()
        log.info("iteration %d: %s", iteration.iteration, rm.message)
    if champion_ref() is None:
        return _stop(state, iteration, "no OrchRM champion to guide the round: nothing trained")

    result = train_conductor(
        TrainConductorRequest(
            recipe=request.recipe,
            overrides=request.overrides,
            pool=request.pool,
            promote=request.promote,
        )
    )
    iteration.conductor_run_id = result.run_id
    iteration.accuracy_before = (
        result.incumbent_accuracy
        if result.incumbent_accuracy is not None
        else result.accuracy_before
    )
    iteration.accuracy_after = result.accuracy_after
    iteration.conductor_promoted = result.promoted
    iteration.conductor_uri = result.adapter_uri
    orchrm = LedgerEntry(
        stage="orchrm",
        worker_calls=0,
        input_tokens=0,
        output_tokens=0,
        cost_usd=0.0,
        conductor_generations=0,
        wall_s=iteration.orchrm_wall_s or 0.0,
    )
    entries = [orchrm, *(e for e in result.ledger if e.stage != "total")]
    iteration.ledger = [*entries, ledger_total(entries)]
    finish_iteration_run(iteration)
    iteration.finished = True
    state.save()
    log.info(
        "iteration %d: conductor %s -> %.3f%s; %d worker calls",
        iteration.iteration,
        f"{iteration.accuracy_before:.3f}" if iteration.accuracy_before is not None else "-",
        result.accuracy_after,
        ", promoted" if result.promoted else ", not promoted",
        iteration.ledger[-1].worker_calls,
    )
    return iteration
