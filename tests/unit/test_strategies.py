"""Strategies: parsing, random plans (always valid), self-consistency votes."""

from __future__ import annotations

import pytest
from prefect_conductor.conductor.data.verify import answer_key
from prefect_conductor.conductor.errors import ConductorError, PoolConfigError
from prefect_conductor.conductor.plan.parse import RawPlan, validate_plan
from prefect_conductor.conductor.plan.strategies import (
    majority_vote,
    parse_strategy,
    random_plan,
    random_plan_seed,
    self_consistency_plan,
)
from prefect_conductor.conductor.pool import load_pool, pool_from_dict

POOL = pool_from_dict(
    {
        "conductor": {"model": "m"},
        "workers": [
            {"name": "a", "model": "m"},
            {"name": "b", "model": "m", "params": {"temperature": 0.3}},
            {"name": "meta", "kind": "conductor"},
        ],
    }
)


@pytest.mark.parametrize(
    ("text", "kind", "worker", "k"),
    [
        ("conductor", "conductor", None, 1),
        ("random-plan", "random-plan", None, 1),
        ("single:a", "single", "a", 1),
        ("self-consistency:b:5", "self-consistency", "b", 5),
    ],
)
def test_parse_strategy(text, kind, worker, k):
    s = parse_strategy(text, POOL)
    assert (s.kind, s.worker, s.samples) == (kind, worker, k)
    assert str(s) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("best", "unknown strategy 'best'"),
        ("single:", "unknown strategy"),
        ("self-consistency:a:x", "K must be an integer"),
        ("self-consistency:a:0", "K must be between 1 and 64"),
    ],
)
def test_bad_strategies(text, message):
    with pytest.raises(ConductorError, match=message):
        parse_strategy(text, POOL)


def test_strategy_worker_must_exist():
    with pytest.raises(PoolConfigError, match="unknown worker 'zz'.*known: a, b, meta"):
        parse_strategy("single:zz", POOL)


@pytest.mark.parametrize("seed", range(50))
def test_random_plans_are_valid_and_never_recurse(seed):
    wf = random_plan(POOL, seed, "Q?", max_steps=5)
    raw = RawPlan(
        workers=tuple(s.worker for s in wf.steps),
        subtasks=tuple(s.instruction for s in wf.steps),
        access=tuple(list(s.access) for s in wf.steps),
    )
    assert validate_plan(raw, POOL) == wf  # passes the same validator as a conductor's plan
    assert "meta" not in {s.worker for s in wf.steps}
    assert wf.steps[0].instruction == "Q?"
    assert 1 <= len(wf.steps) <= 5


def test_random_plan_is_deterministic_per_seed():
    assert random_plan(POOL, 7, "Q?") == random_plan(POOL, 7, "Q?")
    assert len({random_plan(POOL, s, "Q?") for s in range(20)}) > 5


def test_self_consistency_plan_and_vote():
    wf = self_consistency_plan("a", "Q?", 3)
    assert [(s.worker, s.instruction, s.access) for s in wf.steps] == [("a", "Q?", ())] * 3
    outputs = ["It is 41.", "So 42", "The answer is 42.0", "3/4"]
    assert majority_vote(outputs, lambda t: answer_key("math", t)) == "So 42"
    assert majority_vote(["x", "y"], lambda t: None) == "x"
    assert majority_vote([], lambda t: t) is None


def test_with_sampling_only_touches_greedy_worker():
    pool = load_pool()
    hot = pool.with_sampling("smol", 0.7)
    assert hot.worker("smol").params["temperature"] == 0.7
    assert pool.worker("smol").params["temperature"] == 0.0  # the original is unchanged
    assert POOL.with_sampling("b", 0.9).worker("b").params["temperature"] == 0.3


@pytest.mark.parametrize(
    ("text", "kind", "n", "proposer"),
    [
        ("best-of-n:8", "best-of-n", 8, "conductor"),
        ("best-of-n:4:random-plan", "best-of-n", 4, "random-plan"),
        ("best-of-n-plan:8:conductor", "best-of-n-plan", 8, "conductor"),
    ],
)
def test_best_of_n_strategies_parse_and_print_back(text, kind, n, proposer):
    s = parse_strategy(text)
    assert (s.kind, s.samples, s.proposer) == (kind, n, proposer)
    assert s.best_of and s.uses_conductor
    assert parse_strategy(str(s)) == s
    assert str(s).startswith(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("best-of-n", "unknown strategy"),
        ("best-of-n:x", "N must be an integer"),
        ("best-of-n:1", "N must be between 2 and 64"),
        ("best-of-n-plan:8:oracle", "unknown proposer 'oracle'"),
    ],
)
def test_bad_best_of_n_strategies_are_named(text, message):
    with pytest.raises(ConductorError, match=message):
        parse_strategy(text)


def test_random_plan_seed_matches_the_random_plan_strategy():
    pool = load_pool()
    a = random_plan(pool, random_plan_seed("q1", 3), "What is 1 + 1?")
    b = random_plan(pool, random_plan_seed("q1", 3), "What is 1 + 1?")
    assert a == b  # a proposal is reproducible from (question id, seed)
    assert random_plan_seed("q1", 4) == random_plan_seed("q1", 3) + 1
    assert random_plan_seed("q1", 0) != random_plan_seed("q2", 0)
    # Seeds seed .. seed + N - 1 give different proposals (best-of-n's N candidates).
    plans = {random_plan(pool, random_plan_seed("q1", s), "What is 1 + 1?") for s in range(8)}
    assert len(plans) > 1


# The request models carry STRATEGY_PATTERN as the JSON-schema pattern of ``strategy``, so
# the Prefect deployment form rejects what the flow would reject. Both must agree.
_HEADS = ["conductor", "random-plan", "single", "self-consistency", "best-of-n", "best-of-n-plan"]
_HEADS += ["", "best", "Single", "conductor-x"]
_ARGS = ["", "a", "a b", "x.y-z_1", "0", "1", "2", "07", "64", "65", "+3", "\u0663", "-1"]
_ARGS += ["conductor", "random-plan", "oracle"]
_TEXTS = list(_HEADS) + [f"{h}:{a}" for h in _HEADS for a in _ARGS]
_TEXTS += [f"{h}:{a}:{b}" for h in _HEADS for a in _ARGS for b in _ARGS]


def _parses(text: str) -> bool:
    try:
        parse_strategy(text)
    except ConductorError:
        return False
    return True


def _validates(model: type, text: str) -> bool:
    from pydantic import ValidationError

    fields = {"dataset": "arithmetic"} if model.__name__ == "EvalRequest" else {"question": "Q?"}
    try:
        model(strategy=text, **fields)
    except ValidationError:
        return False
    return True


def test_pattern_and_parser_agree_on_every_combination():
    from prefect_conductor.conductor.plan.requests import EvalRequest, OrchestrateRequest

    disagree = [
        t
        for t in _TEXTS
        if not _parses(t) == _validates(EvalRequest, t) == _validates(OrchestrateRequest, t)
    ]
    assert disagree == []
    accepted = [t for t in _TEXTS if _parses(t)]
    assert len(accepted) > 40 and len(_TEXTS) - len(accepted) > 1000  # both kinds covered


@pytest.mark.parametrize(
    "text",
    ["conductor", "random-plan", "single:a", "single:meta", " conductor "]
    + [f"self-consistency:b:{k}" for k in (1, 7, 10, 59, 64)]
    + [f"best-of-n:{n}" for n in (2, 9, 10, 64)]
    + ["best-of-n:4:random-plan", "best-of-n-plan:8:conductor", "best-of-n-plan:3"],
)
def test_every_accepted_strategy_passes_the_pattern(text):
    import re

    from prefect_conductor.conductor.plan.requests import EvalRequest
    from prefect_conductor.conductor.plan.strategies import STRATEGY_PATTERN

    s = parse_strategy(text, POOL)
    assert re.fullmatch(STRATEGY_PATTERN, str(s))  # also the canonical form
    assert EvalRequest(dataset="arithmetic", strategy=text).strategy == text.strip()


@pytest.mark.parametrize(
    "text",
    ["best", "single:", "single:a b", "single:a:b", "self-consistency:a:0", "self-consistency:a:65"]
    + ["best-of-n:1", "best-of-n:65", "best-of-n:4:smol", "best-of-n:+4", "random-plan:3", ""],
)
def test_bad_strategies_fail_parser_and_pattern(text):
    from prefect_conductor.conductor.plan.requests import EvalRequest, OrchestrateRequest
    from pydantic import ValidationError

    with pytest.raises(ConductorError):
        parse_strategy(text)
    with pytest.raises(ValidationError, match="strategy"):
        EvalRequest(dataset="arithmetic", strategy=text)
    with pytest.raises(ValidationError, match="strategy"):
        OrchestrateRequest(question="Q?", strategy=text)


def test_the_form_shows_the_pattern_examples_and_the_choices():
    """What Prefect puts in the deployment's parameter schema (the UI form)."""
    import re

    from prefect.utilities.callables import parameter_schema
    from prefect_conductor.conductor.plan.strategies import STRATEGY_EXAMPLES, STRATEGY_PATTERN
    from prefect_conductor.flows.evaluate import evaluate
    from prefect_conductor.flows.orchestrate import orchestrate

    for flow, model in ((orchestrate, "OrchestrateRequest"), (evaluate, "EvalRequest")):
        field = parameter_schema(flow).model_dump()["definitions"][model]["properties"]["strategy"]
        assert field["pattern"] == STRATEGY_PATTERN
        assert field["examples"] == list(STRATEGY_EXAMPLES)
        assert all(re.fullmatch(STRATEGY_PATTERN, e) and _parses(e) for e in field["examples"])
        for choice in ("single:WORKER", "self-consistency:WORKER:K", "best-of-n-plan:N"):
            assert choice in field["description"]
