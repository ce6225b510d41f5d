"""Tool workers (issue #3): the calculator, the sandbox, and the ``tool`` litellm provider."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import pytest

from conductor.errors import WorkerError
from conductor.pool import WorkerSpec
from conductor.providers._litellm import litellm
from conductor.providers.llm import complete
from conductor.providers.tools import (
    ToolError,
    evaluate,
    extract_code,
    extract_expression,
    run_python,
    run_python_tests,
)
from conductor.providers.tools.provider import register, run_tool
from conductor.providers.tools.sandbox import TRUNCATED

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


# --- sandbox ------------------------------------------------------------------------------


def test_run_python_prints_and_reads_stdin() -> None:
    result = run_python("import sys\nprint(sys.stdin.read().upper())", stdin="héllo")
    assert result.stdout == "HÉLLO\n"
    assert (result.returncode, result.timed_out, result.truncated) == (0, False, False)
    assert result.passed


def test_run_python_reports_errors() -> None:
    result = run_python("print('before')\nraise ValueError('boom')")
    assert result.stdout == "before\n"
    assert result.returncode == 1 and not result.passed
    assert "ValueError: boom" in result.stderr


def test_run_python_timeout_kills_loop() -> None:
    result = run_python("print('started')\nwhile True:\n    pass", timeout_s=1)
    assert result.timed_out and not result.passed
    assert result.returncode < 0  # killed by a signal
    assert result.stdout == "started\n"  # printed before the kill is kept (-u)


def test_run_python_memory_limit() -> None:
    result = run_python("x = bytearray(2 * 1024**3)\nprint('allocated')", memory_mb=512)
    assert result.returncode != 0
    assert "MemoryError" in result.stderr
    assert "allocated" not in result.stdout


def test_run_python_hides_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "s3cr3t")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-parent")
    result = run_python("import json, os\nprint(json.dumps(dict(os.environ)))")
    env = json.loads(result.stdout)
    assert "SECRET_TOKEN" not in env and "OPENAI_API_KEY" not in env
    assert "s3cr3t" not in result.stdout
    assert set(env) <= {"PATH", "HOME", "LANG", "PYTHONIOENCODING", "PYTHONDONTWRITEBYTECODE"}


def test_run_python_truncates_output() -> None:
    code = "import sys\nprint('a' * 50_000)\nprint('é' * 50_000, file=sys.stderr)"
    result = run_python(code, max_output=1000)
    assert result.truncated
    assert result.stdout == "a" * 1000 + TRUNCATED
    assert result.stderr == "é" * 1000 + TRUNCATED


def test_run_python_fresh_cwd_removed_after() -> None:
    """Isolated: the cwd is /sandbox, a private tmpfs; nothing of one run reaches the next."""
    code = (
        "import os\nprint(sorted(os.listdir()))\nopen('scratch.txt', 'w').write('x')\n"
        "print(os.getcwd())\nprint(sorted(os.listdir()))"
    )
    first = run_python(code).stdout.splitlines()
    second = run_python(code).stdout.splitlines()
    assert first == second == ["['main.py']", "/sandbox", "['main.py', 'scratch.txt']"]
    assert not Path("/sandbox/scratch.txt").exists()  # not on the host


def test_run_python_process_mode_fresh_cwd_removed_after() -> None:
    """``sandbox: process``: a fresh host temporary directory per run, removed after."""
    code = "import os\nopen('scratch.txt', 'w').write('x')\nprint(os.getcwd())\nprint(sorted(os.listdir()))"
    first = run_python(code, mode="process").stdout.splitlines()
    second = run_python(code, mode="process").stdout.splitlines()
    assert first[1] == "['main.py', 'scratch.txt']"  # nothing but the script it wrote itself
    assert first[0] != second[0]
    assert Path(first[0]).parent == Path(tempfile.gettempdir()).resolve()
    assert not Path(first[0]).exists() and not Path(second[0]).exists()


def _dead(pid: int) -> bool:
    """Gone or a zombie, within 2 s (a reparented zombie waits for init to reap it)."""
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _host_pids(marker: str) -> list[int]:
    """Host processes whose command line holds ``marker`` (and are not zombies)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    if not _dead(int(entry.name)):
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


_FORK = (
    "import os, time\npid = os.fork()\nif pid == 0:\n"
    "    os.execv('/bin/sleep', ['sleep', '{marker}'])\nprint(pid, flush=True)\n"
)


@pytest.mark.parametrize("mode", ["isolated", "process"])
@pytest.mark.parametrize("parent", ["exits", "hangs"])
def test_run_python_kills_forked_grandchild(parent: str, mode: str) -> None:
    marker = f"1000.{os.getpid()}{len(parent)}{len(mode)}"  # a unique sleep argument
    code = _FORK.format(marker=marker) + ("time.sleep(1000)\n" if parent == "hangs" else "")
    result = run_python(code, timeout_s=1, mode=mode)  # type: ignore[arg-type]
    assert result.timed_out is (parent == "hangs")
    assert int(result.stdout.split()[0]) > 0  # the fork happened
    assert _host_pids(marker) == []


def test_run_python_tests_humaneval_style() -> None:
    program = "def add(a, b):\n    return a + b\n"
    tests = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    assert run_python_tests(program, tests, "add").passed
    wrong = program.replace("a + b", "a - b")
    failed = run_python_tests(wrong, tests, "add")
    assert not failed.passed and "AssertionError" in failed.stderr
    with pytest.raises(ToolError, match="entry point must be an identifier"):
        run_python_tests(program, tests, "add); import os; (")


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


# --- the tool provider, through litellm and conductor.providers.llm ---------------------------------


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


@pytest.mark.parametrize(
    ("code", "answer"),
    [
        ("20 * 22 - 49", "391"),  # an expression plan, as the conductor writes them
        ("x = 3; x * 2", "6"),
        ("(1 +\n 2)", "3"),
        ("def f():\n    return 5\nf()", "5"),
        ("x = 'é'\n'ü' + x  # a comment", "'üé'"),  # repr, as a Python prompt shows it
        ("print('a')", "a"),  # print returns None: nothing more is shown
        ("print(1)\n2 ** 10", "1\n1024"),
        ("x = None\nx", "(no output)"),
        ("if True:\n    7", "(no output)"),  # only a top-level expression is shown
    ],
)
def test_python_shows_the_value_of_a_last_expression(tools: None, code: str, answer: str) -> None:
    assert run_tool("tool/python", _ask(code)) == answer


def test_show_last_value_keeps_the_code_before_it_and_leaves_the_rest_alone(tools: None) -> None:
    from conductor.providers.tools.sandbox import show_last_value

    program = "total = 0\nfor i in range(4):\n    total += i\ntotal"
    shown = show_last_value(program)
    assert shown.startswith("total = 0\nfor i in range(4):\n    total += i\n")
    assert "print(repr(" in shown and run_tool("tool/python", _ask(program)) == "6"
    # no last expression, code that does not parse, a splice that would not parse
    for unchanged in ("x = 1", "print(2)\nx = 3", "1 +", "x=1\n\\\n  x+1"):
        assert show_last_value(unchanged) == unchanged
    # a syntax error is still reported on the user's own line
    out = run_tool("tool/python", _ask("```python\nx = 1\n1 +\n```"))
    assert "SyntaxError" in out and "line 2" in out


def test_python_runs_code_from_earlier_answer(tools: None) -> None:
    messages = [
        {"role": "user", "content": "Write code that prints 6 * 7."},
        {"role": "assistant", "content": "Here:\n```python\nprint(6 * 7)\n```"},
        {"role": "user", "content": "Run the code from the previous step."},
    ]
    response = litellm.completion(model="tool/python", messages=messages)
    assert response.choices[0].message.content == "42"
    assert response.usage.total_tokens == 0


def test_python_runs_the_program_of_the_shared_question(tools: None) -> None:
    """A plan's subtask may name the question's program instead of copying it (issue #18)."""
    from conductor.plan.prompts import worker_messages

    question = "What does this program print?\n```python\nprint(sum(range(5)))\n```"
    asked = worker_messages(question, "Run the program in the question.", [])
    assert run_tool("tool/python", asked) == "10"
    # The subtask's own code and an earlier answer's still come first.
    own = worker_messages(question, "```python\nprint('own')\n```", [])
    assert run_tool("tool/python", own) == "own"
    earlier = worker_messages(question, "Run it.", [("Write it.", "```python\nprint(7)\n```")])
    assert run_tool("tool/python", earlier) == "7"
    # A question without a fenced block is not taken for code, and the question is not
    # shared when the pool says so.
    with pytest.raises(ToolError, match="no code in the instruction, an earlier answer"):
        run_tool("tool/python", worker_messages("What is 2 + 3?", "Run the program.", []))
    with pytest.raises(ToolError):
        run_tool("tool/python", worker_messages(question, "Run it.", [], share_question=False))


def test_python_reports_stderr_and_timeout(tools: None) -> None:
    failing = run_tool("tool/python", _ask("```python\nprint('hi')\n1 / 0\n```"))
    assert failing.startswith("hi\nstderr:\nTraceback") and "ZeroDivisionError" in failing
    slow = run_tool("tool/python", _ask("```python\nwhile True: pass\n```"), timeout_s=1)
    assert slow == "timed out after 1s"


def test_tool_errors_through_litellm(tools: None) -> None:
    with pytest.raises(litellm.exceptions.APIConnectionError) as info:
        litellm.completion(model="tool/python", messages=_ask("Run it."))
    cause = info.value.__cause__ or info.value.__context__
    assert isinstance(cause, ToolError) and cause.worker == "tool/python"
    with pytest.raises(ToolError, match="unknown tool 'tool/shell'"):
        run_tool("tool/shell", _ask("ls"))
