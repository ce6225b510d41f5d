"""Training recipes end to end on the CPU (issue #40): a tiny random base, fake workers.

- a recipe with a stage of every kind (eval, collect, sft, self-sample, grpo) runs, each
  stage's runs are tagged with the training and the stage, and the ledger's worker calls add
  up to the rows of the ``steps`` table of a fresh store;
- a recipe killed in its middle stage resumes there: finished stages are not run again, the
  MLflow run goes on;
- the ledger is an MLflow metric per stage and a Prefect table artifact.
"""

from __future__ import annotations

import json

import pytest
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.providers.local_model import LocalModelRegistry
from prefect_conductor.conductor.training.config import TrainConductorRequest
from prefect_conductor.conductor.training.recipe import recipe_from_dict

from tests.training_world import training_world

pytestmark = pytest.mark.usefixtures("prefect", "fake_provider")

QUESTIONS = {
    "What is 2 + 3?": "5",
    "What is 10 - 4?": "6",
    "What is 7 * 6?": "42",
    "What is 9 + 9?": "18",
    "What is 8 - 1?": "7",
}
HELD_OUT = {"What is 3 + 4?": "7", "What is 6 * 2?": "12"}


@pytest.fixture()
def setup(tmp_path, monkeypatch, tiny_base):
    yield training_world(tmp_path, monkeypatch, tiny_base, QUESTIONS, HELD_OUT, meta=True)
    LocalModelRegistry.remove(str(tiny_base))


def tiny_recipe(data, tiny_base, **changes) -> dict:
    """A recipe with one stage of every kind, sized for a tiny model on the CPU."""
    recipe = {
        "name": "tiny",
        "dataset": str(data),
        "base": str(tiny_base),
        "heldout": {"split": "test", "limit": 2},
        "stages": [
            {"kind": "eval", "name": "before", "conductor": "start"},
            {"kind": "collect", "name": "collect", "questions": {"limit": 2}},
            {"kind": "sft", "name": "warm-start", "num_train_epochs": 1},
            {"kind": "self-sample", "name": "round", "questions": {"limit": 2},
             "num_generations": 2, "min_right": 99, "max_generations": 4,
             "sft": {"init": "previous", "num_train_epochs": 1, "stages": ["round"]}},
            {"kind": "grpo", "name": "grpo", "max_steps": 1, "num_generations": 2,
             "per_device_train_batch_size": 2, "max_completion_length": 16,
             "questions": {"limit": 2, "fresh": False}},
            {"kind": "eval", "name": "after"},
        ],
    }  # fmt: skip
    recipe.update(changes)
    return recipe


def _request(data, pool, tiny_base, **changes) -> TrainConductorRequest:
    return TrainConductorRequest(
        recipe=recipe_from_dict(tiny_recipe(data, tiny_base, **changes)),
        pool=str(pool),
        eval_concurrency=2,
        rollout_concurrency=4,
    )


def test_a_recipe_of_every_stage_kind_runs_and_its_ledger_adds_up(setup, tiny_base):
    from prefect_conductor.flows.train_conductor import train_conductor

    data, pool, _ = setup
    result = train_conductor(_request(data, pool, tiny_base))
    assert [s.stage for s in result.stages] == [
        "before", "collect", "warm-start", "round", "grpo", "after"
    ]  # fmt: skip
    by = {s.stage: s for s in result.stages}
    assert by["collect"].rollouts == 4  # 2 questions x 2 workers
    # 2 fresh questions x 2 plans, then (min_right not reached) 2 more for each question
    # without a right plan in its first two
    assert by["round"].rollouts in (4, 6, 8)
    assert by["grpo"].steps == 1 and by["grpo"].rollouts == 2
    runs = ArtifactStore().read_pandas("runs")
    steps = ArtifactStore().read_pandas("steps")
    tags = [dict(t) for t in runs["tags"]]
    assert {t["train_run"] for t in tags} == {result.run_id}
    # the self-sampled questions are not the collected ones: rounds walk through the split
    stage_q = {
        s: {r.question_id for r, t in zip(runs.itertuples(), tags, strict=True)
            if t["train_stage"] == s}
        for s in ("collect", "round")
    }  # fmt: skip
    assert stage_q["collect"].isdisjoint(stage_q["round"])
    # the round's SFT learns the round's own verified plans only (``sft.stages``), not the
    # collected ones the warm start learned
    right_in_round = {
        r.question_id for r, t in zip(runs.itertuples(), tags, strict=True)
        if t["train_stage"] == "round" and r.correct in (True, 1)
    }  # fmt: skip
    round_runs = [
        (r.question_id, int(t["sample"]), r.correct in (True, 1))
        for r, t in zip(runs.itertuples(), tags, strict=True)
        if t["train_stage"] == "round"
    ]
    first_right = {q for q, k, ok in round_runs if ok and k < 2}
    assert sorted(k for q, k, _ in round_runs if q in first_right) == [0, 1] * len(first_right)
    again = sorted(k for q, k, _ in round_runs if q not in first_right)
    assert again == sorted([0, 1, 2, 3] * (2 - len(first_right)))
    assert by["round"].rollouts == len(round_runs)
    assert by["warm-start"].examples > 0
    assert bool(by["round"].examples) == bool(right_in_round)
    ledger = {e.stage: e for e in result.ledger}
    stages = [e for e in result.ledger if e.stage != "total"]
    called = int((steps["status"] != "skipped").sum())
    assert sum(e.worker_calls for e in stages) == ledger["total"].worker_calls == called
    assert ledger["total"].input_tokens == int(steps["input_tokens"].fillna(0).sum())
    assert ledger["collect"].conductor_generations == 0  # single workers: no plan written
    assert ledger["round"].conductor_generations == by["round"].rollouts
    assert ledger["warm-start"].worker_calls == 0
    assert ledger["collect"].worker_calls == 4


def test_a_recipe_killed_in_its_middle_stage_resumes_there(setup, tiny_base, monkeypatch):
    """The training dies in the self-sampling stage; the same recipe again resumes at that
    stage in the same MLflow run: the collection and the warm start are not run twice."""
    import mlflow
    from prefect_conductor.flows import _stages as module
    from prefect_conductor.flows.train_conductor import train_conductor
    from prefect_conductor.tasks.tracking import tracking_uri

    data, pool, _ = setup
    recipe = {"stages": tiny_recipe(data, tiny_base)["stages"][1:4]}  # collect, sft, round
    del recipe["stages"][2]["sft"]["stages"]  # the round's SFT learns the collected plans too
    request = _request(data, pool, tiny_base, **recipe)
    sft_calls = []
    real_sft = module.warm_start_train

    def counting_sft(*args, **kwargs):
        sft_calls.append(kwargs.get("stage"))
        return real_sft(*args, **kwargs)

    monkeypatch.setattr(module, "warm_start_train", counting_sft)
    real_sample = module.Training.self_sample

    def killed(self, stage):
        raise RuntimeError("killed")

    monkeypatch.setattr(module.Training, "self_sample", killed)
    state = train_conductor(request, return_state=True)
    assert state.is_failed()
    collected = len(ArtifactStore().read_pandas("runs"))
    assert sft_calls == ["warm-start"] and collected == 4

    monkeypatch.setattr(module.Training, "self_sample", real_sample)
    result = train_conductor(request)
    assert result.resumed_at == "round"
    assert sft_calls == ["warm-start", "round"]  # the warm start was not trained again
    runs = ArtifactStore().read_pandas("runs")
    stages = [dict(t)["train_stage"] for t in runs["tags"]]
    assert stages.count("collect") == 4  # not collected again
    assert {dict(t)["train_run"] for t in runs["tags"]} == {result.run_id}  # one MLflow run
    assert [s.stage for s in result.stages] == ["collect", "warm-start", "round", "after"]
    assert [e.stage for e in result.ledger][:4] == ["collect", "warm-start", "round", "after"]
    # the resumed stages' ledger comes from the progress file, as they spent it
    assert result.ledger[0].worker_calls == 4
    client = mlflow.MlflowClient(tracking_uri())
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["collect/worker_calls"] == 4
    assert run.data.metrics["total/worker_calls"] == result.ledger[-1].worker_calls
    # finished: the same command now starts a new training
    again = train_conductor(request.model_copy(update={"promote": False}))
    assert again.run_id != result.run_id and again.resumed_at is None


def test_a_training_killed_after_registering_resumes_without_registering_twice(
    setup, tiny_base, monkeypatch
):
    """Killed between the registration and the end (found by ``benchmarks/recipe_resume.py``):
    the same command resumes at ``registration``, registers nothing again, and ends the
    stage runs a kill left RUNNING as KILLED."""
    import mlflow
    from prefect_conductor.flows import train_conductor as module
    from prefect_conductor.tasks.tracking import tracking_uri

    data, pool, _ = setup
    recipe = {"stages": tiny_recipe(data, tiny_base)["stages"][1:3]}  # collect, sft
    request = _request(data, pool, tiny_base, **recipe)
    real_artifact = module.ledger_artifact

    def killed(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(module, "ledger_artifact", killed)
    assert module.train_conductor(request, return_state=True).is_failed()
    client = mlflow.MlflowClient(tracking_uri())
    (version,) = client.search_model_versions("name='conductor'")
    parent = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string=f"attributes.run_id = '{version.run_id}'",
    )[0]
    orphan = client.create_run(
        parent.info.experiment_id, tags={"mlflow.parentRunId": version.run_id}
    )  # a stage run as a SIGKILL leaves it: RUNNING

    monkeypatch.setattr(module, "ledger_artifact", real_artifact)
    result = module.train_conductor(request)
    assert result.resumed_at == "registration" and result.run_id == version.run_id
    assert [v.version for v in client.search_model_versions("name='conductor'")] == [
        version.version
    ]
    assert result.model_version == str(version.version)
    assert client.get_run(orphan.info.run_id).info.status == "KILLED"
    assert client.get_run(result.run_id).info.status == "FINISHED"


def test_the_ledger_is_a_prefect_table_artifact(setup, tiny_base):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect_conductor.flows.train_conductor import train_conductor

    data, pool, _ = setup
    stages = tiny_recipe(data, tiny_base)["stages"][1:3]  # collect, sft
    result = train_conductor(_request(data, pool, tiny_base, stages=stages))

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["training-ledger"]))
            )

    import asyncio

    # the server is shared by this module's tests: this training's artifact names its run
    (artifact,) = [a for a in asyncio.run(read()) if result.run_id in (a.description or "")]
    rows = artifact.data if isinstance(artifact.data, list) else json.loads(artifact.data)
    assert [r["stage"] for r in rows] == [e.stage for e in result.ledger]
    # collect (2 questions x 2 workers), after and the incumbent's eval (2 questions each)
    assert [r["stage"] for r in rows] == ["collect", "warm-start", "after", "incumbent", "total"]
    assert rows[-1]["worker_calls"] == result.ledger[-1].worker_calls == 4 + 2 + 2


def test_a_teacher_conductor_plans_the_collect_stage(setup, tiny_base):
    """``collect`` with a ``teacher``: a litellm model plans every question on a copy of
    the pool (here the tiny local model; a hosted one in real use), each run stored and
    tagged with the teacher; then the single workers' stage and an SFT as usual."""
    from prefect_conductor.flows.train_conductor import train_conductor

    data, pool, _ = setup
    teacher = f"local/{tiny_base}"
    stages = [
        {"kind": "collect", "name": "teach", "teacher": teacher, "questions": {"limit": 2}},
        {"kind": "collect", "name": "collect", "questions": {"limit": 2}},
        {"kind": "sft", "name": "distil", "num_train_epochs": 1},
    ]
    result = train_conductor(_request(data, pool, tiny_base, stages=stages))
    runs = ArtifactStore().read_pandas("runs")
    taught = [r for r in runs.itertuples() if dict(r.tags)["train_stage"] == "teach"]
    assert len(taught) == 2 and {dict(r.tags)["teacher"] for r in taught} == {teacher}
    assert {r.conductor_model for r in taught} == {teacher}
    assert all(r.conductor_output is not None for r in taught)  # the teacher wrote plans
    ledger = {e.stage: e for e in result.ledger}
    assert ledger["teach"].conductor_generations == 2
    # the stages' questions are disjoint: the teacher's two, then the next two
    collected = {
        r.question_id for r in runs.itertuples() if dict(r.tags)["train_stage"] == "collect"
    }
    assert collected.isdisjoint(r.question_id for r in taught)
