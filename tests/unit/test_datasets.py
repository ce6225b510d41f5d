"""Unit tests for prefect_conductor.conductor.data.datasets (issues #3, #18): arithmetic, mixed, humaneval and
file loaders."""

from __future__ import annotations

import ast
import csv
import json
import operator
import re
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prefect_conductor.conductor.data.datasets import (
    ARITHMETIC_PHRASINGS,
    ARITHMETIC_SIZES,
    BUILTIN_DATASETS,
    HUMANEVAL_INSTRUCTION,
    MIXED_DOMAINS,
    MIXED_SIZES,
    PROGRAM_PHRASINGS,
    DatasetError,
    Example,
    load_dataset,
)
from prefect_conductor.conductor.data.verify import verify
from prefect_conductor.conductor.errors import ConductorError

REPO = Path(__file__).resolve().parents[2]
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(expression: str) -> Fraction:
    """An independent evaluator: integers, + - * /, parentheses; anything else is an error."""
    assert re.fullmatch(r"[\d+\-*/() ]+", expression), expression

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            return walk(node.left) / walk(node.right)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"unexpected node {ast.dump(node)}")

    return walk(ast.parse(expression, mode="eval").body)


def count_ops(expression: str) -> int:
    return sum(isinstance(n, ast.BinOp) for n in ast.walk(ast.parse(expression, mode="eval")))


@pytest.fixture(scope="module")
def arith() -> dict[str, list[Example]]:
    return {split: load_dataset("arithmetic", split=split) for split in ("test", "train")}


# --- arithmetic -------------------------------------------------------------------------------


def test_arithmetic_sizes_ids_and_kind(arith):
    for split, examples in arith.items():
        assert len(examples) == ARITHMETIC_SIZES[split]
        assert [e.id for e in examples] == [f"arithmetic/{split}/{i}" for i in range(len(examples))]
        assert {e.kind for e in examples} == {"math"}
        assert len({e.question for e in examples}) == len(examples)


def test_arithmetic_is_deterministic(arith):
    assert load_dataset("arithmetic") == arith["test"]
    assert load_dataset("arithmetic", split="train", seed=0) == arith["train"]
    other = load_dataset("arithmetic", seed=1)
    assert [e.question for e in other] != [e.question for e in arith["test"]]
    assert load_dataset("arithmetic", seed=1) == other


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_arithmetic_splits_never_share_a_question(seed):
    test = {e.question for e in load_dataset("arithmetic", split="test", seed=seed)}
    train = {e.question for e in load_dataset("arithmetic", split="train", seed=seed)}
    assert len(test) == 200 and len(train) == 1000
    assert not test & train


def test_arithmetic_references_match_an_independent_evaluation(arith):
    for example in arith["test"] + arith["train"]:
        value = evaluate(example.meta["expression"])
        assert value.denominator == 1, example
        assert example.reference == str(value.numerator), example
        # every operand is in the question, and no other number is
        in_question = Counter(re.findall(r"\d+", example.question))
        assert in_question == Counter(re.findall(r"\d+", example.meta["expression"])), example


def test_arithmetic_levels_are_mixed_evenly_and_shaped(arith):
    examples = arith["test"]
    assert Counter(e.meta["level"] for e in examples) == {1: 67, 2: 67, 3: 66}
    assert [e.meta["level"] for e in examples[:6]] == [1, 2, 3, 1, 2, 3]
    for e in examples + arith["train"]:
        expr, level = e.meta["expression"], e.meta["level"]
        numbers = [int(n) for n in re.findall(r"\d+", expr)]
        if level == 1:
            assert re.fullmatch(r"\d\d [+-] \d\d", expr), e
            assert e.question == f"What is {expr}?"
        elif level == 2:
            assert len(numbers) == 3 and all(10 <= n <= 999 for n in numbers), e
            assert "(" in expr and ("*" in expr or "/" in expr), e
            assert e.question == f"What is {expr}?"
        else:
            assert level == 3 and count_ops(expr) in (2, 3), e
            assert not e.question.startswith("What is") and e.question.endswith("?"), e
            assert int(e.reference) >= 0, e
    assert any("/" in e.meta["expression"] for e in examples)
    assert any(e.reference.startswith("-") for e in examples)  # level 1 "a - b" with a < b


def test_arithmetic_limit_takes_the_first_n(arith):
    assert load_dataset("arithmetic", limit=10) == arith["test"][:10]
    assert load_dataset("arithmetic", split="train", limit=3) == arith["train"][:3]
    assert load_dataset("arithmetic", limit=0) == []
    assert len(load_dataset("arithmetic", limit=10_000)) == 200
    with pytest.raises(DatasetError, match="limit"):
        load_dataset("arithmetic", limit=-1)


def test_arithmetic_unknown_split():
    with pytest.raises(DatasetError, match="'validation'"):
        load_dataset("arithmetic", split="validation")


# --- mixed (issue #18) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed() -> dict[str, list[Example]]:
    return {split: load_dataset("mixed", split=split) for split in ("test", "train")}


def test_mixed_sizes_ids_and_builtin(mixed):
    assert "mixed" in BUILTIN_DATASETS
    for split, examples in mixed.items():
        assert len(examples) == MIXED_SIZES[split]
        assert [e.id for e in examples] == [f"mixed/{split}/{i}" for i in range(len(examples))]
        assert len({e.question for e in examples}) == len(examples)
    with pytest.raises(DatasetError, match="splits"):
        load_dataset("mixed", split="validation")


def test_mixed_is_seeded(mixed):
    again = load_dataset("mixed", split="train")
    assert [e.model_dump() for e in again] == [e.model_dump() for e in mixed["train"]]
    other = load_dataset("mixed", split="test", seed=1)
    assert [e.question for e in other] != [e.question for e in mixed["test"]]
    assert {e.meta["domain"] for e in other} == set(MIXED_DOMAINS)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_mixed_splits_never_share_a_question(seed):
    test = load_dataset("mixed", split="test", seed=seed)
    train = load_dataset("mixed", split="train", seed=seed)
    assert not {e.question for e in test} & {e.question for e in train}


def test_mixed_every_prefix_is_balanced(mixed):
    for examples in mixed.values():
        assert all(e.meta["domain"] in MIXED_DOMAINS for e in examples)
        for n in range(1, len(examples) + 1):
            counts = Counter(e.meta["domain"] for e in examples[:n])
            assert max(counts.values()) - min(counts.get(d, 0) for d in MIXED_DOMAINS) <= 1
    topics = Counter(e.meta["task"] for e in mixed["test"][:100] if e.meta["domain"] == "knowledge")
    assert max(topics.values()) - min(topics.values()) <= 1, topics


def test_mixed_kinds_match_the_verifiers(mixed):
    for e in mixed["test"] + mixed["train"]:
        domain = e.meta["domain"]
        if domain == "knowledge":
            assert e.kind == "text"
        elif domain == "program":
            assert e.kind == ("math" if re.fullmatch(r"-?\d+", e.reference) else "text")
        else:
            assert e.kind == "math"
        assert verify(e, e.reference.split("|")[0]).correct, e  # it passes its own verifier


def test_mixed_arithmetic_and_word_references_come_from_the_tree(mixed):
    for e in mixed["test"] + mixed["train"]:
        if e.meta["domain"] not in ("arithmetic", "word"):
            continue
        assert e.reference == str(evaluate(e.meta["expression"]))
        numbers = re.findall(r"\d+", e.meta["expression"])
        if e.meta["domain"] == "word":
            assert e.meta["level"] == 3
            assert all(n in e.question for n in numbers)  # every operand is in the text
            assert not re.search(r"\d\s*[-+*/]\s*\d", e.question)  # but no expression
        elif e in mixed["test"]:  # the measured phrasing
            assert e.question == f"What is {e.meta['expression']}?"
        else:  # train: any phrasing of the expression, exactly as written
            assert e.question in {p.format(e.meta["expression"]) for p in ARITHMETIC_PHRASINGS}


def test_mixed_train_asks_in_many_phrasings_and_test_in_the_measured_one(mixed):
    """Issue #40, point 6: route by need, not by template; test keeps its phrasing."""
    for domain, phrasings, key in (
        ("arithmetic", ARITHMETIC_PHRASINGS, "expression"),
        ("program", PROGRAM_PHRASINGS, "program"),
    ):
        train = [e for e in mixed["train"] if e.meta["domain"] == domain]
        used = {p for e in train for p in phrasings if e.question == p.format(e.meta[key])}
        assert len(used) == len(phrasings)  # every phrasing is drawn
        test = [e for e in mixed["test"] if e.meta["domain"] == domain]
        assert all(e.question == phrasings[0].format(e.meta[key]) for e in test)

    # the same numbers as before phrasings existed: dedup and draws ran on the measured one
    def expressions(split: str) -> set[str]:
        return {e.meta["expression"] for e in mixed[split] if e.meta["domain"] == "arithmetic"}

    assert not expressions("train") & expressions("test")


def test_mixed_knowledge_facts_are_disjoint_in_phrasing(mixed):
    test = [e for e in mixed["test"] if e.meta["domain"] == "knowledge"]
    train = [e for e in mixed["train"] if e.meta["domain"] == "knowledge"]
    assert {e.meta["task"] for e in test} == {e.meta["task"] for e in train}
    assert all(e.kind == "text" and e.reference for e in test + train)
    assert len(train) == MIXED_SIZES["train"] // len(MIXED_DOMAINS)


# --- humaneval --------------------------------------------------------------------------------


def test_humaneval_loads_all_164_problems():
    examples = load_dataset("humaneval")
    assert len(examples) == 164
    assert examples[0].id == "HumanEval/0" and examples[-1].id == "HumanEval/163"
    assert [e.id for e in examples] == [f"HumanEval/{i}" for i in range(164)]
    for e in examples:
        assert e.kind == "code"
        assert set(e.meta) == {"entry_point", "test", "prompt"}
        assert f"def {e.meta['entry_point']}" in e.meta["prompt"]
        assert "def check(candidate)" in e.meta["test"]
        assert e.question == HUMANEVAL_INSTRUCTION + e.meta["prompt"]
        # the prompt alone is a valid stub and prompt + solution is a valid program
        ast.parse(e.meta["prompt"])
        ast.parse(e.meta["prompt"] + e.reference)
    assert examples[0].meta["entry_point"] == "has_close_elements"
    assert "return False" in examples[0].reference
    assert load_dataset("humaneval", limit=2) == examples[:2]


def test_humaneval_has_no_train_split():
    with pytest.raises(DatasetError, match="only a 'test' split"):
        load_dataset("humaneval", split="train")


# --- files ------------------------------------------------------------------------------------

ROWS = [
    {"id": "q1", "question": "What is 2 + 2?", "reference": "4", "kind": "math", "source": "x"},
    {
        "id": "q2",
        "question": "Capital of France?",
        "reference": "Paris",
        "kind": "text",
        "source": "y",
    },
    {"id": "q3", "question": "Pick one", "reference": "B", "kind": "mc", "source": "z"},
]


def write(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        with path.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv"])
def test_file_loaders_read_rows_and_put_extra_columns_in_meta(tmp_path, suffix):
    path = write(tmp_path / f"data{suffix}", ROWS)
    examples = load_dataset(str(path))
    assert [e.id for e in examples] == ["q1", "q2", "q3"]
    assert [e.kind for e in examples] == ["math", "text", "mc"]
    assert examples[1].reference == "Paris"
    assert [e.meta for e in examples] == [{"source": "x"}, {"source": "y"}, {"source": "z"}]
    assert load_dataset(str(path), limit=2) == examples[:2]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv"])
def test_file_missing_column_names_file_and_column(tmp_path, suffix):
    rows = [{k: v for k, v in r.items() if k != "reference"} for r in ROWS]
    path = write(tmp_path / f"data{suffix}", rows)
    with pytest.raises(DatasetError) as err:
        load_dataset(str(path))
    assert str(path) in str(err.value) and "'reference'" in str(err.value)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv"])
def test_file_bad_kind_names_the_row(tmp_path, suffix):
    rows = [dict(r) for r in ROWS]
    rows[1]["kind"] = "essay"
    path = write(tmp_path / f"data{suffix}", rows)
    with pytest.raises(DatasetError, match=r"row 2 \(id 'q2'\) has kind 'essay'"):
        load_dataset(str(path))


def test_jsonl_non_string_values_and_meta_round_trip(tmp_path):
    example = Example(
        id="c1",
        question="q",
        reference="r",
        kind="code",
        meta={"entry_point": "f", "test": "def check(c): pass", "prompt": "def f():"},
    )
    rows = [example.model_dump(), {"id": 7, "question": "2*3?", "reference": 6, "kind": "math"}]
    path = write(tmp_path / "d.jsonl", rows)
    loaded = load_dataset(str(path))
    assert loaded[0] == example
    assert (loaded[1].id, loaded[1].reference) == ("7", "6")


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([ROWS[0], ROWS[0]], "row 2 repeats id 'q1'"),
        ([{**ROWS[0], "question": ""}], "row 1 has an empty 'question'"),
        ([{**ROWS[0], "kind": "code"}], "row 1 has kind 'code' but no 'entry_point'"),
    ],
)
def test_file_row_errors(tmp_path, rows, match):
    with pytest.raises(DatasetError, match=match):
        load_dataset(str(write(tmp_path / "d.jsonl", rows)))


def test_file_split_column_selects_rows(tmp_path):
    rows = [{**r, "split": s} for r, s in zip(ROWS, ["train", "test", "test"], strict=True)]
    path = write(tmp_path / "d.csv", rows)
    assert [e.id for e in load_dataset(str(path))] == ["q2", "q3"]
    assert [e.id for e in load_dataset(str(path), split="train")] == ["q1"]
    with pytest.raises(DatasetError, match=r"splits are \['test', 'train'\]"):
        load_dataset(str(path), split="dev")


def test_bad_files(tmp_path):
    bad_json = tmp_path / "bad.jsonl"
    # Rows are read and checked in file order: row 1 is a good row, line 2 is not JSON.
    bad_json.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(DatasetError, match="line 2 is not valid JSON"):
        load_dataset(str(bad_json))
    txt = tmp_path / "data.txt"
    txt.write_text("hello")
    with pytest.raises(DatasetError, match="unsupported file type '.txt'"):
        load_dataset(str(txt))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(DatasetError, match="no header"):
        load_dataset(str(empty))
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match="junk.parquet"):
        load_dataset(str(junk))


def test_unknown_name_lists_builtins(tmp_path):
    with pytest.raises(DatasetError) as err:
        load_dataset("gsm8k")
    assert all(name in str(err.value) for name in BUILTIN_DATASETS)
    assert isinstance(err.value, ConductorError)
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset(str(tmp_path / "missing.jsonl"))


# --- reading only what a limit needs (issue #38) -----------------------------------------------

BIG = 50_000


def _big_rows(n: int = BIG) -> list[dict]:
    return [
        {"id": f"q{i}", "question": f"What is {i} + 1?", "reference": str(i + 1), "kind": "math"}
        for i in range(n)
    ]


def test_jsonl_limit_stops_reading_before_a_bad_later_line(tmp_path):
    """The last of 50,001 lines is not JSON: reading it would raise, so a limit that is met
    early must never parse it (the old loader parsed every line, then sliced)."""
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _big_rows()) + "{not json\n")
    assert [e.id for e in load_dataset(str(path), limit=2)] == ["q0", "q1"]
    assert len(load_dataset(str(path), limit=BIG)) == BIG  # the bad line is the next one
    with pytest.raises(DatasetError, match=f"line {BIG + 1} is not valid JSON"):
        load_dataset(str(path))
    # Row checks run only on rows read too: a bad kind after the limit is never seen.
    bad_kind = tmp_path / "kind.jsonl"
    bad_kind.write_text("".join(json.dumps(r) + "\n" for r in [*ROWS, {**ROWS[0], "kind": "x"}]))
    assert len(load_dataset(str(bad_kind), limit=3)) == 3


def test_jsonl_split_and_limit_stop_at_the_nth_row_of_the_split(tmp_path):
    rows = [{**r, "split": "test" if i % 3 == 0 else "train"} for i, r in enumerate(_big_rows())]
    path = tmp_path / "split.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{not json\n")
    assert [e.id for e in load_dataset(str(path), limit=3)] == ["q0", "q3", "q6"]
    assert [e.id for e in load_dataset(str(path), split="train", limit=3)] == ["q1", "q2", "q4"]
    # A split no row has needs the whole file (to list the splits): the bad line is reached.
    with pytest.raises(DatasetError, match=f"line {BIG + 1} is not valid JSON"):
        load_dataset(str(path), split="dev", limit=1)


def test_csv_limit_stops_reading_before_bad_bytes(tmp_path):
    path = tmp_path / "big.csv"
    write(path, _big_rows())
    with path.open("ab") as fh:
        fh.write(b"q-bad,\xff\xfe not utf-8,1,math\n")
    assert [e.id for e in load_dataset(str(path), limit=2)] == ["q0", "q1"]
    with pytest.raises(DatasetError, match="cannot read"):
        load_dataset(str(path))


def test_parquet_limit_reads_only_the_first_row_groups(tmp_path):
    """The last of ten row groups is overwritten with junk: reading it raises, so a limit
    met in the first row group must stop before it."""
    path = tmp_path / "big.parquet"
    pq.write_table(
        pa.Table.from_pylist(_big_rows(10_000)), path, row_group_size=1_000, compression="none"
    )
    last = pq.ParquetFile(path).metadata.row_group(9)
    chunks = [last.column(i) for i in range(last.num_columns)]
    start = min(c.dictionary_page_offset or c.data_page_offset for c in chunks)
    end = max(
        (c.dictionary_page_offset or c.data_page_offset) + c.total_compressed_size for c in chunks
    )
    data = bytearray(path.read_bytes())
    data[start:end] = b"\xff" * (end - start)
    path.write_bytes(bytes(data))
    assert [e.id for e in load_dataset(str(path), limit=2)] == ["q0", "q1"]
    with pytest.raises(DatasetError, match=str(path)):
        load_dataset(str(path))


# --- a bad question fails its row only, when the caller keeps it (issue #38) -------------------

BAD_QUESTIONS = [
    ({"question": ""}, "has an empty 'question'"),
    ({"question": "  \n\t "}, "has a blank 'question' (only whitespace or invisible characters)"),
    (
        {"question": "\u200b \ufeff"},
        "has a blank 'question' (only whitespace or invisible characters)",
    ),
    ({"question": None}, "has an empty 'question'"),
    ({"question": 42}, "has a 'question' of type int, not text"),
    ({"question": ["a", "b"]}, "has a 'question' of type list, not text"),
    (None, "has no 'question'"),  # the row has no question key
]


@pytest.mark.parametrize(("change", "problem"), BAD_QUESTIONS)
def test_a_bad_question_fails_the_file_by_default_and_its_row_when_kept(tmp_path, change, problem):
    bad = {**ROWS[1], **change} if change else {k: v for k, v in ROWS[1].items() if k != "question"}
    path = write(tmp_path / "d.jsonl", [ROWS[0], bad, ROWS[2]])
    with pytest.raises(DatasetError, match=re.escape(f"row 2 {problem}")):
        load_dataset(str(path))
    kept = load_dataset(str(path), bad_questions="keep")
    assert [e.id for e in kept] == ["q1", "q2", "q3"]
    assert [e.invalid for e in kept] == [None, f"row 2 {problem}", None]
    assert kept[1].question == "" and kept[1].reference == "Paris"
    assert kept[0] == load_dataset(str(path), limit=1)[0]  # good rows as before


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_an_empty_question_cell_fails_its_row_when_kept(tmp_path, suffix):
    path = write(tmp_path / f"d{suffix}", [ROWS[0], {**ROWS[1], "question": ""}, ROWS[2]])
    kept = load_dataset(str(path), bad_questions="keep")
    assert [e.invalid is None for e in kept] == [True, False, True]
    long = "x" * 25_000  # a request's limit, not the loader's: the eval fails it alone
    path = write(tmp_path / f"long{suffix}", [{**ROWS[0], "question": long}])
    assert load_dataset(str(path))[0].question == long


def test_invalid_is_not_a_column_of_a_dumped_example():
    example = Example(id="a", question="", reference="r", kind="math", invalid="row 1 ...")
    assert "invalid" not in example.model_dump()
