"""Property-based tests of the two parsers of model output: the plan and the calculator.

Both read hostile text, so any input must end in a value or in the module's own error, never
in another exception (issue 38). Generated valid plans parse back to what was generated, and
generated arithmetic agrees with the value this file computes from the tree it generated
(Fractions, never ``eval``).

The example budget is fixed and derandomized: the same examples on every run, a few seconds
in all. To search longer, raise it: ``FUZZ_EXAMPLES=15000 pytest tests/unit/test_fuzz.py``
draws random examples (a few minutes; hypothesis prints how to reproduce a failure).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from prefect_conductor.conductor.errors import ConductorError, PlanError
from prefect_conductor.conductor.plan.parse import extract_plan, parse_plan
from prefect_conductor.conductor.plan.workflow import Workflow
from prefect_conductor.conductor.pool import Pool, pool_from_dict
from prefect_conductor.conductor.providers.tools import ToolError
from prefect_conductor.conductor.providers.tools.calculator import evaluate, extract_expression

_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=_EXAMPLES,
    deadline=None,
    derandomize="FUZZ_EXAMPLES" not in os.environ,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

POOL: Pool = pool_from_dict(
    {
        "conductor": {"model": "local/tiny"},
        "workers": [
            {"name": "a", "model": "local/a"},
            {"name": "b", "model": "local/b"},
            {"name": "meta", "kind": "conductor"},
        ],
    }
)
NAMES = ("a", "b", "meta")

# --- the plan parser ---------------------------------------------------------------------------

# The pieces of plan text the scanner and the literal reader care about, to be shuffled.
PLAN_TOKENS = [
    "model_id = [",
    "subtasks = [",
    "access_list = [",
    "model_id=",
    '{"steps": [',
    '{"worker": 0, "instruction": "x"}',
    "[",
    "]",
    "(",
    ")",
    "{",
    "}",
    "'",
    '"',
    "'''",
    '"""',
    "\\",
    "#",
    "\n",
    " ",
    ",",
    ":",
    "0",
    "1",
    "-",
    "+",
    "'x'",
    '"all"',
    "all",
    "[]",
    "Model 1",
    "b'x'",
    "f'{",
    "\x00",
    "é",
]
plan_soup = st.lists(st.sampled_from(PLAN_TOKENS), max_size=60).map("".join)
any_plan_text = st.one_of(st.text(max_size=300), plan_soup)


def _one_line_error(exc: ConductorError) -> None:
    message = str(exc)
    assert message and "\n" not in message, repr(message)


@FUZZ
@given(any_plan_text)
@example("model_id = [0 # '" + "\\'" * 50 + "\n]\nsubtasks = ['x']\naccess_list = [[]]")
@example("model_id = [ '" + "\\\n" * 5 + "]")
def test_any_text_is_a_plan_or_a_plan_error(text: str) -> None:
    try:
        workflow = parse_plan(text, POOL)
    except PlanError as exc:
        _one_line_error(exc)
    else:
        assert isinstance(workflow, Workflow) and workflow.steps


@FUZZ
@given(any_plan_text)
def test_extract_plan_returns_lists_or_a_plan_error(text: str) -> None:
    try:
        raw = extract_plan(text)
    except PlanError as exc:
        _one_line_error(exc)
    else:
        assert len({len(raw.workers), len(raw.subtasks), len(raw.access)}) >= 1


@dataclass(frozen=True)
class GeneratedPlan:
    workers: list[Any]  # as written: an index, a name or "Model N"
    subtasks: list[str]
    access: list[Any]  # as written: indices (unsorted, repeated) or "all"
    want_workers: list[str]
    want_access: list[list[int]]


@st.composite
def plans(draw: st.DrawFn) -> GeneratedPlan:
    n = draw(st.integers(1, 6))
    workers, want_workers, access, want_access = [], [], [], []
    for i in range(n):
        w = draw(st.integers(0, len(NAMES) - 1))
        workers.append(draw(st.sampled_from([w, NAMES[w], f"Model {w}"])))
        want_workers.append(NAMES[w])
        if i and draw(st.booleans()):
            access.append(draw(st.sampled_from(["all", "ALL", " all "])))
            want_access.append(list(range(i)))
        else:
            reads = draw(st.lists(st.integers(0, i - 1), max_size=4)) if i else []
            access.append(reads)
            want_access.append(sorted(set(reads)))
    # Padded with whitespace, which the parser strips, around one visible character and more.
    chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
    instruction = st.builds(
        "{}{}{}{}".format,
        st.sampled_from(["", " ", "\n\t "]),
        st.sampled_from(["Q", "é", "检", "'", '"', "]", "#", "\\"]),
        st.text(chars, max_size=30),
        st.sampled_from(["", " ", " \n"]),
    )
    subtasks = draw(st.lists(instruction, min_size=n, max_size=n))
    return GeneratedPlan(workers, subtasks, access, want_workers, want_access)


def _paper(p: GeneratedPlan) -> str:
    return f"model_id = {p.workers!r}\nsubtasks = {p.subtasks!r}\naccess_list = {p.access!r}"


def _json(p: GeneratedPlan) -> str:
    steps = [
        {"worker": w, "instruction": s, "access": a}
        for w, s, a in zip(p.workers, p.subtasks, p.access, strict=True)
    ]
    return json.dumps({"steps": steps}, ensure_ascii=False)


# Reasoning before the plan: prose, and drafts of the lists that the plan must win over.
REASONING_TOKENS = [
    "Model 0 solves. ",
    "access_list = [[]]",
    "subtasks = ['draft']",
    "model_id = [2]",
    "model_id = [0, 1",
    "model_id == [3]",
    "it's ",
    '"quoted" ',
    "# ",
    "[",
    "]",
    "\n",
    "```python\n",
    "```\n",
    '{"steps": 0}',
]
reasoning = st.one_of(
    st.just(""),
    st.lists(st.sampled_from(REASONING_TOKENS), max_size=12).map("".join),
    st.text(max_size=80),
)


@FUZZ
@given(plans(), reasoning, st.sampled_from(["paper", "paper-fenced", "json"]))
def test_a_generated_plan_parses_back(plan: GeneratedPlan, before: str, form: str) -> None:
    body = {
        "paper": _paper(plan),
        "paper-fenced": f"```python\n{_paper(plan)}\n```\n",
        "json": _json(plan),
    }[form]
    if form == "json":
        assume('{"steps"' not in before)  # an unclosed draft of the JSON form may swallow it
    workflow = parse_plan(f"{before}\n{body}", POOL, max_steps=6)
    assert [s.worker for s in workflow.steps] == plan.want_workers
    assert [s.instruction for s in workflow.steps] == [t.strip() for t in plan.subtasks]
    assert [list(s.access) for s in workflow.steps] == plan.want_access


# --- the calculator ------------------------------------------------------------------------------

CALC_TOKENS = [
    *"0123456789",
    "+",
    "-",
    "*",
    "/",
    "//",
    "%",
    "**",
    "(",
    ")",
    ",",
    ".",
    "e",
    " ",
    "x",
    "^",
    "×",
    "sqrt(",
    "round(",
    "min(",
    "max(",
    "abs(",
    "floor(",
    "ceil(",
    "1e308",
    "9**9",
    "0.5",
    "plus",
    "times",
    "divided by",
    "1,000",
    "j",
    "'",
    "_",
    "lambda",
    "[",
    "]",
]
calc_soup = st.lists(st.sampled_from(CALC_TOKENS), max_size=40).map("".join)
any_calc_text = st.one_of(st.text(max_size=120), calc_soup)


@FUZZ
@given(any_calc_text)
def test_any_text_is_a_number_or_a_tool_error(text: str) -> None:
    try:
        result = evaluate(text)
    except ToolError as exc:
        assert str(exc).startswith("calculator: ")
        _one_line_error(exc)
    else:
        assert isinstance(result, str)
        float(result)  # the result is a number


@FUZZ
@given(any_calc_text)
def test_any_instruction_gives_an_expression_or_a_tool_error(text: str) -> None:
    try:
        expression = extract_expression(text)
    except ToolError as exc:
        _one_line_error(exc)
        return
    assert isinstance(expression, str) and expression
    try:
        evaluate(expression)
    except ToolError as exc:
        _one_line_error(exc)


# An arithmetic tree: an int, or (op, left, right), ("neg", x), or (function, *args).
Tree = Any


def _trees() -> st.SearchStrategy[Tree]:
    leaf = st.integers(0, 12)

    def extend(inner: st.SearchStrategy[Tree]) -> st.SearchStrategy[Tree]:
        return st.one_of(
            st.tuples(st.sampled_from(["+", "-", "*", "/", "//", "%"]), inner, inner),
            st.tuples(st.just("**"), inner, st.integers(-2, 3)),
            st.tuples(st.just("neg"), inner),
            st.tuples(st.just("abs"), inner),
            st.tuples(st.sampled_from(["min", "max"]), inner, inner),
        )

    return st.recursive(leaf, extend, max_leaves=12)


def _value(tree: Tree) -> Fraction:
    """What the calculator must answer: exact arithmetic over the generated tree."""
    if isinstance(tree, int):
        return Fraction(tree)
    op, *args = tree
    if op == "neg":
        return -_value(args[0])
    if op == "abs":
        return abs(_value(args[0]))
    if op == "**":
        return _value(args[0]) ** args[1]  # Fraction ** int: exact
    a, b = _value(args[0]), _value(args[1])
    return {
        "+": lambda: a + b,
        "-": lambda: a - b,
        "*": lambda: a * b,
        "/": lambda: a / b,
        "//": lambda: Fraction(a // b),
        "%": lambda: a % b,
        "min": lambda: min(a, b),
        "max": lambda: max(a, b),
    }[op]()


def _text(tree: Tree) -> str:
    """The tree written out, every operation in parentheses."""
    if isinstance(tree, int):
        return str(tree)
    op, *args = tree
    if op == "neg":
        return f"(-{_text(args[0])})"
    if op in ("abs", "min", "max"):
        return f"{op}({', '.join(_text(a) for a in args)})"
    right = f"({args[1]})" if op == "**" else _text(args[1])
    return f"({_text(args[0])} {op} {right})"


@FUZZ
@given(_trees())
@example(("/", 10, ("*", 4, 1)))
@example(("**", 0, -1))
def test_generated_arithmetic_agrees_with_exact_arithmetic(tree: Tree) -> None:
    text = _text(tree)
    try:
        want = _value(tree)
    except ZeroDivisionError:
        with pytest.raises(ToolError, match="division by zero"):
            evaluate(text)
        return
    size = max(abs(want.numerator), want.denominator)
    assume(size < 10**300)  # far below the calculator's limits, and a float can hold it
    got = evaluate(text)
    if want.denominator == 1:
        assert got == str(want.numerator), (text, got, want)
    else:
        assert math.isclose(float(got), float(want), rel_tol=1e-11), (text, got, want)
