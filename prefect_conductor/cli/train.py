"""The training commands: ``conductor train-conductor`` and ``conductor train-rm``.

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
    load_pool_option,
)

__all__ = ["train_conductor_cmd", "train_rm_cmd"]


def train_conductor_cmd(
    dataset: Annotated[
        str, typer.Option(help="Training questions: arithmetic, mixed, or a JSONL/Parquet/CSV file")
    ] = "arithmetic",
    max_steps: Annotated[int, typer.Option(help="GRPO steps (0: no GRPO stage).")] = 24,
    num_generations: Annotated[int, typer.Option(help="Rollouts per question (G).")] = 4,
    batch_size: Annotated[int, typer.Option(help="Rollouts per GRPO step.")] = 4,
    max_completion_length: Annotated[int, typer.Option(help="Plan tokens at most.")] = 192,
    learning_rate: Annotated[float, typer.Option(help="GRPO learning rate.")] = 5e-5,
    loss_type: Annotated[str, typer.Option(help="TRL loss_type.")] = "grpo",
    base: Annotated[
        str, typer.Option(help="Base model: smollm2-135m-instruct or an HF model directory.")
    ] = "smollm2-135m-instruct",
    init_adapter: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Continue from a conductor (adapter directory, models:/…, embedded or "
            "champion): the warm start, self-sampling and GRPO go on training it."
        ),
    ] = None,
    warm_start: Annotated[
        bool,
        typer.Option(
            "--warm-start/--no-warm-start",
            help="SFT on verified-correct runs of the store first (off: self-sampling and "
            "GRPO start from --init-adapter as it is).",
        ),
    ] = True,
    warm_start_epochs: Annotated[float, typer.Option(help="Warm-start epochs.")] = 2.0,
    warm_start_examples: Annotated[
        int, typer.Option(help="Warm-start plans at most (balanced over workers).")
    ] = 160,
    self_sample_rounds: Annotated[
        int,
        typer.Option(
            help="Rounds of verified self-sampling after the warm start (the conductor's own "
            "verified-correct plans join the SFT data; 0: none)."
        ),
    ] = 1,
    self_sample_questions: Annotated[
        int, typer.Option(help="Fresh training questions per self-sampling round.")
    ] = 100,
    self_sample_k: Annotated[int, typer.Option(help="Plans sampled per question.")] = 4,
    self_sample_temperature: Annotated[
        float | None,
        typer.Option(help="Self-sampling temperature (default: the GRPO temperature, 1.0)."),
    ] = None,
    self_sample_hints: Annotated[
        str | None,
        typer.Option(
            help="Worked examples the conductor reads while it self-samples only: a YAML file "
            "or a built-in name (word-problems)."
        ),
    ] = None,
    eval_stages: Annotated[
        bool,
        typer.Option(
            "--eval-stages", help="Evaluate every intermediate conductor on the held-out split."
        ),
    ] = False,
    collect_limit: Annotated[
        int,
        typer.Option(
            help="With no verified-correct run in the store: each single worker first answers "
            "this many training questions (0: never)."
        ),
    ] = 100,
    limit: Annotated[Optional[int], typer.Option(help="First N training questions.")] = None,  # noqa: UP045
    eval_limit: Annotated[int, typer.Option(help="Held-out questions, before and after.")] = 50,
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
    fan_out: FanOutOpt = False,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Train the conductor with GRPO (TRL + PEFT) on executed plans; register it in MLflow."""
    from prefect_conductor.conductor.data.datasets import load_dataset
    from prefect_conductor.conductor.training.config import (
        TrainConductorRequest,
        TrainConductorResult,
    )

    load_pool_option(pool)
    load_dataset(dataset, split="train", limit=1, seed=seed)  # a bad dataset fails here
    check_fan_out(fan_out)
    request = build_request(
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
        warm_start_examples=warm_start_examples,
        self_sample_rounds=self_sample_rounds,
        self_sample_questions=self_sample_questions,
        self_sample_k=self_sample_k,
        self_sample_temperature=self_sample_temperature,
        self_sample_hints=self_sample_hints,
        fan_out=fan_out,
        eval_stages=eval_stages,
        collect_limit=collect_limit,
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
    if self_sample_hints:
        from prefect_conductor.conductor.pool import load_pool
        from prefect_conductor.conductor.training.hints import load_hint

        load_hint(self_sample_hints, load_pool(request.pool))  # a bad file: one line, now
    if orchrm_weight:
        from prefect_conductor.reward_model.model import CHAMPION, load_reward_model
        from prefect_conductor.tasks.registry import download_registered

        # A missing reward model fails here, in one line.
        load_reward_model(orchrm or CHAMPION, download_registered)
    from prefect_conductor.flows.train_conductor import train_conductor

    result = call_long_flow(train_conductor, request, TrainConductorResult, "training")
    if as_json:
        print(result.model_dump_json(exclude={"adapter_dir", "model_version"}))
        return
    for key, value in result.model_dump().items():
        print(f"{key:<22} {value}")


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
