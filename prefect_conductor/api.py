"""The Python API (issue #39): the functions the ``conductor`` command calls, for a program.

>>> import prefect_conductor as pc                              # doctest: +SKIP
>>> result = pc.run("What is 17 + 25?")                         # doctest: +SKIP
>>> result.answer                                               # doctest: +SKIP
'42'

Each function builds the flow's request from a few user-facing arguments, runs the flow in
this process (Prefect's temporary server unless ``PREFECT_API_URL`` names one) and returns the
same typed result that ``--json`` prints: :class:`RunResult`, :class:`EvalResult`,
:class:`TrainConductorResult`. A pool is a path to a YAML file, a :class:`Pool` built in code
(written once under ``$CONDUCTOR_HOME/pools/``, so a stored run can always name its pool) or
``None`` for the embedded local pool.

The offline and quiet defaults (no telemetry; litellm's price map from the package) are set
when a function is called, never at import, and each is a default: a user's own setting of
the same variable wins. Bad input raises a :class:`ConductorError` subclass whose message is
one line; a question that runs and fails returns a result with ``status="failed"`` and its
``reason``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_conductor.conductor.errors import ConductorError
from prefect_conductor.conductor.plan.requests import EvalResult, RunResult
from prefect_conductor.conductor.pool import Pool, load_pool, pool_from_dict

if TYPE_CHECKING:
    from prefect_conductor.conductor.training.config import TrainConductorResult

__all__ = [
    "ConductorError",
    "EvalResult",
    "Pool",
    "RunResult",
    "evaluate",
    "improve",
    "load_pool",
    "pool_from_dict",
    "run",
    "train",
]

PoolArg = str | Path | Pool | None


def _pool_file(pool: PoolArg) -> str | None:
    """The pool as the flows take it: a file path, or None for the embedded pool."""
    if pool is None:
        return None
    if isinstance(pool, Pool):
        from prefect_conductor.conductor.home import conductor_home
        from prefect_conductor.conductor.pool import write_pool_file

        return str(write_pool_file(pool, conductor_home() / "pools"))
    path = Path(pool).expanduser().resolve()
    load_pool(path)  # fail here, in one line, not inside a flow run
    return str(path)


def run_flow(flow: Any, request: Any) -> tuple[Any, Any]:
    """Run ``flow`` in this process with the runtime's settings, chosen now: the offline
    defaults, the temporary server (unless ``PREFECT_API_URL``), result storage under the
    home. Returns its final state and its result (or exception). The CLI calls this too."""
    from prefect_conductor.runtime.quiet import offline_defaults, quiet_third_party_notices

    offline_defaults()  # before Prefect, MLflow or Hugging Face is imported by the flow
    quiet_third_party_notices()
    from prefect_conductor.runtime.server import (
        local_run_settings,
        wait_until_recorded,
        with_local_results,
    )

    with local_run_settings():
        state = with_local_results(flow)(request, return_state=True)
        result = state.result(raise_on_failure=False)
        wait_until_recorded(state.state_details.flow_run_id)
    return state, result


def _call(flow: Any, request: Any, expected: type) -> Any:
    """``run_flow``'s typed result, or raise."""
    state, result = run_flow(flow, request)
    if isinstance(result, expected):
        return result
    if isinstance(result, BaseException):
        raise result
    raise ConductorError(f"{flow.name} ended without a result ({state.name}: {state.message})")


def _checked(model: Any, **fields: Any) -> Any:
    """The request model, or ``ConductorError`` naming the bad field in one line."""
    from pydantic import ValidationError

    try:
        return model(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(map(str, err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")
        raise ConductorError(f"{where}: {msg}" if where else msg) from None


def run(
    question: str,
    *,
    pool: PoolArg = None,
    conductor: str | None = None,
    strategy: str = "conductor",
    reference: str | None = None,
    rm: str | None = None,
    seed: int = 0,
    artifacts: str | None = None,
) -> RunResult:
    """Answer ``question``: the conductor writes a plan, the plan runs as a Prefect flow.

    ``strategy`` is any of ``conductor eval``'s (``single:WORKER``, ``random-plan``,
    ``self-consistency:WORKER:K``, ``best-of-n:N``, ``best-of-n-plan:N``); ``conductor`` an
    adapter directory, ``models:/conductor@champion`` or ``embedded``; ``reference`` scores
    the answer (``result.correct``, ``result.reward``)."""
    from prefect_conductor.conductor.plan.requests import OrchestrateRequest
    from prefect_conductor.conductor.plan.strategies import parse_strategy

    request = _checked(
        OrchestrateRequest,
        question=question,
        pool=_pool_file(pool),
        conductor=conductor,
        strategy=strategy,
        reference=reference,
        rm=rm,
        seed=seed,
        artifacts=artifacts,
    )
    if parse_strategy(request.strategy).best_of:
        from prefect_conductor.flows.best_of_n import best_of_n as flow
    else:
        from prefect_conductor.flows.orchestrate import orchestrate as flow
    return _call(flow, request, RunResult)


def evaluate(
    dataset: str | Path,
    *,
    split: str = "test",
    limit: int | None = None,
    strategy: str = "conductor",
    pool: PoolArg = None,
    conductor: str | None = None,
    concurrency: int = 4,
    samples: int = 1,
    seed: int = 0,
    experiment: str | None = None,
    artifacts: str | None = None,
) -> EvalResult:
    """Run ``strategy`` over a data set (``arithmetic``, ``mixed``, ``humaneval`` or a
    JSONL/Parquet/CSV file); every question is a stored run, the eval one MLflow run."""
    from prefect_conductor.conductor.plan.requests import EvalRequest
    from prefect_conductor.flows.evaluate import evaluate as flow

    request = _checked(
        EvalRequest,
        dataset=str(dataset),
        split=split,
        limit=limit,
        strategy=strategy,
        pool=_pool_file(pool),
        conductor=conductor,
        concurrency=concurrency,
        samples=samples,
        seed=seed,
        experiment=experiment,
        artifacts=artifacts,
    )
    return _call(flow, request, EvalResult)


def _overrides(settings: dict[str, Any] | None) -> list[str]:
    """A recipe's ``settings`` mapping as ``--set`` items (values as YAML reads them).

    >>> _overrides({"heldout.limit": 100, "stages.round.guide": {"execute": 1}})
    ['heldout.limit=100', 'stages.round.guide={"execute": 1}']
    """
    return [
        f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in (settings or {}).items()
    ]


def train(
    recipe: str | Path = "default",
    *,
    pool: PoolArg = None,
    dataset: str | Path | None = None,
    settings: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Train a conductor for ``pool`` with a training recipe (what ``conductor train-conductor
    --recipe`` runs): a built-in name (``conductor recipes``) or a YAML file; ``dataset``
    replaces the recipe's training questions; ``settings`` are ``--set``'s, as a mapping
    (``{"stages.grpo.max_steps": 0, "heldout.limit": 100}``); ``options`` the request's
    own (``promote``, ``restart``, ``fan_out``, ...). Returns a ``TrainConductorResult``
    (its ``ledger`` says what each stage spent); the adapter is registered in MLflow."""
    from prefect_conductor.conductor.training.config import (
        TrainConductorRequest,
        TrainConductorResult,
    )
    from prefect_conductor.flows.train_conductor import train_conductor as flow

    overrides = [f"dataset={dataset}"] if dataset is not None else []
    request = _checked(
        TrainConductorRequest,
        recipe=str(recipe),
        overrides=overrides + _overrides(settings),
        pool=_pool_file(pool),
        **options,
    )
    result: TrainConductorResult = _call(flow, request, TrainConductorResult)
    return result


def improve(
    recipe: str | Path = "improve",
    *,
    pool: PoolArg = None,
    settings: dict[str, Any] | None = None,
    reward_model: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """One iteration of the improvement loop (``conductor improve``): the runs stored since
    the last iteration -> OrchRM's pairs -> OrchRM retrained -> an OrchRM-guided round from
    the champion conductor (``recipe``, ``settings`` as ``--set``) -> promoted if better.
    ``reward_model``: OrchRM's training settings (``{"max_steps": 60}``); ``options`` the
    request's own (``min_new_runs``, ``promote``). Returns an ``ImproveIteration``."""
    from prefect_conductor.conductor.training.improve import ImproveIteration, ImproveRequest
    from prefect_conductor.flows.improve import improve as flow
    from prefect_conductor.reward_model.model import loop_settings

    loop_settings(reward_model or {})  # a bad setting: one line, before the flow starts
    request = _checked(
        ImproveRequest,
        recipe=str(recipe),
        overrides=_overrides(settings),
        pool=_pool_file(pool),
        reward_model=reward_model or {},
        **options,
    )
    result: ImproveIteration = _call(flow, request, ImproveIteration)
    return result
