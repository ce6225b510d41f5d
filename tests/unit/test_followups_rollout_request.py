"""``conductor.training.config.rollout_request``: the one place the requests of training-time
plan runs (GRPO rollouts, self-sampled plans) are built, the same as the two requests that
``flows.train_conductor`` wrote out by hand."""

from __future__ import annotations

from conductor.data.datasets import Example
from conductor.plan.requests import OrchestrateRequest
from conductor.training.config import TrainConductorRequest, rollout_request
from conductor.training.rewards import Rollout

REQUEST = TrainConductorRequest(dataset="mixed", split="train", pool="pool.yaml", seed=3)


def test_a_grpo_rollout_runs_its_own_plan_on_the_training_pool():
    rollout = Rollout("What is 2 + 3?", "q1", "5", "math", "PLAN", meta={"n": 1})
    tags = {"train_run": "r", "train_step": "4", "rollout": "0", "strategy": "grpo-rollout"}
    built = rollout_request(REQUEST, rollout, tags, plan_text=rollout.plan_text, plan_source="s")
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
    tags = {"train_run": "r", "self_sample_round": "1", "sample": "2"}
    built = rollout_request(
        REQUEST, example, tags, conductor="/a", conductor_temperature=1.0, seed=REQUEST.seed + 2
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
    assert tags == {"train_run": "r", "self_sample_round": "1", "sample": "2"}  # not mutated
