"""GRPO's OrchRM reward checked on a fraction of executed rollouts (issue #41)."""

from __future__ import annotations

import math

import pytest
from prefect_conductor.conductor.pool import load_pool
from prefect_conductor.conductor.training.rewards import RolloutOutcome
from prefect_conductor.reward_model.rewards import (
    CheckedOrchRMReward,
    agreement_warning,
    order_agreement,
)

VALID = "model_id = [0]\nsubtasks = ['2 + 3']\naccess_list = [[]]"
OTHER = "model_id = [1]\nsubtasks = ['2 + 3']\naccess_list = [[]]"


class _Model:
    def score(self, question, plans, pool_description=None):
        return [2.0 if plans[0]["model_id"] == ["calculator"] else 1.0]  # OTHER above VALID


class _Scorer:
    """OrchRMReward's face: the pool, ``plan`` (lists or raw text) and ``model.score``."""

    def __init__(self):
        from prefect_conductor.conductor.errors import PlanError
        from prefect_conductor.conductor.plan.parse import parse_plan

        self.pool = load_pool()
        self.model = _Model()
        self._parse, self._error = parse_plan, PlanError

    def plan(self, text):
        try:
            return self._parse(text, self.pool).to_lists()
        except self._error:
            return text


def _batch(n):
    completions = [VALID, OTHER, "not a plan", VALID][:n] * (n // 4 or 1)
    n = len(completions)
    return completions, {
        "question": ["What is 2 + 3?"] * n,
        "question_id": [f"q{i}" for i in range(n)],
        "reference": ["5"] * n,
        "kind": ["math"] * n,
    }


def test_rewards_are_orchrms_sigmoid_and_zero_for_an_unparseable_plan():
    ran = []
    reward = CheckedOrchRMReward(
        _Scorer(), lambda rs, step: ran.extend(rs) or [None] * len(rs), 0.5
    )
    completions, columns = _batch(4)
    got = reward([], completions, **columns)
    assert got == [
        1 / (1 + math.exp(-1.0)),
        1 / (1 + math.exp(-2.0)),
        0.0,
        1 / (1 + math.exp(-1.0)),
    ]
    assert len(ran) == 2 and reward.executed == 2


@pytest.mark.parametrize("fraction", [0.1, 0.25, 1.0])
def test_exactly_the_fraction_of_rollouts_runs_over_the_stage(fraction):
    ran = []

    def execute(rollouts, step):
        ran.extend(rollouts)
        return [RolloutOutcome(1.0 if r.plan_text == OTHER else 0.5, True, False) for r in rollouts]

    reward = CheckedOrchRMReward(_Scorer(), execute, fraction, seed=3)
    logged = {}
    for _ in range(10):  # 10 batches of 4: 40 rollouts
        completions, columns = _batch(4)
        reward([], completions, log_metric=logged.__setitem__, **columns)
    assert len(ran) == round(fraction * 40) == reward.executed
    assert len(reward.samples) == 40
    if fraction == 1.0:  # OTHER scores higher and is the one that is right: full agreement
        assert logged["orchrm_agreement"] == 1.0
        assert order_agreement(reward.checks) == 1.0


def test_a_fraction_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match="fraction"):
        CheckedOrchRMReward(_Scorer(), lambda rs, step: [], 0.0)


def test_a_stage_whose_orchrm_orders_its_checks_worse_than_chance_is_warned_about():
    # The measured case (issue #41): one right rollout among 8 checked, scored below the 7
    # wrong ones.
    wrong_first = [(0.2, 1.0)] + [(0.6 + i / 100, 0.5) for i in range(7)]
    line = agreement_warning("grpo", wrong_first)
    assert line is not None and "orchrm_agreement 0.00 over 8 checked" in line
    assert line.startswith("grpo: ") and "\n" not in line
    assert agreement_warning("grpo", [(0.9, 1.0), (0.2, 0.5), (0.4, 0.5)]) is None  # agrees
    assert agreement_warning("grpo", [(0.5, 1.0), (0.5, 0.5)]) is None  # chance: no warning
    assert agreement_warning("grpo", [(0.3, 0.5), (0.7, 0.5)]) is None  # no pair to judge
