"""Run ids of requests sent to the fleet (``prefect_conductor.fleet.fanout.fleet_run_id``, issue #19): the same
for every send of one request, different for any two requests of one eval or training run."""

from __future__ import annotations

from prefect_conductor.conductor.plan.requests import OrchestrateRequest

from prefect_conductor.fleet.fanout import fleet_run_id


def _request(qid: str = "q1", **tags: str) -> OrchestrateRequest:
    return OrchestrateRequest(question="2 + 3", question_id=qid, tags=tags)


def test_a_resent_request_keeps_its_run_id():
    first = _request(eval_id="e1", sample="0")
    again = first.model_copy(update={"pool": "/abs/pool.yaml"})  # what Fleet.submit changes
    assert fleet_run_id(first) == fleet_run_id(again)
    assert fleet_run_id(_request(sample="0", eval_id="e1")) == fleet_run_id(first)  # tag order


def test_requests_that_differ_in_question_or_any_tag_get_different_run_ids():
    ids = {
        fleet_run_id(_request(eval_id="e1", sample="0")),
        fleet_run_id(_request(eval_id="e1", sample="1")),
        fleet_run_id(_request("q2", eval_id="e1", sample="0")),
        fleet_run_id(_request(eval_id="e2", sample="0")),
        # GRPO: three rollouts of one question in one step are three runs
        *(fleet_run_id(_request(train_run="t", train_step="3", rollout=str(i))) for i in range(3)),
    }
    assert len(ids) == 7


def test_a_serve_process_with_question_storage_but_no_result_storage_is_told():
    """A worker runs fan-out questions with its own settings (the eval's are not sent), so
    one that reads questions from shared storage must write outcomes there too."""
    from prefect.settings import (
        PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK,
        PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK,
        temporary_settings,
    )

    from prefect_conductor.fleet.fanout import worker_storage_gap

    block = "s3-bucket/conductor-results"
    with temporary_settings({PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK: block}):
        gap = worker_storage_gap()
    assert gap is not None and "PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK is not" in gap
    both = {
        PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK: block,
        PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK: block,
    }
    with temporary_settings(both):
        assert worker_storage_gap() is None
    with temporary_settings(restore_defaults={PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK}):
        assert worker_storage_gap() is None  # a serve for `conductor run` only
