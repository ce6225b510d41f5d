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

import json
import threading
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from prefect_conductor.conductor.adapters import EMBEDDED_ADAPTER, INCUMBENT
from prefect_conductor.conductor.data.datasets import Example, load_dataset
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.errors import ConductorError, PlanError
from prefect_conductor.conductor.home import conductor_home
from prefect_conductor.conductor.plan.parse import parse_plan
from prefect_conductor.conductor.plan.prompts import describe_workers
from prefect_conductor.conductor.plan.requests import (
    EvalRequest,
    EvalResult,
    OrchestrateRequest,
    RunResult,
)
from prefect_conductor.conductor.pool import Pool, load_pool, write_pool_file
from prefect_conductor.conductor.training.config import (
    StageReport,
    TrainConductorRequest,
    TrainConductorResult,
    rollout_request,
)
from prefect_conductor.conductor.training.hints import hint_rotations
from prefect_conductor.conductor.training.ledger import LedgerEntry, ledger_total, stage_ledger
from prefect_conductor.conductor.training.progress import FinishedStage, Progress
from prefect_conductor.conductor.training.recipe import (
    CollectStage,
    EvalStage,
    GrpoStage,
    Questions,
    Recipe,
    SelfSampleStage,
    SftSettings,
    SftStage,
    recipe_digest,
)
from prefect_conductor.conductor.training.rewards import ExecutedPlanReward, Rollout, RolloutOutcome
from prefect_conductor.conductor.training.warm_start import warm_start_examples
from prefect_conductor.flows.best_of_n import QUESTION_FLOWS
from prefect_conductor.flows.evaluate import evaluate
from prefect_conductor.tasks.artifacts import RunBatch, ledger_artifact
from prefect_conductor.tasks.planning import write_plan
from prefect_conductor.tasks.questions import RunOutcome, run_question
from prefect_conductor.tasks.registry import resolve_conductor, with_conductor
from prefect_conductor.tasks.reward_model import score_plans
from prefect_conductor.tasks.training import (
    EXPERIMENT,
    champion_exists,
    champion_needs_eval,
    finish_training_run,
    grpo_train,
    log_stage,
    register_conductor,
    resume_training_run,
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


def _logger() -> Any:
    """The flow run's logger; the module's outside a run (a stage called directly)."""
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        import logging

        return logging.getLogger(__name__)


class _Training:
    """One training's state while its stages run: the recipe, the pool, the MLflow run,
    the current adapter and the questions used so far."""

    def __init__(self, request: TrainConductorRequest, run_id: str, pool: Pool):
        self.request = request
        self.recipe: Recipe = request.recipe
        self.pool = pool
        self.run_id = run_id
        self.output_dir = Path(
            request.output_dir or conductor_home() / "training" / run_id
        ).absolute()
        # Where every "start" SFT starts: init_adapter's LoRA, or (None) a new one on the base.
        init = self.recipe.init_adapter
        self.start: Path | None = resolve_conductor(init).path if init else None
        self.current: Path | None = self.start
        self.used: set[str] = set()
        self.fleet = Fleet(request.rollout_concurrency) if request.fan_out else None
        heldout = self.recipe.heldout
        self.heldout_dataset = heldout.dataset or self.recipe.dataset
        self.heldout = load_dataset(
            self.heldout_dataset, split=heldout.split, limit=heldout.limit, seed=self.recipe.seed
        )
        self.evals: dict[str, EvalResult] = {}

    def tags(self, stage: str) -> dict[str, str]:
        return {"train_run": self.run_id, "train_stage": stage}

    # --- question selection -----------------------------------------------------------------

    def questions(self, q: Questions) -> list[Example]:
        """The stage's questions: its data set and split, ``where`` on ``meta``, the fresh
        ones (not used by an earlier stage of this training) first ``limit``."""
        dataset = q.dataset or self.recipe.dataset
        if dataset == self.heldout_dataset and q.split == self.recipe.heldout.split:
            raise ConductorError(
                f"stage questions come from {dataset}/{q.split}, the held-out split: "
                "training never reads it"
            )
        examples = load_dataset(dataset, split=q.split, seed=self.recipe.seed)
        held = {e.question for e in self.heldout}
        chosen = []
        for e in examples:
            if e.question in held or any(e.meta.get(k) != v for k, v in q.where.items()):
                continue
            if q.fresh and e.id in self.used:
                continue
            chosen.append(e)
            if len(chosen) == q.limit:
                break
        if not chosen:
            raise ConductorError(
                f"no training question left in {dataset}/{q.split}"
                + (f" where {q.where}" if q.where else "")
                + (" that an earlier stage did not use" if q.fresh else "")
            )
        return chosen

    # --- stages -----------------------------------------------------------------------------

    def collect(self, stage: CollectStage) -> StageReport:
        questions = self.questions(stage.questions)
        split = stage.questions.split
        dataset = stage.questions.dataset or self.recipe.dataset
        requests = []
        if stage.teacher:
            pool, conductor = self._teacher(stage.teacher)
            requests = [
                rollout_request(
                    pool,
                    ex,
                    {**self.tags(stage.name), "teacher": stage.teacher},
                    dataset,
                    split,
                    conductor=conductor,
                    seed=self.recipe.seed,
                )  # fmt: skip
                for ex in questions
            ]
        else:
            names = [w.name for w in self.pool.workers if w.kind != "conductor"]
            for name in stage.workers or names:
                if name not in names:
                    raise ConductorError(
                        f"stage {stage.name}: no worker {name!r} in the pool ({', '.join(names)})"
                    )
            requests = [
                rollout_request(
                    self.request.pool,
                    ex,
                    self.tags(stage.name),
                    dataset,
                    split,
                    strategy=f"single:{name}",
                    on_invalid_plan="fallback",
                )
                for name in stage.workers or names
                for ex in questions
            ]
        outcomes = [_outcome(r) for r in self._run(requests)]
        self.used.update(e.id for e in questions)
        return StageReport(
            stage=stage.name,
            kind=stage.kind,
            questions=len(questions),
            rollouts=len(outcomes),
            right=sum(bool(o and o.correct) for o in outcomes),
        )

    def _teacher(self, teacher: str) -> tuple[str | None, str | None]:
        """(pool, conductor) of the runs a ``teacher`` plans: an adapter (a directory,
        ``models:/…``, ``embedded``) plans on the training pool; a litellm model (``openai/…``)
        becomes the conductor of a copy of the pool, written next to the adapters."""
        try:
            resolve_conductor(teacher)
            return self.request.pool, teacher
        except ConductorError:
            if "/" not in teacher:
                raise
        conductor = self.pool.conductor.model_copy(update={"model": teacher, "prompt": "full"})
        pool = self.pool.model_copy(update={"conductor": conductor})
        return str(write_pool_file(pool, self.output_dir)), None

    def sft(self, name: str, settings: SftSettings, new_plans: bool = False) -> StageReport:
        runs = ArtifactStore().read_pandas("runs")
        if settings.data == "training":
            from prefect_conductor.conductor.training.ledger import tagged_runs

            runs = tagged_runs(runs, self.run_id)
        examples = warm_start_examples(
            runs,
            self.pool,
            exclude_questions=[e.question for e in self.heldout],
            limit=settings.max_examples,
            seed=self.recipe.seed,
        )
        if not examples:
            if new_plans:  # a self-sampling round that found nothing: the adapter is kept
                _logger().info("%s: no verified plan, the adapter is kept", name)
                return StageReport(stage=name, kind="sft", examples=0)
            raise ConductorError(
                f"stage {name}: the artifact store holds no verified-correct run outside the "
                "held-out questions; put a collect stage first"
            )
        init = self.start if settings.init == "start" else self.current
        adapter, steps = warm_start_train(
            self.recipe, settings, examples, self.output_dir, self.run_id, stage=name,
            init_adapter=init,
        )  # fmt: skip
        self.current = adapter
        return StageReport(
            stage=name, kind="sft", examples=len(examples), steps=steps, adapter=str(adapter)
        )

    def self_sample(self, stage: SelfSampleStage) -> StageReport:
        questions = self.questions(stage.questions)
        hints = hint_rotations(stage.hints, self.pool) if stage.hints else None
        dataset = stage.questions.dataset or self.recipe.dataset
        tags = {
            **self.tags(stage.name),
            **({"self_sample_hints": stage.hints} if stage.hints else {}),
        }

        def sample(ex: Example, k: int, extra: dict | None = None, **fields: Any):
            return rollout_request(
                self.request.pool, ex, {**tags, "sample": str(k), **(extra or {})}, dataset,
                stage.questions.split, seed=self.recipe.seed + k, **fields,
            )  # fmt: skip

        if stage.guide is None:  # every sampled plan runs
            requests = [
                sample(
                    ex,
                    k,
                    conductor=str(self.current) if self.current else None,
                    conductor_temperature=stage.temperature,
                    conductor_hint=hints[k % len(hints)] if hints else None,
                )  # fmt: skip
                for ex in questions
                for k in range(stage.num_generations)
            ]
            sampled = None
        else:
            requests, sampled = self._guided(stage, questions, hints, sample)
        outcomes = [_outcome(r) for r in self._run(requests)]
        self.used.update(e.id for e in questions)
        right = sum(bool(o and o.correct) for o in outcomes)
        _logger().info("%s: %d of %d plans right", stage.name, right, len(outcomes))
        trained = self.sft(stage.name, stage.sft, new_plans=True)
        return trained.model_copy(
            update={
                "kind": stage.kind,
                "questions": len(questions),
                "sampled": sampled,
                "rollouts": len(outcomes),
                "right": right,
            }
        )

    def _guided(
        self, stage: SelfSampleStage, questions: list[Example], hints: list[str] | None, sample
    ) -> tuple[list[OrchestrateRequest], int]:
        """OrchRM-guided sampling: every plan is written (no worker call), identical plans
        are merged, OrchRM scores the distinct valid ones plan-only and the top
        ``guide.execute`` run; an unparseable plan is stored as the invalid run it is (no
        step, no worker call), a merged or unchosen one is never run. Returns the requests
        and the number of plans written."""
        assert stage.guide is not None
        pool = with_conductor(self.pool, str(self.current)) if self.current else self.pool
        max_steps = pool.max_steps
        futures = {
            (i, k): write_plan.submit(
                ex.question,
                _sampling_pool(
                    pool,
                    stage.temperature,
                    self.recipe.seed + k,
                    hints[k % len(hints)] if hints else None,
                ),
                max_steps,
            )  # fmt: skip
            for i, ex in enumerate(questions)
            for k in range(stage.num_generations)
        }
        workers = describe_workers(pool)
        requests: list[OrchestrateRequest] = []
        source = pool.conductor.model
        for i, ex in enumerate(questions):
            distinct: dict[str, tuple[int, str, dict]] = {}
            for k in range(stage.num_generations):
                text = futures[(i, k)].result().text
                try:
                    lists = parse_plan(text, pool, max_steps=max_steps).to_lists()
                except PlanError:
                    requests.append(sample(ex, k, plan_text=text, plan_source=source))
                    continue
                distinct.setdefault(json.dumps(lists, sort_keys=True), (k, text, lists))
            if not distinct:
                continue
            candidates = list(distinct.values())
            scores = score_plans(
                stage.guide.orchrm, ex.question, [c[2] for c in candidates], None, workers
            )
            ranked = sorted(range(len(candidates)), key=lambda j: (-scores[j], candidates[j][0]))
            for j in ranked[: stage.guide.execute]:
                k, text, _ = candidates[j]
                requests.append(
                    sample(
                        ex, k, plan_text=text, plan_source=source,
                        extra={"plan_score": f"{scores[j]:.6f}", "guided": "orchrm"},
                    )
                )  # fmt: skip
        return requests, len(futures)

    def grpo(self, stage: GrpoStage) -> StageReport:
        if not stage.max_steps:
            return StageReport(stage=stage.name, kind=stage.kind, steps=0)
        questions = self.questions(stage.questions)
        dataset = stage.questions.dataset or self.recipe.dataset
        reward = ExecutedPlanReward(self._executor(stage, dataset))
        outcome = grpo_train(
            self.recipe, stage, self.pool, questions, self.current, reward, self.output_dir,
            self.run_id,
        )  # fmt: skip
        self.current = outcome.adapter_dir
        return StageReport(
            stage=stage.name,
            kind=stage.kind,
            questions=len(questions),
            rollouts=outcome.rollouts,
            right=sum(1 for s in reward.samples if s.get("reward") == 1.0),
            steps=outcome.steps,
            adapter=str(outcome.adapter_dir),
        )

    def _executor(self, stage: GrpoStage, dataset: str):
        source = f"grpo:{self.run_id}"

        def execute(rollouts: list[Rollout], step: int) -> list[RolloutOutcome | None]:
            requests = [
                rollout_request(
                    self.request.pool,
                    r,
                    {
                        **self.tags(stage.name),
                        "train_step": str(step),
                        "rollout": str(i),
                        "strategy": "grpo-rollout",
                    },
                    dataset,
                    stage.questions.split,
                    plan_text=r.plan_text,
                    plan_source=source,
                )  # fmt: skip
                for i, r in enumerate(rollouts)
            ]
            return [_outcome(r) for r in self._run(requests)]

        return execute

    def evaluate(self, stage: EvalStage | None, name: str, conductor: str | None) -> EvalResult:
        heldout = self.recipe.heldout
        state = evaluate(
            EvalRequest(
                dataset=(stage and stage.dataset) or self.heldout_dataset,
                split=(stage and stage.split) or heldout.split,
                limit=(stage and stage.limit) or heldout.limit,
                strategy="conductor",
                concurrency=self.request.eval_concurrency,
                pool=self.request.pool,
                seed=self.recipe.seed,
                conductor=conductor,
                experiment=EXPERIMENT,
                run_name=name,
                mlflow_tags={"mlflow.parentRunId": self.run_id, "stage": name},
                tags=self.tags(name),
                fan_out=self.request.fan_out,
            ),
            return_state=True,
        )
        result = state.result(raise_on_failure=False)
        if not isinstance(result, EvalResult):
            raise ConductorError(f"evaluation '{name}' failed: {result}")
        return result

    def eval_stage(self, stage: EvalStage) -> StageReport:
        if stage.conductor == "start":
            conductor = self.recipe.init_adapter
        else:
            conductor = str(self.current) if self.current else self.recipe.init_adapter
        result = self.evaluate(stage, stage.name, conductor)
        self.evals[stage.name] = result
        return StageReport(
            stage=stage.name,
            kind=stage.kind,
            questions=result.n,
            accuracy=result.accuracy,
            format_valid=result.format_valid_rate,
            adapter=conductor,
        )

    def _run(self, requests: list[OrchestrateRequest]) -> list[object]:
        return _run_all(requests, self.request.rollout_concurrency, self.fleet)

    def run_stage(self, stage: Any) -> StageReport:
        if isinstance(stage, CollectStage):
            return self.collect(stage)
        if isinstance(stage, SftStage):
            return self.sft(stage.name, stage)
        if isinstance(stage, SelfSampleStage):
            return self.self_sample(stage)
        if isinstance(stage, GrpoStage):
            return self.grpo(stage)
        return self.eval_stage(stage)

    def ledger(self, stage: str, wall_s: float) -> LedgerEntry:
        store = ArtifactStore()
        runs = store.read_pandas("runs", columns=["run_id", "tags", "conductor_output"])
        steps = store.read_pandas(
            "steps", columns=["run_id", "status", "input_tokens", "output_tokens", "cost_usd"]
        )
        return stage_ledger(runs, steps, self.run_id, stage, wall_s)


def _sampling_pool(pool: Pool, temperature: float, seed: int, hint: str | None) -> Pool:
    sampled = pool.with_conductor_sampling(temperature, seed)
    return sampled.with_conductor_hint(hint) if hint else sampled


def _training_pool(request: TrainConductorRequest) -> Pool:
    pool = load_pool(request.pool)
    conductor = pool.conductor.model_copy(update={"prompt": request.recipe.prompt})
    return pool.model_copy(update={"conductor": conductor})


def _digest(request: TrainConductorRequest, pool: Pool) -> str:
    return recipe_digest(request.recipe, pool=pool.public_dict(), output_dir=request.output_dir)


def _begin(request: TrainConductorRequest, digest: str) -> tuple[Progress, str | None]:
    """This training's progress: a killed one of the same digest, resumed (and the name of
    the stage it resumes at), or a new MLflow run."""
    previous = None if request.restart else Progress.load(digest)
    if previous is not None and not previous.finished:
        resume_training_run(previous.run_id)
        names = [s.name for s in request.recipe.stages]
        at = next((n for n in names if previous.done(n) is None), names[-1])
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
    pool = _training_pool(request)
    for stage in recipe.stages:  # a bad hint file is one clear error before anything runs
        if isinstance(stage, SelfSampleStage) and stage.hints:
            hint_rotations(stage.hints, pool)
    digest = _digest(request, pool)
    progress, resumed_at = _begin(request, digest)
    run_id = progress.run_id
    if resumed_at:
        log.info("resuming training %s (MLflow run %s) at stage %s", digest, run_id, resumed_at)
    training = _Training(request, run_id, pool)
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
        incumbent_acc = None
        if request.promote:
            t0 = time.perf_counter()
            incumbent_acc = _incumbent_accuracy(training, signature, before)
            if "incumbent" in training.evals:
                ledger.append(training.ledger("incumbent", time.perf_counter() - t0))
        registration = register_conductor(
            run_id, final, after.accuracy, signature, request.promote, incumbent_acc
        )
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


def _heldout_eval(training: _Training, report: StageReport) -> bool:
    stage = training.recipe.stage(report.stage)
    return isinstance(stage, EvalStage) and not (stage.dataset or stage.split or stage.limit)


def _after(training: _Training, reports: list[StageReport]) -> EvalResult:
    """The last eval stage on the held-out questions (a recipe always ends with one)."""
    report = next(r for r in reversed(reports) if _heldout_eval(training, r))
    return training.evals.get(report.stage) or _stored_eval(report)


def _before(training: _Training, reports: list[StageReport]) -> EvalResult | None:
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
    training: _Training, signature: str, before: EvalResult | None
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
