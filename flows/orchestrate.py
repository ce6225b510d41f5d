"""The ``orchestrate`` flow: question -> conductor plan -> dynamic DAG of step tasks -> artifacts.

Compilation (issue #2): one task run per step, named ``step-{i} {worker}``. A step's
upstream futures are its parameters, so it starts as soon as every step in its access list
has finished and independent steps overlap in the thread pool. A failed step's dependents
never run: Prefect leaves them not-ready and we record them as ``skipped``. The paper runs
steps in sequence; running them in parallel is our addition.

Recursion (paper §4): a step whose worker is of kind ``conductor`` is a ``conductor-step``
task run (``tasks/recursion.py``), a nested planning round, which either accepts the last
visible response (three empty lists) or runs its own plan at ``depth + 1`` as a
``conductor-round`` subflow (``conductor_round``, which ``execute`` hands to the task) and
returns that plan's answer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefect import flow, get_run_logger
from prefect.context import FlowRunContext
from prefect.futures import PrefectFuture, wait
from prefect.logging.loggers import flow_run_logger
from prefect.runtime import flow_run
from prefect.states import Failed, State
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote
from prefect_conductor.conductor.data.datasets import Example
from prefect_conductor.conductor.data.records import RunRecord, StepRecord
from prefect_conductor.conductor.data.verify import answer_key
from prefect_conductor.conductor.errors import ConductorError, PlanError
from prefect_conductor.conductor.home import artifacts_location
from prefect_conductor.conductor.plan.parse import parse_plan
from prefect_conductor.conductor.plan.requests import OrchestrateRequest, RunResult
from prefect_conductor.conductor.plan.strategies import (
    SELF_CONSISTENCY_TEMPERATURE,
    Strategy,
    majority_vote,
    parse_strategy,
    random_plan,
    random_plan_seed,
    self_consistency_plan,
)
from prefect_conductor.conductor.plan.workflow import Step, Workflow, plan_lines, step_line
from prefect_conductor.conductor.pool import Pool, load_pool
from prefect_conductor.conductor.providers.llm import Completion
from prefect_conductor.conductor.providers.tools import SANDBOXED_MODELS
from prefect_conductor.tasks.artifacts import (
    publish_answer,
    publish_plan,
    publish_steps,
    run_tables,
    save_run,
    store_root,
)
from prefect_conductor.tasks.assets import writing
from prefect_conductor.tasks.planning import write_plan
from prefect_conductor.tasks.questions import RunOutcome
from prefect_conductor.tasks.recursion import Execution, NestedRoundError, RunIds, conductor_step
from prefect_conductor.tasks.registry import with_conductor
from prefect_conductor.tasks.verify import verify_answer
from prefect_conductor.tasks.workers import StepOutcome, step_run_name, step_task_for

__all__ = ["conductor_round", "orchestrate", "run_unstored"]

# Enough threads for the widest layer we expect; I/O-bound worker calls mostly wait.
TASK_RUNNER_WORKERS = 64
ANSWER_LOG_LIMIT = 1000

#: The terminal's view of a run (issue #16): the plan, then one line per top-level step as
#: it finishes. Silent unless someone attaches a handler (``conductor run`` does); an eval's
#: questions and deployed runs say nothing here. The run's own log, in the Prefect API and
#: UI, is the flow-run logger's and has every line regardless.
PROGRESS = logging.getLogger("prefect_conductor.progress")
if PROGRESS.level == logging.NOTSET:  # ``conductor run`` may have set it up already
    PROGRESS.setLevel(logging.WARNING)
PROGRESS.propagate = False
PROGRESS.addHandler(logging.NullHandler())


@dataclass
class _Usage:
    """Run totals. The cost becomes unknown (``None``) as soon as one call's cost is."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = 0.0

    def add(self, inp: int | None, out: int | None, cost: float | None) -> None:
        self.input_tokens += inp or 0
        self.output_tokens += out or 0
        self.cost_usd = None if self.cost_usd is None or cost is None else self.cost_usd + cost


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _run_name() -> str:
    params = flow_run.parameters or {}
    req = params.get("request") or {}
    question = req.question if isinstance(req, OrchestrateRequest) else str(req.get("question", ""))
    words = " ".join(question.split())
    return (words[:60] + "…") if len(words) > 60 else (words or "orchestrate")


def _record(
    ids: RunIds, step: Step, model: str, depth: int, parent: int | None, **kw: Any
) -> StepRecord:
    return StepRecord(
        run_id=ids.run_id,
        question_id=ids.question_id,
        step=step.index,
        depth=depth,
        parent_step=parent,
        worker=step.worker,
        model=model,
        instruction=step.instruction,
        access=list(step.access),
        **kw,
    )


def execute(
    workflow: Workflow,
    pool: Pool,
    ids: RunIds,
    depth: int = 0,
    parent: int | None = None,
    while_running: Callable[[], None] | None = None,
) -> Execution:
    """Submit every step with its upstream futures, wait, and turn states into records.

    ``while_running`` (e.g. publishing the plan artifact) runs once every step is submitted,
    so bookkeeping overlaps the first steps instead of delaying them.
    """
    futures: dict[int, PrefectFuture[StepOutcome]] = {}
    step_tasks: dict[str, Any] = {}  # one configured task per worker
    for step in workflow.steps:
        visible = [futures[j] for j in step.access]
        instructions = [workflow.steps[j].instruction for j in step.access]
        worker = pool.worker(step.worker)
        if worker.kind == "conductor":
            submit = conductor_step.with_options(task_run_name=step_run_name(step, depth))
            futures[step.index] = submit.submit(
                quote(step),
                visible,
                instructions,
                quote(pool),
                quote(workflow),
                ids,
                depth,
                conductor_round,  # the nested plan's subflow: tasks/ import no flows/
            )
        else:
            if worker.name not in step_tasks:
                step_tasks[worker.name] = step_task_for(worker, depth)
            # quote(): Prefect need not walk the pool and the step looking for futures (only
            # ``visible`` holds any); walking a pool model costs ~0.5 ms per pass per step.
            futures[step.index] = step_tasks[worker.name].submit(
                ids.question, quote(step), visible, instructions, quote(pool)
            )
    if depth == 0 and PROGRESS.isEnabledFor(logging.INFO):
        for step in workflow.steps:
            futures[step.index].add_done_callback(_announce_step(step))
    if while_running is not None:
        while_running()
    wait(list(futures.values()))

    out = Execution()
    broken: dict[int, str] = {}  # step -> why its dependents are skipped
    for step in workflow.steps:
        model = pool.worker(step.worker).model or pool.conductor.model
        state = futures[step.index].state
        if state.is_completed():
            outcome: StepOutcome = futures[step.index].result()
            out.records.extend(outcome.children)
            out.records.append(
                _record(
                    ids, step, outcome.model, depth, parent, status="completed", **outcome.fields()
                )
            )
            continue
        upstream = next((j for j in step.access if j in broken), None)
        if state.is_failed() or upstream is None:
            exc = futures[step.index].result(raise_on_failure=False)
            if isinstance(exc, NestedRoundError):
                out.records.extend(exc.records)
            error = (
                _one_line(exc) if isinstance(exc, BaseException) else (state.message or state.name)
            )
            broken[step.index] = f"step {step.index} failed"
            out.reason = out.reason or f"step {step.index} ({step.worker}) failed: {error}"
            # A failed run of model-written code still records which sandbox it ran in.
            sandbox = pool.sandbox if model in SANDBOXED_MODELS else None
            out.records.append(
                _record(
                    ids, step, model, depth, parent, status="failed", error=error, sandbox=sandbox
                )
            )
        else:
            broken[step.index] = broken[upstream]
            out.records.append(
                _record(
                    ids,
                    step,
                    model,
                    depth,
                    parent,
                    status="skipped",
                    error=f"skipped: {broken[upstream]}",
                )
            )
    last = futures[workflow.final.index]
    if last.state.is_completed():
        out.answer = last.result().output
    return out


@flow(
    name="conductor-round",
    flow_run_name="nested plan (depth {depth})",
    task_runner=ThreadPoolTaskRunner(TASK_RUNNER_WORKERS),
)
def conductor_round(
    workflow: Workflow, pool: Pool, ids: RunIds, depth: int, parent: int
) -> Execution:
    """Run a nested plan (recursion) as a subflow."""
    return execute(workflow, pool, ids, depth, parent)


def _flow_logger() -> Any:
    """This flow run's logger, also when the flow runs inside a task (an eval's question, a
    served request), where ``get_run_logger`` would give the enclosing task run's."""
    ctx = FlowRunContext.get()
    if ctx is not None and ctx.flow_run is not None:
        return flow_run_logger(ctx.flow_run, ctx.flow)
    return get_run_logger()


def _log_plan(workflow: Workflow, format_error: str | None, log: Callable[[], Any]) -> None:
    text = "\n".join(plan_lines(workflow.steps, format_error))
    log().info(text)  # the run's log in the Prefect UI
    PROGRESS.info(text)


def _announce_step(step: Step) -> Callable[[PrefectFuture[StepOutcome]], None]:
    """A done-callback that says on ``PROGRESS`` how a top-level step ended, as it ends."""

    def done(future: PrefectFuture[StepOutcome]) -> None:
        try:
            value = future.result(raise_on_failure=False)
        except BaseException:  # noqa: BLE001 - a progress line must never break the run
            value = None
        if isinstance(value, StepOutcome):
            PROGRESS.info(step_line(step, "completed", value.output, value.latency_s))
        else:
            PROGRESS.info(
                step_line(step, "failed" if isinstance(value, BaseException) else "skipped")
            )

    return done


def _question_id(question: str) -> str:
    return hashlib.sha256(question.strip().encode()).hexdigest()[:16]


@dataclass
class _Plan:
    workflow: Workflow | None = None
    text: str | None = None
    format_error: str | None = None
    reason: str | None = None  # set when the run cannot go on


def _single_subtask(strategy: Strategy, request: OrchestrateRequest, pool: Pool) -> str:
    """The question itself, or the worker's own short ``subtask`` when the worker sees the
    shared question anyway (the python tool runs the question's fenced program)."""
    worker = next((w for w in pool.workers if w.name == strategy.worker), None)
    if worker is not None and worker.subtask and pool.share_question:
        return worker.subtask
    return request.question


def _make_plan(
    request: OrchestrateRequest, pool: Pool, strategy: Strategy, ids: RunIds, usage: _Usage
) -> _Plan:
    """The plan for this run: written by the conductor, or built by a baseline strategy."""
    if strategy.kind == "single":
        return _Plan(
            Workflow.single_step(strategy.worker or "", _single_subtask(strategy, request, pool))
        )
    if strategy.kind == "self-consistency":
        return _Plan(
            self_consistency_plan(strategy.worker or "", request.question, strategy.samples)
        )
    if strategy.kind == "random-plan":
        seed = random_plan_seed(ids.question_id, request.seed)
        return _Plan(random_plan(pool, seed, request.question, ids.max_steps))
    if strategy.best_of and request.plan_text is None:
        raise ConductorError(f"{strategy} runs through the best-of-n flow, not orchestrate")
    if request.plan_text is not None:  # written elsewhere (a GRPO rollout): only run it
        plan = Completion(
            text=request.plan_text,
            model=request.plan_source or "external",
            input_tokens=0,
            output_tokens=0,
            cost_usd=0.0,
            latency_s=0.0,
        )
    else:
        plan = write_plan(request.question, pool, ids.max_steps)
    usage.add(plan.input_tokens, plan.output_tokens, plan.cost_usd)
    try:
        workflow = parse_plan(
            plan.text, pool, max_steps=ids.max_steps, allow_conductor=pool.conductor.max_depth > 0
        )
        return _Plan(workflow, plan.text)
    except PlanError as exc:
        if request.on_invalid_plan == "error":
            return _Plan(None, plan.text, str(exc), reason=f"invalid plan: {exc}")
        return _Plan(Workflow.single_step(pool.default.name, request.question), plan.text, str(exc))


def _answer(execution: Execution, strategy: Strategy, kind: str) -> str | None:
    if strategy.kind != "self-consistency" or execution.reason is not None:
        return execution.answer
    outputs = [
        r.output or "" for r in execution.records if r.depth == 0 and r.status == "completed"
    ]
    return majority_vote(outputs, lambda text: answer_key(kind, text))


def _log_answer(result: RunResult, log: Callable[[], Any]) -> None:
    """One ``answer: …`` line (whitespace collapsed, cut at ``ANSWER_LOG_LIMIT``), plus the
    verdict or the reason; the full answer is the run's result and its artifact."""
    answer = " ".join((result.answer or "").split()) or "(none)"
    if len(answer) > ANSWER_LOG_LIMIT:
        answer = answer[:ANSWER_LOG_LIMIT] + "…"
    extra = ""
    if result.correct is not None:
        extra = f" ({'correct' if result.correct else 'wrong'}, reward {result.reward})"
    if result.reason is not None:
        extra += f" (failed: {result.reason})"
    log().info(f"answer: {answer}{extra}")


@dataclass
class _Done:
    run: RunRecord
    records: list[StepRecord]
    plan: _Plan
    execution: Execution
    started: float


def _run_request(
    request: OrchestrateRequest, run_id: str, log: Callable[[], Any], publish: bool
) -> _Done:
    """Plan, execute and verify one question; the run record is built but not stored.

    ``publish``: the plan's Markdown artifact while the first steps run (a single run's view;
    an eval shows one table of all its runs instead). ``log`` gives the logger of the run's
    own lines (the plan, the answer)."""
    started = time.perf_counter()
    pool = load_pool(request.pool)
    if request.conductor:
        pool = with_conductor(pool, request.conductor)
    if request.conductor_temperature is not None:
        pool = pool.with_conductor_sampling(request.conductor_temperature, request.seed)
    if request.conductor_hint:
        pool = pool.with_conductor_hint(request.conductor_hint)
    strategy = parse_strategy(request.strategy, pool)
    if strategy.kind == "self-consistency":
        pool = pool.with_sampling(strategy.worker or "", SELF_CONSISTENCY_TEMPERATURE)
    ids = RunIds(
        run_id=run_id,
        question_id=request.question_id or _question_id(request.question),
        question=request.question,
        max_steps=request.max_steps or pool.max_steps,
    )
    usage = _Usage()
    plan = _Plan()
    execution = Execution()
    try:
        plan = _make_plan(request, pool, strategy, ids, usage)
        execution.reason = plan.reason
        if plan.workflow is not None:
            workflow, format_error = plan.workflow, plan.format_error
            _log_plan(workflow, format_error, log)
            execution = execute(
                workflow,
                pool,
                ids,
                while_running=(
                    (lambda: publish_plan(workflow, request.question, format_error))
                    if publish
                    else None
                ),
            )
    except ConductorError as exc:
        execution.reason = execution.reason or _one_line(exc)

    for r in execution.records:
        if r.status == "completed":
            usage.add(r.input_tokens, r.output_tokens, r.cost_usd)
    answer = _answer(execution, strategy, request.kind)
    format_valid = plan.format_error is None and (
        plan.text is not None or not strategy.uses_conductor
    )
    correct = reward = None
    if request.reference is not None and execution.reason is None:
        example = Example(
            id=ids.question_id,
            question=request.question,
            reference=request.reference,
            kind=request.kind,
            meta=request.meta,
        )
        verdict = verify_answer(example, answer, format_valid)
        correct, reward = verdict.correct, verdict.reward
    elif request.reference is not None:
        correct, reward = False, 0.0 if not format_valid else 0.5
    status = "completed" if execution.reason is None else "failed"
    run = RunRecord(
        run_id=ids.run_id,
        question_id=ids.question_id,
        question=request.question,
        reference=request.reference,
        conductor_model=(
            (request.plan_source or pool.conductor.model)
            if strategy.uses_conductor
            else f"({strategy})"
        ),
        conductor_output=plan.text,
        workflow_json=json.dumps(plan.workflow.to_lists()) if plan.workflow else None,
        format_valid=format_valid,
        format_error=plan.format_error,
        answer=answer,
        correct=correct,
        reward=reward,
        status=status,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cost_usd=usage.cost_usd,
        wall_s=time.perf_counter() - started,
        tags={**request.tags, "strategy": str(strategy)},
        reason=execution.reason,
    )
    return _Done(run, execution.records, plan, execution, started)


def _run_result(done: _Done, root: str) -> RunResult:
    run, plan = done.run, done.plan
    return RunResult(
        run_id=run.run_id,
        status=run.status,
        answer=run.answer,
        workflow=[s.model_dump(mode="json") for s in plan.workflow.steps] if plan.workflow else [],
        input_tokens=run.input_tokens,
        output_tokens=run.output_tokens,
        cost_usd=run.cost_usd,
        wall_s=round(time.perf_counter() - done.started, 3),
        artifacts=root,
        format_valid=run.format_valid,
        format_error=plan.format_error,
        reason=done.execution.reason,
        correct=run.correct,
        reward=run.reward,
        question_id=run.question_id,
        step_outputs=[
            (r.status, r.output if r.status == "completed" else r.error)
            for r in sorted(done.records, key=lambda r: r.step)
            if r.depth == 0
        ],
    )


def run_unstored(request: OrchestrateRequest, run_id: str) -> RunOutcome:
    """One question as part of a larger run (an eval's question task): the same plan, step
    task runs, verification and records as ``orchestrate``, in the calling task run, with no
    flow run, no per-run artifacts and nothing stored; the caller stores ``steps`` and ``run``
    (``tasks.artifacts.RunBatch``). ``result.artifacts`` is the store the caller writes to."""
    done = _run_request(request, run_id, get_run_logger, publish=False)
    result = _run_result(done, store_root(request.artifacts or artifacts_location()))
    _log_answer(result, get_run_logger)
    return RunOutcome(result, done.run, done.records)


# The result is persisted (JSON, readable as a file too) so the UI and API show the answer.
@flow(
    name="orchestrate",
    flow_run_name=_run_name,
    task_runner=ThreadPoolTaskRunner(TASK_RUNNER_WORKERS),
    log_prints=False,
    persist_result=True,
    result_serializer="json",
)
def orchestrate(request: OrchestrateRequest) -> RunResult | State:
    """Answer one question with a conductor-written plan; store every step as an artifact."""
    run_id = str(flow_run.id or hashlib.sha256(str(time.time_ns()).encode()).hexdigest()[:32])
    done = _run_request(request, run_id, _flow_logger, publish=True)
    # Storing the rows and publishing the UI table overlap: both are I/O after the last step.
    root = request.artifacts or artifacts_location()
    saved = writing(save_run, run_tables(root)).submit(done.run, done.records, root)
    if done.records:
        publish_steps(done.records)
    result = _run_result(done, saved.result())
    publish_answer(result)
    _log_answer(result, _flow_logger)
    if result.reason is not None:
        return Failed(message=result.reason, data=result)
    return result
