"""What ``python -m benchmarks.word_problem_hint`` asks (issue #18): its questions, and its
same-shape hint files (``benchmarks/hints/shape-*.yaml``, ``--hint``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prefect_conductor.conductor.plan.parse import parse_plan
from prefect_conductor.conductor.pool import load_pool
from prefect_conductor.conductor.training.hints import load_hint

from benchmarks.word_problem_hint import _questions


def test_the_hint_benchmark_takes_the_first_questions_of_each_story_it_is_asked_for():
    chosen = _questions(0, 16, "A shop sells|A farmer packs", 3)
    assert [e.question.split(" ", 3)[:3] for e in chosen] == [["A", "shop", "sells"]] * 3 + [
        ["A", "farmer", "packs"]
    ] * 3
    assert len({e.id for e in chosen}) == 6
    assert all(e.meta["domain"] == "word" for e in chosen)
    plain = _questions(0, 5, None, 3)
    assert len(plain) == 5 and all(e.meta["domain"] == "word" for e in plain)


def test_the_hint_benchmark_can_take_one_level_of_the_curriculum_in_its_order():
    """``--level N``: what a recipe round with ``where: {level: N}`` samples first."""
    from prefect_conductor.conductor.data.datasets import load_dataset

    one = _questions(0, 8, None, 3, level=1)
    train = [e for e in load_dataset("words", split="train") if e.meta.get("level") == 1]
    assert [e.id for e in one] == [e.id for e in train[:8]]
    three = _questions(0, 4, None, 3, level=3)
    assert len(three) == 4 and all(e.meta["level"] == 3 for e in three)
    assert not {e.id for e in one} & {e.id for e in three}
    assert [e.id for e in _questions(0, 2, None, 3, level=1, skip=64)] == [
        e.id for e in train[64:66]
    ]


@pytest.mark.parametrize("path", sorted((Path(__file__).parent / "hints").glob("shape-*.yaml")))
def test_each_same_shape_hint_of_the_benchmark_holds_one_shape_with_its_own_numbers(path):
    """``benchmarks/hints/shape-*.yaml`` (word_problem_hint.py ``--hint``): three examples
    of one operation shape, each a calculator plan whose numbers are the question's, in the
    order the question gives them (the elevator's floor numbers are not operands)."""
    pool = load_pool()
    shots = load_hint(str(path), pool).note.split("\n\nQuestion: ")[1:]
    assert len(shots) == 3
    shapes = set()
    for shot in shots:
        question, plan_text = shot.split("\n", 1)
        (step,) = parse_plan(plan_text, pool).steps
        assert step.worker == "calculator"
        given = iter(re.findall(r"\d+", question))
        assert all(number in given for number in re.findall(r"\d+", step.instruction))
        shapes.add(re.sub(r"\d+", "n", step.instruction))
    assert len(shapes) == 1, shapes
