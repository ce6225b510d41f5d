"""The stages of a training recipe (issue #40): ``Training`` holds one training's state
(the recipe, the pool, the MLflow run, the current adapter, the questions used so far) and
runs each stage kind as task runs of the ``train-conductor`` flow that creates it
(``flows/train_conductor.py``): the wiring between the tasks, no flow of its own (a
private module of ``flows/``, ``tests/unit/test_rooms.py``).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from prefect import get_run_logger
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
from prefect_conductor.conductor.pool import ConductorHint, Pool, load_pool, write_pool_file
from prefect_conductor.conductor.training.config import (
    StageReport,
    TrainConductorRequest,
    rollout_request,
)
from prefect_conductor.conductor.training.hints import hint_rotations
from prefect_conductor.conductor.training.ledger import LedgerEntry, stage_ledger, tagged_runs
from prefect_conductor.conductor.training.recipe import (
    CollectStage,
    EvalStage,
    GrpoStage,
    Questions,
    Recipe,
    SelfSampleStage,
    SftSettings,
    SftStage,
)
from prefect_conductor.conductor.training.rewards import ExecutedPlanReward, Rollout, RolloutOutcome
from prefect_conductor.conductor.training.warm_start import warm_start_examples
from prefect_conductor.flows.best_of_n import QUESTION_FLOWS
from prefect_conductor.flows.evaluate import evaluate
from prefect_conductor.reward_model.model import CHAMPION
from prefect_conductor.reward_model.rewards import (
    CheckedOrchRMReward,
    OrchRMReward,
    agreement_warning,
    order_agreement,
)
from prefect_conductor.tasks.artifacts import RunBatch
from prefect_conductor.tasks.planning import write_plan
from prefect_conductor.tasks.questions import RunOutcome, run_question
from prefect_conductor.tasks.registry import download_registered, resolve_conductor, with_conductor
from prefect_conductor.tasks.reward_model import score_plans
from prefect_conductor.tasks.training import EXPERIMENT, grpo_train, warm_start_train

from prefect_conductor.fleet.fanout import Fleet

__all__ = ["Training", "training_pool"]


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


def trained_questions() -> set[str]:
    """The questions of every run a training stored (tagged ``train_run``)."""
    runs = ArtifactStore().read_pandas("runs", columns=["question", "tags"])
    if runs.empty:
        return set()
    trained = runs["tags"].map(lambda t: "train_run" in dict(t if t is not None else ()))
    return set(runs.loc[trained, "question"])


class Training:
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
        sampled = trained_questions() if q.fresh == "store" else set()
        chosen = []
        for e in examples:
            if e.question in held or any(e.meta.get(k) != v for k, v in q.where.items()):
                continue
            if q.fresh and (e.id in self.used or e.question in sampled):
                continue
            chosen.append(e)
            if len(chosen) == q.limit:
                break
        if not chosen:
            raise ConductorError(
                f"no training question left in {dataset}/{q.split}"
                + (f" where {q.where}" if q.where else "")
                + (" that an earlier stage did not use" if q.fresh is True else "")
                + (" that no earlier training sampled" if q.fresh == "store" else "")
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
        if settings.stages is not None:
            runs = tagged_runs(runs, self.run_id, stages=settings.stages)
        elif settings.data == "training":
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
            outcomes = self._sample_until(stage, questions, hints, sample)
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

    def _sample_until(
        self,
        stage: SelfSampleStage,
        questions: list[Example],
        hints: list[ConductorHint] | None,
        sample,
    ) -> list[RolloutOutcome | None]:
        """Every sampled plan runs, ``num_generations`` per question; with ``min_right``,
        batches of ``num_generations`` more for the questions still without a right plan,
        until the stage has that many right plans or each question ``max_generations``
        (rare right plans cost time, not the round's chance; sample ``k`` is seeded
        ``seed + k`` whatever its batch)."""
        outcomes: list[RolloutOutcome | None] = []
        pending, first, right = questions, 0, 0
        conductor = str(self.current) if self.current else None
        while pending:
            last = min(first + stage.num_generations, stage.generation_cap)
            jobs = [(ex, k) for ex in pending for k in range(first, last)]
            requests = [
                sample(
                    ex,
                    k,
                    conductor=conductor,
                    conductor_temperature=stage.temperature,
                    conductor_hint=hints[k % len(hints)] if hints else None,
                )  # fmt: skip
                for ex, k in jobs
            ]
            batch = [_outcome(r) for r in self._run(requests)]
            outcomes += batch
            right += sum(bool(o and o.correct) for o in batch)
            if last >= stage.generation_cap or right >= stage.min_right:  # cap: no min_right
                break
            solved = {ex.id for (ex, _), o in zip(jobs, batch, strict=True) if o and o.correct}
            pending, first = [ex for ex in pending if ex.id not in solved], last
            _logger().info(
                "%s: %d of %d plans right, below %d: %d more for each of %d questions",
                stage.name, right, len(outcomes), stage.min_right,
                min(stage.num_generations, stage.generation_cap - first), len(pending),
            )  # fmt: skip
        return outcomes

    def _guided(
        self,
        stage: SelfSampleStage,
        questions: list[Example],
        hints: list[ConductorHint] | None,
        sample,
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
        execute = self._executor(stage, dataset)
        if stage.reward == "orchrm":
            reward = CheckedOrchRMReward(
                OrchRMReward(stage.orchrm or CHAMPION, self.pool, download_registered),
                execute,
                stage.fraction_executed,
                seed=self.recipe.seed,
            )
        else:
            reward = ExecutedPlanReward(execute)
        outcome = grpo_train(
            self.recipe, stage, self.pool, questions, self.current, reward, self.output_dir,
            self.run_id,
        )  # fmt: skip
        self.current = outcome.adapter_dir
        if isinstance(reward, CheckedOrchRMReward):
            checked = [s["executed_reward"] for s in reward.samples if s["executed"]]
            if warning := agreement_warning(stage.name, reward.checks):
                _logger().warning(warning)
            return StageReport(
                stage=stage.name,
                kind=stage.kind,
                questions=len(questions),
                sampled=outcome.rollouts,
                rollouts=len(checked),
                right=sum(1 for r in checked if r == 1.0),
                steps=outcome.steps,
                adapter=str(outcome.adapter_dir),
                orchrm_agreement=order_agreement(reward.checks),
            )
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


def _sampling_pool(pool: Pool, temperature: float, seed: int, hint: ConductorHint | None) -> Pool:
    sampled = pool.with_conductor_sampling(temperature, seed)
    return sampled.with_conductor_hint(hint) if hint else sampled


def training_pool(request: TrainConductorRequest) -> Pool:
    pool = load_pool(request.pool)
    conductor = pool.conductor.model_copy(update={"prompt": request.recipe.prompt})
    return pool.model_copy(update={"conductor": conductor})
