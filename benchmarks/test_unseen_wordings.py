"""The held-out set of ``python -m benchmarks.unseen_wordings`` (issue #40): its references
recomputed, its wordings absent from every built-in data set, and the goal rule."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
from prefect_conductor.conductor.data._knowledge import TOPICS
from prefect_conductor.conductor.data.datasets import load_dataset
from prefect_conductor.conductor.providers.tools.calculator import evaluate

from benchmarks.conductor_goals import domain_of
from benchmarks.unseen_wordings import DATA, goals

ROWS = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


def test_the_set_has_twelve_questions_in_each_domain_and_loads_as_a_data_set():
    assert Counter(r["domain"] for r in ROWS) == {
        "knowledge": 12, "program": 12, "arithmetic": 12, "word": 12,
    }  # fmt: skip
    assert len({r["id"] for r in ROWS}) == len(ROWS)
    examples = load_dataset(str(DATA), split="test")  # no split column: every row
    assert [e.id for e in examples] == [r["id"] for r in ROWS]
    assert {domain_of(str(DATA), e.meta) for e in examples} == {r["domain"] for r in ROWS}


COMPUTED = [r for r in ROWS if r["domain"] != "knowledge"]


@pytest.mark.parametrize("row", COMPUTED, ids=[r["id"] for r in COMPUTED])
def test_every_reference_is_recomputed_from_the_row_itself(row):
    if row["domain"] == "program":
        assert f"```python\n{row['program']}\n```" in row["question"]
        out = subprocess.run(
            [sys.executable, "-c", row["program"]], capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == row["reference"]
    else:
        assert evaluate(row["worked"]) == row["reference"]


def test_no_question_is_worded_as_any_built_in_set_words_it():
    asked = {r["question"] for r in ROWS}
    for name in ("mixed", "arithmetic", "words"):
        for split in ("train", "test"):
            seen = {e.question for e in load_dataset(name, split=split)}
            assert not asked & seen, (name, split)
    # Nor is a fact asked with any template of the knowledge topics, for any subject.
    for topic in TOPICS:
        templated = {t.format(s) for t in topic.templates for s, _ in topic.facts}
        assert not asked & templated, topic.name
    # The program intros are none of the generators' own.
    assert not any(r["question"].startswith("What does this program print?") for r in ROWS)


def _measured(right: int, oracle: int, routing: dict[str, float]) -> dict:
    return {"n": 48, "conductor_accuracy": right / 48, "oracle_accuracy": oracle / 48,
            "routing": routing}  # fmt: skip


def test_goals_are_decided_on_counts():
    met = {g["measure"]: g["met"] for g in goals(_measured(27, 30, {"program": 0.9}))}
    assert met == {
        "conductor / oracle router": True,  # 27 of 30 is exactly 0.9
        "routing: program to python": True,
        "moonshot: conductor above the oracle router": False,
    }
    met = {g["measure"]: g["met"] for g in goals(_measured(26, 30, {"knowledge": 0.85}))}
    assert met["conductor / oracle router"] is False
    assert met["routing: knowledge to smol"] is False
    assert goals(_measured(31, 30, {}))[-1]["met"] is True
