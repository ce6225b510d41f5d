"""Pure pieces of conductor training: rewards, warm-start data, prompts, adapters, promotion,
the requests of training-time plan runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from prefect_conductor.conductor.adapters import (
    AdapterError,
    read_adapter,
    resolve_conductor,
    with_conductor,
    write_adapter_meta,
)
from prefect_conductor.conductor.data.datasets import Example
from prefect_conductor.conductor.plan.parse import parse_plan
from prefect_conductor.conductor.plan.prompts import conductor_messages, render_plan
from prefect_conductor.conductor.plan.requests import OrchestrateRequest
from prefect_conductor.conductor.plan.workflow import Step, Workflow
from prefect_conductor.conductor.pool import load_pool
from prefect_conductor.conductor.training.config import (
    TrainConductorRequest,
    rollout_request,
    should_promote,
)
from prefect_conductor.conductor.training.recipe import GrpoStage, RecipeError, recipe_from_dict
from prefect_conductor.conductor.training.rewards import (
    ExecutedPlanReward,
    Rollout,
    RolloutOutcome,
    TokenCostPenalty,
    completion_text,
    plan_format_reward,
)
from prefect_conductor.conductor.training.warm_start import warm_start_examples

POOL = load_pool()
# The embedded pool's conductor is the shipped adapter; BASE has the untrained SmolLM2.
BASE = POOL.model_copy(
    update={"conductor": POOL.conductor.model_copy(update={"model": "local/smollm2-135m-instruct"})}
)
VALID = 'ok\nmodel_id = [1]\nsubtasks = ["17 + 25"]\naccess_list = [[]]'


def _kwargs(n: int) -> dict:
    return {
        "question": ["What is 17 + 25?"] * n,
        "question_id": ["q1"] * n,
        "reference": ["42"] * n,
        "kind": ["math"] * n,
        "meta": ["{}"] * n,
    }


def test_executed_reward_returns_what_execution_scored_in_order():
    seen = []

    def execute(rollouts, step):
        seen.append((step, [r.plan_text for r in rollouts]))
        return [
            RolloutOutcome(0.0, False, False),
            RolloutOutcome(0.5, True, False, tokens=10),
            RolloutOutcome(1.0, True, True, tokens=20),
            None,  # the run crashed: no opinion
        ]

    reward = ExecutedPlanReward(execute)
    completions = [[{"role": "assistant", "content": t}] for t in ("bad", VALID, VALID, VALID)]
    scores = reward(["p"] * 4, completions, **_kwargs(4))
    assert scores == [0.0, 0.5, 1.0, None]
    assert seen == [(0, ["bad", VALID, VALID, VALID])]
    assert [s["reward"] for s in reward.samples] == [0.0, 0.5, 1.0, None]
    assert TokenCostPenalty(reward)(["p"] * 4, completions) == [0.0, -0.01, -0.02, None]


def test_executed_reward_names_a_missing_dataset_column():
    reward = ExecutedPlanReward(lambda rollouts, step: [])
    kwargs = _kwargs(1)
    del kwargs["reference"]
    with pytest.raises(ValueError, match="'reference'"):
        reward(["p"], ["x"], **kwargs)


def test_token_penalty_must_follow_the_plan_reward():
    reward = ExecutedPlanReward(lambda rollouts, step: [])
    with pytest.raises(RuntimeError, match="must follow plan_reward"):
        TokenCostPenalty(reward)(["p"], ["x"])


def test_format_reward_and_completion_text():
    fmt = plan_format_reward(POOL)
    assert fmt(
        [], [VALID, "The answer is 42.", 'model_id = [9]\nsubtasks = ["x"]\naccess_list = [[]]']
    ) == [
        0.5,
        0.0,
        0.0,
    ]
    assert completion_text([{"role": "assistant", "content": "a"}, {"content": "b"}]) == "ab"


def test_render_plan_round_trips_through_the_parser():
    workflow = Workflow(
        steps=(
            Step(index=0, worker="smol", instruction='Say "hi" to 7 + 3'),
            Step(index=1, worker="calculator", instruction="7 + 3", access=(0,)),
        )
    )
    text = render_plan(workflow, POOL)
    assert "model_id = [0, 1]" in text
    assert parse_plan(text, POOL) == workflow


def test_compact_prompt_drops_the_examples_but_keeps_rules_and_pool():
    compact = BASE.model_copy(
        update={"conductor": BASE.conductor.model_copy(update={"prompt": "compact"})}
    )
    full_text = conductor_messages("q", BASE)[0]["content"]
    compact_text = conductor_messages("q", compact)[0]["content"]
    assert "Examples" in full_text and "Examples" not in compact_text
    assert "Model 1: A calculator" in compact_text and "access_list" in compact_text
    assert len(compact_text) < len(full_text) / 2


def _runs(**overrides) -> pd.DataFrame:
    base = {
        "run_id": "r",
        "question_id": "q",
        "question": "What is 17 + 25?",
        "reference": "REFERENCE-SENTINEL",
        "workflow_json": json.dumps(
            {"model_id": ["calculator"], "subtasks": ["What is 17 + 25?"], "access_list": [[]]}
        ),
        "correct": True,
        "status": "completed",
        "tags": [("strategy", "single:calculator")],
    }
    return pd.DataFrame([{**base, **overrides}])


def test_warm_start_uses_only_verified_correct_completed_runs():
    frames = pd.concat(
        [
            _runs(),
            _runs(question="What is 1 + 2?", correct=False),
            _runs(question="What is 3 + 4?", correct=None),
            _runs(question="What is 5 + 6?", status="failed"),
            _runs(question="What is 8 + 9?", tags=[("strategy", "self-consistency:smol:5")]),
            _runs(question="What is 2 + 2?", workflow_json=None),
            _runs(  # names a worker the pool no longer has
                question="What is 6 + 6?",
                workflow_json=json.dumps(
                    {"model_id": ["gone"], "subtasks": ["x"], "access_list": [[]]}
                ),
            ),
            _runs(),  # a duplicate
        ],
        ignore_index=True,
    )
    rows = warm_start_examples(frames, POOL)
    assert [r["prompt"][-1]["content"] for r in rows] == ["Question: What is 17 + 25?"]
    target = rows[0]["completion"][0]["content"]
    assert parse_plan(target, POOL).steps[0].worker == "calculator"


def test_warm_start_never_reads_the_reference_and_skips_held_out_questions():
    frames = pd.concat([_runs(), _runs(question="What is 40 + 2?")], ignore_index=True)
    rows = warm_start_examples(frames, POOL, exclude_questions=["What is 40 + 2?"])
    assert len(rows) == 1
    assert "REFERENCE-SENTINEL" not in json.dumps(rows)
    # Without the reference column at all, the same rows come out: it is never read.
    assert (
        warm_start_examples(
            frames.drop(columns=["reference"]), POOL, exclude_questions=["What is 40 + 2?"]
        )
        == rows
    )


def test_warm_start_never_trains_on_a_test_split_run():
    frames = pd.concat(
        [
            _runs(tags=[("strategy", "conductor"), ("split", "train")]),
            _runs(question="What is 40 + 2?", tags=[("strategy", "conductor"), ("split", "test")]),
        ],
        ignore_index=True,
    )
    rows = warm_start_examples(frames, POOL)  # no exclude list: the tag alone keeps it out
    assert [r["prompt"][-1]["content"] for r in rows] == ["Question: What is 17 + 25?"]


def test_warm_start_limit_draws_a_seeded_subset():
    frames = pd.concat([_runs(question=f"What is {i} + 1?") for i in range(10)], ignore_index=True)
    a = warm_start_examples(frames, POOL, limit=4, seed=1)
    assert len(a) == 4 and a == warm_start_examples(frames, POOL, limit=4, seed=1)


def _plan(*steps: tuple[str, str]) -> str:
    return json.dumps(
        {
            "model_id": [w for w, _ in steps],
            "subtasks": [t for _, t in steps],
            "access_list": [[] if i == 0 else [i - 1] for i in range(len(steps))],
        }
    )


def test_warm_start_draw_is_balanced_over_the_workers_plans_use():
    # 12 calculator plans and 3 smol plans: a draw of 6 keeps all 3 smol plans (a
    # proportional draw would keep about 1).
    frames = pd.concat(
        [_runs(question=f"What is {i} + 1?") for i in range(12)]
        + [
            _runs(question=f"Capital {i}?", workflow_json=_plan(("smol", f"Capital {i}?")))
            for i in range(3)
        ],
        ignore_index=True,
    )
    for seed in range(5):
        rows = warm_start_examples(frames, POOL, limit=6, seed=seed)
        workers = [parse_plan(r["completion"][0]["content"], POOL).steps[0].worker for r in rows]
        assert sorted(workers) == ["calculator"] * 3 + ["smol"] * 3


def test_warm_start_repeats_small_worker_sets_under_the_limit_too():
    # 9 calculator plans, 2 smol plans, a limit of 160: fewer plans than the limit, yet the
    # store's 9:2 is not what the conductor learns from (issue #18's third run). smol's two
    # plans are repeated, at most 3 times over (6), never past the largest set (9).
    frames = pd.concat(
        [_runs(question=f"What is {i} + 1?") for i in range(9)]
        + [
            _runs(question=f"Capital {i}?", workflow_json=_plan(("smol", f"Capital {i}?")))
            for i in range(2)
        ],
        ignore_index=True,
    )
    rows = warm_start_examples(frames, POOL, limit=160, seed=0)
    workers = [parse_plan(r["completion"][0]["content"], POOL).steps[0].worker for r in rows]
    assert workers.count("calculator") == 9 and workers.count("smol") == 6
    assert len({r["prompt"][-1]["content"] for r in rows}) == 11  # every plan, none left out
    # A store of one worker's plans is used as it is: nothing to balance, nothing repeated.
    alone = warm_start_examples(frames.iloc[:9], POOL, limit=160, seed=0)
    assert len(alone) == 9
    # Without a limit every plan appears once.
    assert len(warm_start_examples(frames, POOL)) == 11


def test_warm_start_draw_gives_each_data_set_an_equal_share():
    # The shipped recipe's store: bare expressions collected on `mixed`, then many more word
    # problems of the `words` curriculum, both planned for the calculator. Balanced over
    # worker sets alone, a 12-row draw holds 6 calculator plans, of which the expressions
    # are a few; by data set first, `mixed` keeps half of the draw (its two worker sets 3
    # each) and `words` the other half.
    mixed = [("mixed", f"What is {i} + 1?", "calculator") for i in range(6)] + [
        ("mixed", f"Capital {i}?", "smol") for i in range(6)
    ]
    words = [
        ("words", f"Ann has {i} apples and buys 3. How many?", "calculator") for i in range(30)
    ]
    frames = pd.concat(
        [
            _runs(question=q, workflow_json=_plan((w, q)), tags=[("dataset", d)])
            for d, q, w in mixed + words
        ],
        ignore_index=True,
    )
    for seed in range(3):
        rows = warm_start_examples(frames, POOL, limit=12, seed=seed)
        questions = [r["prompt"][-1]["content"] for r in rows]
        assert sum("apples" in q for q in questions) == 6
        assert sum("+ 1?" in q for q in questions) == 3
        assert sum("Capital" in q for q in questions) == 3
    # Without the tag (one data set) the draw is balanced over worker sets only: as before.
    plain = frames.assign(tags=[[("strategy", "single:x")]] * len(frames))
    rows = warm_start_examples(plain, POOL, limit=12, seed=0)
    assert _workers(rows).count("smol") == 6 and _workers(rows).count("calculator") == 6


def test_warm_start_keeps_the_shortest_verified_plan_of_a_question():
    chain = _plan(("smol", "Work out 17 + 25 step by step."), ("calculator", "17 + 25"))
    frames = pd.concat(
        [_runs(workflow_json=chain), _runs(workflow_json=_plan(("calculator", "17 + 25")))],
        ignore_index=True,
    )
    (row,) = warm_start_examples(frames, POOL)
    assert len(parse_plan(row["completion"][0]["content"], POOL).steps) == 1
    two = warm_start_examples(frames, POOL, per_question=2)
    assert [len(parse_plan(r["completion"][0]["content"], POOL).steps) for r in two] == [1, 2]


def _facts(sets: dict[str, tuple[int, int]], start: int = 0) -> list[pd.DataFrame]:
    """Single-worker runs of fact questions ``start``…: ``{worker: (tried, right)}``, each
    worker tried on the first ``tried`` questions and right on the first ``right``."""
    return [
        _runs(
            question=f"Capital {i}?",
            workflow_json=_plan((worker, f"Capital {i}?")),
            correct=i < start + right,
            tags=[("strategy", f"single:{worker}")],
        )
        for worker, (tried, right) in sets.items()
        for i in range(start, start + tried)
    ]


def _workers(rows) -> list[str]:
    return [parse_plan(r["completion"][0]["content"], POOL).steps[0].worker for r in rows]


def test_a_question_right_for_two_workers_teaches_the_one_right_more_often_head_to_head():
    # Issue #40's own pool: a distractor right on 4 fact questions, all among the chat
    # model's 8. Both plans are one step of the same length, so the shortest-plan rule alone
    # kept whichever run came first; the record on the questions both were tried on picks
    # the one right more often, whichever came first.
    for worse, better in (("smol", "python"), ("python", "smol")):
        frames = pd.concat(_facts({worse: (20, 4), better: (20, 8)}), ignore_index=True)
        rows = warm_start_examples(frames, POOL)
        assert len(rows) == 8 and set(_workers(rows)) == {better}
    # With no question tried by both, nothing is known: the shortest plan, as before.
    apart = pd.concat(
        _facts({"smol": (3, 3)}) + _facts({"python": (3, 3)}, start=3), ignore_index=True
    )
    assert sorted(_workers(warm_start_examples(apart, POOL))) == ["python"] * 3 + ["smol"] * 3


def test_a_dominated_worker_set_is_kept_but_never_repeated_by_the_balanced_draw():
    # calculator: 9 arithmetic plans. smol right on 4 of 20 shared fact questions, python on
    # 8 of them (smol's 4 among them), and smol alone right on 2 more questions python never
    # saw. smol's two plans there are kept (each was verified) but not repeated: python's
    # are (up to the largest set's 9), as an undominated set's always were.
    frames = pd.concat(
        [_runs(question=f"What is {i} + 1?") for i in range(9)]
        + _facts({"python": (20, 8), "smol": (20, 4)})
        + _facts({"smol": (2, 2)}, start=20),
        ignore_index=True,
    )
    workers = _workers(warm_start_examples(frames, POOL, limit=160, seed=0))
    assert workers.count("smol") == 2
    assert workers.count("python") == 9 and workers.count("calculator") == 9
    # The same store without the shared questions: smol is dominated by no one, repeated.
    alone = pd.concat(
        [_runs(question=f"What is {i} + 1?") for i in range(9)] + _facts({"smol": (2, 2)}),
        ignore_index=True,
    )
    assert _workers(warm_start_examples(alone, POOL, limit=160, seed=0)).count("smol") == 6


def test_adapter_references(tmp_path):
    with pytest.raises(AdapterError, match="not a LoRA adapter directory"):
        read_adapter(tmp_path)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": ""}))
    with pytest.raises(AdapterError, match="which base model"):
        read_adapter(tmp_path)
    write_adapter_meta(tmp_path, "smollm2-135m-instruct", "compact", {"steps": 3})
    info = read_adapter(tmp_path)
    assert (info.base, info.prompt, info.provenance) == (
        "smollm2-135m-instruct",
        "compact",
        {"steps": 3},
    )
    pool = with_conductor(POOL, str(tmp_path))
    assert pool.conductor.model == f"local/{tmp_path.resolve()}"
    assert pool.conductor.prompt == "compact"
    assert pool.workers == POOL.workers


def test_registry_reference_without_a_registered_model_is_a_clear_error(tmp_path, monkeypatch):
    from prefect_conductor.tasks import registry

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(
        AdapterError, match="models:/conductor@champion: not in the MLflow registry"
    ):
        registry.resolve_conductor("models:/conductor@champion")


def test_the_core_reads_no_registry() -> None:
    """Issue #39: a registry reference needs the task layer's downloader."""
    with pytest.raises(AdapterError, match="a model-registry reference"):
        resolve_conductor("models:/conductor@champion")
    seen: list[str] = []

    def download(ref: str) -> Path:
        seen.append(ref)
        raise AdapterError(f"{ref}: offline")

    with pytest.raises(AdapterError, match="offline"):
        resolve_conductor("models:/orchrm@champion", download)
    assert seen == ["models:/orchrm@champion"]


def test_the_incumbent_is_the_champion_else_the_shipped_adapter(tmp_path, monkeypatch):
    from prefect_conductor.conductor.adapters import INCUMBENT, NotRegistered, embedded_adapter_path
    from prefect_conductor.tasks.registry import resolve_conductor

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert resolve_conductor(INCUMBENT).path == embedded_adapter_path().resolve()
    # A registry that is not reachable is an error, not "no champion".
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with pytest.raises(AdapterError) as raised:
        resolve_conductor(INCUMBENT)
    assert not isinstance(raised.value, NotRegistered)


def test_promotion_only_for_a_better_candidate():
    assert should_promote(0.5, None)
    assert not should_promote(0.6, 0.7)
    assert not should_promote(0.7, 0.7)
    assert should_promote(0.71, 0.7)


def test_request_checks_the_group_size():
    """The group-size check lives on the recipe's GRPO stage: a bad one is one line naming
    the stage, and a request never holds it."""
    with pytest.raises(ValueError, match="multiple of num_generations"):
        GrpoStage(kind="grpo", num_generations=4, per_device_train_batch_size=6)
    stages = [
        {"kind": "sft"},
        {"kind": "grpo", "name": "rl", "num_generations": 4, "per_device_train_batch_size": 6},
    ]
    with pytest.raises(RecipeError) as raised:
        recipe_from_dict({"stages": stages}, "mine.yaml")
    assert str(raised.value) == (
        "recipe mine.yaml: stage 2 (rl): per_device_train_batch_size (6) must be a multiple "
        "of num_generations (4)"
    )
    with pytest.raises(ValueError, match="multiple of num_generations"):
        TrainConductorRequest(recipe={"stages": stages})
    stage = GrpoStage(kind="grpo")
    assert stage.temperature == 1.0 and stage.beta == 0.0  # the Conductor paper's settings


def test_a_pool_naming_an_adapter_gets_the_prompt_it_was_trained_with(tmp_path):
    from prefect_conductor.conductor.plan.prompts import prompt_style

    (tmp_path / "adapter_config.json").write_text("{}")
    write_adapter_meta(tmp_path, "smollm2-135m-instruct", "compact")
    named = POOL.model_copy(
        update={"conductor": POOL.conductor.model_copy(update={"model": f"local/{tmp_path}"})}
    )
    assert prompt_style(BASE) == "full"
    assert prompt_style(POOL) == "compact"  # the shipped adapter was trained with it
    assert prompt_style(named) == "compact"
    assert "Examples" not in conductor_messages("q", named)[0]["content"]
    explicit = named.model_copy(
        update={"conductor": named.conductor.model_copy(update={"prompt": "full"})}
    )
    assert prompt_style(explicit) == "full"  # an explicit choice in the pool file wins


def test_the_shipped_adapter_is_small_and_says_how_it_was_made():
    from prefect_conductor.conductor.adapters import EMBEDDED_ADAPTER, embedded_adapter_path

    info = resolve_conductor("embedded")
    assert info.path == embedded_adapter_path().resolve()
    assert resolve_conductor(EMBEDDED_ADAPTER).path == info.path
    assert info.base == "smollm2-135m-instruct" and info.prompt == "compact"
    assert (
        info.provenance["stage"] in ("grpo", "warm-start", "self-sampling")
        and info.provenance["mlflow_run"]
    )
    assert info.provenance["command"]  # the project's own command that made it
    size = sum(f.stat().st_size for f in info.path.iterdir())
    assert size <= 10 * 2**20
    assert POOL.conductor.model == f"local/{EMBEDDED_ADAPTER}"


# -- the requests of training-time plan runs -------------------------------------------------------

SEED = 3  # the recipe's seed: sample k of a question is seeded SEED + k


def test_a_grpo_rollout_runs_its_own_plan_on_the_training_pool():
    """``rollout_request`` is the one place the requests of training-time plan runs (GRPO
    rollouts, self-sampled plans) are built."""
    rollout = Rollout("What is 2 + 3?", "q1", "5", "math", "PLAN", meta={"n": 1})
    tags = {
        "train_run": "r",
        "train_stage": "grpo",
        "train_step": "4",
        "rollout": "0",
        "strategy": "grpo-rollout",
    }
    built = rollout_request(
        "pool.yaml", rollout, tags, "mixed", "train", plan_text=rollout.plan_text, plan_source="s"
    )
    assert built == OrchestrateRequest(
        question="What is 2 + 3?",
        pool="pool.yaml",
        question_id="q1",
        reference="5",
        kind="math",
        meta={"n": 1},
        plan_text="PLAN",
        plan_source="s",
        on_invalid_plan="error",
        tags={**tags, "dataset": "mixed", "split": "train"},
    )


def test_a_self_sampled_question_is_planned_by_the_adapter():
    example = Example(id="q7", question="Capital of France?", reference="Paris", kind="text")
    tags = {"train_run": "r", "train_stage": "round-1", "sample": "2"}
    built = rollout_request(
        "pool.yaml",
        example,
        tags,
        "mixed",
        "train",
        conductor="/a",
        conductor_temperature=1.0,
        seed=SEED + 2,
    )
    assert built == OrchestrateRequest(
        question="Capital of France?",
        pool="pool.yaml",
        question_id="q7",
        reference="Paris",
        kind="text",
        meta={},
        conductor="/a",
        conductor_temperature=1.0,
        seed=5,
        on_invalid_plan="error",
        tags={**tags, "dataset": "mixed", "split": "train"},
    )
    assert tags == {"train_run": "r", "train_stage": "round-1", "sample": "2"}  # not mutated
