"""The goal arithmetic of ``python -m benchmarks.conductor_goals`` (issue #18): routing,
topology, goals. A benchmark's own checks live next to it: ``tests/`` never imports a
benchmark (issue #39)."""

from __future__ import annotations

import json

from benchmarks.conductor_goals import domain_of, goals, topology


def test_topology_names_the_worker_sequence_or_invalid():
    plan = json.dumps({"model_id": ["smol", "calculator"], "subtasks": ["a", "b"]})
    assert topology(plan, True) == "smol>calculator"
    assert topology(plan, False) == "invalid"
    assert topology(None, True) == "invalid"


def test_arithmetic_level_three_is_the_word_domain():
    assert domain_of("arithmetic", {"level": 3}) == "word"
    assert domain_of("arithmetic", {"level": 1}) == "expression"
    assert domain_of("mixed", {"domain": "knowledge"}) == "knowledge"


def _measure(acc: float, word: float, valid: float, routing: dict) -> dict:
    return {
        "best_single": "single:calculator",
        "best_single_accuracy": 0.26,
        "oracle_accuracy": 0.69,
        "conductor_accuracy": acc,
        "word_accuracy": word,
        "valid_plans": valid,
        "routing": routing,
    }


def test_goals_are_met_only_by_the_measured_figures():
    mixed = _measure(0.63, 0.1, 0.99, {"arithmetic": 1.0, "program": 0.95, "knowledge": 0.85})
    arith = _measure(0.70, 0.2, 0.97, {"expression": 1.0})
    rows = {g["measure"]: g for g in goals(mixed, arith, {"wall_s": 95 * 60})}
    assert rows["mixed test accuracy"]["met"]  # 63 % >= 26 % + 25
    assert rows["routing quality (share of oracle router)"]["met"]  # 63/69 = 0.913
    assert not rows["routing: knowledge to smol"]["met"]
    assert rows["routing: program to python"]["met"]
    assert rows["arithmetic test accuracy"]["met"]
    assert not rows["valid plans (arithmetic)"]["met"]
    assert not rows["moonshot: word problems (mixed)"]["met"]
    assert not rows["train-conductor --dataset mixed (min)"]["met"]  # 95 min > 90
    worse = {g["measure"]: g for g in goals({**mixed, "conductor_accuracy": 0.5}, arith, None)}
    assert not worse["mixed test accuracy"]["met"]
    assert not worse["routing quality (share of oracle router)"]["met"]
    assert "train-conductor --dataset mixed (min)" not in worse
