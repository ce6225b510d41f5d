"""``conductor``: the command line. A thin layer over the flows and the core.

Exit codes: 0 success; 1 the run failed (one-line reason on stderr); 2 bad input (pool file,
plan, arguments). User errors never print a traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from conductor.errors import ConductorError, PlanError
from flows.cli_help import ConductorCommand, ConductorGroup
from flows.quiet import (
    hide_deprecation_warnings,
    progress_bars_off,
    quiet_prefect_shutdown,
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

PoolOpt = Annotated[
    Optional[Path],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option("--pool", "-p", help="Pool YAML file (default: the embedded local pool)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
ConductorOpt = Annotated[
    Optional[str],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option(
        "--conductor",
        "-c",
        metavar="REF",
        help="A trained conductor instead of the pool's: an adapter directory, "
        "models:/conductor@champion, or embedded.",
    ),
]


RmOpt = Annotated[
    Optional[str],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option(
        "--rm",
        metavar="REF",
        help="OrchRM of best-of-n: a directory or models:/orchrm@champion (default).",
    ),
]


def _check_rm(strategy: Any, rm: str | None) -> None:
    """Best-of-n needs a reward model: load it now, so a missing one fails in one line."""
    if strategy.best_of:
        from flows.best_of_n import DEFAULT_RM
        from reward_model.model import load_reward_model

        load_reward_model(rm or DEFAULT_RM)


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _request(model: Any, **fields: Any) -> Any:
    """The flow's request model, or one line naming the bad field (exit 2)."""
    from pydantic import ValidationError

    try:
        return model(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        _fail(f"{'.'.join(map(str, err['loc']))}: {err['msg'].removeprefix('Value error, ')}")


def _call_long_flow(flow: Any, request: Any, result_type: type, what: str) -> Any:
    """A long flow (eval, training): per-task logs off, stdout kept for the result."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # The trainers print their log lines and progress on stdout; stdout is for the result.
    with contextlib.redirect_stdout(sys.stderr):
        _, result = _call_flow(flow, request)
    if not isinstance(result, result_type):
        _fail(str(result).strip().splitlines()[0] if result else f"{what} crashed", code=1)
    return result


def _call_flow(flow: Any, request: Any) -> tuple[Any, Any]:
    """Run a flow in this process; returns its final state and its result (or exception)."""
    from flows.runtime import local_run_settings, wait_until_recorded

    with quiet_prefect_shutdown(), local_run_settings():
        state = flow(request, return_state=True)
        result = state.result(raise_on_failure=False)
        wait_until_recorded(state.state_details.flow_run_id)
    # Everything the user needs is printed after this; Prefect's shutdown output is not.
    silence_stderr_at_exit()
    return state, result


def _load_pool(pool: Path | None, conductor: str | None = None):
    from conductor.pool import load_pool

    loaded = load_pool(pool)
    if conductor:
        from conductor.adapters import with_conductor

        loaded = with_conductor(loaded, conductor)
    return loaded


def _print_plan(workflow: Any, pool: Any, stream: Any = None) -> None:
    out = stream or sys.stdout
    for s in workflow.steps:
        reads = ", ".join(map(str, s.access)) or "-"
        print(f"  step {s.index} · {s.worker:<12} reads [{reads}]  {s.instruction}", file=out)


@app.command(cls=ConductorCommand)
def run(
    question: Annotated[str, typer.Argument(help="The question to answer.")],
    pool: PoolOpt = None,
    as_json: JsonOpt = False,
    on_invalid_plan: Annotated[
        str, typer.Option(help="fallback: one step on the default worker; error: fail the run.")
    ] = "fallback",
    max_steps: Annotated[Optional[int], typer.Option(help="Override the pool's max_steps.")] = None,  # noqa: UP045
    conductor: ConductorOpt = None,
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
) -> None:
    """Plan QUESTION with the conductor and run the plan as a Prefect flow."""
    from conductor.requests import OrchestrateRequest
    from conductor.strategies import parse_strategy

    p = _load_pool(pool, conductor)  # fail fast on a bad pool or adapter, before Prefect starts
    strategy = "conductor"
    if best_of is not None:
        strategy = f"best-of-n{'-plan' if plan_only else ''}:{best_of}:{proposer}"
    elif plan_only:
        _fail("--plan-only goes with --best-of N")
    _check_rm(parse_strategy(strategy, p), rm)
    request = _request(
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
    state, result = _call_flow(_run_flow(best_of is not None), request)
    from conductor.requests import RunResult

    if not isinstance(result, RunResult):
        # The flow itself crashed (bad pool at run time, store unwritable, ...).
        message = (
            str(result).strip().splitlines()[0]
            if isinstance(result, BaseException)
            else state.message
        )
        _fail(message or "the run crashed", code=1)
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
            print(f"answer: {result.answer}")
        print(
            f"tokens: {result.input_tokens} in / {result.output_tokens} out · "
            f"cost: {'n/a' if result.cost_usd is None else f'${result.cost_usd:.6f}'} · "
            f"{result.wall_s:.1f}s · run {result.run_id}",
            file=sys.stderr,
        )
    if result.status != "completed":
        _fail(result.reason or "the run failed", code=1)


def _run_flow(best_of: bool) -> Any:
    """The flow of ``run``: OrchRM's modules load only for best-of-N (cold start, issue #10).
    Importing a flow imports Prefect, which sets up its log handlers."""
    if best_of:
        from flows.best_of_n import best_of_n

        return best_of_n
    from flows.orchestrate import orchestrate

    return orchestrate


@app.command("eval", cls=ConductorCommand)
def eval_(
    dataset: Annotated[
        str, typer.Option(help="arithmetic, humaneval, or a JSONL/Parquet/CSV file.")
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
    as_json: JsonOpt = False,
) -> None:
    """Evaluate a strategy on a dataset; every question is a run, the eval an MLflow run."""
    from conductor.datasets import load_dataset
    from conductor.requests import EvalRequest
    from conductor.strategies import parse_strategy

    p = _load_pool(pool, conductor)
    _check_rm(parse_strategy(strategy, p), rm)
    load_dataset(dataset, split=split, limit=limit, seed=seed)  # bad dataset: fail before Prefect
    request = _request(
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
    )
    from conductor.requests import EvalResult
    from flows.evaluate import evaluate

    # Per-question flow logs would bury the progress bar; warnings and errors still show.
    result = _call_long_flow(evaluate, request, EvalResult, "the eval")
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
        "wall s",
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
        print(f"{cells[0]:<28}" + "".join(f"{c!s:>12}" for c in cells[1:]))
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
    from conductor.plan import parse_plan
    from conductor.policy import LiteLLMPolicy

    p = _load_pool(pool, conductor)
    completion = LiteLLMPolicy(max_steps).write_plan(question, p)
    try:
        workflow = parse_plan(completion.text, p, max_steps=max_steps)
    except PlanError as exc:
        typer.echo(f"conductor output:\n{completion.text}", err=True)
        _fail(f"invalid plan: {exc}")
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
    from conductor.plan import MAX_PLAN_TEXT_CHARS, parse_plan

    try:
        if file == "-":
            text = sys.stdin.read(MAX_PLAN_TEXT_CHARS + 1)
        else:
            with open(file, encoding="utf-8", errors="replace") as fh:
                text = fh.read(MAX_PLAN_TEXT_CHARS + 1)
    except OSError as exc:
        _fail(f"{file}: {exc.strerror or exc}")
    workflow = parse_plan(text, _load_pool(pool), max_steps=max_steps)
    print(json.dumps({"steps": [s.model_dump(mode="json") for s in workflow.steps]}))


@app.command("train-conductor", cls=ConductorCommand)
def train_conductor_cmd(
    dataset: Annotated[
        str, typer.Option(help="Training questions: arithmetic, or a JSONL/Parquet/CSV file.")
    ] = "arithmetic",
    max_steps: Annotated[int, typer.Option(help="GRPO steps.")] = 8,
    num_generations: Annotated[int, typer.Option(help="Rollouts per question (G).")] = 4,
    batch_size: Annotated[int, typer.Option(help="Rollouts per GRPO step.")] = 4,
    max_completion_length: Annotated[int, typer.Option(help="Plan tokens at most.")] = 128,
    learning_rate: Annotated[float, typer.Option(help="GRPO learning rate.")] = 5e-5,
    loss_type: Annotated[str, typer.Option(help="TRL loss_type.")] = "grpo",
    base: Annotated[
        str, typer.Option(help="Base model: smollm2-135m-instruct or an HF model directory.")
    ] = "smollm2-135m-instruct",
    init_adapter: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Continue from a conductor (adapter directory or models:/…)."),
    ] = None,
    warm_start: Annotated[
        bool,
        typer.Option("--warm-start", help="SFT on verified-correct runs of the store first."),
    ] = False,
    warm_start_epochs: Annotated[float, typer.Option(help="Warm-start epochs.")] = 1.5,
    limit: Annotated[Optional[int], typer.Option(help="First N training questions.")] = None,  # noqa: UP045
    eval_limit: Annotated[int, typer.Option(help="Held-out questions, before and after.")] = 200,
    no_eval_before: Annotated[
        bool, typer.Option("--no-eval-before", help="Skip evaluating the starting conductor.")
    ] = False,
    orchrm_weight: Annotated[float, typer.Option(help="Weight of the OrchRM reward.")] = 0.0,
    orchrm: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="OrchRM of --orchrm-weight (default models:/orchrm@champion)."),
    ] = None,
    token_penalty: Annotated[
        float, typer.Option(help="Weight of the token-cost penalty (tokens/1k).")
    ] = 0.0,
    no_promote: Annotated[
        bool, typer.Option("--no-promote", help="Register as candidate only.")
    ] = False,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
    pool: PoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Train the conductor with GRPO (TRL + PEFT) on executed plans; register it in MLflow."""
    from conductor.datasets import load_dataset
    from conductor.training import TrainConductorRequest, TrainConductorResult

    _load_pool(pool)
    load_dataset(dataset, split="train", limit=1, seed=seed)  # a bad dataset fails here
    request = _request(
        TrainConductorRequest,
        dataset=dataset,
        limit=limit,
        eval_limit=eval_limit,
        eval_before=not no_eval_before,
        pool=str(pool) if pool else None,
        base=base,
        init_adapter=init_adapter,
        warm_start=warm_start,
        warm_start_epochs=warm_start_epochs,
        max_steps=max_steps,
        num_generations=num_generations,
        batch_size=batch_size,
        max_completion_length=max_completion_length,
        learning_rate=learning_rate,
        loss_type=loss_type,
        orchrm_weight=orchrm_weight,
        orchrm=orchrm,
        token_penalty_weight=token_penalty,
        promote=not no_promote,
        seed=seed,
    )
    if orchrm_weight:
        from reward_model.model import CHAMPION, load_reward_model

        load_reward_model(orchrm or CHAMPION)  # a missing reward model fails here, in one line
    from flows.train_conductor import train_conductor

    result = _call_long_flow(train_conductor, request, TrainConductorResult, "training")
    if as_json:
        print(result.model_dump_json(exclude={"adapter_dir", "model_version"}))
        return
    for key, value in result.model_dump().items():
        print(f"{key:<22} {value}")


@app.command("train-rm", cls=ConductorCommand)
def train_rm_cmd(
    since: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Build pairs from runs created since this date (default: all runs)."),
    ] = None,
    split: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Only runs of this dataset split, e.g. train (default: all runs)."),
    ] = None,
    min_pairs: Annotated[int, typer.Option(help="Train only with at least N new pairs.")] = 64,
    max_steps: Annotated[int, typer.Option(help="RewardTrainer steps.")] = 120,
    batch_size: Annotated[int, typer.Option(help="Pairs per step.")] = 8,
    learning_rate: Annotated[float, typer.Option(help="Learning rate.")] = 3e-4,
    base: Annotated[
        str, typer.Option(help="Backbone: smollm2-135m-instruct or an HF model directory.")
    ] = "smollm2-135m-instruct",
    max_tokens: Annotated[int, typer.Option(help="Token budget of one plan document.")] = 192,
    no_promote: Annotated[
        bool, typer.Option("--no-promote", help="Register as candidate only.")
    ] = False,
    seed: Annotated[int, typer.Option(help="Seed of the split, sampling and training.")] = 0,
    pool: PoolOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Train OrchRM (a Bradley-Terry reward model) on pairs from the stored runs."""

    from reward_model.model import RewardModelRequest, RewardModelResult

    _load_pool(pool)
    request = _request(
        RewardModelRequest,
        since=since,
        split=split,
        min_pairs=min_pairs,
        max_steps=max_steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        base=base,
        max_tokens=max_tokens,
        promote=not no_promote,
        seed=seed,
        pool=str(pool) if pool else None,
    )
    from flows.train_reward_model import train_reward_model

    result = _call_long_flow(train_reward_model, request, RewardModelResult, "training")
    if as_json:
        print(json.dumps(result.model_dump(mode="json")))
        return
    print(result.message)
    if result.trained:
        for key, value in result.model_dump(exclude={"message"}).items():
            print(f"  {key:<38} {value}")


@artifacts_app.callback()
def artifacts(
    ctx: typer.Context,
    path: Annotated[bool, typer.Option("--path", help="Print the dataset location only.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Summarise the store: runs, steps, failures, tokens, cost."""
    if ctx.invoked_subcommand is not None:
        return
    from conductor.store import ArtifactStore

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
    from conductor.store import ArtifactStore

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


def main() -> None:
    """Entry point: one line on stderr for every error of ours, never a traceback."""
    # Before Prefect is imported: the first ephemeral-server start on a fresh machine runs the
    # database migrations and can take well over Prefect's default 20 s on 2 cores, and the
    # server must not try to phone home from an offline machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    quiet_third_party_notices()
    hide_deprecation_warnings()
    if not sys.stderr.isatty():
        progress_bars_off()
    logging.captureWarnings(True)
    ours = logging.getLogger("conductor")
    if not ours.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("conductor: %(message)s"))
        ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = False  # Prefect's root console handler would print it twice
    try:
        app(standalone_mode=True)
    except ConductorError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2 if not isinstance(exc, _runtime_errors()) else 1)


def _runtime_errors() -> tuple[type[BaseException], ...]:
    from conductor.errors import StoreError, WorkerError

    return (WorkerError, StoreError)


if __name__ == "__main__":
    main()
