"""The word-problem curriculum (``conductor/data/curriculum.py``, issue #18): easier word
problems in the train split only, held-out word problems of both generators in test."""

from __future__ import annotations

import re

from prefect_conductor.conductor.data.curriculum import EASY, THREE, curriculum_rows
from prefect_conductor.conductor.data.datasets import load_dataset


def _solve(question: str) -> int:
    """The easy templates' arithmetic, read back from the text (an independent check)."""
    n = [int(x) for x in re.findall(r"\d+", question)]
    if "split equally" in question:
        return n[0] // n[1] + (n[2] if len(n) == 3 else 0)
    if "bags with" in question:
        return n[0] * n[1] + (n[2] if "more from" in question else -n[2])
    if "dollars each" in question:
        return (n[0] + n[1]) * n[2]
    if "then loses" in question:
        return n[0] + n[1] - n[2]
    if "finds" in question:
        return n[0] + n[1]
    if "gives away" in question:
        return n[0] - n[1]
    return n[0] * n[1]  # jars, a day for


def test_the_curriculum_is_train_only_and_the_held_out_set_is_both_generators_word_problems():
    rows = curriculum_rows(0)
    train = [r for r in rows if r["split"] == "train"]
    test = [r for r in rows if r["split"] == "test"]
    assert {r["question"] for r in train}.isdisjoint(r["question"] for r in test)
    assert len({r["question"] for r in rows}) == len(rows)
    easy = train[: 2 * EASY]
    assert all(r["id"].startswith("easy/") for r in easy)
    assert not any(r["id"].startswith("easy/") for r in train[2 * EASY :] + test)
    for r in easy:  # references recomputed from the question, and no expression stored
        assert int(r["reference"]) == _solve(r["question"]), r
        assert set(r) == {"id", "question", "reference", "kind", "split", "meta"}
    # one operation first, then two: the first half's questions hold two numbers
    assert all(len(re.findall(r"\d+", r["question"])) == 2 for r in easy[:EASY])
    assert all(len(re.findall(r"\d+", r["question"])) == 3 for r in easy[EASY:])
    mixed = {e.question for e in load_dataset("mixed", split="test") if e.meta["domain"] == "word"}
    arith = {e.question for e in load_dataset("arithmetic", split="test") if e.meta["level"] == 3}
    held_out = [r["question"] for r in test[:40]]
    assert sum(q in mixed for q in held_out) == 20 and sum(q in arith for q in held_out) == 20
    assert curriculum_rows(0) == rows and curriculum_rows(1) != rows  # seeded


def _solve_three(question: str) -> int:
    """The three-operation block's arithmetic, read back from the text."""
    n = [int(x) for x in re.findall(r"\d+", question)]
    if "packs of" in question:
        return n[0] + n[1] * n[2] - n[3]
    if "jars on Monday" in question:
        return (n[0] + n[1]) * n[2]
    if "bags with" in question:
        return n[0] * n[1] + n[2] - n[3]
    return n[0] - n[1] + n[2] - n[3]  # loses, finds, then loses more


def test_the_three_operation_block_ends_the_train_split_and_moves_no_earlier_row():
    rows = curriculum_rows(0)
    train = [r for r in rows if r["split"] == "train"]
    three, before = train[-THREE:], train[:-THREE]
    assert all(r["id"].startswith("three/") for r in three)
    assert not any(r["id"].startswith("three/") for r in before)
    # the generators' rows come right before it: the block is appended, offsets stay
    assert not before[-1]["id"].startswith("easy/")
    for r in three:
        assert int(r["reference"]) == _solve_three(r["question"]) >= 0, r
        assert set(r) == {"id", "question", "reference", "kind", "split", "meta"}
    kinds = {("packs of" in q) + 2 * ("jars on" in q) + 4 * ("bags with" in q) for q in
             (r["question"] for r in three)}  # fmt: skip
    assert kinds == {0, 1, 2, 4}  # every shape drawn


def test_words_is_a_built_in_data_set_ordered_easiest_first_with_levels():
    """The curriculum as data (issue #40): ``load_dataset("words")``, whose ``meta.level`` a
    recipe filters on (``where: {level: 4}``) instead of naming offsets into a split."""
    train = load_dataset("words", split="train")
    test = load_dataset("words", split="test")
    rows = [r for r in curriculum_rows(0) if r["split"] == "train"]
    assert [e.question for e in train] == [r["question"] for r in rows]
    levels = [e.meta["level"] for e in train]
    assert levels == sorted(levels[: 2 * EASY]) + levels[2 * EASY :]  # 1s, then 2s first
    assert levels[:EASY] == [1] * EASY and levels[EASY : 2 * EASY] == [2] * EASY
    assert levels[-THREE:] == [4] * THREE and set(levels[2 * EASY : -THREE]) == {3}
    for e in train:
        if e.meta["level"] in (1, 2):
            assert int(e.reference) == _solve(e.question)
        elif e.meta["level"] == 4:
            assert int(e.reference) == _solve_three(e.question)
    assert {e.question for e in train}.isdisjoint(e.question for e in test)
    assert all(e.meta == {"level": 3, "domain": "word"} for e in test)
