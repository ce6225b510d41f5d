"""The word-problem curriculum (issue #18): easier word problems first in the train split.

Verified self-sampling keeps only the plans that were right, so a conductor learns a word
problem's story only once it has written one right plan for it; on the generators' word
problems it finds too few. ``curriculum_rows(seed)`` is a data set (rows of ``id, question,
reference, kind, split``, what ``load_dataset`` reads from a file) that puts easier problems
first in the *train* split, in stories and phrasings the generators do not use:

- ``EASY`` problems of one operation ("Ana has 20 shells and finds 45 more", ids ``easy/…``),
  then ``EASY`` of two;
- the ``mixed`` and ``arithmetic`` train splits' word problems, interleaved (their own ids);
- ``THREE`` problems of three operations or of a sum that must be bracketed (``three/…``): the
  shapes no round of the probe solved (library, bus, shop), after the generators' rows so that
  every earlier offset stays;

and in *test* the ``mixed`` and ``arithmetic`` test splits' word problems, interleaved, none of
them in train. References are computed by the generators; no expression is stored. Pure: no
I/O, seeded. It is the built-in data set ``words`` (``meta.level`` 1-4), which the ``shipped``
recipe's self-sampling rounds walk through in order (``fresh`` questions, no offsets).

May import: ``datasets`` (the built-in splits it draws on).
"""

from __future__ import annotations

import random
from typing import Any

from prefect_conductor.conductor.data.datasets import load_dataset

__all__ = ["EASY", "THREE", "curriculum_examples", "curriculum_rows"]

EASY = 128  # questions of each difficulty (one operation, then two)
THREE = 128  # three-operation (and bracketed-sum) problems, after the generators' ones

_NAMES = ("Tom", "Ana", "Ben", "Lily", "Omar", "Zoe", "Raj", "Ella")
_ITEMS = ("shells", "cards", "buttons", "beads", "coins", "stones", "rings", "leaves")


def _one_operation(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    shape = rng.randrange(5)
    if shape == 0:
        a, b = rng.randint(10, 90), rng.randint(5, 60)
        return (
            f"{name} has {a} {item} and finds {b} more. How many {item} does {name} have now?",
            a + b,
        )
    if shape == 1:
        a = rng.randint(30, 99)
        b = rng.randint(5, a - 5)
        return (
            f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?",
            a - b,
        )
    if shape == 2:
        a, b = rng.randint(3, 15), rng.randint(4, 20)
        return (
            f"{name} fills {a} jars with {b} {item} in each jar. How many {item} are in the jars?",
            a * b,
        )
    if shape == 3:
        b, q = rng.randint(2, 9), rng.randint(3, 20)
        return (
            f"{b * q} {item} are split equally among {b} friends. "
            f"How many {item} does each friend get?",
            q,
        )
    a, b = rng.randint(3, 12), rng.randint(2, 15)
    return (
        f"{name} collects {a} {item} a day for {b} days. How many {item} does {name} collect?",
        a * b,
    )


def _two_operations(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    shape = rng.randrange(5)
    if shape == 0:
        a, b = rng.randint(20, 90), rng.randint(5, 40)
        c = rng.randint(2, a + b - 1)
        return (
            f"{name} has {a} {item}, finds {b} more, then loses {c}. How many {item} does {name} "
            "have now?",
            a + b - c,
        )
    if shape == 1:
        a, b, c = rng.randint(3, 12), rng.randint(4, 15), rng.randint(2, 30)
        return (
            f"{name} buys {a} bags with {b} {item} in each bag, then gets {c} more from a friend. "
            f"How many {item} does {name} have?",
            a * b + c,
        )
    if shape == 2:
        a, b = rng.randint(3, 12), rng.randint(4, 15)
        c = rng.randint(2, a * b - 1)
        return (
            f"{name} buys {a} bags with {b} {item} in each bag, then drops {c}. How many {item} "
            f"does {name} have left?",
            a * b - c,
        )
    if shape == 3:
        a, b, c = rng.randint(10, 40), rng.randint(10, 40), rng.randint(2, 9)
        return (
            f"{name} sells {a} {item} on Monday and {b} on Tuesday for {c} dollars each. How many "
            f"dollars does {name} get?",
            (a + b) * c,
        )
    b, q, c = rng.randint(2, 9), rng.randint(3, 15), rng.randint(2, 10)
    return (
        f"{b * q} {item} are split equally among {b} friends, and each friend then finds {c} more. "
        f"How many {item} does each friend have?",
        q + c,
    )


def _three_operations(rng: random.Random) -> tuple[str, int]:
    """Three operations, or two with a sum that must be bracketed: the shapes of the stories
    no round solved (issue #18), in the probe's own names, items and phrasings."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    shape = rng.randrange(4)
    if shape == 0:
        a, b, c = rng.randint(10, 90), rng.randint(2, 9), rng.randint(3, 12)
        d = rng.randint(2, a + b * c - 1)
        return (
            f"{name} has {a} {item}, buys {b} packs of {c} {item} each, then gives away {d}. "
            f"How many {item} does {name} have now?",
            a + b * c - d,
        )
    if shape == 1:
        a = rng.randint(30, 90)
        b, c = rng.randint(2, a - 1), rng.randint(2, 30)
        d = rng.randint(1, a - b + c)
        return (
            f"{name} has {a} {item}, loses {b}, finds {c}, then loses {d} more. How many "
            f"{item} does {name} have now?",
            a - b + c - d,
        )
    if shape == 2:
        a, b, c = rng.randint(2, 12), rng.randint(2, 12), rng.randint(3, 15)
        return (
            f"{name} fills {a} jars on Monday and {b} jars on Tuesday, with {c} {item} in every "
            f"jar. How many {item} are in the jars?",
            (a + b) * c,
        )
    a, b, c = rng.randint(3, 12), rng.randint(4, 15), rng.randint(2, 30)
    d = rng.randint(1, a * b + c - 1)
    return (
        f"{name} buys {a} bags with {b} {item} in each bag, finds {c} more, then loses {d}. "
        f"How many {item} does {name} have?",
        a * b + c - d,
    )


def _row(id_: str, question: str, reference: str, split: str, level: int) -> dict[str, Any]:
    return {
        "id": id_,
        "question": question,
        "reference": reference,
        "kind": "math",
        "split": split,
        "meta": {"level": level, "domain": "word"},
    }


def curriculum_rows(seed: int = 0) -> list[dict[str, Any]]:
    """The probe's data set: train = 128 one-operation and 128 two-operation problems, then
    the mixed and arithmetic train splits' word problems (interleaved), then 128 problems of
    three operations or a bracketed sum (``_three_operations``); test = the mixed and
    arithmetic test splits' word problems (interleaved). References are computed here; no
    expression is stored."""
    rng = random.Random("curriculum-probe" if seed == 0 else f"curriculum-probe:{seed}")
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for level, generate in ((1, _one_operation), (2, _two_operations)):
        made = 0
        while made < EASY:
            question, value = generate(rng)
            if question in seen:
                continue
            seen.add(question)
            made += 1
            rows.append(_row(f"easy/{len(rows)}", question, str(value), "train", level))

    def words(name: str, split: str) -> list[Any]:
        examples = load_dataset(name, split=split, seed=seed)
        if name == "mixed":
            return [e for e in examples if e.meta.get("domain") == "word"]
        return [e for e in examples if e.meta.get("level") == 3]

    test = [
        e
        for pair in zip(words("mixed", "test"), words("arithmetic", "test"), strict=False)
        for e in pair
    ]
    held = {e.question for e in test}
    for pair in zip(words("mixed", "train"), words("arithmetic", "train"), strict=False):
        for e in pair:
            if e.question not in held and e.question not in seen:
                seen.add(e.question)
                rows.append(_row(e.id, e.question, e.reference, "train", 3))
    # Added after the generators' rows (its own draw), so every earlier row keeps its offset.
    rng3 = random.Random(f"curriculum-probe-three:{seed}")
    made = 0
    while made < THREE:
        question, value = _three_operations(rng3)
        if question in seen:
            continue
        seen.add(question)
        made += 1
        rows.append(_row(f"three/{made - 1}", question, str(value), "train", 4))
    for e in test:
        rows.append(_row(e.id, e.question, e.reference, "test", 3))
    return rows


def curriculum_examples(split: str, seed: int = 0) -> list[Any]:
    """The built-in data set ``words``: ``curriculum_rows`` of ``split`` as examples, easiest
    first in train; ``meta.level`` is 1 (one operation), 2 (two), 3 (the generators' word
    problems) or 4 (three operations, or a sum that must be bracketed)."""
    from prefect_conductor.conductor.data.datasets import Example

    return [
        Example(
            id=r["id"],
            question=r["question"],
            reference=r["reference"],
            kind="math",
            meta=r["meta"],
        )  # fmt: skip
        for r in curriculum_rows(seed)
        if r["split"] == split
    ]
