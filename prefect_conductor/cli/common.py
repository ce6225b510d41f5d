"""What the CLI's commands share: option types, one-line failures, running a flow here."""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from prefect_conductor.conductor.terminal import for_terminal
from prefect_conductor.runtime.quiet import (
    quiet_prefect_shutdown,
    silence_stderr_at_exit,
    verbose_output,
)

__all__ = [
    "ConductorOpt",
    "JsonOpt",
    "PoolOpt",
    "RmOpt",
    "VerboseOpt",
    "call_flow",
    "call_long_flow",
    "check_rm",
    "fail",
    "load_pool_option",
    "build_request",
]

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
        "models:/conductor@champion, embedded, or champion (the registry's champion, else "
        "embedded).",
    ),
]


def _verbose(value: bool) -> bool:
    if value:  # eager: before the command body imports Prefect or MLflow
        verbose_output()
    return value


VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        is_eager=True,
        callback=_verbose,
        help="Also show Prefect's run log lines and third-party INFO lines on stderr.",
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


def check_rm(strategy: Any, rm: str | None) -> None:
    """Best-of-n needs a reward model: load it now, so a missing one fails in one line."""
    if strategy.best_of:
        from prefect_conductor.flows.best_of_n import DEFAULT_RM
        from prefect_conductor.reward_model.model import load_reward_model
        from prefect_conductor.tasks.registry import download_registered

        load_reward_model(rm or DEFAULT_RM, download_registered)


FanOutOpt = Annotated[
    bool,
    typer.Option(
        "--fan-out",
        help="Hand each question (each plan) to the fleet: any `conductor serve` on any host "
        "of this Prefect server. Needs PREFECT_API_URL and "
        "PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK / "
        "PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK (storage every host reads).",
    ),
]


def check_fan_out(fan_out: bool) -> None:
    """``--fan-out`` without a fleet to hand work to: one line, before any work starts."""
    if fan_out:
        from prefect_conductor.fleet.fanout import FanOutError, check_fleet

        try:
            check_fleet()
        except FanOutError as exc:
            fail(str(exc))


def fail(message: str, code: int = 2) -> None:
    # A run's reason may quote a worker's or a tool's output (issue #38).
    typer.echo(f"error: {for_terminal(message, multiline=True)}", err=True)
    raise typer.Exit(code)


def build_request(model: Any, **fields: Any) -> Any:
    """The flow's request model, or one line naming the bad field (exit 2)."""
    from pydantic import ValidationError

    try:
        return model(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where, msg = ".".join(map(str, err["loc"])), err["msg"].removeprefix("Value error, ")
        fail(f"{where}: {msg}" if where else msg)


def call_long_flow(flow: Any, request: Any, result_type: type, what: str) -> Any:
    """A long flow (eval, training): per-task logs off, stdout kept for the result."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # The trainers print their log lines and progress on stdout; stdout is for the result.
    with contextlib.redirect_stdout(sys.stderr):
        _, result = call_flow(flow, request)
    if not isinstance(result, result_type):
        fail(str(result).strip().splitlines()[0] if result else f"{what} crashed", code=1)
    return result


def call_flow(flow: Any, request: Any) -> tuple[Any, Any]:
    """The Python API's ``run_flow``, with Prefect's shutdown kept off the terminal."""
    from prefect_conductor.api import run_flow

    with quiet_prefect_shutdown():
        state, result = run_flow(flow, request)
    # Everything the user needs is printed after this; Prefect's shutdown output is not.
    silence_stderr_at_exit()
    return state, result


def load_pool_option(pool: Path | None, conductor: str | None = None):
    from prefect_conductor.conductor.pool import load_pool

    loaded = load_pool(pool)
    if conductor:
        from prefect_conductor.tasks.registry import with_conductor

        loaded = with_conductor(loaded, conductor)
    return loaded
