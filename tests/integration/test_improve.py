"""The ``improve`` loop (issue #41) on a tiny random model and fake workers: iterations end
to end, resume after a kill, promotion only when better, too little data, and unreferenced
runs that give only label-free pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.plan.requests import EvalRequest, OrchestrateRequest
from prefect_conductor.conductor.training.improve import ImproveRequest, ImproveState

from prefect_conductor.testing.fakes import CYCLE
from tests.training_world import training_world

pytestmark = pytest.mark.usefixtures("prefect", "fake_provider")

TRAIN = {f"What is {a} + {b}?": str(a + b) for a, b in [(2, 3), (4, 5), (6, 1), (7, 2), (3, 3)]}
TEST = {"What is 8 + 1?": "9", "What is 5 + 5?": "10"}
LABEL_FREE = {"valid-over-invalid", "step-completed-over-failed"}


def _recipe(tmp_path: Path, data: Path, tiny_base: Path) -> Path:
    recipe = {
        "name": "tiny-improve",
        "dataset": str(data),
        "base": str(tiny_base),
        "heldout": {"limit": 2},
        "stages": [
            {"kind": "self-sample", "name": "guided", "num_generations": 2,
             "questions": {"limit": 2, "fresh": "store"}, "guide": {"execute": 1},
             "sft": {"init": "previous", "num_train_epochs": 1, "max_examples": 4}},
            {"kind": "eval", "name": "after"},
        ],
    }  # fmt: skip
    path = tmp_path / "improve.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _rm(tiny_base: Path, **changes) -> dict:
    return {"base": str(tiny_base), "min_pairs": 1, "max_steps": 2, "batch_size": 4,
            "test_fraction": 0.34, **changes}  # fmt: skip


def _pairs_trained(uri: str) -> float:
    """How many pairs the OrchRM version ``models:/orchrm/N`` was trained on (MLflow)."""
    import mlflow
    from prefect_conductor.tasks.tracking import tracking_uri

    client = mlflow.MlflowClient(tracking_uri())
    version = client.get_model_version("orchrm", uri.rsplit("/", 1)[-1])
    return client.get_run(version.run_id).data.metrics["pairs_train"]


def _guided_questions(run_id: str) -> set[str]:
    runs = ArtifactStore().read_pandas("runs")
    tags = runs["tags"].map(dict)
    keep = tags.map(lambda t: t.get("train_run") == run_id and t.get("train_stage") == "guided")
    return set(runs.loc[keep, "question"])


def test_the_loop_resumes_a_killed_iteration_then_improves_again_then_stops(
    tmp_path, monkeypatch, tiny_base
):
    from prefect_conductor.flows import improve as loop
    from prefect_conductor.flows.evaluate import evaluate

    data, pool, _ = training_world(tmp_path, monkeypatch, tiny_base, TRAIN, TEST)
    evaluate(EvalRequest(dataset=str(data), split="train", strategy="random-plan", samples=4,
                         pool=str(pool), concurrency=8))  # fmt: skip
    request = ImproveRequest(
        recipe=str(_recipe(tmp_path, data, tiny_base)),
        pool=str(pool),
        min_new_runs=10,
        reward_model=_rm(tiny_base),
    )
    real_train, real_rm = loop.train_conductor, loop.train_reward_model
    rm_calls = []

    def killed(*args, **kwargs):
        raise RuntimeError("killed")

    def counted(*args, **kwargs):
        rm_calls.append(1)
        return real_rm(*args, **kwargs)

    monkeypatch.setattr(loop, "train_conductor", killed)
    monkeypatch.setattr(loop, "train_reward_model", counted)
    with pytest.raises(RuntimeError, match="killed"):
        loop.improve(request)
    state = ImproveState.load()
    (dead,) = state.iterations
    assert not dead.finished and dead.orchrm_wall_s is not None and dead.orchrm_trained
    assert dead.runs.total == 20 == dead.runs.referenced  # 5 questions x 4 samples
    assert dead.pairs_by_source and sum(dead.pairs_by_source.values()) >= dead.pairs_new > 0

    monkeypatch.setattr(loop, "train_conductor", real_train)
    first = loop.improve(request)
    assert len(rm_calls) == 1  # resumed after OrchRM's step: not trained again
    assert (first.iteration, first.until, first.mlflow_run_id) == (
        1, dead.until, dead.mlflow_run_id
    )  # fmt: skip
    assert first.finished and first.stopped is None and first.conductor_run_id
    ledger = {e.stage: e for e in first.ledger}
    assert ledger["orchrm"].worker_calls == 0
    assert ledger["total"].worker_calls == sum(
        e.worker_calls for e in first.ledger if e.stage != "total"
    )
    steps = ArtifactStore().read_pandas("steps")
    runs = ArtifactStore().read_pandas("runs")
    mine = runs[runs["tags"].map(lambda t: dict(t).get("train_run") == first.conductor_run_id)]
    called = steps[steps["run_id"].isin(mine["run_id"]) & (steps["status"] != "skipped")]
    assert ledger["total"].worker_calls == len(called)
    # promoted only if better than the champion on the same held-out questions
    assert first.conductor_promoted == (first.accuracy_after > (first.accuracy_before or 0.0))

    # the next iteration's window starts where the first ended: the first's own runs
    second = loop.improve(request.model_copy(update={"min_new_runs": 1}))
    assert second.iteration == 2 and second.since == first.until and second.runs.total > 0
    assert second.finished and second.stopped is None
    # OrchRM is retrained on the pairs of every stored run, the window's runs adding the new
    # ones: never on the window's pairs alone (a handful, judged on a handful held out)
    assert second.orchrm_trained and second.pairs_new == sum(second.pairs_by_source.values())
    assert _pairs_trained(second.orchrm_uri) > second.pairs_new
    assert _pairs_trained(second.orchrm_uri) >= _pairs_trained(first.orchrm_uri)
    assert second.runs.total == len(runs[runs["created_at"] >= first.until])
    # fresh: store: the round samples questions no earlier training sampled
    assert _guided_questions(second.conductor_run_id).isdisjoint(
        _guided_questions(first.conductor_run_id)
    )
    third = loop.improve(request.model_copy(update={"min_new_runs": 10_000}))
    assert third.stopped.startswith("too little new data:") and third.conductor_run_id is None
    assert ImproveState.load().window_start() == second.until  # its runs wait for the next

    import mlflow
    from prefect_conductor.tasks.tracking import tracking_uri

    client = mlflow.MlflowClient(tracking_uri())
    tracked = client.get_run(first.mlflow_run_id)
    assert tracked.info.status == "FINISHED"
    assert tracked.data.metrics["runs"] == 20
    assert tracked.data.metrics["total/worker_calls"] == ledger["total"].worker_calls

    # Lineage, read back through the Prefect API: conductor -> OrchRM -> pairs -> runs.
    from prefect_conductor.tasks.assets import model_asset, table_asset

    conductor = model_asset("conductor", second.conductor_uri.rsplit("/", 1)[-1])
    guide = second.orchrm_uri if second.orchrm_promoted else first.orchrm_uri  # the champion
    orchrm = model_asset("orchrm", guide.rsplit("/", 1)[-1])
    runs_table, pairs_table = table_asset("runs"), table_asset("pairs")
    upstream = _materialized({conductor, orchrm, pairs_table, runs_table})
    assert {runs_table, table_asset("steps"), orchrm} <= upstream[conductor]
    assert upstream[orchrm] == {pairs_table}
    assert {runs_table, table_asset("steps")} == upstream[pairs_table]
    assert runs_table in upstream  # materialised by the tasks that store runs


def _materialized(keys: set[str], timeout_s: float = 60) -> dict[str, set[str]]:
    """Each asset's upstream assets, from the Prefect server's materialisation events (they
    are sent asynchronously: waited for until every key in ``keys`` has one)."""
    import asyncio
    import time

    from prefect.client.orchestration import get_client

    async def read() -> list[dict]:
        body = {
            "filter": {
                "event": {"name": ["prefect.asset.materialization.succeeded"]},
                "occurred": {"since": "2020-01-01T00:00:00Z"},
            },
            "limit": 50,
        }
        async with get_client() as client:
            page = (await client._client.post("/events/filter", json=body)).json()
            events = page["events"]
            while page.get("next_page") and len(events) < 2000:
                page = (await client._client.get(page["next_page"])).json()
                events += page["events"]
            return events  # fmt: skip

    deadline = time.monotonic() + timeout_s
    while True:
        upstream: dict[str, set[str]] = {}
        for event in asyncio.run(read()):
            key = event["resource"]["prefect.resource.id"]
            assets = {r["prefect.resource.id"] for r in event.get("related", [])
                      if r.get("prefect.resource.role") == "asset"}  # fmt: skip
            upstream.setdefault(key, set()).update(assets)
        if keys <= set(upstream) or time.monotonic() > deadline:
            return upstream
        time.sleep(1)


PLAN_OK = 'model_id = ["oracle"]\nsubtasks = ["Answer the question."]\naccess_list = [[]]'
PLAN_BROKEN = 'model_id = ["broken"]\nsubtasks = ["Answer the question."]\naccess_list = [[]]'


def test_runs_without_a_reference_give_only_label_free_pairs(tmp_path, monkeypatch, tiny_base):
    from prefect_conductor.flows.improve import improve
    from prefect_conductor.flows.orchestrate import orchestrate

    data, pool, _ = training_world(tmp_path, monkeypatch, tiny_base, TRAIN, TEST)
    doc = yaml.safe_load(pool.read_text())
    doc["conductor"] = {"model": "fake/cycle"}
    doc["workers"].append({"name": "broken", "model": "fake/auth", "retries": 0})
    pool.write_text(yaml.safe_dump(doc))
    CYCLE[:] = [PLAN_OK, PLAN_BROKEN, "no plan at all"]
    for question in list(TRAIN)[:3]:  # everyday runs: no reference, three plans each
        for _ in CYCLE:
            orchestrate(OrchestrateRequest(question=question, pool=str(pool)), return_state=True)
    iteration = improve(
        ImproveRequest(
            recipe=str(_recipe(tmp_path, data, tiny_base)),
            pool=str(pool),
            min_new_runs=5,
            reward_model=_rm(tiny_base, min_pairs=10_000),  # count the pairs, train nothing
        )
    )
    assert iteration.runs.total == 9 == iteration.runs.unreferenced
    made = {source for source, n in iteration.pairs_by_source.items() if n}
    assert made and made <= LABEL_FREE, iteration.pairs_by_source
    # Every pair came from runs without a reference, and the report counts them per source.
    assert iteration.pairs_unreferenced_by_source == iteration.pairs_by_source
    assert not iteration.orchrm_trained
    assert iteration.stopped == "no OrchRM champion to guide the round: nothing trained"
    assert json.loads(json.dumps(iteration.model_dump(mode="json")))["finished"] is True


def test_cli_improve_on_an_empty_store_says_so_and_a_bad_setting_is_one_line(tmp_path):
    from tests.local_cli import run_cli

    proc = run_cli(tmp_path, "improve", "--min-new-runs", "5")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == (
        "too little new data: 0 runs stored since the first run, fewer than min_new_runs 5; "
        "nothing trained"
    )
    proc = run_cli(tmp_path, "improve", "--rm-set", "max_stepz=3")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "unknown OrchRM setting max_stepz" in proc.stderr.strip().splitlines()[-1]


def test_the_python_api_runs_an_iteration(tmp_path, monkeypatch, tiny_base):
    import prefect_conductor as pc

    data, pool, _ = training_world(tmp_path, monkeypatch, tiny_base, TRAIN, TEST)
    first = pc.improve(str(_recipe(tmp_path, data, tiny_base)), pool=pool, min_new_runs=3)
    assert first.iteration == 1 and first.stopped.startswith("too little new data: 0 runs")
    with pytest.raises(pc.ConductorError, match="unknown OrchRM setting"):
        pc.improve(pool=pool, reward_model={"max_stepz": 3})
