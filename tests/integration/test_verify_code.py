"""The code verifier (issue #3) running HumanEval checks for real: in a child interpreter, and
through the isolated sandbox. How it builds the program, and what it makes of a runner's
result, are ``tests/unit/test_verify.py``, with a recording runner."""

from __future__ import annotations

import subprocess
import sys

import pytest
from prefect_conductor.conductor.data.datasets import load_dataset
from prefect_conductor.conductor.data.verify import verify, verify_code

HE0 = load_dataset("humaneval", limit=1)[0]
CORRECT_FUNCTION = """from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    ordered = sorted(numbers)
    return any(b - a < threshold for a, b in zip(ordered, ordered[1:]))
"""
WRONG_FUNCTION = """def has_close_elements(numbers, threshold):
    return False
"""


def subprocess_run_tests(program: str, tests: str, entry_point: str) -> tuple[bool, str]:
    """A stand-in for the sandbox: runs the tests in a child interpreter (never in-process)."""
    proc = subprocess.run(
        [sys.executable, "-I", "-c", f"{program}\n{tests}\ncheck({entry_point})\n"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return proc.returncode == 0, proc.stderr[-500:]


@pytest.mark.parametrize(
    ("answer", "correct"),
    [
        (f"Here it is:\n```python\n{CORRECT_FUNCTION}```\nDone.", True),
        (f"```python\n{HE0.meta['prompt']}{HE0.reference}```", True),
        (HE0.reference, True),  # a bare body: the prompt is prepended
        (f"```python\n{WRONG_FUNCTION}```", False),
        (f"```python\n{CORRECT_FUNCTION}```\nor shorter:\n```python\n{WRONG_FUNCTION}```", False),
        ("```python\ndef has_close_elements(numbers, threshold)\n```", False),  # syntax error
    ],
)
def test_verify_code_in_a_child_interpreter(answer, correct):
    verdict = verify_code(answer, HE0, subprocess_run_tests)
    assert verdict.correct is correct, verdict.details


def test_verify_code_with_the_real_sandbox():
    assert verify(HE0, f"```python\n{CORRECT_FUNCTION}```").correct
    assert not verify(HE0, f"```python\n{WRONG_FUNCTION}```").correct
