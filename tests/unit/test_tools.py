"""Tool workers (issue #3): the calculator, code extraction, and the ``tool`` litellm provider,
as far as they run no program. The ``python`` tool running programs (``run_python``, the
provider's answers) is ``tests/integration/test_python_tool.py``; hostile programs are
``tests/integration/test_sandbox.py``."""

from __future__ import annotations

import asyncio
import contextlib
import io

import pytest
from prefect_conductor.conductor.errors import WorkerError
from prefect_conductor.conductor.pool import WorkerSpec
from prefect_conductor.conductor.providers._litellm import litellm
from prefect_conductor.conductor.providers.llm import complete
from prefect_conductor.conductor.providers.tools import (
    ToolError,
    evaluate,
    extract_code,
    extract_expression,
)
from prefect_conductor.conductor.providers.tools.provider import register, run_tool

# --- calculator ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("17 + 25", "42"),
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("10 - 2 - 3", "5"),
        ("-3 + +5", "2"),
        ("-(-(4))", "4"),
        ("2 ** 10", "1024"),
        ("2 ** 3 ** 2", "512"),  # right-associative, as in Python
        ("-2 ** 2", "-4"),
        ("2 ** -2", "0.25"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("1 / 3", "0.333333333333"),
        ("10 / 4 * 2", "5"),  # exact: a Fraction, not 5.000000000000001
        ("1 / 3 * 3", "1"),
        ("0.1 + 0.2", "0.3"),
        ("42.0", "42"),
        ("2.5 * 4", "10"),
        ("1e3", "1000"),
        ("3.14159265358979", "3.14159265359"),
        ("2 ** 100", "1267650600228229401496703205376"),
        ("2 ** 0.5", "1.41421356237"),
        ("abs(-7.5)", "7.5"),
        ("round(2.567, 2)", "2.57"),
        ("round(7 / 2)", "4"),
        ("min(3, 1, 2)", "1"),
        ("max(3, 1, 2) * 2", "6"),
        ("sqrt(16)", "4"),
        ("sqrt(2)", "1.41421356237"),
        ("sqrt(10 ** 400)", "1" + "0" * 200),  # exact for perfect squares
        ("floor(7 / 2)", "3"),
        ("ceil(7 / 2)", "4"),
        ("1_000 * 3", "3000"),
    ],
)
def test_evaluate(expression: str, expected: str) -> None:
    assert evaluate(expression) == expected


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("9**9**9", "exponent 387420489 is too large"),
        ("10**100000", "exponent 100000 is too large"),
        ("99999**1000", "more than 4000 digits"),
        ("(10**900)**900", "digits (limit 10000)"),  # |exponent| <= 1000, the result is not
        (
            "2**1000 * 2**1000 * 2**1000 * 2**1000 * 2**1000 * 2**1000 * 2**1000 * 2**1000"
            " * 2**1000 * 2**1000 * 2**1000 * 2**1000 * 2**1000 * 2**1000",
            "more than 4000 digits",
        ),
        ("1e308 * 10", "too large for a float"),
        ("10.0 ** 400", "too large for a float"),
        ("().__class__", "attribute access is not allowed"),
        ("(1).real", "attribute access is not allowed"),
        ("x + 1", "names are not allowed ('x')"),
        ("__import__('os')", "function '__import__' is not allowed"),
        ("math.sqrt(4)", "only plain function calls"),
        ("lambda: 1", "lambdas are not allowed"),
        ("'abc'", "strings are not allowed"),
        ("f'{1}'", "strings are not allowed"),
        ("[i for i in (1, 2)]", "comprehensions are not allowed"),
        ("(1, 2)[0]", "subscripts are not allowed"),
        ("1 < 2", "comparisons are not allowed"),
        ("1j", "only int and float"),
        ("True", "only int and float"),
        ("2 ^ 10", "use ** for powers"),
        ("1 << 10", "'<<' is not allowed"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("sqrt(-1)", "sqrt of a negative number"),
        ("(-8) ** (1 / 3)", "not a real number"),
        ("round(1 / 3, 1000)", "round() takes a whole number of digits"),
        ("abs(1, 2)", "abs() takes 1 argument(s), got 2"),
        ("max(x=1)", "positional arguments only"),
        ("1" * 1001, "1001 characters long (limit 1000)"),
        ("(" * 300 + "1" + ")" * 300, "not a valid arithmetic expression"),
        ("-" * 500 + "1", "501 parts (limit 200)"),
        ("1 +", "not a valid arithmetic expression"),
        ("", "empty expression"),
    ],
)
def test_evaluate_refuses(expression: str, reason: str) -> None:
    with pytest.raises(ToolError) as info:
        evaluate(expression)
    message = str(info.value)
    assert message.startswith("calculator: ") and "\n" not in message
    assert reason in message
    assert info.value.retryable is False
    assert isinstance(info.value, WorkerError)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Compute 17 + 25.", "17 + 25"),
        ("What is 3 * (4 + 5)?", "3 * (4 + 5)"),
        ("calculate 2^10", "2**10"),
        ("17 plus 25", "17 + 25"),
        ("What is 100 minus 58?", "100 - 58"),
        ("What is 6 x 7?", "6 * 7"),
        ("What is 6 × 7?", "6 * 7"),
        ("12 ÷ 4 =", "12 / 4"),
        ("What is 1,234 + 5?", "1234 + 5"),
        ("max(3,500), please", "max(3,500)"),
        ("In 2023, what is 5*5?", "5*5"),  # an expression beats a longer bare number
        ("What is sqrt(16) + 2?", "sqrt(16) + 2"),
        ("(then add 3 + 4)", "3 + 4"),
        ("Just 42", "42"),
    ],
)
def test_extract_expression(text: str, expected: str) -> None:
    assert extract_expression(text) == expected


def test_extract_expression_none() -> None:
    with pytest.raises(ToolError, match="no arithmetic expression in the instruction"):
        extract_expression("Add the two numbers from the previous step.")
    with pytest.raises(ToolError):
        extract_expression("Step 2: add them", require_operator=True)


# --- code extraction --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Run:\n```python\nprint(1)\n```\nand\n```python\nprint(2)\n```", "print(2)\n"),
        ("```python\nprint(1)\n```\n```text\nnot code\n```", "print(1)\n"),
        ("```\nx = 3\nprint(x)\n```", "x = 3\nprint(x)\n"),
        ("print(sum(range(10)))", "print(sum(range(10)))"),
    ],
)
def test_extract_code(text: str, expected: str) -> None:
    assert extract_code(text) == expected


@pytest.mark.parametrize("text", ["Run the code from the previous step.", "Run", "42", ""])
def test_extract_code_none(text: str) -> None:
    with pytest.raises(ToolError, match="no code"):
        extract_code(text)


# --- the tool provider, through litellm and prefect_conductor.conductor.providers.llm ---------------------------------


@pytest.fixture()
def tools() -> None:
    register()
    register()  # idempotent
    assert sum(e["provider"] == "tool" for e in litellm.custom_provider_map) == 1


def _ask(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def test_litellm_calculator(tools: None) -> None:
    response = litellm.completion(model="tool/calculator", messages=_ask("What is 17 + 25?"))
    assert response.choices[0].message.content == "42"
    assert response.usage.prompt_tokens == 0 and response.usage.completion_tokens == 0


def test_litellm_calculator_async(tools: None) -> None:
    response = asyncio.run(
        litellm.acompletion(model="tool/calculator", messages=_ask("What is 3 * (4 + 5)?"))
    )
    assert response.choices[0].message.content == "27"


def test_complete_calculator(tools: None) -> None:
    worker = WorkerSpec(
        name="calculator",
        kind="tool",
        model="tool/calculator",
        input_cost_per_token=0,
        output_cost_per_token=0,
    )
    done = complete(worker, _ask("calculate 2^10"))
    assert (done.text, done.input_tokens, done.output_tokens, done.cost_usd) == ("1024", 0, 0, 0)
    with pytest.raises(WorkerError) as info:
        complete(worker, _ask("What is 9**9**9?"))
    assert info.value.retryable is False
    assert (
        str(info.value)
        == "tool/calculator: calculator: exponent 387420489 is too large (limit 1000)"
    )


def test_calculator_reads_earlier_answer(tools: None) -> None:
    messages = [
        {"role": "system", "content": "You are part of a team answering: what is 6 * 7?"},
        {"role": "user", "content": "Write the product as an expression."},
        {"role": "assistant", "content": "The product is 6 * 7."},
        {"role": "user", "content": "Step 2: evaluate it."},  # "2" alone is not taken
    ]
    assert run_tool("tool/calculator", messages) == "42"


WORD_PROBLEM = (
    "A shop sells 41 stickers on Monday. Each sticker costs 5 dollars. "
    "How many dollars did the shop take in?"
)


@pytest.mark.parametrize(
    "messages",
    [
        _ask(WORD_PROBLEM),
        _ask("What is 7?"),
        [  # an earlier answer that is only a number is not an expression either
            {"role": "user", "content": WORD_PROBLEM},
            {"role": "assistant", "content": "The answer is 205."},
            {"role": "user", "content": "Give the final answer."},
        ],
    ],
    ids=["word-problem", "bare-number", "earlier-bare-number"],
)
def test_calculator_fails_on_prose_instead_of_echoing_a_number(
    tools: None, messages: list[dict[str, str]]
) -> None:
    with pytest.raises(ToolError, match="no arithmetic expression") as info:
        run_tool("tool/calculator", messages)
    assert "41" not in str(info.value) and "prose" in str(info.value)


def test_a_failing_calculator_is_a_failed_worker_call(tools: None) -> None:
    worker = WorkerSpec(name="calculator", kind="tool", model="tool/calculator")
    with pytest.raises(WorkerError, match="no arithmetic expression") as info:
        complete(worker, _ask(WORD_PROBLEM))
    assert info.value.retryable is False


def test_python_fails_on_prose_instead_of_answering(tools: None) -> None:
    with pytest.raises(ToolError, match="no code"):
        run_tool("tool/python", _ask(WORD_PROBLEM))
    with pytest.raises(ToolError, match="no code"):
        run_tool("tool/python", _ask("Run"))


def test_show_last_value_keeps_the_code_before_it_and_leaves_the_rest_alone() -> None:
    from prefect_conductor.conductor.providers.tools.sandbox import show_last_value

    program = "total = 0\nfor i in range(4):\n    total += i\ntotal"
    shown = show_last_value(program)
    assert shown.startswith("total = 0\nfor i in range(4):\n    total += i\n")
    assert "print(repr(" in shown
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # our own program: run here, not sandboxed
        exec(compile(shown, "<shown>", "exec"), {})  # noqa: S102
    assert printed.getvalue() == "6\n"
    # no last expression, code that does not parse, a splice that would not parse
    for unchanged in ("x = 1", "print(2)\nx = 3", "1 +", "x=1\n\\\n  x+1"):
        assert show_last_value(unchanged) == unchanged


def test_tool_errors_through_litellm(tools: None) -> None:
    with pytest.raises(litellm.exceptions.APIConnectionError) as info:
        litellm.completion(model="tool/python", messages=_ask("Run it."))
    cause = info.value.__cause__ or info.value.__context__
    assert isinstance(cause, ToolError) and cause.worker == "tool/python"
    with pytest.raises(ToolError, match="unknown tool 'tool/shell'"):
        run_tool("tool/shell", _ask("ls"))


def test_the_calculator_refuses_the_questions_expression_copied_with_other_brackets():
    """Issue #40: ``(3 + 4) * 5`` copied as ``3 + 4 * 5`` was a silent wrong answer; it is a
    failed step now, and an exact copy (or another expression) is answered as before."""
    from prefect_conductor.conductor.plan.prompts import worker_messages
    from prefect_conductor.conductor.providers.tools import ToolError
    from prefect_conductor.conductor.providers.tools.provider import answer_calculator

    question = "What is (3 + 4) * 5?"
    assert answer_calculator(worker_messages(question, "(3 + 4) * 5", [])) == "35"
    assert answer_calculator(worker_messages(question, "Compute (3+4)*5", [])) == "35"
    with pytest.raises(ToolError, match=r"'3 \+ 4 \* 5' is the question's '\(3 \+ 4\) \* 5'"):
        answer_calculator(worker_messages(question, "3 + 4 * 5", []))
    # brackets that change nothing are no miscopy; a new expression (a word problem's) is fine
    assert answer_calculator(worker_messages("What is (2 * 3) + 1?", "2 * 3 + 1", [])) == "7"
    story = "Tom has 3 bags of 4 marbles and finds 5 more. How many?"
    assert answer_calculator(worker_messages(story, "3 * 4 + 5", [])) == "17"
    # without the shared question (share_question off) there is nothing to compare
    assert answer_calculator(worker_messages(question, "3 + 4 * 5", [], False)) == "23"
