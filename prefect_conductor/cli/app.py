"""``conductor``: the command line. A thin layer over the flows and the core.

Exit codes: 0 success; 1 the run failed (one-line reason on stderr); 2 bad input (pool file,
plan, arguments). User errors never print a traceback.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Annotated, Any, Optional

import typer

from prefect_conductor.cli.common import (
    ConductorOpt,
    FanOutOpt,
    JsonOpt,
    PoolOpt,
    RmOpt,
    VerboseOpt,
    build_request,
    call_flow,
    call_long_flow,
    check_fan_out,
    check_rm,
    fail,
    load_pool_option,
)
from prefect_conductor.cli.help import ConductorCommand, ConductorGroup
from prefect_conductor.cli.train import (
    improve_cmd,
    recipes_cmd,
    train_conductor_cmd,
    train_rm_cmd,
)
from prefect_conductor.conductor.errors import ConductorError, PlanError
from prefect_conductor.conductor.question import check_question
from prefect_conductor.conductor.terminal import TerminalFormatter, for_terminal
from prefect_conductor.runtime.quiet import (
    hide_deprecation_warnings,
    offline_defaults,
    progress_bars_off,
    quiet_third_party_notices,
    silence_stderr_at_exit,
)

app = typer.Typer(
    cls=ConductorGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Learned LLM orchestration on Prefect: a conductor plans, workers run the steps.",
)
artifacts_app = typer.Typer(
    cls=ConductorGroup,
    help="Inspect and maintain the Parquet artifact store.",
    invoke_without_command=True,
)
app.add_typer(artifacts_app, name="artifacts")


def _print_plan(workflow: Any, pool: Any, stream: Any = None) -> None:
    out = stream or sys.stdout
    for s in workflow.steps:
        reads = ", ".join(map(str, s.access)) or "-"
        line = f"  step {s.index} · {s.worker:<12} reads [{reads}]  {s.instruction}"
        print(for_terminal(line), file=out)


@app.command(cls=ConductorCommand)
def run(
    question: Annotated[str, typer.Argument(help="The question to answer.")],
    pool: PoolOpt = None,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = False,
    on_invalid_plan: Annotated[
        str, typer.Option(help="fallback: one step on the default worker; error: fail the run.")
    ] = "fallback",
    max_steps: Annotated[Optional[int], typer.Option(help="Override the pool's max_steps.")] = None,  # noqa: UP045
    conductor: ConductorOpt = None,
    strategy: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="As `conductor eval`'s: conductor, single:WORKER, random-plan, "
            "self-consistency:WORKER:K, best-of-n:N, best-of-n-plan:N. Default: conductor."
        ),
    ] = None,
    best_of: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option("--best-of", help="Propose N plans and let OrchRM pick one (best-of-N)."),
    ] = None,
    plan_only: Annotated[
        bool,
        typer.Option("--plan-only", help="With --best-of: score plans before running; run one."),
    ] = False,
    proposer: Annotated[
        str, typer.Option(help="With --best-of: who proposes, conductor or random-plan.")
    ] = "conductor",
    rm: RmOpt = None,
    seed: Annotated[int, typer.Option(help="Seed of proposals and random plans.")] = 0,
    in_process: Annotated[
        bool, typer.Option("--in-process", help="Run here even if `conductor serve` is running.")
    ] = False,
) -> None:
    """Plan QUESTION with the conductor and run the plan as a Prefect flow."""
    from prefect_conductor.conductor.plan.requests import OrchestrateRequest
    from prefect_conductor.conductor.plan.strategies import parse_strategy

    # Fail fast on a blank question, a bad pool or adapter, before Prefect starts.
    check_question(question)
    p = load_pool_option(pool, conductor)
    if best_of is not None and strategy is not None:
        fail("--best-of N is a strategy: give --best-of or --strategy, not both")
    if best_of is not None:
        strategy = f"best-of-n{'-plan' if plan_only else ''}:{best_of}:{proposer}"
    elif plan_only:
        fail("--plan-only goes with --best-of N")
    strategy = strategy or "conductor"
    try:
        parsed = parse_strategy(strategy, p)
    except ConductorError as exc:
        fail(f"--strategy: {exc}")
    check_rm(parsed, rm)
    request = build_request(
        OrchestrateRequest,
        question=question,
        pool=str(pool) if pool else None,
        on_invalid_plan=on_invalid_plan,  # type: ignore[arg-type]
        max_steps=max_steps,
        conductor=conductor,
        strategy=strategy,
        rm=rm,
        seed=seed,
    )
    _show_progress()
    state, result = _run_request(request, parsed.best_of, in_process)
    from prefect_conductor.conductor.plan.requests import RunResult

    if not isinstance(result, RunResult):
        # The flow itself crashed (bad pool at run time, store unwritable, ...).
        message = (
            str(result).strip().splitlines()[0]
            if isinstance(result, BaseException)
            else state.message
        )
        fail(message or "the run crashed", code=1)
    if as_json:
        print(
            json.dumps(
                result.model_dump(mode="json", exclude={"format_error", "format_valid", "reason"})
                | {
                    "format_valid": result.format_valid,
                    "format_error": result.format_error,
                    "reason": result.reason,
                }
            )
        )
    else:
        if result.selection:
            s = result.selection
            scores = ", ".join(f"{x:.2f}" for x in s["scores"])
            print(
                f"OrchRM picked candidate {s['chosen']} of {len(s['scores'])} "
                f"(scores {scores}; {s['executed']} run)",
                file=sys.stderr,
            )
        if result.status == "completed":
            print(f"answer: {for_terminal(str(result.answer), multiline=True)}")
        print(
            f"tokens: {result.input_tokens} in / {result.output_tokens} out · "
            f"cost: {'n/a' if result.cost_usd is None else f'${result.cost_usd:.6f}'} · "
            f"flow {result.wall_s:.1f}s · command {time.monotonic() - _STARTED:.1f}s · "
            f"run {result.run_id}",
            file=sys.stderr,
        )
    if result.status != "completed":
        fail(result.reason or "the run failed", code=1)


def _show_progress() -> None:
    """The run's progress on stderr: the plan, then each top-level step as it finishes
    (``flows.orchestrate.PROGRESS``; set up here so that only ``conductor run`` says it)."""
    progress = logging.getLogger("prefect_conductor.progress")
    if not any(getattr(h, "_conductor_progress", False) for h in progress.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(TerminalFormatter("%(message)s"))  # model and tool text
        handler._conductor_progress = True  # type: ignore[attr-defined]
        progress.addHandler(handler)
    progress.setLevel(logging.INFO)
    progress.propagate = False


def _print_served_progress(result: Any) -> None:
    """What the in-process run says as it goes, said once the served run is back."""
    from prefect_conductor.conductor.plan.workflow import Step, plan_lines, step_line

    steps = [Step(**s) for s in result.workflow]
    lines = plan_lines(steps, result.format_error)
    outputs = result.step_outputs or []
    pairs = zip(steps, outputs, strict=False)  # a plan cut short has fewer outputs
    lines += [step_line(s, status, text) for s, (status, text) in pairs]
    print(for_terminal("\n".join(lines), multiline=True), file=sys.stderr)


def _run_request(request: Any, best_of: bool, in_process: bool) -> tuple[Any, Any]:
    """Through a running ``conductor serve`` when there is one (warm models, no imports of
    litellm or torch here), else the flow in this process."""
    if not in_process:
        from prefect_conductor.fleet.serve import find_served, submit

        served = find_served()
        if served is not None:
            print(f"conductor: via conductor serve (pid {served.pid})", file=sys.stderr)
            result = submit(request, served, best_of=best_of)
            silence_stderr_at_exit()
            if getattr(result, "workflow", None):
                _print_served_progress(result)
            return None, result
    return call_flow(_run_flow(best_of), request)


@app.command(cls=ConductorCommand)
def serve(
    pool: PoolOpt = None,
    conductor: ConductorOpt = None,
    limit: Annotated[int, typer.Option(help="Requests served at once.")] = 4,
    verbose: VerboseOpt = False,
) -> None:
    """Keep the engine and the pool's local models loaded; `conductor run` uses this process.

    Needs PREFECT_API_URL (a running `prefect server start`). Stop with Ctrl-C."""
    from prefect_conductor.fleet.fanout import worker_storage_gap
    from prefect_conductor.fleet.serve import marker_path
    from prefect_conductor.fleet.serve import serve as serve_forever

    p = load_pool_option(pool, conductor)

    def ready(warmed: list[str], seconds: float) -> None:
        models = ", ".join(warmed) or "no local model"
        print(
            f"conductor serve: ready in {seconds:.1f} s ({models} loaded); "
            f"`conductor run` with CONDUCTOR_HOME={marker_path().parent} and this "
            "PREFECT_API_URL now runs here. Ctrl-C stops.",
            file=sys.stderr,
            flush=True,
        )
        if gap := worker_storage_gap():
            print(f"conductor serve: warning: {gap}", file=sys.stderr, flush=True)

    serve_forever(p, limit=limit, on_ready=ready)


def _run_flow(best_of: bool) -> Any:
    """The flow of ``run``: OrchRM's modules load only for best-of-N (cold start, issue #10).
    Importing a flow imports Prefect, which sets up its log handlers."""
    if best_of:
        from prefect_conductor.flows.best_of_n import best_of_n

        return best_of_n
    from prefect_conductor.flows.orchestrate import orchestrate

    return orchestrate


@app.command("eval", cls=ConductorCommand)
def eval_(
    dataset: Annotated[
        str, typer.Option(help="arithmetic, mixed, humaneval, or a JSONL/Parquet/CSV file.")
    ],
    split: Annotated[str, typer.Option(help="Dataset split.")] = "test",
    limit: Annotated[Optional[int], typer.Option(help="First N questions only.")] = None,  # noqa: UP045
    strategy: Annotated[
        str,
        typer.Option(
            help="conductor | single:WORKER | self-consistency:WORKER:K | random-plan | "
            "best-of-n:N[:PROPOSER] | best-of-n-plan:N[:PROPOSER]"
        ),
    ] = "conductor",
    concurrency: Annotated[int, typer.Option(help="Questions run at once.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of generated data and random plans.")] = 0,
    samples: Annotated[
        int,
        typer.Option(
            help="Runs per question (OrchRM's pairs need several): seed + k for random plans, "
            "temperature 1.0 for a conductor."
        ),
    ] = 1,
    pool: PoolOpt = None,
    conductor: ConductorOpt = None,
    rm: RmOpt = None,
    fan_out: FanOutOpt = False,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Evaluate a strategy on a dataset; every question is a run, the eval an MLflow run."""
    from prefect_conductor.conductor.data.datasets import load_dataset
    from prefect_conductor.conductor.plan.requests import EvalRequest
    from prefect_conductor.conductor.plan.strategies import parse_strategy

    p = load_pool_option(pool, conductor)
    check_rm(parse_strategy(strategy, p), rm)
    # A bad dataset fails before Prefect starts; a bad question fails alone, in the eval.
    load_dataset(dataset, split=split, limit=limit, seed=seed, bad_questions="keep")
    check_fan_out(fan_out)
    request = build_request(
        EvalRequest,
        dataset=dataset,
        split=split,
        limit=limit,
        strategy=strategy,
        concurrency=concurrency,
        samples=samples,
        pool=str(pool) if pool else None,
        seed=seed,
        conductor=conductor,
        rm=rm,
        fan_out=fan_out,
    )
    from prefect_conductor.conductor.plan.requests import EvalResult
    from prefect_conductor.flows.evaluate import evaluate

    # Per-question flow logs would bury the progress bar; warnings and errors still show.
    result = call_long_flow(evaluate, request, EvalResult, "the eval")
    if as_json:
        print(result.model_dump_json())
        return
    cost = "n/a" if result.mean_cost_usd is None else f"${result.mean_cost_usd:.6f}"
    fvr = "-" if result.format_valid_rate is None else f"{result.format_valid_rate:.1%}"
    header = (
        "strategy",
        "n",
        "accuracy",
        "in tok/q",
        "out tok/q",
        "cost/q",
        "valid plans",
        "flow s",
    )
    row = (
        result.strategy,
        result.n,
        f"{result.accuracy:.1%}",
        f"{result.mean_input_tokens:.1f}",
        f"{result.mean_output_tokens:.1f}",
        cost,
        fvr,
        f"{result.wall_s:.1f}",
    )
    for cells in (header, row):
        shown = [for_terminal(str(c)) for c in cells]
        print(f"{shown[0]:<28}" + "".join(f"{c:>12}" for c in shown[1:]))
    if result.selection:
        print(
            "same candidates: "
            + " · ".join(
                f"{k.removesuffix('_accuracy').replace('_', ' ')} {v:.1%}"
                for k, v in result.selection.items()
            )
        )
    if result.pass_at_k is not None:
        print(
            f"{result.questions} questions x {result.samples} samples · "
            f"pass@{result.samples}: {result.pass_at_k:.1%}"
        )
    print(
        f"MLflow: experiment {result.mlflow_experiment!r}, run {result.mlflow_run_id}",
        file=sys.stderr,
    )


@app.command(cls=ConductorCommand)
def plan(
    question: Annotated[str, typer.Argument(help="The question to plan for.")],
    pool: PoolOpt = None,
    as_json: JsonOpt = False,
    max_steps: Annotated[Optional[int], typer.Option(help="Override the pool's max_steps.")] = None,  # noqa: UP045
    conductor: ConductorOpt = None,
) -> None:
    """Ask the conductor for a plan and print it, validated, without running it."""
    from prefect_conductor.conductor.plan.parse import parse_plan
    from prefect_conductor.conductor.plan.policy import LiteLLMPolicy

    check_question(question)  # before the conductor is asked
    p = load_pool_option(pool, conductor)
    from prefect_conductor.tasks.secrets import prefect_secrets

    with prefect_secrets():
        completion = LiteLLMPolicy(max_steps).write_plan(question, p)
    try:
        workflow = parse_plan(completion.text, p, max_steps=max_steps)
    except PlanError as exc:
        typer.echo(f"conductor output:\n{for_terminal(completion.text, multiline=True)}", err=True)
        fail(f"invalid plan: {exc}")
    if as_json:
        print(json.dumps({"steps": [s.model_dump(mode="json") for s in workflow.steps]}))
    else:
        _print_plan(workflow, p)


@app.command(cls=ConductorCommand)
def validate(
    file: Annotated[str, typer.Argument(help="Raw conductor output; '-' reads stdin.")],
    pool: PoolOpt = None,
    max_steps: Annotated[Optional[int], typer.Option(help="Override the pool's max_steps.")] = None,  # noqa: UP045
) -> None:
    """Parse and validate a raw conductor output; print the plan as JSON."""
    from prefect_conductor.conductor.plan.parse import MAX_PLAN_TEXT_CHARS, parse_plan

    try:
        if file == "-":
            text = sys.stdin.read(MAX_PLAN_TEXT_CHARS + 1)
        else:
            with open(file, encoding="utf-8", errors="replace") as fh:
                text = fh.read(MAX_PLAN_TEXT_CHARS + 1)
    except OSError as exc:
        fail(f"{file}: {exc.strerror or exc}")
    workflow = parse_plan(text, load_pool_option(pool), max_steps=max_steps)
    print(json.dumps({"steps": [s.model_dump(mode="json") for s in workflow.steps]}))


# The training commands live in prefect_conductor/cli/train.py.
app.command("train-conductor", cls=ConductorCommand)(train_conductor_cmd)
app.command("train-rm", cls=ConductorCommand)(train_rm_cmd)
app.command("recipes", cls=ConductorCommand)(recipes_cmd)
app.command("improve", cls=ConductorCommand)(improve_cmd)


@artifacts_app.callback()
def artifacts(
    ctx: typer.Context,
    path: Annotated[bool, typer.Option("--path", help="Print the dataset location only.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Summarise the store: runs, steps, failures, tokens, cost."""
    if ctx.invoked_subcommand is not None:
        return
    from prefect_conductor.conductor.data.store import ArtifactStore

    store = ArtifactStore()
    if path:
        print(store.root)
        return
    s = store.summary()
    data = {
        "location": store.root,
        "runs": s.runs,
        "failed_runs": s.failed_runs,
        "steps": s.steps,
        "failed_steps": s.failed_steps,
        "skipped_steps": s.skipped_steps,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        "cost_usd": s.cost_usd,
        "files": s.files,
    }
    if as_json:
        print(json.dumps(data))
        return
    cost = "n/a" if s.cost_usd is None else f"${s.cost_usd:.6f}"
    lines = {
        "location": store.root,
        "runs": f"{s.runs:,} ({s.failed_runs:,} failed)",
        "steps": f"{s.steps:,} ({s.failed_steps:,} failed, {s.skipped_steps:,} skipped)",
        "tokens": f"{s.input_tokens:,} in / {s.output_tokens:,} out",
        "cost": cost,
        "files": ", ".join(f"{n:,} {table}" for table, n in s.files.items()) or "none",
    }
    width = max(map(len, lines)) + 2
    for key, value in lines.items():
        print(f"{key + ':':<{width}}{value}")


@artifacts_app.command(cls=ConductorCommand)
def compact(as_json: JsonOpt = False) -> None:
    """Merge the small Parquet files of each table into one (safe for concurrent readers)."""
    from prefect_conductor.conductor.data.store import ArtifactStore

    result = ArtifactStore().compact()
    if as_json:
        print(json.dumps(_jsonable(result)))
        return
    for table, before in result.files_before.items():
        after = result.files_after.get(table, before)
        note = " (skipped: another compaction holds the lock)" if table in result.busy else ""
        print(
            f"{table:<6} {before} files -> {after} ({result.rows.get(table, 0)} rows merged){note}"
        )


def _jsonable(obj: Any) -> Any:
    from dataclasses import asdict, is_dataclass

    return asdict(obj) if is_dataclass(obj) else obj


# The command's own clock, for the totals line: the flow's wall time leaves out the server's
# start and the imports, which a user waited for too (issue #39).
_STARTED = time.monotonic()


def main() -> None:
    """Entry point: one line on stderr for every error of ours, never a traceback."""
    global _STARTED
    _STARTED = time.monotonic()
    # Before Prefect, MLflow or Hugging Face is imported: nothing may phone home from an
    # offline machine (the temporary server's generous start-up wait:
    # prefect_conductor.runtime.server).
    offline_defaults()
    quiet_third_party_notices()
    hide_deprecation_warnings()
    if not sys.stderr.isatty():
        progress_bars_off()
    logging.captureWarnings(True)
    ours = logging.getLogger("prefect_conductor")
    if not ours.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(TerminalFormatter("conductor: %(message)s"))
        ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = False  # Prefect's root console handler would print it twice
    from prefect_conductor.conductor.home import legacy_home_notice

    notice = legacy_home_notice()
    if notice:
        print(notice, file=sys.stderr)
    try:
        app(standalone_mode=True)
    except ConductorError as exc:
        typer.echo(f"error: {for_terminal(str(exc), multiline=True)}", err=True)
        sys.exit(2 if not isinstance(exc, _runtime_errors()) else 1)


def _runtime_errors() -> tuple[type[BaseException], ...]:
    from prefect_conductor.conductor.errors import StoreError, WorkerError
    from prefect_conductor.fleet.serve import ServeError
    from prefect_conductor.runtime.server import TemporaryServerError

    return (WorkerError, StoreError, ServeError, TemporaryServerError)


if __name__ == "__main__":
    main()
