"""The orchestrate flow end to end on a Prefect harness, with the fake litellm provider."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from prefect_conductor.conductor.data.records import StepRecord
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.conductor.plan.requests import OrchestrateRequest, RunResult

from prefect_conductor.testing.fakes import ANSWERS, CALLS, PLAN_PROMPTS, PLANS

pytestmark = pytest.mark.usefixtures("prefect", "fake_provider")


def make_pool(tmp_path: Path, workers: list[dict], **extra) -> str:
    doc = {
        "conductor": {
            "model": "fake/plan",
            "input_cost_per_token": 1e-6,
            "output_cost_per_token": 2e-6,
        },
        "workers": workers,
        **extra,
    }
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def run(
    question: str, pool: str, tmp_path: Path, plan: str, nested: str = "", **kw
) -> tuple[RunResult, list[StepRecord], str | None]:
    from prefect_conductor.flows.orchestrate import orchestrate

    PLANS["top"], PLANS["nested"] = plan, nested
    root = str(tmp_path / "artifacts")
    state = orchestrate(
        OrchestrateRequest(question=question, pool=pool, artifacts=root, **kw), return_state=True
    )
    result = state.result(raise_on_failure=False)
    assert isinstance(result, RunResult), result
    steps = ArtifactStore(root).read_pandas("steps")
    records = [
        StepRecord(
            **{
                k: (None if v != v else v) if not isinstance(v, (list, tuple)) else v
                for k, v in row.items()
            }
        )
        for row in _rows(steps)
    ]
    return result, records, state.message


def _rows(df) -> list[dict]:
    out = []
    for row in df.to_dict("records"):
        row["access"] = [int(x) for x in row["access"]]
        for key in ("parent_step", "input_tokens", "output_tokens"):
            if row[key] is not None and row[key] == row[key]:
                row[key] = int(row[key])
        out.append(row)
    return sorted(out, key=lambda r: (r["depth"], r["parent_step"] or -1, r["step"]))


def test_fan_out_runs_in_parallel_and_join_sees_all(tmp_path):
    pool = make_pool(
        tmp_path,
        [{"name": "slow", "model": "fake/sleep-0.5"}, {"name": "echo", "model": "fake/echo"}],
    )
    plan = (
        "Three in parallel, then a join.\n"
        "model_id = [0, 0, 0, 1]\n"
        'subtasks = ["a", "b", "c", "join them"]\n'
        'access_list = [[], [], [], "all"]'
    )
    result, steps, _ = run("Q?", pool, tmp_path, plan)
    assert result.status == "completed"
    assert result.answer == "echo: join them"
    assert [s.status for s in steps] == ["completed"] * 4
    parallel = steps[:3]
    # The three independent steps overlap: each starts before any of them finishes.
    assert max(s.started_at for s in parallel) < min(s.finished_at for s in parallel)
    join = steps[3]
    assert join.started_at >= max(s.finished_at for s in parallel)
    messages = json.loads(join.messages)
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert messages[0]["content"].endswith("Q?")
    assert messages[1:3] == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "slept 0.5"},
    ]
    assert result.input_tokens > 0 and result.output_tokens > 0
    assert result.format_valid


def test_worker_sees_only_its_access_list_and_no_question_when_not_shared(tmp_path):
    pool = make_pool(tmp_path, [{"name": "echo", "model": "fake/echo"}], share_question=False)
    plan = 'model_id = [0, 0, 0]\nsubtasks = ["one", "two", "three"]\naccess_list = [[], [], [0]]'
    result, steps, _ = run("Q?", pool, tmp_path, plan)
    assert result.status == "completed"
    third = json.loads(steps[2].messages)
    assert third == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "echo: one"},
        {"role": "user", "content": "three"},
    ]


def test_single_plan_gives_a_worker_its_own_subtask_only_when_the_question_is_shared(tmp_path):
    worker = {"name": "echo", "model": "fake/echo", "subtask": "Run the program in the question."}
    result, (step,), _ = run(
        "Q?", make_pool(tmp_path, [worker]), tmp_path, "", strategy="single:echo"
    )
    assert step.instruction == "Run the program in the question."
    assert result.answer == "echo: Run the program in the question."
    assert json.loads(step.messages)[0] == {
        "role": "system",
        "content": "You are part of a team answering this question:\nQ?",
    }
    # The worker would not see the question: its subtask is the question itself.
    other = tmp_path / "hidden"
    other.mkdir()
    hidden = make_pool(other, [worker], share_question=False)
    result, (step,), _ = run("Q?", hidden, other, "", strategy="single:echo")
    assert step.instruction == "Q?" and result.answer == "echo: Q?"


def test_a_worker_system_prompt_comes_first_and_only_in_that_workers_steps(tmp_path):
    workers = [
        {"name": "brief", "model": "fake/echo", "system": "Answer in English."},
        {"name": "echo", "model": "fake/echo"},
    ]
    plan = 'model_id = [0, 1]\nsubtasks = ["one", "two"]\naccess_list = [[], [0]]'
    result, steps, _ = run("Q?", make_pool(tmp_path, workers), tmp_path, plan)
    assert result.status == "completed"
    first, second = (json.loads(s.messages) for s in steps)
    assert first[0] == {"role": "system", "content": "Answer in English."}
    assert first[1]["content"].endswith("Q?") and first[-1] == {"role": "user", "content": "one"}
    assert all(m["content"] != "Answer in English." for m in second)
    # The question itself as the subtask: the system prompt alone, no team turn.
    other = tmp_path / "single"
    other.mkdir()
    result, (step,), _ = run("Q?", make_pool(other, workers), other, "", strategy="single:brief")
    assert json.loads(step.messages) == [
        {"role": "system", "content": "Answer in English."},
        {"role": "user", "content": "Q?"},
    ]


def test_failed_step_skips_dependents_and_keeps_completed_work(tmp_path):
    pool = make_pool(
        tmp_path,
        [
            {"name": "echo", "model": "fake/echo"},
            {"name": "bad", "model": "fake/badrequest", "retries": 3},
        ],
    )
    plan = 'model_id = [0, 1, 0, 0]\nsubtasks = ["ok", "boom", "after boom", "after after"]\naccess_list = [[], [], [1], [2]]'
    result, steps, message = run("Q?", pool, tmp_path, plan)
    assert result.status == "failed"
    assert result.reason.startswith("step 1 (bad) failed: fake/badrequest: BadRequestError")
    assert message == result.reason
    assert [s.status for s in steps] == ["completed", "failed", "skipped", "skipped"]
    assert steps[0].output == "echo: ok"
    assert steps[2].error == "skipped: step 1 failed" and steps[3].error == "skipped: step 1 failed"
    assert CALLS["badrequest"] == 1  # a bad request is never retried
    runs = ArtifactStore(str(tmp_path / "artifacts")).read_pandas("runs")
    assert list(runs["status"]) == ["failed"] and runs["answer"].isna().all()


def test_rate_limit_is_retried_until_it_succeeds(tmp_path):
    pool = make_pool(
        tmp_path,
        [{"name": "flaky", "model": "fake/ratelimit-2", "retries": 3, "retry_backoff_s": 0.01}],
    )
    result, steps, _ = run("Q?", pool, tmp_path, 'model_id=[0]\nsubtasks=["go"]\naccess_list=[[]]')
    assert result.status == "completed" and result.answer == "ok"
    assert CALLS["ratelimit-2"] == 3


def test_authentication_error_is_not_retried(tmp_path):
    pool = make_pool(
        tmp_path, [{"name": "locked", "model": "fake/auth", "retries": 3, "retry_backoff_s": 0.01}]
    )
    result, steps, _ = run("Q?", pool, tmp_path, 'model_id=[0]\nsubtasks=["go"]\naccess_list=[[]]')
    assert result.status == "failed"
    assert "AuthenticationError" in result.reason
    assert CALLS["auth"] == 1


def test_timeout_is_retried_then_fails(tmp_path):
    pool = make_pool(
        tmp_path, [{"name": "slow", "model": "fake/timeout", "retries": 1, "retry_backoff_s": 0.01}]
    )
    result, steps, _ = run("Q?", pool, tmp_path, 'model_id=[0]\nsubtasks=["go"]\naccess_list=[[]]')
    assert result.status == "failed" and "Timeout" in result.reason
    assert CALLS["timeout"] == 2
    assert steps[0].status == "failed"


def test_fallback_worker_answers_when_primary_fails(tmp_path):
    pool = make_pool(
        tmp_path,
        [
            {"name": "locked", "model": "fake/auth", "retries": 0, "fallbacks": ["echo"]},
            {"name": "echo", "model": "fake/echo"},
        ],
    )
    result, steps, _ = run("Q?", pool, tmp_path, 'model_id=[0]\nsubtasks=["go"]\naccess_list=[[]]')
    assert result.status == "completed" and result.answer == "echo: go"
    assert steps[0].worker == "locked" and steps[0].model == "fake/echo"


def test_invalid_plan_falls_back_to_one_step(tmp_path):
    pool = make_pool(tmp_path, [{"name": "echo", "model": "fake/echo"}])
    result, steps, _ = run("What is 2+2?", pool, tmp_path, "I think the answer is 4.")
    assert result.status == "completed"
    assert not result.format_valid and result.format_error.startswith("no plan found")
    assert len(steps) == 1 and steps[0].instruction == "What is 2+2?"
    runs = ArtifactStore(str(tmp_path / "artifacts")).read_pandas("runs")
    assert runs.loc[0, "format_valid"] == False  # noqa: E712
    assert runs.loc[0, "conductor_output"] == "I think the answer is 4."


def test_a_conductor_hint_reaches_that_runs_conductor_only(tmp_path):
    """``conductor_hint`` (hinted self-sampling) is read after the conductor's instructions
    in the run that carries it, and in no other run."""
    pool = make_pool(tmp_path, [{"name": "echo", "model": "fake/echo"}])
    plan = 'model_id = [0]\nsubtasks = ["say hi"]\naccess_list = [[]]'
    PLAN_PROMPTS.clear()
    hinted, _, _ = run("Q1?", pool, tmp_path, plan, conductor_hint="Worked example: HINT-42")
    plain, _, _ = run("Q2?", pool, tmp_path, plan)
    assert hinted.status == plain.status == "completed"
    systems = [messages[0]["content"] for messages in PLAN_PROMPTS]
    assert len(systems) == 2
    assert systems[0].endswith("\n\nWorked example: HINT-42")
    assert "HINT-42" not in systems[1]
    assert systems[0].removesuffix("\n\nWorked example: HINT-42") == systems[1]


def test_invalid_plan_in_error_mode_fails_the_run(tmp_path):
    pool = make_pool(tmp_path, [{"name": "echo", "model": "fake/echo"}])
    plan = 'model_id = [0, 0]\nsubtasks = ["a", "b"]\naccess_list = [[], [1]]'
    result, steps, _ = run("Q?", pool, tmp_path, plan, on_invalid_plan="error")
    assert result.status == "failed"
    assert result.reason == "invalid plan: step 1 reads itself"
    assert steps == []
    runs = ArtifactStore(str(tmp_path / "artifacts")).read_pandas("runs")
    assert runs.loc[0, "format_error"] == "step 1 reads itself"


def test_recursion_runs_a_nested_plan_as_a_subflow(tmp_path):
    pool = make_pool(
        tmp_path,
        [
            {"name": "echo", "model": "fake/echo"},
            {"name": "meta", "kind": "conductor", "description": "a planner"},
        ],
    )
    top = 'model_id = [0, 1]\nsubtasks = ["draft", "improve the draft"]\naccess_list = [[], [0]]'
    nested = 'model_id = [0, 0]\nsubtasks = ["redo", "final"]\naccess_list = [[], [0]]'
    result, steps, _ = run("Q?", pool, tmp_path, top, nested)
    assert result.status == "completed"
    assert result.answer == "echo: final"
    by_depth = [(s.depth, s.parent_step, s.step, s.worker) for s in steps]
    assert by_depth == [
        (0, None, 0, "echo"),
        (0, None, 1, "meta"),
        (1, 1, 0, "echo"),
        (1, 1, 1, "echo"),
    ]


def test_recursion_accepts_with_three_empty_lists(tmp_path):
    pool = make_pool(
        tmp_path,
        [{"name": "echo", "model": "fake/echo"}, {"name": "meta", "kind": "conductor"}],
    )
    top = 'model_id = [0, 1]\nsubtasks = ["draft", "check"]\naccess_list = [[], [0]]'
    result, steps, _ = run(
        "Q?", pool, tmp_path, top, "model_id = []\nsubtasks = []\naccess_list = []"
    )
    assert result.status == "completed" and result.answer == "echo: draft"
    assert [s.depth for s in steps] == [0, 0]


def test_recursion_depth_cap_is_enforced(tmp_path):
    pool = make_pool(
        tmp_path,
        [{"name": "echo", "model": "fake/echo"}, {"name": "meta", "kind": "conductor"}],
    )
    top = 'model_id = [0, 1]\nsubtasks = ["draft", "check"]\naccess_list = [[], [0]]'
    # The nested plan tries to recurse again: depth 1 is the cap, so it is refused and the
    # round keeps the last response.
    nested = 'model_id = [0, 1]\nsubtasks = ["x", "again"]\naccess_list = [[], [0]]'
    result, steps, _ = run("Q?", pool, tmp_path, top, nested)
    assert result.status == "completed" and result.answer == "echo: draft"
    assert max(s.depth for s in steps) == 0


def test_two_flows_at_once_write_without_loss(tmp_path):
    pool = make_pool(tmp_path, [{"name": "slow", "model": "fake/sleep-0.2"}])
    from prefect_conductor.flows.orchestrate import orchestrate

    PLANS["top"] = 'model_id=[0, 0]\nsubtasks=["a", "b"]\naccess_list=[[], [0]]'
    root = str(tmp_path / "shared")
    results: list = []

    def go(i: int) -> None:
        results.append(
            orchestrate(OrchestrateRequest(question=f"question {i}", pool=pool, artifacts=root))
        )

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and all(r.status == "completed" for r in results)
    store = ArtifactStore(root)
    assert sorted(store.read_pandas("runs")["question"]) == ["question 0", "question 1"]
    assert len(store.read_pandas("steps")) == 4


def test_deterministic_calls_are_cached(tmp_path):
    pool = make_pool(
        tmp_path,
        [{"name": "echo", "model": "fake/echo", "cache": True, "params": {"temperature": 0}}],
    )
    # Prefect keeps cached results across sessions: a fresh subtask per test run.
    subtask = f"same {uuid.uuid4().hex}"
    plan = f'model_id=[0]\nsubtasks=["{subtask}"]\naccess_list=[[]]'
    first, _, _ = run("cache me", pool, tmp_path, plan)
    second, _, _ = run("cache me", pool, tmp_path, plan)
    assert first.answer == second.answer == f"echo: {subtask}"
    assert CALLS["echo"] == 1
    uncached = make_pool(
        tmp_path,
        [{"name": "echo", "model": "fake/echo", "cache": True, "params": {"temperature": 0.7}}],
    )
    run("cache me", uncached, tmp_path, plan)
    assert CALLS["echo"] == 2  # sampling calls are never cached


def test_cost_uses_pool_prices_and_unknown_price_is_null(tmp_path):
    pool = make_pool(
        tmp_path,
        [
            {
                "name": "priced",
                "model": "fake/echo",
                "input_cost_per_token": 0.001,
                "output_cost_per_token": 0.002,
            }
        ],
    )
    result, steps, _ = run("Q?", pool, tmp_path, 'model_id=[0]\nsubtasks=["go"]\naccess_list=[[]]')
    assert steps[0].cost_usd == pytest.approx(
        0.001 * steps[0].input_tokens + 0.002 * steps[0].output_tokens
    )
    unpriced = make_pool(tmp_path, [{"name": "free", "model": "fake/echo"}])
    result2, steps2, _ = run(
        "Q?", unpriced, tmp_path / "b", 'model_id=[0]\nsubtasks=["go"]\naccess_list=[[]]'
    )
    assert result2.status == "completed"
    assert steps2[0].cost_usd is None and result2.cost_usd is None


def test_api_key_from_env_never_reaches_artifacts(tmp_path, monkeypatch):
    secret = "sk-test-very-secret-4242"
    monkeypatch.setenv("FAKE_PROVIDER_KEY", secret)
    pool = make_pool(
        tmp_path, [{"name": "echo", "model": "fake/echo", "api_key_env": "FAKE_PROVIDER_KEY"}]
    )
    result, _, _ = run("Q?", pool, tmp_path, 'model_id=[0]\nsubtasks=["go"]\naccess_list=[[]]')
    assert result.status == "completed"
    for f in (tmp_path / "artifacts").rglob("*.parquet"):
        table = pq.read_table(f)
        assert secret not in json.dumps(table.to_pylist(), default=str)
        assert secret.encode() not in f.read_bytes()
    assert secret not in result.model_dump_json()


def test_api_key_from_a_prefect_secret_block_is_used_and_never_stored(tmp_path, monkeypatch):
    import prefect_conductor.conductor.providers.llm as llm
    from prefect.blocks.system import Secret

    secret = "sk-block-secret-777"
    Secret(value=secret).save("conductor-test-key", overwrite=True)
    seen: list[str | None] = []
    real = llm.litellm.completion

    def spy(*args, **kwargs):
        seen.append(kwargs.get("api_key"))
        return real(*args, **kwargs)

    monkeypatch.setattr(llm.litellm, "completion", spy)
    pool = make_pool(
        tmp_path, [{"name": "echo", "model": "fake/echo", "api_key_secret": "conductor-test-key"}]
    )
    result, _, _ = run("Q?", pool, tmp_path, 'model_id=[0]\nsubtasks=["go"]\naccess_list=[[]]')
    assert result.status == "completed"
    assert secret in seen  # the worker call got the key from the block
    for f in (tmp_path / "artifacts").rglob("*.parquet"):
        assert secret.encode() not in f.read_bytes()


def test_missing_api_key_env_fails_the_step_with_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    pool = make_pool(
        tmp_path, [{"name": "echo", "model": "fake/echo", "api_key_env": "NOT_SET_ANYWHERE"}]
    )
    result, steps, _ = run("Q?", pool, tmp_path, 'model_id=[0]\nsubtasks=["go"]\naccess_list=[[]]')
    assert result.status == "failed"
    assert (
        result.reason
        == "step 0 (echo) failed: environment variable NOT_SET_ANYWHERE (api_key_env of fake/echo) is not set"
    )


def test_task_runs_are_named_after_their_step_and_worker(tmp_path):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect_conductor.flows.orchestrate import orchestrate

    from prefect_conductor.runtime.server import wait_until_recorded

    pool = make_pool(
        tmp_path,
        [{"name": "echo", "model": "fake/echo"}, {"name": "slow", "model": "fake/sleep-0.1"}],
    )
    PLANS["top"] = 'model_id = [1, 0]\nsubtasks = ["a", "b"]\naccess_list = [[], [0]]'
    state = orchestrate(
        OrchestrateRequest(question="Q?", pool=pool, artifacts=str(tmp_path / "a")),
        return_state=True,
    )
    assert state.is_completed()
    assert wait_until_recorded(state.state_details.flow_run_id)  # the server records in batches
    flt = FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
    with get_client(sync_client=True) as client:
        names = {r.name for r in client.read_task_runs(flow_run_filter=flt)}
    # ASCII names: the UI's run graph drops characters such as "·".
    assert {"step-0 slow", "step-1 echo", "plan (conductor)"} <= names


# Outcomes in the Prefect UI (issue #10): what the API holds about a finished run.


def _artifacts(flow_run_id) -> dict:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    flt = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
    with get_client(sync_client=True) as client:
        return {a.key: a for a in client.read_artifacts(artifact_filter=flt)}


def _log_lines(flow_run_id, starting: str, timeout_s: float = 20.0) -> list[str]:
    """The flow run's log messages that start with ``starting``, once the API has them."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=5)
    flt = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            lines = [log.message for log in client.read_logs(log_filter=flt)]
            found = [m for m in lines if m.startswith(starting)]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.2)


def _oracle_pool(tmp_path: Path) -> str:
    ANSWERS.clear()
    ANSWERS["What is 6 * 7?"] = "The answer is 42."
    return make_pool(
        tmp_path,
        [{"name": "oracle", "model": "fake/lookup"}, {"name": "bad", "model": "fake/badrequest"}],
    )


_READ_BACK = """
import json, sys
from prefect import get_client
with get_client(sync_client=True) as client:
    for run_id in sys.argv[1:]:
        state = client.read_flow_run(run_id).state
        result = state.result(raise_on_failure=False)
        print(json.dumps([state.type.value, type(result).__name__, result.model_dump(mode="json")]))
"""


def test_the_result_is_persisted_and_read_back_through_the_api_by_another_process(tmp_path):
    from prefect.settings import PREFECT_API_URL
    from prefect_conductor.flows.orchestrate import orchestrate as bare

    from prefect_conductor.runtime.server import result_storage, with_local_results

    # The storage is chosen per call, as the API and the CLI choose it (issue #39): the flow
    # module's own decorator fixes none at import.
    assert bare.result_storage is None
    orchestrate = with_local_results(bare)
    pool = _oracle_pool(tmp_path)
    root = str(tmp_path / "artifacts")
    ok = orchestrate(
        OrchestrateRequest(
            question="What is 6 * 7?", pool=pool, artifacts=root, strategy="single:oracle"
        ),
        return_state=True,
    )
    failed = orchestrate(
        OrchestrateRequest(
            question="What is 6 * 7?", pool=pool, artifacts=root, strategy="single:bad"
        ),
        return_state=True,
    )
    assert ok.is_completed() and failed.is_failed()
    # Stored as a file under the results directory of the conductor home at the call, as
    # JSON rather than a pickle.
    key = Path(ok.data.metadata.storage_key)
    assert result_storage() is not None and key.parent == result_storage()
    stored = key.read_text()
    assert json.loads(stored) and "The answer is 42." in stored  # JSON, not a pickle

    ids = [str(s.state_details.flow_run_id) for s in (ok, failed)]
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    proc = subprocess.run(
        [sys.executable, "-c", _READ_BACK, *ids],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (t1, cls1, r1), (t2, cls2, r2) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert (t1, cls1) == ("COMPLETED", "RunResult") and r1 == ok.result().model_dump(mode="json")
    assert r1["answer"] == "The answer is 42." and r1["status"] == "completed"
    assert (t2, cls2) == ("FAILED", "RunResult")
    assert r2["status"] == "failed" and r2["reason"].startswith("step 0 (bad) failed")


def test_the_answer_is_an_artifact_and_a_log_line_and_the_plan_renders(tmp_path):
    from prefect_conductor.flows.orchestrate import orchestrate

    pool = _oracle_pool(tmp_path)
    PLANS["top"] = 'model_id = [0]\nsubtasks = ["What is 6 * 7?"]\naccess_list = [[]]'
    state = orchestrate(
        OrchestrateRequest(
            question="What is 6 * 7?", pool=pool, artifacts=str(tmp_path / "a"), reference="42"
        ),
        return_state=True,
    )
    assert state.is_completed()
    run_id = state.state_details.flow_run_id
    artifacts = _artifacts(run_id)
    assert {"conductor-plan", "conductor-answer", "conductor-steps"} <= set(artifacts)

    answer = artifacts["conductor-answer"]
    assert answer.type == "markdown" and answer.description == "completed: The answer is 42."
    assert answer.data.startswith("## Answer\n\n> The answer is 42.\n")
    assert "| status | correct | reward |" in answer.data
    assert "| completed | yes | 1.0 |" in answer.data

    plan = artifacts["conductor-plan"].data
    assert "mermaid" not in plan and "```" not in plan  # the UI shows neither
    assert "| step | wave | worker | sees | subtask |" in plan
    assert "| 0 | 0 | oracle | - | What is 6 * 7? |" in plan

    lines = _log_lines(run_id, "answer: ")
    assert lines == ["answer: The answer is 42. (correct, reward 1.0)"]


def test_a_failed_run_shows_its_reason_in_the_answer_artifact_and_log(tmp_path):
    from prefect_conductor.flows.orchestrate import orchestrate

    pool = _oracle_pool(tmp_path)
    state = orchestrate(
        OrchestrateRequest(
            question="What is 6 * 7?",
            pool=pool,
            artifacts=str(tmp_path / "a"),
            strategy="single:bad",
        ),
        return_state=True,
    )
    assert state.is_failed()
    run_id = state.state_details.flow_run_id
    answer = _artifacts(run_id)["conductor-answer"]
    assert answer.description == "failed: (no answer)"
    assert "**Failed:** step 0 (bad) failed: fake/badrequest" in answer.data
    [line] = _log_lines(run_id, "answer: ")
    assert line.startswith("answer: (none) (failed: step 0 (bad) failed")
