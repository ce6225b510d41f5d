"""The ``python`` tool running programs (issue #3): ``run_python`` and ``run_python_tests`` in
the sandbox, and the ``tool/python`` litellm provider's answers. What runs no program (the
calculator, code extraction, the provider's refusals) is ``tests/unit/test_tools.py``; hostile
programs are ``test_sandbox.py``."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import pytest
from prefect_conductor.conductor.providers._litellm import litellm
from prefect_conductor.conductor.providers.tools import ToolError, run_python, run_python_tests
from prefect_conductor.conductor.providers.tools.provider import register, run_tool
from prefect_conductor.conductor.providers.tools.sandbox import TRUNCATED

# --- run_python -------------------------------------------------------------------------------


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


# --- the tool provider, through litellm -------------------------------------------------------


@pytest.fixture()
def tools() -> None:
    register()


def _ask(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


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
        ("total = 0\nfor i in range(4):\n    total += i\ntotal", "6"),  # the code before it runs
    ],
)
def test_python_shows_the_value_of_a_last_expression(tools: None, code: str, answer: str) -> None:
    assert run_tool("tool/python", _ask(code)) == answer


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
    from prefect_conductor.conductor.plan.prompts import worker_messages

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


def test_python_reports_a_syntax_error_on_the_users_own_line(tools: None) -> None:
    out = run_tool("tool/python", _ask("```python\nx = 1\n1 +\n```"))
    assert "SyntaxError" in out and "line 2" in out
