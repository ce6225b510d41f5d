"""The plan parser's work grows linearly with its input (issue 38), counted, never timed.

Issue 38: ``_literal`` ran a regex for "any string" over each literal, outside the scanner's
budget. A regex does not know comments, so in ``model_id = [0 # '\\'\\'...`` it retried at
every quote and read to the end of the line each time: 2.5 s at 20k characters, 31.6 s at
80k, 53 s for ``conductor validate`` on a 100 KB file.

The tests count work instead of timing it. Every compiled pattern of ``prefect_conductor.conductor.plan.parse``
is wrapped so that a call adds what the regex engine must read: a backtracking engine tries a
match at each start position in turn, and an attempt that fails has read at least the longest
prefix from there that a match could begin with (``regex``'s partial matching finds it), plus
the character that ended it. The scanner's own searches (``str.find``) are what it charges to
its budget, 16 characters a step.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import prefect_conductor.conductor.plan.parse as plan_mod
import pytest
import regex  # partial matching; installed with transformers (its tokenizers use it)
from prefect_conductor.conductor.errors import PlanError
from prefect_conductor.conductor.plan.parse import extract_plan

TAIL = "\nsubtasks = ['x']\naccess_list = [[]]"


class Meter:
    """Characters the regex engine must read, and scanner budget steps spent."""

    def __init__(self) -> None:
        self.reads = 0
        self.steps = 0

    @property
    def work(self) -> int:
        return self.reads + 16 * self.steps


class CountedPattern:
    """A compiled pattern that adds the characters each call must read to a ``Meter``."""

    def __init__(self, compiled: re.Pattern[str], meter: Meter) -> None:
        self._re = compiled
        self._meter = meter
        flags = 0
        for ours, theirs in ((re.I, regex.I), (re.S, regex.S), (re.M, regex.M), (re.X, regex.X)):
            if compiled.flags & ours:
                flags |= theirs
        self._partial = regex.compile(compiled.pattern, flags)
        self.pattern = compiled.pattern
        self.flags = compiled.flags

    def _viable(self, text: str, k: int, end: int) -> bool:
        """Whether ``text[k:end]`` is the start of a match at ``k``."""
        return self._partial.match(text, k, end, partial=True) is not None

    def _failed_attempt(self, text: str, k: int, endpos: int) -> int:
        if k >= endpos or not self._viable(text, k, k + 1):
            return 1
        lo, hi = k + 1, endpos  # text[k:lo] is viable; is text[k:hi]?
        if self._viable(text, k, hi):
            return hi - k + 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self._viable(text, k, mid) else (lo, mid)
        return lo - k + 1

    def _charge(self, text: str, pos: int, endpos: int, spans: list[tuple[int, int]]) -> None:
        """Failed attempts from ``pos`` up to each match, then the match itself."""
        for start, end in [*spans, (endpos, endpos)]:
            self._meter.reads += sum(
                self._failed_attempt(text, k, endpos) for k in range(pos, start)
            )
            self._meter.reads += end - start + 1
            pos = max(end, start + 1)
            if pos > endpos:
                break

    @staticmethod
    def _end(text: str, endpos: int | None) -> int:
        return len(text) if endpos is None else min(endpos, len(text))

    def match(self, text: str, pos: int = 0, endpos: int | None = None) -> Any:
        m = self._re.match(text, pos, self._end(text, endpos))
        if m is None:
            self._meter.reads += self._failed_attempt(text, pos, self._end(text, endpos))
        else:
            self._meter.reads += m.end() - pos + 1
        return m

    def fullmatch(self, text: str, pos: int = 0, endpos: int | None = None) -> Any:
        self._meter.reads += self._end(text, endpos) - pos + 1
        return self._re.fullmatch(text, pos, self._end(text, endpos))

    def search(self, text: str, pos: int = 0, endpos: int | None = None) -> Any:
        end = self._end(text, endpos)
        m = self._re.search(text, pos, end)
        if m is None:
            self._charge(text, pos, end, [])
        else:
            self._charge(text, pos, m.start(), [])
            self._meter.reads += m.end() - m.start() + 1
        return m

    def finditer(self, text: str, pos: int = 0, endpos: int | None = None) -> Iterator[Any]:
        end = self._end(text, endpos)
        found = list(self._re.finditer(text, pos, end))
        self._charge(text, pos, end, [m.span() for m in found])
        return iter(found)

    def subn(self, repl: Any, text: str, count: int = 0) -> tuple[str, int]:
        assert count == 0, "the parser substitutes everywhere"
        self._charge(text, 0, len(text), [m.span() for m in self._re.finditer(text)])
        return self._re.subn(repl, text)

    def sub(self, repl: Any, text: str, count: int = 0) -> str:
        return self.subn(repl, text, count)[0]


@pytest.fixture()
def meter(monkeypatch: pytest.MonkeyPatch) -> Meter:
    """Counts the parser's work from now on: every pattern it uses, and its scan budget."""
    meter = Meter()
    for name, value in list(vars(plan_mod).items()):
        if isinstance(value, re.Pattern):
            monkeypatch.setattr(plan_mod, name, CountedPattern(value, meter))
        elif (
            isinstance(value, dict)
            and value
            and all(isinstance(v, re.Pattern) for v in value.values())
        ):
            counted = {k: CountedPattern(v, meter) for k, v in value.items()}
            monkeypatch.setattr(plan_mod, name, counted)
    charge = plan_mod._Scanner._charge

    def counted_charge(self: plan_mod._Scanner, *args: Any, **kwargs: Any) -> None:
        before = self.budget
        try:
            charge(self, *args, **kwargs)
        finally:
            meter.steps += before - self.budget

    monkeypatch.setattr(plan_mod._Scanner, "_charge", counted_charge)
    return meter


def work_of(meter: Meter, text: str) -> int:
    before = meter.work
    try:
        extract_plan(text)
    except PlanError:
        pass
    return meter.work - before


# Quotes the scanner skips (in a comment) that a regex for "any string" would not.
SHAPES: dict[str, Callable[[int], str]] = {
    "issue-38": lambda n: "model_id = [0 # '" + "\\'" * (n // 2) + "\n]" + TAIL,
    "double-quotes": lambda n: 'model_id = [0 # "' + '\\"' * (n // 2) + "\n]" + TAIL,
    "in-subtasks": lambda n: (
        "model_id = [0]\nsubtasks = ['x', # '" + "\\'" * (n // 2) + "\n]\naccess_list = [[]]"
    ),
    "in-json": lambda n: '{"steps": [{"worker": 0, "instruction": "x"}]} # \'' + "\\'" * (n // 2),
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_work_grows_linearly_with_the_text(shape: Callable[[int], str], meter: Meter) -> None:
    small, large = work_of(meter, shape(2000)), work_of(meter, shape(4000))
    assert small > 2000  # the meter sees the work at all
    assert large <= 2.5 * small, (small, large)


def test_the_issue_plan_parses_with_work_proportional_to_its_size(meter: Meter) -> None:
    text = SHAPES["issue-38"](4000)
    assert extract_plan(text) == plan_mod.RawPlan(workers=(0,), subtasks=("x",), access=([],))
    assert meter.work <= 20 * len(text), meter.work


# Candidates inside comments that all reach one string that never closes; a backslash takes
# the string over each newline, so the failed match reads far past its first line.
def _continued_string(candidates: int, lines: int) -> str:
    return "model_id = [ # " * candidates + "\n'" + "\\\n" * lines


@pytest.mark.parametrize(
    "text",
    [
        SHAPES["issue-38"](8000),
        _continued_string(20, 4000),
        "model_id = [ '" * 400,
        "model_id = [ \\'" * 400,
        "model_id = [ #" * 400,
        "model_id = [ '''" * 400,
        "model_id = [" + "'', " * 2000 + "0]" + TAIL,
    ],
    ids=["issue-38", "continued-string", "open", "escaped", "comment", "triple", "quotes"],
)
def test_regex_reading_is_charged_to_the_scan_budget(text: str, meter: Meter) -> None:
    # Beyond the candidates' own search (about once over the text), whatever the regex
    # engine reads was charged to the budget (16 characters a step); a failed string match
    # is read twice, once more to find how far it went.
    work_of(meter, text)
    assert meter.reads <= 3 * 16 * meter.steps + 4 * len(text), (meter.reads, meter.steps)


def test_a_continued_string_is_charged_as_far_as_it_was_read() -> None:
    # One charge per failed string: the scan reads the text past each escaped newline.
    scan = plan_mod._Scanner("model_id = [0, '" + "\\\n" * 3000 + "]")
    with pytest.raises(plan_mod._Unclosed, match="string at line 1 is never closed"):
        scan.end_of(11)
    assert plan_mod._SCAN_BUDGET - scan.budget >= 6000 // 16


def test_a_megabyte_plan_is_refused_before_any_scan(meter: Meter) -> None:
    text = SHAPES["issue-38"](1_000_000)
    with pytest.raises(PlanError, match=rf"^plan text is {len(text)} characters; at most"):
        extract_plan(text)
    assert meter.work == 0
