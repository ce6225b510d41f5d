"""The goal arithmetic of ``python -m benchmarks.conductor_goals`` (issue #18): routing,
topology, goals. A benchmark's own checks live next to it: ``tests/`` never imports a
benchmark (issue #39)."""

from __future__ import annotations

import json

from benchmarks.conductor_goals import _value, domain_of, goals, topology


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
    train = {"recipe": "shipped", "wall_s": 125 * 60}
    rows = {g["measure"]: g for g in goals(mixed, arith, train)}
    assert rows["mixed test accuracy"]["met"]  # 63 % >= 26 % + 25
    assert rows["routing quality (share of oracle router)"]["met"]  # 63/69 = 0.913
    assert not rows["routing: knowledge to smol"]["met"]
    assert rows["routing: program to python"]["met"]
    assert rows["arithmetic test accuracy"]["met"]
    assert not rows["valid plans (arithmetic)"]["met"]
    assert not rows["moonshot: word problems (mixed)"]["met"]
    assert not rows["train-conductor --recipe shipped (min)"]["met"]  # 125 min > 120
    # issue #40's shipped-quality row, for a recipe's conductor only
    assert not rows["recipe: mixed test accuracy"]["met"]  # 63 % < 85 %
    assert not rows["recipe: word problems (arithmetic)"]["met"]
    assert not any(m.startswith("recipe: ") for m in
                   {g["measure"] for g in goals(mixed, arith, None)})  # fmt: skip
    assert "training worker calls (ledger total)" not in rows  # a result without a ledger
    worse = {g["measure"]: g for g in goals({**mixed, "conductor_accuracy": 0.5}, arith, None)}
    assert not worse["mixed test accuracy"]["met"]
    assert not worse["routing quality (share of oracle router)"]["met"]
    assert not any(m.startswith("train-conductor") for m in worse)


def _ledger(calls: int) -> list[dict]:
    entry = {"input_tokens": 900, "output_tokens": 100, "cost_usd": 0.0125,
             "conductor_generations": 4, "wall_s": 60.0}  # fmt: skip
    return [{**entry, "stage": "collect", "worker_calls": calls},
            {**entry, "stage": "total", "worker_calls": calls}]  # fmt: skip


def test_the_cost_rows_time_the_whole_command_and_check_the_ledger_against_the_steps_table():
    m = _measure(0.9, 0.8, 1.0, {})
    train = {"recipe": "shipped", "wall_s": 80 * 60, "command_wall_s": 110 * 60,
             "ledger": _ledger(12), "steps_worker_calls": 12}  # fmt: skip
    rows = {g["measure"]: g for g in goals(m, m, train)}
    minutes = rows["train-conductor --recipe shipped (min)"]
    assert minutes["value"] == 110 and minutes["met"]  # the command, not the flow's wall_s
    assert not {g["measure"]: g for g in goals(m, m, train, 100)}[minutes["measure"]]["met"]
    assert rows["training worker calls (ledger total)"]["value"] == 12
    assert rows["training tokens in + out (ledger total)"]["value"] == 1000
    assert rows["ledger worker calls = steps table rows"]["met"]
    off = {g["measure"]: g for g in goals(m, m, {**train, "steps_worker_calls": 13})}
    assert not off["ledger worker calls = steps table rows"]["met"]
    assert _value(rows["training cost USD (ledger total)"]) == "0.0125"
    assert _value(minutes) == "110.0"
    assert _value(rows["mixed test accuracy"]) == "90.0%"
    assert rows["recipe: mixed test accuracy"]["met"]  # 90 % >= 85 %
    assert rows["recipe: word problems (mixed)"]["met"]  # 80 % >= 60 %
    assert not {g["measure"]: g for g in goals({**m, "word_accuracy": 0.59}, m, train)}[
        "recipe: word problems (mixed)"
    ]["met"]
