"""Unit tests for prefect_conductor.conductor.data.verify (issue #3): math, mc, text and code verifiers, reward."""

from __future__ import annotations

import doctest
import re
import sys
import types
from typing import Any

import prefect_conductor.conductor.data.verify as verify_mod
import pytest
from prefect_conductor.conductor.data.datasets import DatasetError, Example, load_dataset
from prefect_conductor.conductor.data.verify import (
    Verdict,
    answer_key,
    extract_code,
    normalize_text,
    reward,
    sandbox_run_tests,
    verify,
    verify_code,
    verify_math,
    verify_mc,
    verify_text,
)
from prefect_conductor.conductor.errors import ConductorError


def test_doctests():
    assert doctest.testmod(verify_mod).failed == 0


# --- math -------------------------------------------------------------------------------------

MATH_CASES = [
    # (answer, reference, correct, extracted)
    ("17 + 25 = 42", "42", True, "42"),
    ("The answer is \\boxed{42}", "42", True, "42"),
    ("42.0", "42", True, "42.0"),
    ("42", "42.0", True, "42"),
    ("1,234", "1234", True, "1,234"),
    ("The total is $1,234,567.", "1234567", True, "1,234,567"),
    ("-5", "-5", True, "-5"),
    ("It drops to -5 degrees", "5", False, "-5"),
    ("3/4", "0.75", True, "3/4"),
    ("0.75", "3/4", True, "0.75"),
    ("\\boxed{\\frac{3}{4}}", "0.75", True, "3/4"),
    ("$\\dfrac{6}{8}$", "3/4", True, "6/8"),
    ("0.3333333", "1/3", True, "0.3333333"),
    ("0.33", "1/3", False, "0.33"),
    ("I think 41... no, 42", "42", True, "42"),
    ("I think 41... no, 42", "41", False, "42"),
    ("The answer is 42 because 6 * 7 = 42 and 7 is prime.", "42", True, "42"),
    ("Final answer: **-17**. Check: 3 - 20 = -17, done in 2 steps", "-17", True, "-17"),
    ("\\boxed{42} was my first guess, but 43", "42", True, "42"),
    ("2 + 2 = 4.", "4", True, "4"),
    ("x = 12 apples", "12", True, "12"),
    ("17 + 25 = 43", "42", False, "43"),
    ("41", "42", False, "41"),
    ("3/0", "0", False, "3/0"),
    ("version2 of 7", "7", True, "7"),
    ("I have no idea", "42", False, None),
    ("\\boxed{forty-two}", "42", False, None),
    ("", "42", False, None),
    ("9" * 5000, "9", False, "9" * 5000),  # past int()'s digit limit: no crash
]


@pytest.mark.parametrize(("answer", "reference", "correct", "extracted"), MATH_CASES)
def test_verify_math(answer, reference, correct, extracted):
    verdict = verify_math(answer, reference)
    assert (verdict.correct, verdict.extracted) == (correct, extracted), verdict.details


def test_verify_math_reports_rule_and_bad_reference():
    assert verify_math("so 40 + 2 = 42", "42").details == "trailing =: 42 == reference 42"
    assert verify_math("The answer is 5.", "6").details == "answer is: 5 != reference 6"
    bad = verify_math("42", "forty-two")
    assert not bad.correct and "not a number" in bad.details


class _Scanned:
    """A compiled pattern that records the length of every text it is asked to scan."""

    def __init__(self, pattern: re.Pattern[str], lengths: list[int]):
        self._pattern, self._lengths = pattern, lengths

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._pattern, name)

        def scan(*args: Any, **kwargs: Any) -> Any:
            self._lengths.append(max(len(a) for a in args if isinstance(a, str)))
            return method(*args, **kwargs)

        return scan


def test_verify_math_is_linear_on_hostile_text(monkeypatch):
    """200k characters of near-misses: it finishes (a backtracking regex would not) because
    each pattern scans a bounded tail a bounded number of times; counted, not timed."""
    lengths: list[int] = []
    for name in ("_NUM_RE", "_ANSWER_NUM_RE", "_EQ_END_RE", "_FRAC_RE"):
        monkeypatch.setattr(verify_mod, name, _Scanned(getattr(verify_mod, name), lengths))
    text = "answer is " * 5_000 + "1," * 50_000 + "= " * 20_000 + "=" + "1/" * 10_000
    assert verify_math(text, "1") == Verdict(True, "1/1", "last number: 1/1 == reference 1")
    assert 0 < len(lengths) <= 10 and max(lengths) <= verify_mod._TAIL_CHARS
    scanned = list(lengths)
    lengths.clear()
    verify_math("= " * 100_000 + text, "1")  # twice as long: the same work
    assert lengths == scanned


# --- multiple choice --------------------------------------------------------------------------

MC_CASES = [
    ("The answer is (B)", "B", True, "B"),
    ("The answer is (B)", "(b)", True, "B"),
    ("B.", "B", True, "B"),
    ("B. Paris, because it is the capital", "B", True, "B"),
    ("**C**", "c", True, "C"),
    ("**C**", "B", False, "C"),
    ("Answer: d", "D", True, "D"),
    ("answer: d", "A", False, "D"),
    ("**Answer:** C", "C", True, "C"),
    ("The answer is option A.", "A", True, "A"),
    ("b", "B", True, "B"),
    ("(a)", "A", True, "A"),
    ("A) Rome\nB) Paris\nThe answer is B because Paris", "B", True, "B"),
    ("The answer is a bit unclear", "A", False, None),
    ("The answer is Apples", "A", False, None),
    ("I am not sure", "A", False, None),
    ("The answer is (E)", "B", False, "E"),
]


@pytest.mark.parametrize(("answer", "reference", "correct", "extracted"), MC_CASES)
def test_verify_mc(answer, reference, correct, extracted):
    verdict = verify_mc(answer, reference)
    assert (verdict.correct, verdict.extracted) == (correct, extracted), verdict.details


def test_verify_mc_bad_reference():
    verdict = verify_mc("B", "Paris")
    assert not verdict.correct and "not an option letter" in verdict.details


# --- text -------------------------------------------------------------------------------------

TEXT_CASES = [
    ("Paris", "Paris", True),
    ("paris.", "Paris", True),
    ("The Eiffel  Tower!", "eiffel tower", True),
    ("The answer is: the Eiffel Tower.", "Eiffel Tower", True),
    ("I reasoned a lot.\nAnswer: Marie Curie", "Marie Curie", True),
    ("\\boxed{an apple}", "apple", True),
    ("London", "Paris", False),
    ("", "Paris", False),
    # issue #18: a short answer in the worker's own words passes (measured smol outputs)
    ("The capital city of France is Paris.", "Paris", True),
    ('The opposite of "hot" is "cold"', "cold", True),
    ("The opposite of \u201chot\u201d is \u201ccold\u201d.", "cold", True),
    ("Paris is the capital and largest city of France.", "Paris", True),
    ("Paris, France", "Paris", True),  # two items, no "or": a place, not a hedge
    ("The capital isn't Lyon, it's Paris.", "Paris", True),
    ("The answer is: New York City", "new york city", True),
    # the first sentence is the answer; what follows cannot add candidates
    (
        "The opposite of hot is cold. This is a fundamental concept in science and "
        "technology, where heat is often associated with warmth and light.",
        "cold",
        True,
    ),
    ("Lyon.\nParis", "Paris", False),
    ("It is Lyon. Paris, Berlin and Rome are other capitals.", "Paris", False),
    ("The capital of the U.S. is Washington, D.C. today.", "Washington, D.C.", True),
    # aliases
    ("It is Paris, France.", "Lutetia|paris, france", True),
    ("Lutetia", "Paris|Lutetia", True),
    ("Lyon", "Paris|paris, france", False),
    # gaming attempts
    ("Paris London Berlin Rome Madrid", "Paris", False),  # a bag of candidates
    (" ".join(["Berlin", "Paris", "Rome", "Madrid", "Lisbon"] * 4), "Paris", False),  # 20 tokens
    ("It could be Berlin, Paris, Rome, Madrid or Lisbon.", "Paris", False),  # a list
    ("Berlin, Paris, Rome", "Paris", False),
    ("Paris or Lyon", "Paris", False),
    ("Lyon / Paris", "Paris", False),
    ("not Paris", "Paris", False),
    ("The capital isn't Paris.", "Paris", False),
    ("It is not really Paris", "Paris", False),
    ("Never Paris.", "Paris", False),
    ("Parisian", "Paris", False),  # inside another word
    ("The capital is Parisian.", "Paris", False),
    ("The opposite of hot is coldness", "cold", False),
    (
        "The capital and largest city of France is Paris, which is famous for the Eiffel Tower.",
        "Paris",
        False,  # 14 tokens > 12: the length bound errs on the strict side
    ),
]


@pytest.mark.parametrize(("answer", "reference", "correct"), TEXT_CASES)
def test_verify_text(answer, reference, correct):
    verdict = verify_text(answer, reference)
    assert verdict.correct is correct, verdict.details


def test_verify_text_length_bound_grows_with_the_reference():
    ref = "one two three four"  # 4 tokens: bound max(12, 16) = 16
    answer = "it is " + ref + " and five six seven eight nine ten"  # 12 tokens
    assert verify_text(answer, ref).correct
    assert not verify_text(answer + " x y z w u", ref).correct  # 17 tokens
    assert "more than 16" in verify_text(answer + " x y z w u", ref).details


def test_verify_text_says_why():
    assert "negated" in verify_text("not Paris", "Paris").details
    assert "list of candidates" in verify_text("Berlin, Paris, Rome", "Paris").details
    assert "whole-word" in verify_text("Parisian", "Paris").details


def test_verify_text_is_linear_on_hostile_text():
    # 280k characters: the answer is cut to _TAIL_CHARS characters (4000 tokens of "paris
    # or") before any guard reads it, and the length bound rejects it in one pass.
    text = "paris, or " * 20_000 + "not " * 20_000
    verdict = verify_text(text, "paris")
    assert not verdict.correct and verdict.extracted.startswith("paris or paris or")
    assert verdict.details.endswith(
        "'paris': answer has 4000 tokens, more than 12 for this reference"
    )


def test_answer_key_for_text_uses_the_answer_span():
    assert answer_key("text", "I thought hard.\nAnswer: Paris.") == "paris"
    assert answer_key("text", "\\boxed{The Paris}") == answer_key("text", "paris")


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("The  Cat's HAT!", "cats hat"),
        ("an Apple a day", "apple day"),
        ("  ", ""),
        ("A.B.C", "abc"),
        ("\u201cQuoted\u201d \u2014 words\u2026", "quoted words"),
    ],
)
def test_normalize_text(raw, normal):
    assert normalize_text(raw) == normal


# --- code -------------------------------------------------------------------------------------

HE0 = load_dataset("humaneval", limit=1)[0]
WRONG_FUNCTION = """def has_close_elements(numbers, threshold):
    return False
"""


class Recorder:
    def __init__(self, result: tuple[bool, str] = (True, "ok")):
        self.calls: list[tuple[str, str, str]] = []
        self.result = result

    def __call__(self, program: str, tests: str, entry_point: str) -> tuple[bool, str]:
        self.calls.append((program, tests, entry_point))
        return self.result


def test_verify_code_builds_the_program():
    rec = Recorder()
    verdict = verify_code(f"```python\n{WRONG_FUNCTION}```", HE0, rec)
    program, tests, entry_point = rec.calls[0]
    assert (tests, entry_point) == (HE0.meta["test"], "has_close_elements")
    # the answer redefines the prompt's stub, so the prompt's imports and helpers stay visible
    assert program.startswith(HE0.meta["prompt"].rstrip()) and program.endswith(WRONG_FUNCTION)
    assert verdict == Verdict(True, WRONG_FUNCTION.rstrip("\n"), "ok")
    verify_code("    return True\n", HE0, rec)
    assert rec.calls[1][0] == HE0.meta["prompt"] + "    return True\n\n"


def test_verify_code_details_come_from_the_runner():
    verdict = verify_code("x", HE0, Recorder((False, "AssertionError")))
    assert verdict == Verdict(False, "x", "AssertionError")


def test_verify_code_needs_test_metadata():
    bare = Example(id="c", question="q", reference="r", kind="code")
    with pytest.raises(DatasetError, match="'c'.*no entry_point or test"):
        verify_code("def f(): pass", bare, Recorder())


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("```python\na = 1\n```", "a = 1"),
        ("```py\na = 1\n```\n```python3\nb = 2\n```", "b = 2"),
        ("```python\na = 1\n```\n```\nplain\n```", "a = 1"),  # a python block beats a later one
        ("```\nplain\n```\n```text\nother\n```", "other"),  # else the last fenced block
        ("text\n```python\nunclosed = 1\n", "unclosed = 1"),
        ("def f():\n    return 1", "def f():\n    return 1"),
        ("  ```Python  \nx = 1\n  ```  ", "x = 1"),
    ],
)
def test_extract_code(text, code):
    assert extract_code(text) == code


def test_sandbox_adapter_maps_results(monkeypatch):
    seen = {}

    def run_python_tests(program, tests, entry_point, timeout_s):
        seen["timeout_s"] = timeout_s
        rc, timed_out, end = {"ok": (0, False, True), "fail": (1, False, False),
                              "slow": (-9, True, False), "exit": (0, False, False)}[program]  # fmt: skip
        return types.SimpleNamespace(returncode=rc, timed_out=timed_out, stdout="", stderr="E!",
                                     ran_to_end=end)  # fmt: skip

    fake = types.SimpleNamespace(run_python_tests=run_python_tests)
    monkeypatch.setitem(sys.modules, "prefect_conductor.conductor.providers.tools.sandbox", fake)
    assert sandbox_run_tests("ok", "t", "f") == (True, "all tests passed")
    assert sandbox_run_tests("fail", "t", "f") == (False, "tests failed (exit 1): E!")
    assert sandbox_run_tests("slow", "t", "f") == (False, "timed out after 10 s")
    assert sandbox_run_tests("exit", "t", "f") == (  # exit 0 before the tests ended (#38)
        False,
        "the tests did not run to their end (the program exited before)",
    )
    assert seen["timeout_s"] == 10


def test_sandbox_adapter_missing_module(monkeypatch):
    monkeypatch.setitem(
        sys.modules, "prefect_conductor.conductor.providers.tools.sandbox", None
    )  # import now fails
    with pytest.raises(ConductorError, match="prefect_conductor.conductor.providers.tools.sandbox"):
        sandbox_run_tests("p", "t", "f")


# --- dispatch and reward ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "reference", "answer", "correct"),
    [
        ("math", "42", "so 42", True),
        ("math", "42", "so 43", False),
        ("mc", "B", "The answer is (B)", True),
        ("text", "Paris", "paris", True),
        ("text", "Paris", "Rome", False),
    ],
)
def test_verify_dispatches_on_kind(kind, reference, answer, correct):
    example = Example(id="x", question="q", reference=reference, kind=kind)
    assert verify(example, answer).correct is correct


def test_verify_code_dispatch_and_no_answer():
    rec = Recorder()
    assert verify(HE0, "```python\nx = 1\n```", run_tests=rec).correct
    assert rec.calls[0][2] == "has_close_elements"
    for example in (HE0, Example(id="m", question="q", reference="1", kind="math")):
        assert verify(example, None, run_tests=rec) == Verdict(False, None, "no answer")
    assert len(rec.calls) == 1


@pytest.mark.parametrize(
    ("format_valid", "correct", "value"),
    [(False, False, 0.0), (False, True, 0.0), (True, False, 0.5), (True, True, 1.0)],
)
def test_reward(format_valid, correct, value):
    assert reward(format_valid, correct) == value
