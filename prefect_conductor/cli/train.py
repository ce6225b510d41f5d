"""The training commands: ``conductor train-conductor``, ``conductor train-rm`` and
``conductor improve``.

Plain functions, registered on the app by ``prefect_conductor.cli.app``; each loads its flow only
when run.
"""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from prefect_conductor.cli.common import (
    FanOutOpt,
    JsonOpt,
    PoolOpt,
    VerboseOpt,
    build_request,
    call_long_flow,
    check_fan_out,
    fail,
    load_pool_option,
)

__all__ = ["improve_cmd", "recipes_cmd", "train_conductor_cmd", "train_rm_cmd"]


def train_conductor_cmd(
    recipe: Annotated[
        str,
        typer.Option(
            help="Training recipe: a built-in name (`conductor recipes` lists them) or a YAML file."
        ),
    ] = "default",
    set_: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--set",
            help="Override a recipe setting, KEY=VALUE (repeatable): e.g. "
            "stages.grpo.max_steps=0, heldout.limit=100 (a stage by name or index).",
        ),
    ] = None,
    dataset: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Training questions: arithmetic, mixed, words, or a JSONL/Parquet/CSV "
            "file (default: the recipe's)."
        ),
    ] = None,
    eval_limit: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="Held-out questions of the evals (default: the recipe's)."),
    ] = None,
    base: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Base model: smollm2-135m-instruct or an HF model directory."),
    ] = None,
    init_adapter: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Start from a conductor (adapter directory, models:/…, embedded or champion) "
            "instead of a new LoRA."
        ),
    ] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed (default: the recipe's).")] = None,  # noqa: UP045
    restart: Annotated[
        bool,
        typer.Option(
            "--restart", help="Start over even if a killed training of this recipe can resume."
        ),
    ] = False,
    no_promote: Annotated[
        bool, typer.Option("--no-promote", help="Register as candidate only.")
    ] = False,
    pool: PoolOpt = None,
    fan_out: FanOutOpt = False,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Train a conductor for the pool with a recipe (TRL + PEFT); register it in MLflow.

    A killed training resumes at the stage it was in when the same command runs again."""
    from prefect_conductor.conductor.training.config import (
        TrainConductorRequest,
        TrainConductorResult,
    )

    load_pool_option(pool)
    loaded = load_recipe_option(recipe, set_, dataset, eval_limit, base, init_adapter, seed)
    check_fan_out(fan_out)
    request = build_request(
        TrainConductorRequest,
        recipe=loaded,
        pool=str(pool) if pool else None,
        promote=not no_promote,
        restart=restart,
        fan_out=fan_out,
    )
    from prefect_conductor.flows.train_conductor import train_conductor

    result = call_long_flow(train_conductor, request, TrainConductorResult, "training")
    if as_json:
        print(result.model_dump_json(exclude={"adapter_dir", "model_version"}))
        return
    print_training(result)


def load_recipe_option(
    recipe: str,
    overrides: list[str] | None,
    dataset: str | None = None,
    eval_limit: int | None = None,
    base: str | None = None,
    init_adapter: str | None = None,
    seed: int | None = None,
):
    """The recipe with the common options and ``--set`` applied, checked before anything
    runs: a bad recipe, data set, hint file or reward model is one line (exit 2)."""
    from prefect_conductor.conductor.data.datasets import load_dataset
    from prefect_conductor.conductor.errors import ConductorError
    from prefect_conductor.conductor.training.recipe import GrpoStage, SelfSampleStage, load_recipe

    common = {
        "dataset": dataset,
        "heldout.limit": eval_limit,
        "base": base,
        "init_adapter": init_adapter,
        "seed": seed,
    }
    sets = [f"{k}={v}" for k, v in common.items() if v is not None] + list(overrides or [])
    try:
        loaded = load_recipe(recipe, sets)
        load_dataset(loaded.dataset, split="train", limit=1, seed=loaded.seed)
        for stage in loaded.stages:
            if isinstance(stage, SelfSampleStage) and stage.hints:
                from prefect_conductor.conductor.pool import load_pool
                from prefect_conductor.conductor.training.hints import load_hint

                load_hint(stage.hints, load_pool(None))
            if (
                isinstance(stage, GrpoStage)
                and stage.max_steps
                and stage.reward_weights.get("orchrm")
            ):
                from prefect_conductor.reward_model.model import CHAMPION, load_reward_model
                from prefect_conductor.tasks.registry import download_registered

                load_reward_model(stage.orchrm or CHAMPION, download_registered)
    except ConductorError as exc:
        fail(str(exc))
    return loaded


def print_training(result) -> None:
    """The result as a person reads it: the before/after line, each stage, the ledger."""
    from prefect_conductor.conductor.terminal import for_terminal

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    print(
        f"recipe {for_terminal(result.recipe)}: accuracy {pct(result.accuracy_before)} -> "
        f"{pct(result.accuracy_after)}, valid plans {pct(result.format_valid_before)} -> "
        f"{pct(result.format_valid_after)}"
    )
    print(
        f"conductor {result.adapter_uri}{' (promoted to champion)' if result.promoted else ''}"
        f"; MLflow run {result.run_id}; {result.wall_s / 60:.1f} min"
        + (f" (resumed at {result.resumed_at})" if result.resumed_at else "")
    )
    print()
    print(f"{'stage':<16} {'kind':<12} {'questions':>9} {'plans':>6} {'right':>6} "
          f"{'examples':>8} {'accuracy':>8}")  # fmt: skip
    for r in result.stages:
        cells = [r.questions, r.rollouts, r.right, r.examples]
        q, n, k, e = ("-" if c is None else str(c) for c in cells)
        print(f"{for_terminal(r.stage):<16} {r.kind:<12} {q:>9} {n:>6} {k:>6} {e:>8} "
              f"{pct(r.accuracy):>8}")  # fmt: skip
    print()
    print(f"{'ledger':<16} {'worker calls':>12} {'tokens in':>10} {'tokens out':>10} "
          f"{'cost $':>8} {'plans written':>13} {'wall s':>8}")  # fmt: skip
    for e in result.ledger:
        print(f"{for_terminal(e.stage):<16} {e.worker_calls:>12} {e.input_tokens:>10} "
              f"{e.output_tokens:>10} {e.cost_usd:>8.4f} {e.conductor_generations:>13} "
              f"{e.wall_s:>8.1f}")  # fmt: skip


def recipes_cmd(
    name: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(help="Print this recipe as it runs (a built-in name or a YAML file)."),
    ] = None,
    set_: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--set", help="Override a setting, KEY=VALUE (repeatable)."),
    ] = None,
) -> None:
    """List the built-in training recipes, or print one (with --set applied)."""
    from prefect_conductor.conductor.errors import ConductorError
    from prefect_conductor.conductor.training.recipe import list_recipes, load_recipe

    if name is None:
        for key, line in list_recipes().items():
            print(f"{key:<10} {line}")
        return
    try:
        print(load_recipe(name, list(set_ or [])).to_yaml(), end="")
    except ConductorError as exc:
        fail(str(exc))


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
    verbose: VerboseOpt = False,
) -> None:
    """Train OrchRM (a Bradley-Terry reward model) on pairs from the stored runs."""

    from prefect_conductor.reward_model.model import RewardModelRequest, RewardModelResult

    load_pool_option(pool)
    request = build_request(
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
    from prefect_conductor.flows.train_reward_model import train_reward_model

    result = call_long_flow(train_reward_model, request, RewardModelResult, "training")
    if as_json:
        print(json.dumps(result.model_dump(mode="json")))
        return
    print(result.message)
    if result.trained:
        for key, value in result.model_dump(exclude={"message"}).items():
            print(f"  {key:<38} {value}")


def improve_cmd(
    recipe: Annotated[
        str, typer.Option(help="The conductor's round: a built-in recipe or a YAML file.")
    ] = "improve",
    set_: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--set", help="A recipe setting, KEY=VALUE (repeatable).", show_default=False),
    ] = None,
    min_new_runs: Annotated[
        int, typer.Option(help="Fewer runs stored since the last iteration: stop.")
    ] = 50,
    rm_set: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--rm-set",
            help="An OrchRM training setting (train-rm's fields), KEY=VALUE (repeatable).",
            show_default=False,
        ),
    ] = None,
    no_promote: Annotated[
        bool, typer.Option("--no-promote", help="Register candidates only.")
    ] = False,
    pool: PoolOpt = None,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """One iteration of the loop: stored runs -> pairs -> OrchRM -> a guided round -> promotion."""
    import yaml

    from prefect_conductor.conductor.training.improve import ImproveIteration, ImproveRequest

    load_pool_option(pool)
    settings = {}
    for item in rm_set or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--rm-set {item!r}: expected KEY=VALUE")
        settings[key] = yaml.safe_load(value)
    from prefect_conductor.conductor.errors import ConductorError
    from prefect_conductor.reward_model.model import loop_settings

    try:
        loop_settings(settings)
    except ConductorError as exc:
        fail(str(exc))
    request = build_request(
        ImproveRequest,
        recipe=recipe,
        overrides=list(set_ or []),
        min_new_runs=min_new_runs,
        reward_model=settings,
        promote=not no_promote,
        pool=str(pool) if pool else None,
    )
    from prefect_conductor.flows.improve import improve

    result = call_long_flow(improve, request, ImproveIteration, "iteration")
    if as_json:
        print(json.dumps(result.model_dump(mode="json")))
        return
    print(
        f"iteration {result.iteration}: {result.runs.total} runs since "
        f"{result.since or 'the start'}"
        f" ({result.runs.unreferenced} without a reference)"
    )
    if result.stopped:
        print(result.stopped)
        return
    print(f"pairs: {result.pairs_new} new, by source {result.pairs_by_source}")
    unreferenced = {s: n for s, n in result.pairs_unreferenced_by_source.items() if n}
    print(f"pairs from runs without a reference: {unreferenced or 'none'}")
    print(
        f"OrchRM: {'trained' if result.orchrm_trained else 'not trained'}"
        f"{', promoted' if result.orchrm_promoted else ''}"
    )
    before = f"{result.accuracy_before:.3f}" if result.accuracy_before is not None else "-"
    after = f"{result.accuracy_after:.3f}" if result.accuracy_after is not None else "-"
    print(
        f"conductor: {before} -> {after} ({result.conductor_uri}"
        f"{', promoted' if result.conductor_promoted else ', not promoted'})"
    )
    total = result.ledger[-1] if result.ledger else None
    if total is not None:
        print(
            f"ledger: {total.worker_calls} worker calls, {total.input_tokens} + "
            f"{total.output_tokens} tokens, ${total.cost_usd:.4f}, {total.wall_s:.0f} s"
        )
