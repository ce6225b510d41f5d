"""OrchRM end to end on the CPU: stored runs -> pairs -> RewardTrainer -> registry -> best-of-N.

A tiny random backbone (from a config) and fake workers: ``oracle`` knows the answers,
``echo`` repeats its input. Runs come from a real ``random-plan`` eval with ``--samples``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.plan.requests import EvalRequest, OrchestrateRequest
from prefect_conductor.reward_model.model import RewardModelRequest, load_reward_model
from safetensors.torch import load_file

from prefect_conductor.testing.fakes import ANSWERS
from tests.local_cli import run_cli

pytestmark = pytest.mark.usefixtures("prefect", "fake_provider")

QUESTIONS = {
    "What is 2 + 3?": "5",
    "What is 10 - 4?": "6",
    "What is 7 * 6?": "42",
    "What is 9 + 9?": "18",
    "What is 8 - 1?": "7",
    "What is 3 * 3?": "9",
}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_base):
    """A home with stored random-plan runs (4 samples per question) and a trained OrchRM."""
    import os

    from prefect_conductor.flows.evaluate import evaluate
    from prefect_conductor.flows.train_reward_model import train_reward_model

    root = tmp_path_factory.mktemp("orchrm")
    saved = {k: os.environ.get(k) for k in ("CONDUCTOR_HOME", "MLFLOW_TRACKING_URI")}
    os.environ["CONDUCTOR_HOME"] = str(root / "home")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    data = root / "mini.jsonl"
    rows = [
        {"id": f"{split}-q{i}", "question": q, "reference": a, "kind": "math", "split": split}
        for split in ("train", "test")
        for i, (q, a) in enumerate(QUESTIONS.items())
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    ANSWERS.clear()
    ANSWERS.update({q: f"The answer is {a}." for q, a in QUESTIONS.items()})
    pool = root / "pool.yaml"
    pool.write_text(
        yaml.safe_dump(
            {
                "conductor": {"model": "fake/echo"},
                "workers": [
                    {"name": "oracle", "model": "fake/lookup", "description": "Knows answers."},
                    {"name": "echo", "model": "fake/echo", "description": "Repeats."},
                ],
                "max_steps": 3,
            }
        )
    )
    from prefect_conductor.testing.fakes import register_fake_provider

    register_fake_provider()
    eval_result = evaluate(
        EvalRequest(
            dataset=str(data),
            split="train",
            strategy="random-plan",
            samples=4,
            pool=str(pool),
            concurrency=8,
        )
    )
    # A split seed that holds out some of the six questions, not all.
    from prefect_conductor.reward_model.pairs import split_of

    seed = next(
        s
        for s in range(100)
        if 2 <= [split_of(f"train-q{i}", 0.34, s) for i in range(6)].count("test") <= 3
    )
    request = RewardModelRequest(
        base=str(tiny_base),
        pool=str(pool),
        min_pairs=1,
        max_steps=3,
        batch_size=4,
        learning_rate=1e-2,
        test_fraction=0.34,
        seed=seed,
    )
    trained = train_reward_model(request)
    yield {"data": data, "pool": pool, "eval": eval_result, "request": request, "trained": trained}
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_samples_store_k_runs_per_question_tagged_and_report_pass_at_k(world):
    result = world["eval"]
    assert (result.n, result.questions, result.samples) == (24, 6, 4)
    runs = ArtifactStore().read_pandas("runs")
    tags = runs["tags"].map(dict)
    assert sorted(tags.map(lambda t: t.get("sample")).value_counts().to_dict().items()) == [
        (str(k), 6) for k in range(4)
    ]
    solved = runs[runs["correct"].fillna(False).astype(bool)]["question_id"].nunique()
    assert result.pass_at_k == pytest.approx(solved / 6)
    # Four different seeds: the four plans of one question are not all the same.
    plans = runs.groupby("question_id")["workflow_json"].nunique()
    assert (plans > 1).any()


def test_train_rm_stores_pairs_tracks_registers_and_changes_weights(world):
    import mlflow
    from prefect_conductor.tasks.tracking import tracking_uri

    trained = world["trained"]
    assert trained.trained, trained.message
    assert trained.pairs_train > 0 and trained.pairs_test > 0
    assert sum(trained.pairs_by_source.values()) == trained.pairs_train + trained.pairs_test
    assert 0.0 <= trained.pairwise_accuracy <= 1.0
    assert set(trained.pairwise_accuracy_by_source) <= set(trained.pairs_by_source)
    stored = ArtifactStore().read_pandas("pairs")
    assert len(stored) == trained.pairs_new == trained.pairs_train + trained.pairs_test
    assert set(stored["pair_set"]) and not (
        set(stored[stored.split == "train"].question_id)
        & set(stored[stored.split == "test"].question_id)
    )
    # LoRA B starts at zero: after the RewardTrainer steps it is not; the score head is saved.
    weights = load_file(str(Path(trained.model_dir) / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in weights.items())
    assert any("score" in k for k in weights)
    client = mlflow.MlflowClient(tracking_uri())
    run = client.get_run(trained.run_id)
    assert run.data.metrics["pairwise_accuracy"] == pytest.approx(trained.pairwise_accuracy)
    assert run.data.metrics["pairs_train"] == trained.pairs_train
    assert client.get_model_version_by_alias("orchrm", "champion").run_id == trained.run_id
    assert client.get_model_version_by_alias("orchrm", "candidate").run_id == trained.run_id
    nested = client.search_runs(
        [run.info.experiment_id], f"tags.mlflow.parentRunId = '{trained.run_id}'"
    )
    assert any("loss" in r.data.metrics or "train_loss" in r.data.metrics for r in nested)


def test_train_rm_without_enough_new_pairs_trains_nothing(world):
    from prefect_conductor.flows.train_reward_model import train_reward_model

    again = train_reward_model(world["request"])
    assert not again.trained and again.run_id is None and again.pairs_new == 0
    assert "nothing trained" in again.message


def test_a_worse_candidate_is_not_promoted(world):
    import mlflow
    from prefect_conductor.tasks.reward_model import register_reward_model, start_rm_run
    from prefect_conductor.tasks.tracking import tracking_uri

    trained = world["trained"]
    run_id = start_rm_run.fn(world["request"], {})
    reg = register_reward_model.fn(
        run_id,
        Path(trained.model_dir),
        accuracy=0.1,
        champion_accuracy=0.9,
        has_champion=True,
        promote=True,
    )
    client = mlflow.MlflowClient(tracking_uri())
    assert not reg.promoted
    assert str(client.get_model_version_by_alias("orchrm", "candidate").version) == reg.version
    assert client.get_model_version_by_alias("orchrm", "champion").run_id == trained.run_id


def test_scores_are_deterministic_and_batching_does_not_change_them(world):
    rm = load_reward_model(world["trained"].model_dir)
    plans = [
        {"model_id": ["oracle"], "subtasks": ["What is 2 + 3?"], "access_list": [[]]},
        {"model_id": ["echo", "oracle"], "subtasks": ["a", "b"], "access_list": [[], [0]]},
        "not a plan at all",
    ]
    outputs = [[("completed", "The answer is 5.")], [("failed", "boom"), ("skipped", None)], None]
    first = rm.score("What is 2 + 3?", plans, outputs, pool_description="oracle, echo")
    again = rm.score("What is 2 + 3?", plans, outputs, pool_description="oracle, echo")
    assert first == again and len(first) == 3
    rm.batch_size = 1
    try:
        one_by_one = rm.score("What is 2 + 3?", plans, outputs, pool_description="oracle, echo")
    finally:
        rm.batch_size = 16
    assert one_by_one == pytest.approx(first, abs=1e-4)
    with_outputs = rm.score("What is 2 + 3?", plans[:1], outputs[:1], pool_description="x")
    plan_only = rm.score("What is 2 + 3?", plans[:1], None, pool_description="x")
    assert with_outputs != plan_only  # the outputs are read


def _runs_of(selection_id: str):
    runs = ArtifactStore().read_pandas("runs")
    return runs[runs["tags"].map(lambda t: dict(t).get("selection_id") == selection_id)]


def test_best_of_n_runs_all_candidates_and_picks_the_top_score(world):
    from prefect_conductor.flows.best_of_n import best_of_n

    result = best_of_n(
        OrchestrateRequest(
            question="What is 9 + 9?",
            question_id="train-q3",
            reference="18",
            pool=str(world["pool"]),
            strategy="best-of-n:3:random-plan",
            rm=world["trained"].model_dir,
        ),
        return_state=True,
    ).result(raise_on_failure=False)
    s = result.selection
    assert s["executed"] == 3 and len(s["scores"]) == 3
    assert s["chosen"] == max(range(3), key=lambda i: (s["scores"][i], -i))
    assert result.run_id == s["candidates"][s["chosen"]]["run_id"]
    assert s["oracle_correct"] == any(c["correct"] for c in s["candidates"])
    stored = _runs_of(s["selection_id"])
    assert len(stored) == 3
    assert sorted(stored["tags"].map(lambda t: dict(t)["candidate"])) == ["0", "1", "2"]
    assert result.input_tokens + result.output_tokens == s["tokens"]


def test_best_of_n_plan_scores_before_running_and_runs_exactly_one_plan(world):
    from prefect_conductor.flows.best_of_n import best_of_n

    result = best_of_n(
        OrchestrateRequest(
            question="What is 7 * 6?",
            question_id="train-q2",
            reference="42",
            pool=str(world["pool"]),
            strategy="best-of-n-plan:4:random-plan",
            rm=world["trained"].model_dir,
        )
    )
    s = result.selection
    assert s["executed"] == 1
    assert s["chosen"] == max(range(4), key=lambda i: (s["plan_scores"][i], -i))
    stored = _runs_of(s["selection_id"])
    assert len(stored) == 1 and stored.iloc[0]["run_id"] == result.run_id
    assert dict(stored.iloc[0]["tags"])["selected"] == "true"
    steps = ArtifactStore().read_pandas("steps")
    ran = steps[steps["run_id"] == result.run_id]
    assert len(ran) == len(result.workflow)  # only the chosen plan's steps ran
    assert [c["run_id"] is None for c in s["candidates"]].count(False) == 1


def test_eval_best_of_n_reports_baselines_on_the_same_candidates(world):
    from prefect_conductor.flows.evaluate import evaluate

    result = evaluate(
        EvalRequest(
            dataset=str(world["data"]),
            split="test",
            limit=3,
            strategy="best-of-n:3:random-plan",
            pool=str(world["pool"]),
            rm=world["trained"].model_dir,
        )
    )
    sel = result.selection
    assert set(sel) == {
        "majority_accuracy",
        "random_accuracy",
        "oracle_accuracy",
        "plan_pick_accuracy",
    }
    # The oracle bounds every pick made among the same candidates.
    assert (
        max(result.accuracy, sel["majority_accuracy"], sel["random_accuracy"])
        <= (sel["oracle_accuracy"])
    )


def test_orchrm_reward_scores_the_plan_each_completion_writes(world):
    from prefect_conductor.conductor.plan.prompts import describe_workers
    from prefect_conductor.conductor.pool import load_pool
    from prefect_conductor.reward_model.rewards import OrchRMReward

    pool = load_pool(world["pool"])
    reward = OrchRMReward(world["trained"].model_dir, pool)
    good = 'model_id = [0]\nsubtasks = ["What is 2 + 3?"]\naccess_list = [[]]'
    scores = reward(["p", "p"], [good, "no plan here"], question=["What is 2 + 3?"] * 2)
    rm = load_reward_model(world["trained"].model_dir)
    expected = rm.score(
        "What is 2 + 3?",
        [
            {"model_id": ["oracle"], "subtasks": ["What is 2 + 3?"], "access_list": [[]]},
            "no plan here",
        ],
        pool_description=describe_workers(pool),
    )
    assert scores == pytest.approx(expected) and scores[0] != scores[1]
    with pytest.raises(ValueError, match="question"):
        reward(["p"], [good])


def test_pairs_can_be_limited_to_one_split(world):
    from prefect_conductor.conductor.pool import load_pool
    from prefect_conductor.tasks.reward_model import build_reward_pairs

    pool = load_pool(world["pool"])
    every = build_reward_pairs.fn(world["request"], pool, "x")
    only_test = build_reward_pairs.fn(
        world["request"].model_copy(update={"split": "test"}), pool, "x"
    )
    assert len(every.train) + len(every.test) > 0
    # The eval above ran the test split after training: those runs alone give the test pairs.
    runs = ArtifactStore().read_pandas("runs")
    test_questions = {
        q
        for q, t in zip(runs["question"], runs["tags"], strict=True)
        if dict(t).get("split") == "test"
    }
    for pair in only_test.train + only_test.test:
        assert pair["input"].splitlines()[0].removeprefix("Question: ") in test_questions


def test_new_since_counts_the_pairs_of_recent_runs_but_every_pair_is_trained_on(world):
    from prefect_conductor.conductor.pool import load_pool
    from prefect_conductor.tasks.reward_model import build_reward_pairs

    pool = load_pool(world["pool"])
    every = build_reward_pairs.fn(world["request"], pool, "x")
    created = sorted(ArtifactStore().read_pandas("runs")["created_at"])
    news = []
    for cut in (created[0], created[len(created) // 2], created[-1] + pd.Timedelta(seconds=1)):
        since = world["request"].model_copy(update={"new_since": cut.isoformat()})
        built = build_reward_pairs.fn(since, pool, "x")
        assert (built.train, built.test) == (every.train, every.test)  # trained on every pair
        assert built.new == sum(built.stats["new"]["by_source"].values())
        news.append(built.new)
    # every run is recent: every pair is new; none is: nothing is new; halfway: in between
    assert news[0] == len(every.train) + len(every.test) > news[1] >= news[2] == 0


def _cli(tmp_path: Path, *args: str):
    return run_cli(tmp_path, *args, timeout=600)


def test_cli_train_rm_with_too_few_pairs_says_so_in_one_line_and_exits_0(tmp_path):
    proc = _cli(tmp_path, "train-rm", "--min-pairs", "5")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "0 new pairs, fewer than --min-pairs 5: nothing trained"
    proc = _cli(tmp_path, "train-rm", "--min-pairs", "5", "--json")
    result = json.loads(proc.stdout)
    assert result["trained"] is False and result["run_id"] is None


def test_cli_best_of_n_without_a_reward_model_is_one_line_exit_2(tmp_path):
    for args in (
        ["eval", "--dataset", "arithmetic", "--limit", "1", "--strategy", "best-of-n:2"],
        ["run", "What is 2 + 2?", "--best-of", "2", "--plan-only"],
    ):
        proc = _cli(tmp_path, *args)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert "models:/orchrm@champion" in last and "conductor train-rm" in last
    proc = _cli(tmp_path, "run", "What is 2 + 2?", "--plan-only")
    assert proc.returncode == 2 and "--plan-only goes with --best-of N" in proc.stderr
    proc = _cli(tmp_path, "eval", "--dataset", "arithmetic", "--strategy", "best-of-n:1")
    assert proc.returncode == 2 and "N must be between 2 and 64" in proc.stderr


def test_orchrm_reward_function_uses_the_champion(world):
    from prefect_conductor.conductor.plan.prompts import describe_workers
    from prefect_conductor.conductor.pool import load_pool
    from prefect_conductor.reward_model.model import CHAMPION
    from prefect_conductor.reward_model.rewards import OrchRMReward
    from prefect_conductor.tasks.registry import download_registered

    reward = OrchRMReward(CHAMPION, load_pool(), download_registered)
    (score,) = reward(["p"], ["no plan at all"], question=["What is 2 + 3?"])
    rm = load_reward_model(world["trained"].model_dir)  # the champion of this home
    expected = rm.score(
        "What is 2 + 3?", ["no plan at all"], pool_description=describe_workers(load_pool())
    )
    assert score == pytest.approx(expected[0])


PLAN_A = 'model_id = ["oracle"]\nsubtasks = ["Answer the question."]\naccess_list = [[]]'
PLAN_B = (
    'model_id = ["echo", "oracle"]\nsubtasks = ["Repeat it.", "Answer the question."]\n'
    "access_list = [[], [0]]"
)


@pytest.mark.parametrize("execute", [1, 2])
def test_guided_self_sampling_merges_identical_plans_and_runs_only_orchrms_top_m(
    world, tmp_path, execute
):
    """Issue #41: 4 plans written per question (A, A, B, unparseable), A's twins merged,
    OrchRM scores A and B plan-only and only the top ``execute`` run (counted in the steps
    table); the unparseable one is stored as the invalid run it is, with no step."""
    from prefect import flow
    from prefect_conductor.conductor.pool import load_pool
    from prefect_conductor.conductor.training.config import TrainConductorRequest
    from prefect_conductor.conductor.training.recipe import recipe_from_dict
    from prefect_conductor.flows import _stages as tc

    from prefect_conductor.testing.fakes import CYCLE

    pool_doc = yaml.safe_load(world["pool"].read_text())
    pool_doc["conductor"] = {"model": "fake/cycle"}
    pool = tmp_path / "cycle.yaml"
    pool.write_text(yaml.safe_dump(pool_doc))
    CYCLE[:] = [PLAN_A, PLAN_A, PLAN_B, "no plan at all"]
    guide = {"orchrm": str(world["trained"].model_dir), "execute": execute}
    recipe = recipe_from_dict({
        "dataset": str(world["data"]), "heldout": {"limit": 1},
        "stages": [{"kind": "self-sample", "name": f"guided-{execute}", "num_generations": 4,
                    "questions": {"limit": 2}, "guide": guide}],
    })  # fmt: skip
    request = TrainConductorRequest(recipe=recipe, pool=str(pool))
    stage = recipe.stages[0]

    @flow
    def sample_only():
        training = tc.Training(request, f"guided-run-{execute}", load_pool(pool))
        training.sft = lambda *a, **k: tc.StageReport(stage=stage.name, kind="sft")
        return training.self_sample(stage)

    report = sample_only()
    assert report.sampled == 8 and report.questions == 2
    runs = ArtifactStore().read_pandas("runs")
    mine = runs[runs["tags"].map(lambda t: dict(t).get("train_run") == f"guided-run-{execute}")]
    invalid = mine[~mine["format_valid"]]
    ran = mine[mine["format_valid"]]
    assert len(invalid) == 2  # one unparseable plan per question, stored, never executed
    assert len(ran) == 2 * execute == report.rollouts - 2  # A and B distinct: top m of 2
    # the merged twin of A is never run: at most one run per distinct plan and question
    assert not ran.duplicated(["question_id", "conductor_output"]).any()
    steps = ArtifactStore().read_pandas("steps")
    assert steps["run_id"].isin(invalid["run_id"]).sum() == 0
    executed = steps[steps["run_id"].isin(ran["run_id"])]
    assert len(executed) == sum(1 if t == PLAN_A else 2 for t in ran["conductor_output"])
    if execute == 1:  # the one run is OrchRM's higher-scored plan
        first = ran.iloc[0]
        scores = load_reward_model(str(world["trained"].model_dir)).score(
            first["question"],
            [json.loads(json.dumps(p)) for p in (_lists(PLAN_A, pool), _lists(PLAN_B, pool))],
            None,
            pool_description=_workers(pool),
        )
        assert first["conductor_output"] == (PLAN_A if scores[0] >= scores[1] else PLAN_B)
    assert {dict(t)["guided"] for t in ran["tags"]} == {"orchrm"}


def _lists(text: str, pool: Path) -> dict:
    from prefect_conductor.conductor.plan.parse import parse_plan
    from prefect_conductor.conductor.pool import load_pool

    return parse_plan(text, load_pool(pool)).to_lists()


def _workers(pool: Path) -> str:
    from prefect_conductor.conductor.plan.prompts import describe_workers
    from prefect_conductor.conductor.pool import load_pool

    return describe_workers(load_pool(pool))


def test_grpo_with_the_orchrm_reward_executes_only_its_fraction_of_the_rollouts(
    world, tmp_path, tiny_base
):
    """Issue #41: ``reward: orchrm`` — OrchRM scores every rollout; a quarter of them run (the
    runs table of the stage has exactly that many), the rest cost no worker call."""
    from prefect_conductor.conductor.training.config import TrainConductorRequest
    from prefect_conductor.conductor.training.recipe import recipe_from_dict
    from prefect_conductor.flows.train_conductor import train_conductor

    recipe = recipe_from_dict({
        "dataset": str(world["data"]), "base": str(tiny_base), "heldout": {"limit": 1},
        "stages": [{"kind": "grpo", "name": "rm-grpo", "max_steps": 2, "num_generations": 2,
                    "per_device_train_batch_size": 4, "max_completion_length": 16,
                    "questions": {"limit": 4}, "reward": "orchrm", "execute_fraction": 0.25,
                    "orchrm": str(world["trained"].model_dir)}],
    })  # fmt: skip
    request = TrainConductorRequest(
        recipe=recipe, pool=str(world["pool"]), promote=False, output_dir=str(tmp_path)
    )
    result = train_conductor(request)
    report = next(s for s in result.stages if s.stage == "rm-grpo")
    assert report.steps == 2 and report.sampled == 8  # 2 steps x 4 completions
    assert report.rollouts == 2  # 0.25 of 8, and only those ran
    runs = ArtifactStore().read_pandas("runs")
    mine = runs[runs["tags"].map(lambda t: dict(t).get("train_run") == result.run_id)]
    stage_runs = mine[mine["tags"].map(lambda t: dict(t).get("train_stage") == "rm-grpo")]
    assert len(stage_runs) == 2
    ledger = {e.stage: e for e in result.ledger}
    assert ledger["rm-grpo"].conductor_generations == 8  # every rollout written, 2 executed
    assert (Path(report.adapter) / "adapter_config.json").is_file()
