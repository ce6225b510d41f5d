"""The ``train-conductor`` flow: warm start, GRPO on executed plans, evaluation, registry.

Stages (issue #8), each a task run and, in MLflow, a run nested under the training run of
experiment ``train/conductor``:

1. evaluate the starting conductor on the held-out split (``evaluate`` subflow);
2. optionally a warm start (SFT) on verified-correct runs of the artifact store; on a store
   with none, each single worker first answers ``collect_limit`` training questions (one
   eval each), so ``train-conductor`` on an empty store collects the runs it needs itself;
   the plans are drawn balanced over the workers they use;
3. rounds of verified self-sampling (``self_sample_rounds``, issue #18): the warm-started
   conductor samples ``self_sample_k`` plans at ``temperature`` for each of
   ``self_sample_questions`` fresh training questions, every plan runs and is verified like
   any run, and the SFT is redone from the warm start's starting point (the base, or
   ``init_adapter``) on the store's verified-correct plans, so a plan the conductor found
   itself (a word problem it turned into an expression) becomes a target;
   ``self_sample_hints`` adds worked examples to the sampling prompt only
   (``conductor.training.hints``); with ``eval_stages`` each stage's conductor is evaluated
   on the held-out split;
4. GRPO (skipped when ``max_steps`` is 0): the policy samples ``num_generations`` plans
   per question, every plan runs as an ``orchestrate`` subflow (a step's rollouts
   concurrently), is verified and stored in the ``runs``/``steps`` tables tagged with the
   training run and step, and its reward (0 / 0.5 / 1) drives the update;
5. evaluate the trained adapter on the same held-out questions;
6. register it as model ``conductor`` (alias ``candidate``), promoted to ``champion`` only
   if it beats the *incumbent* on those questions: the champion of the registry, or, while
   the registry has none, the pool's own conductor (the embedded adapter for the local pool),
   which is what ``conductor run`` would keep using. A worse first candidate never becomes
   champion (issue #18 measured one at 0 % valid plans promoted over the shipped 100 %).

``before`` measures ``init_adapter`` or, without one, the pool's conductor; the result says
what it measured (``before_conductor``) and what training started from (``started_from``),
so a before/after pair from different conductors is labelled as such.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from prefect_conductor.conductor.adapters import EMBEDDED_ADAPTER, INCUMBENT
from prefect_conductor.conductor.data.datasets import load_dataset
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.errors import ConductorError
from prefect_conductor.conductor.home import conductor_home
from prefect_conductor.conductor.plan.requests import (
    EvalRequest,
    EvalResult,
    OrchestrateRequest,
    RunResult,
)
from prefect_conductor.conductor.pool import Pool, load_pool
from prefect_conductor.conductor.training.config import (
    StageScore,
    TrainConductorRequest,
    TrainConductorResult,
    rollout_request,
)
from prefect_conductor.conductor.training.hints import hint_rotations
from prefect_conductor.conductor.training.rewards import ExecutedPlanReward, Rollout, RolloutOutcome
from prefect_conductor.conductor.training.warm_start import warm_start_examples
from prefect_conductor.flows.best_of_n import QUESTION_FLOWS
from prefect_conductor.flows.evaluate import evaluate
from prefect_conductor.tasks.artifacts import RunBatch
from prefect_conductor.tasks.questions import RunOutcome, run_question
from prefect_conductor.tasks.registry import resolve_conductor
from prefect_conductor.tasks.training import (
    EXPERIMENT,
    champion_exists,
    champion_needs_eval,
    finish_training_run,
    grpo_train,
    register_conductor,
    start_training_run,
    warm_start_train,
)

from prefect_conductor.fleet.fanout import Fleet

__all__ = ["train_conductor"]


def _outcome(result: object) -> RolloutOutcome | None:
    if not isinstance(result, RunResult) or result.reward is None:
        return None  # the run itself crashed: no opinion on the plan
    return RolloutOutcome(
        reward=result.reward,
        format_valid=result.format_valid,
        correct=bool(result.correct),
        tokens=result.input_tokens + result.output_tokens,
        run_id=result.run_id,
        answer=result.answer,
    )


def _run_all(
    requests: list[OrchestrateRequest], concurrency: int, fleet: Fleet | None = None
) -> list[object]:
    """Every request as a ``run_question`` task (or, with a ``fleet``, a question of the
    fleet), at most ``concurrency`` at once; the results (a RunResult, or what the failed
    task left) in request order."""
    gate = threading.Semaphore(concurrency)
    futures = []
    for req in requests:
        gate.acquire()
        future = (
            fleet.submit(req) if fleet is not None else run_question.submit(req, QUESTION_FLOWS)
        )
        future.add_done_callback(lambda _f: gate.release())
        futures.append(future)
    if fleet is None:
        return [f.result(raise_on_failure=False) for f in futures]
    # The fleet's workers return their rows unstored: stored here, once per run id, as an
    # eval stores them (flows/evaluate.py).
    batch = RunBatch(None)
    results = []
    for future in futures:
        outcome = future.result()
        if isinstance(outcome, RunOutcome):
            batch.add(outcome.run, outcome.steps)
            outcome = outcome.result
        results.append(outcome)
    batch.close()
    return results


def rollout_executor(
    request: TrainConductorRequest, source: str, run_id: str, fleet: Fleet | None = None
):
    """Runs a batch of rollouts, at most N at once: here, or on the fleet (``fan_out``), so
    that a GPU trainer executes no plan itself."""

    def execute(rollouts: list[Rollout], step: int) -> list[RolloutOutcome | None]:
        requests = [
            rollout_request(
                request,
                r,
                {
                    "train_run": run_id,
                    "train_step": str(step),
                    "rollout": str(i),
                    "strategy": "grpo-rollout",
                },
                plan_text=r.plan_text,
                plan_source=source,
            )
            for i, r in enumerate(rollouts)
        ]
        return [_outcome(r) for r in _run_all(requests, request.rollout_concurrency, fleet)]

    return execute


def self_sample(
    request: TrainConductorRequest,
    questions: list,
    adapter: Path,
    round_: int,
    run_id: str,
    fleet: Fleet | None = None,
    hints: list[str] | None = None,
) -> list[RolloutOutcome | None]:
    """One round of verified self-sampling: the conductor ``adapter`` writes
    ``self_sample_k`` plans per question at ``self_sample_temperature`` (default:
    ``temperature``; seeds ``seed .. seed + k - 1``),
    each runs through ``orchestrate`` and is verified and stored like any run (tagged
    ``self_sample_round``). Its verified-correct plans are warm-start data for the next
    round; the reference only verifies, it never becomes a target. ``hints`` (worked examples,
    ``conductor.training.hints.hint_rotations``) are added to the sampling prompt only, sample
    ``k`` reading rotation ``k mod len(hints)``: the plans are trained with the standard
    prompt."""
    hinted = {"self_sample_hints": request.self_sample_hints} if hints else {}
    requests = [
        rollout_request(
            request,
            ex,
            {"train_run": run_id, "self_sample_round": str(round_), "sample": str(k), **hinted},
            conductor=str(adapter),
            conductor_temperature=request.self_sample_temperature or request.temperature,
            conductor_hint=hints[k % len(hints)] if hints else None,
            seed=request.seed + k,
        )
        for ex in questions
        for k in range(request.self_sample_k)
    ]
    return [_outcome(r) for r in _run_all(requests, request.rollout_concurrency, fleet)]


def _round_questions(request: TrainConductorRequest, train: list, round_: int) -> list:
    """Fresh training questions for self-sampling round ``round_`` (1-based): those after
    the ones the collection used, cycling through the split."""
    n = len(train)
    start = request.collect_limit + (round_ - 1) * request.self_sample_questions
    return [train[(start + i) % n] for i in range(min(request.self_sample_questions, n))]


def _eval(request: TrainConductorRequest, conductor: str | None, name: str, parent: str):
    state = evaluate(
        EvalRequest(
            dataset=request.dataset,
            split=request.eval_split,
            limit=request.eval_limit,
            strategy="conductor",
            concurrency=request.eval_concurrency,
            pool=request.pool,
            seed=request.seed,
            conductor=conductor,
            experiment=EXPERIMENT,
            run_name=name,
            mlflow_tags={"mlflow.parentRunId": parent, "stage": name},
            fan_out=request.fan_out,
        ),
        return_state=True,
    )
    result = state.result(raise_on_failure=False)
    if not isinstance(result, EvalResult):
        raise ConductorError(f"evaluation '{name}' failed: {result}")
    return result


def _warm_start_data(request: TrainConductorRequest, pool: Pool, heldout: list) -> list:
    return warm_start_examples(
        ArtifactStore().read_pandas("runs"),
        pool,
        exclude_questions=[e.question for e in heldout],
        limit=request.warm_start_examples,
        seed=request.seed,
    )


def _collect(request: TrainConductorRequest, pool: Pool, parent: str) -> None:
    """An empty store: every single worker answers ``collect_limit`` training questions, so
    that the verified-correct ones (and only those) become warm-start plans. Each worker is
    one eval, tracked under the training run as ``collect <worker>``."""
    for worker in pool.workers:
        if worker.kind == "conductor":
            continue
        evaluate(
            EvalRequest(
                dataset=request.dataset,
                split=request.split,
                limit=request.collect_limit,
                strategy=f"single:{worker.name}",
                concurrency=request.eval_concurrency,
                pool=request.pool,
                seed=request.seed,
                experiment=EXPERIMENT,
                run_name=f"collect {worker.name}",
                mlflow_tags={"mlflow.parentRunId": parent, "stage": "collect"},
            ),
            return_state=True,
        )


def _training_pool(request: TrainConductorRequest) -> Pool:
    pool = load_pool(request.pool)
    conductor = pool.conductor.model_copy(update={"prompt": request.prompt})
    return pool.model_copy(update={"conductor": conductor})


@flow(
    name="train-conductor",
    flow_run_name="train conductor · {request.dataset}",
    task_runner=ThreadPoolTaskRunner(64),
    log_prints=False,
)
def train_conductor(request: TrainConductorRequest) -> TrainConductorResult:
    """Train the conductor with GRPO on executed plans; register and maybe promote it."""
    started = time.perf_counter()
    log = get_run_logger()
    pool = _training_pool(request)
    # A bad hint file is one clear error before anything runs.
    hints = hint_rotations(request.self_sample_hints, pool) if request.self_sample_hints else None
    train = load_dataset(
        request.dataset, split=request.split, limit=request.limit, seed=request.seed
    )
    heldout = load_dataset(
        request.dataset, split=request.eval_split, limit=request.eval_limit, seed=request.seed
    )
    signature = f"{request.dataset}/{request.eval_split}/{request.eval_limit}/{request.seed}"
    run_id = start_training_run(request, {"flow_run_id": str(flow_run.id or "")})
    output_dir = Path(request.output_dir or conductor_home() / "training" / run_id).absolute()
    status = "FAILED"
    try:
        before = (
            _eval(request, request.init_adapter, "before", run_id) if request.eval_before else None
        )
        before_conductor = request.init_adapter or f"pool conductor ({pool.conductor.model})"
        # Where every SFT starts: init_adapter's LoRA, or (None) a new one on the base.
        start = resolve_conductor(request.init_adapter).path if request.init_adapter else None
        init = start
        n_warm = None
        stages: list[StageScore] = []
        scored_adapters: dict[Path, EvalResult] = {}  # a stage's eval, reused as `after`
        # With fan_out, every plan of this run (self-sampling, GRPO rollouts, evals) is
        # executed by the fleet's `conductor serve` processes, not by the trainer's host.
        fleet = Fleet(request.rollout_concurrency) if request.fan_out else None

        def stage_score(name: str, adapter: Path, **counts: int | None) -> None:
            if request.eval_stages:
                scored = _eval(request, str(adapter), f"stage {name}", run_id)
                scored_adapters[adapter] = scored
                stages.append(
                    StageScore(
                        stage=name,
                        accuracy=scored.accuracy,
                        format_valid=scored.format_valid_rate,
                        **counts,
                    )
                )
            else:
                stages.append(StageScore(stage=name, **counts))

        if request.warm_start:
            examples = _warm_start_data(request, pool, heldout)
            if not examples and request.collect_limit:
                _collect(request, pool, run_id)
                examples = _warm_start_data(request, pool, heldout)
            n_warm = len(examples)
            if not examples:
                raise ConductorError(
                    "warm start: the artifact store holds no verified-correct run outside the "
                    "held-out split; run e.g. `conductor eval --dataset arithmetic --split train "
                    "--strategy random-plan` first"
                )
            log.info("warm start on %d verified-correct plans", n_warm)
            # From init_adapter (the champion of a weekly retraining) when given: it goes on
            # training; else a new LoRA on the base model.
            init = warm_start_train(request, examples, output_dir, run_id, init_adapter=start)
            stage_score("warm-start", init, examples=n_warm)
        # Self-sampling needs a conductor of our own to sample: the warm start's, or
        # init_adapter's. Each round then redoes the SFT from where the warm start started
        # (a new LoRA on the base, or init_adapter) on every verified-correct plan stored,
        # its own now included. Training only the round's plans on top of the last adapter
        # was measured (issue #18, ninth session): 84.5 min instead of 91, but the candidate
        # sent every arithmetic question to smol (40 % against 66 %), so it is not done.
        if init is not None:
            for round_ in range(1, request.self_sample_rounds + 1):
                questions = _round_questions(request, train, round_)
                outcomes = self_sample(request, questions, init, round_, run_id, fleet, hints)
                right = sum(bool(o and o.correct) for o in outcomes)
                log.info(
                    "self-sampling round %d: %d of %d plans right", round_, right, len(outcomes)
                )
                examples = _warm_start_data(request, pool, heldout)
                if examples:
                    n_warm = len(examples)
                    init = warm_start_train(
                        request,
                        examples,
                        output_dir,
                        run_id,
                        stage=f"round-{round_}",
                        init_adapter=start,
                    )
                else:
                    log.info(
                        "self-sampling round %d: no verified plan, the adapter is kept", round_
                    )
                stage_score(f"round-{round_}", init, examples=len(examples), rollouts=len(outcomes))
        if request.max_steps:
            source = f"grpo:{run_id}"
            reward = ExecutedPlanReward(rollout_executor(request, source, run_id, fleet))
            grpo = grpo_train(request, pool, train, init, reward, output_dir, run_id)
            final = grpo.adapter_dir
        elif init is not None:
            grpo, final = None, init
        else:
            raise ConductorError("nothing to train: max_steps is 0 and there is no warm start")
        # With eval_stages and no GRPO the last stage's adapter is the final one: its
        # held-out eval is already done (the MLflow run "stage round-N"), not run twice.
        after = scored_adapters.get(final) or _eval(request, str(final), "after", run_id)
        incumbent_acc = (
            _incumbent_accuracy(request, signature, before, run_id) if request.promote else None
        )
        registration = register_conductor(
            run_id, final, after.accuracy, signature, request.promote, incumbent_acc
        )
        status = "FINISHED"
    finally:
        wall = time.perf_counter() - started
        if status != "FINISHED":
            finish_training_run(run_id, {"wall_s": wall}, status)
    metrics = {
        "wall_s": wall,
        "grpo_steps": grpo.steps if grpo else 0,
        "rollouts": grpo.rollouts if grpo else 0,
        "self_sample_rollouts": sum(st.rollouts or 0 for st in stages),
        "rollouts_per_s": grpo.rollouts / grpo.wall_s if grpo and grpo.wall_s else None,
        "steps_per_s": grpo.steps / grpo.wall_s if grpo and grpo.wall_s else None,
        "reward_first": grpo.rewards[0] if grpo and grpo.rewards else None,
        "reward_last": grpo.rewards[-1] if grpo and grpo.rewards else None,
        "accuracy_before": before.accuracy if before else None,
        "accuracy_after": after.accuracy,
        "format_valid_before": before.format_valid_rate if before else None,
        "format_valid_after": after.format_valid_rate,
        "warm_start_examples": n_warm,
        "promoted": float(registration.promoted),
        **{
            f"stage_{s.stage}_{k}": getattr(s, k)
            for s in stages
            for k in ("accuracy", "format_valid")
            if getattr(s, k) is not None
        },
    }
    finish_training_run(run_id, metrics, "FINISHED")
    log.info(
        "accuracy %s -> %.3f, valid plans %s -> %s; model conductor v%s%s",
        f"{before.accuracy:.3f}" if before else "-",
        after.accuracy,
        before.format_valid_rate if before else "-",
        after.format_valid_rate,
        registration.version,
        " promoted to champion" if registration.promoted else "",
    )
    return TrainConductorResult(
        run_id=run_id,
        steps=grpo.steps if grpo else 0,
        wall_s=round(wall, 1),
        warm_start_examples=n_warm,
        reward_first=metrics["reward_first"],
        reward_last=metrics["reward_last"],
        format_valid_before=metrics["format_valid_before"],
        format_valid_after=metrics["format_valid_after"],
        accuracy_before=metrics["accuracy_before"],
        accuracy_after=after.accuracy,
        adapter_uri=f"models:/conductor/{registration.version}",
        adapter_dir=str(final),
        model_version=registration.version,
        promoted=registration.promoted,
        incumbent_accuracy=registration.champion_accuracy,
        before_conductor=before_conductor if before else None,
        started_from=_started_from(request, n_warm),
        stages=stages,
    )


def _incumbent_accuracy(
    request: TrainConductorRequest, signature: str, before: EvalResult | None, run_id: str
) -> float | None:
    """The held-out accuracy the candidate must beat: the registry's champion (recorded for
    these questions, or evaluated now), else the pool's own conductor (``before`` when it
    measured that conductor, else evaluated now)."""
    champion = champion_needs_eval(signature)
    if champion is not None:
        return _eval(request, champion, "champion", run_id).accuracy
    if champion_exists():
        return None  # its accuracy on these questions is recorded: register_conductor reads it
    # Without a champion, ``champion`` is the shipped adapter: the local pool's conductor.
    shipped = load_pool(request.pool).conductor.model == f"local/{EMBEDDED_ADAPTER}"
    if before is not None and (
        request.init_adapter is None or (request.init_adapter == INCUMBENT and shipped)
    ):
        return before.accuracy
    return _eval(request, None, "incumbent", run_id).accuracy


def _started_from(request: TrainConductorRequest, n_warm: int | None) -> str:
    start = request.init_adapter or f"{request.base} + a new LoRA"
    return f"{start}, warm-started on {n_warm} plans" if n_warm else start
