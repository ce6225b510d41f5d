"""Parse and validate the plan a conductor writes.

The Conductor (arXiv 2512.04388) writes free reasoning text, then three Python list literals:
``model_id = [...]`` (the worker of each step, shown to it as "Model 0..k"), ``subtasks =
[...]`` (one instruction per step) and ``access_list = [...]`` (per step, earlier step indices,
``"all"`` or ``[]``). We also accept a JSON object ``{"steps": [{"worker": ..., "instruction":
..., "access": ...}]}``. Either form may sit inside fenced code blocks; if the model repeats
itself, the last complete plan in the text wins, and the three lists written one after the
other in the paper's order are one plan, whatever stray assignment its reasoning made before.

The text is model output and so hostile input. Its size is capped first; literals are then
located by a bracket scanner whose total work is budgeted (no regex that can backtrack badly),
nesting and size are measured by the same scanner and capped before parsing (issue 38: work
linear in the text), and values are read only with ``ast.literal_eval`` or ``json.loads``.
Every failure is one ``PlanError`` line, naming the step where there is one.

Departure from the paper: a worker may also be named by its pool name or by "Model N".
"""

from __future__ import annotations

import ast
import bisect
import json
import re
from dataclasses import dataclass
from typing import Any

import networkx as nx
from prefect_conductor.conductor.errors import PlanError
from prefect_conductor.conductor.plan.workflow import Step, Workflow
from prefect_conductor.conductor.pool import Pool

__all__ = [
    "MAX_INSTRUCTION_CHARS",
    "MAX_PLAN_TEXT_CHARS",
    "RawPlan",
    "extract_plan",
    "parse_plan",
    "validate_plan",
]

MAX_INSTRUCTION_CHARS = 4000
MAX_PLAN_TEXT_CHARS = 200_000
_MAX_DEPTH = 32  # the paper's form nests 2 deep, the JSON form 4; ast recurses on deeper input
_SCAN_BUDGET = 100_000  # scanner steps per text; see _Scanner
# ast.literal_eval spends microseconds per token: cap the tokens it may see (outside strings).
_MAX_CODE_CHARS = 48_000  # a 128-step plan reading every earlier step explicitly needs 32k
_MAX_STRINGS = 1000

_NAMES = ("model_id", "subtasks", "access_list")
_ASSIGN = re.compile(r"\b(model_id|subtasks|access_list)\s*=(?!=)\s*")
_JSON_START = re.compile(r'\{\s*"steps"\s*:')
_SPECIAL = re.compile(r"[\[\](){}'\"#]")
_PAIRS = {"[": "]", "(": ")", "{": "}"}
# A whole string literal, in one match: the body is runs of ordinary characters separated by
# escapes (or, in triple quotes, by lone quotes). Single-quoted strings stop at a newline.
_STRING = {q: re.compile(rf"{q}[^{q}\\\n]*(?:\\.[^{q}\\\n]*)*{q}", re.DOTALL) for q in "'\""} | {
    q * 3: re.compile(rf"{q * 3}[^{q}\\]*(?:(?:\\.|{q}(?!{q * 2}))[^{q}\\]*)*{q * 3}", re.DOTALL)
    for q in "'\""
}
# How far a single-quoted string that never closes was searched: a backslash carries it over
# a newline, so "to the end of the line" would undercharge the failed match.
_OPEN_STRING = {q: re.compile(rf"{q}[^{q}\\\n]*(?:\\.[^{q}\\\n]*)*", re.DOTALL) for q in "'\""}
_STRING_OR_COMMENT = re.compile(r"['\"#]")
_MODEL_N = re.compile(r"model\s*(\d{1,6})", re.IGNORECASE)
_AST_NODE = re.compile(r"<ast\.(\w+) object at 0x[0-9a-fA-F]+>")


@dataclass(frozen=True)
class RawPlan:
    """The three lists as parsed, before any check against the pool."""

    workers: tuple
    subtasks: tuple
    access: tuple

    @property
    def is_empty(self) -> bool:
        """Three empty lists: the recursion round's "accept the answer" signal."""
        return not (self.workers or self.subtasks or self.access)


class _Unclosed(Exception):
    """A candidate literal does not close; only reported if no complete plan is found."""


class _Scanner:
    """Finds the bracket closing the one at a position, skipping strings and comments.

    A scan that meets a bracket outside strings would, scanning from that bracket, follow the
    same path; so every bracket's end (or failure) is memoised and later scans jump over it,
    and every string's end (or failure) too.
    All work, C-level searching included, is charged to one budget per text, which bounds
    crafted input that would otherwise rescan the text once per candidate.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.budget = _SCAN_BUDGET
        self.ends: dict[int, int] = {}
        self.failures: dict[int, str] = {}
        self.strings: dict[int, int | str] = {}  # a quote -> the end of its string, or why not
        self.newlines: list[int] | None = None

    def _line(self, pos: int) -> int:
        # Failures can be many (one per candidate): counting newlines each time is quadratic.
        if self.newlines is None:
            self.newlines = [m.start() for m in re.finditer("\n", self.text)]
        return bisect.bisect_left(self.newlines, pos) + 1

    def _charge(self, chars: int, tokens: int = 1) -> None:
        """One step per token, plus one per 16 characters searched."""
        self.budget -= tokens + chars // 16
        if self.budget < 0:
            raise PlanError("plan text is too tangled to scan: write the plan once, at the end")

    def _skip_string(self, i: int) -> int:
        """Index just past the string literal opening at ``i``; raises ``_Unclosed``."""
        known = self.strings.get(i)
        if isinstance(known, str):
            raise _Unclosed(known)
        if known is not None:
            return known
        text = self.text
        quote = text[i] * (3 if text.startswith(text[i] * 3, i) else 1)
        m = _STRING[quote].match(text, i)
        if m is None:  # the match searched to the end of the text, or of the (logical) line
            stop = len(text) if len(quote) == 3 else _OPEN_STRING[quote].match(text, i).end()
            self._charge(stop - i)
            self.strings[i] = f"the string at line {self._line(i)} is never closed"
            raise _Unclosed(self.strings[i])
        self._charge(m.end() - i)
        self.strings[i] = m.end()
        return m.end()

    def measure(self, start: int, end: int) -> tuple[int, int]:
        """Characters outside string literals (comments included), and string literals, in
        ``text[start:end]``, a literal that ``end_of`` has closed.

        One pass in the scanner's own tokens; its strings were paid for when the literal was
        closed and are looked up, not searched again. (A regex for "any string" does not know
        comments: in ``# '\\'\\'...`` it retries at every quote, quadratic; issue 38.)
        """
        text, i, code, strings = self.text, start, 0, 0
        while (m := _STRING_OR_COMMENT.search(text, i, end)) is not None:
            j = _line_end(text, m.start()) if m.group() == "#" else m.start()
            self._charge(j - i, tokens=0)
            code += j - i
            if m.group() == "#":
                i = j
            else:
                strings += 1
                i = self._skip_string(j)
        self._charge(end - i, tokens=0)
        return code + end - i, strings

    def end_of(self, start: int) -> int:
        """Index just past the bracket closing ``text[start]``; raises ``_Unclosed``."""
        if start in self.ends:
            return self.ends[start]
        if start in self.failures:
            raise _Unclosed(self.failures[start])
        text, stack, i = self.text, [start], start + 1
        try:
            while stack:
                m = _SPECIAL.search(text, i)
                self._charge((m.start() if m else len(text)) - i)
                if m is None:
                    where = f"{text[stack[-1]]!r} at line {self._line(stack[-1])}"
                    raise _Unclosed(f"{where} is never closed")
                c, i = m.group(), m.start()
                if c in "'\"":
                    i = self._skip_string(i)
                elif c == "#":
                    self._charge(_line_end(text, i) - i)
                    i = _line_end(text, i)
                elif i in self.failures:
                    raise _Unclosed(self.failures[i])
                elif i in self.ends:
                    i = self.ends[i]
                elif c in _PAIRS:
                    stack.append(i)
                    if len(stack) > _MAX_DEPTH:
                        raise PlanError(
                            f"brackets at line {self._line(i)} nest more than {_MAX_DEPTH} deep"
                        )
                    i += 1
                elif _PAIRS[text[stack[-1]]] != c:
                    where = f"{text[stack[-1]]!r} at line {self._line(stack[-1])}"
                    raise _Unclosed(f"{where} is closed by {c!r} at line {self._line(i)}")
                else:
                    i += 1
                    self.ends[stack.pop()] = i
        except _Unclosed as exc:
            for pos in stack:  # every bracket still open would meet the same fate
                self.failures[pos] = str(exc)
            raise
        return self.ends[start]


def _line_end(text: str, i: int) -> int:
    nl = text.find("\n", i)
    return len(text) if nl < 0 else nl


def _literal(what: str, scan: _Scanner, start: int, end: int) -> Any:
    """The value of the literal ``text[start:end]`` that ``scan`` has closed."""
    code, strings = scan.measure(start, end)
    if code > _MAX_CODE_CHARS or strings > _MAX_STRINGS:
        raise PlanError(
            f"{what} is too big for a plan: {strings} strings and {code} characters "
            f"outside them; at most {_MAX_STRINGS} and {_MAX_CODE_CHARS}"
        )
    try:
        return ast.literal_eval(scan.text[start:end])
    # Besides ValueError and SyntaxError, long operator chains ("----1") overflow the parser
    # (MemoryError) or the AST builder (RecursionError); they are bad input, not a crash.
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        if isinstance(exc, (MemoryError, RecursionError)):
            detail = "an expression is nested too deeply"
        else:
            detail = _AST_NODE.sub(r"\1", (str(exc).splitlines() or [type(exc).__name__])[0])
        raise PlanError(f"{what} is not a Python literal: {detail[:160]}") from None


def _from_json(src: str) -> RawPlan:
    try:
        doc = json.loads(src)
    except (ValueError, RecursionError) as exc:
        raise PlanError(f"the JSON plan is not valid JSON: {str(exc)[:160]}") from None
    steps = doc.get("steps") if isinstance(doc, dict) else None
    if not isinstance(steps, list):
        raise PlanError(f'the JSON plan\'s "steps" must be a list, got {type(steps).__name__}')
    for i, s in enumerate(steps):
        if not isinstance(s, dict):
            raise PlanError(f"step {i}: a JSON step must be an object, got {type(s).__name__}")
        missing = [k for k in ("worker", "instruction") if k not in s]
        if missing:
            raise PlanError(f'step {i}: the JSON step has no "{missing[0]}"')
    return RawPlan(
        workers=tuple(s["worker"] for s in steps),
        subtasks=tuple(s["instruction"] for s in steps),
        access=tuple(s.get("access", []) for s in steps),
    )


def extract_plan(text: str) -> RawPlan:
    """Find the last complete plan in ``text`` and parse its literals; raises ``PlanError``."""
    if not isinstance(text, str):
        raise PlanError(f"plan text must be a string, got {type(text).__name__}")
    if len(text) > MAX_PLAN_TEXT_CHARS:
        raise PlanError(f"plan text is {len(text)} characters; at most {MAX_PLAN_TEXT_CHARS}")
    scan = _Scanner(text)
    failures: list[tuple[int, str]] = []
    triple: dict[str, tuple[int, int]] = {}  # name -> (start, end) of its list literal
    best_lists: tuple[int, dict[str, tuple[int, int]]] | None = None
    # The last three literals read. Three in the paper's order, one after the other, are a
    # plan even when a stray draft ("access_list = [[]] for one step") came before them and
    # completed ``triple`` with the model_id and subtasks of the real plan.
    recent: list[tuple[str, int, int]] = []
    pos = 0
    while (m := _ASSIGN.search(text, pos)) is not None:
        name, start = m.group(1), m.end()
        pos = start
        if not text.startswith("[", start):
            triple.pop(name, None)
            snippet = text[start : start + 40].split("\n")[0]
            failures.append((start, f"{name} = {snippet!r} is not a list literal"))
            continue
        try:
            end = scan.end_of(start)
        except _Unclosed as exc:
            triple.pop(name, None)
            failures.append((start, f"{name}: {exc}"))
            continue
        triple[name], pos = (start, end), end  # skip "model_id = [" quoted inside the literal
        if len(triple) == len(_NAMES):
            best_lists = (max(e for _, e in triple.values()), triple)
            triple = {}
        recent = [*recent[-2:], (name, start, end)]
        if tuple(n for n, _, _ in recent) == _NAMES:
            best_lists, triple = (end, {n: (s, e) for n, s, e in recent}), {}
    best_json: tuple[int, int] | None = None
    pos = 0
    while (m := _JSON_START.search(text, pos)) is not None:
        try:
            best_json = (m.start(), scan.end_of(m.start()))
            pos = best_json[1]
        except _Unclosed as exc:
            failures.append((m.start(), f"the JSON plan: {exc}"))
            pos = m.end()
    if best_json is not None and (best_lists is None or best_json[1] > best_lists[0]):
        return _from_json(text[best_json[0] : best_json[1]])
    if best_lists is None:
        if failures:
            raise PlanError(f"no complete plan found: {max(failures)[1]}")
        raise PlanError(
            "no plan found: expected model_id = [...], subtasks = [...], access_list = [...] "
            'or a JSON {"steps": [...]}'
        )
    values = {n: _literal(n, scan, s, e) for n, (s, e) in best_lists[1].items()}
    return RawPlan(*(tuple(values[n]) for n in _NAMES))


def _resolve_worker(i: int, item: Any, pool: Pool, allow_conductor: bool) -> str:
    names = [w.name for w in pool.workers]
    if isinstance(item, str) and item not in names and (m := _MODEL_N.fullmatch(item.strip())):
        item = int(m.group(1))  # the paper shows workers as "Model 0..k"
    if isinstance(item, int) and not isinstance(item, bool):
        if not 0 <= item < len(names):
            last = len(names) - 1
            shown = "Model 0" if last == 0 else f"Model 0..{last}"
            raise PlanError(f"step {i}: worker {_short(item)} does not exist; the pool has {shown}")
        name = names[item]
    elif isinstance(item, str):
        if item not in names:
            raise PlanError(f"step {i}: unknown worker {_short(item)}; known: {', '.join(names)}")
        name = item
    else:
        raise PlanError(
            f"step {i}: worker must be a model index (int) or a worker name (str), "
            f"got {_short(item)}"
        )
    if not allow_conductor and pool.worker(name).kind == "conductor":
        raise PlanError(
            f"step {i} uses conductor worker {name!r}, but the recursion depth cap is reached"
        )
    return name


def _instruction(i: int, item: Any) -> str:
    if not isinstance(item, str):
        raise PlanError(f"step {i}: instruction must be a string, got {_short(item)}")
    text = item.strip()
    if not text:
        raise PlanError(f"step {i}: instruction is empty")
    if len(text) > MAX_INSTRUCTION_CHARS:
        raise PlanError(
            f"step {i}: instruction is {len(text)} characters; at most {MAX_INSTRUCTION_CHARS}"
        )
    if "\x00" in text:
        raise PlanError(f"step {i}: instruction contains a NUL character")
    return text


def _access(i: int, item: Any, n: int) -> tuple[int, ...]:
    if isinstance(item, str) and item.strip().lower() == "all":
        return tuple(range(i))
    ok = isinstance(item, (list, tuple)) and all(
        isinstance(j, int) and not isinstance(j, bool) for j in item
    )
    if not ok:
        raise PlanError(
            f'step {i}: access must be a list of step indices, "all" or [], got {_short(item)}'
        )
    for j in item:
        if j == i:
            raise PlanError(f"step {i} reads itself")
        if not 0 <= j < n:
            raise PlanError(f"step {i} reads step {_short(j)}, which does not exist")
    return tuple(sorted(set(item)))


def _check_acyclic(access: list[tuple[int, ...]]) -> None:
    """Refuse cyclic reads, naming the cycle; edges point from a step to the steps it reads."""
    g = nx.DiGraph()
    g.add_nodes_from(range(len(access)))
    g.add_edges_from((i, j) for i, reads in enumerate(access) for j in reads)
    if not nx.is_directed_acyclic_graph(g):
        cycle = nx.find_cycle(g)
        path = " reads ".join(f"step {u}" for u, _ in cycle) + f" reads step {cycle[0][0]}"
        raise PlanError(f"access lists form a cycle: {path}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validate_plan(
    raw: RawPlan, pool: Pool, *, max_steps: int | None = None, allow_conductor: bool = True
) -> Workflow:
    """Check a raw plan against the pool and build the ``Workflow``; raises ``PlanError``."""
    limit = pool.max_steps if max_steps is None else max_steps
    lengths = (len(raw.workers), len(raw.subtasks), len(raw.access))
    if len(set(lengths)) > 1:
        raise PlanError(
            "model_id, subtasks and access_list have different lengths "
            f"({lengths[0]}, {lengths[1]}, {lengths[2]})"
        )
    n = lengths[0]
    if n == 0:
        raise PlanError("plan has no steps")
    if n > limit:
        raise PlanError(f"plan has {n} steps; at most {limit} are allowed")
    steps = [
        Step(
            index=i,
            worker=_resolve_worker(i, raw.workers[i], pool, allow_conductor),
            instruction=_instruction(i, raw.subtasks[i]),
            access=_access(i, raw.access[i], n),
        )
        for i in range(n)
    ]
    # A cycle is named as such before the stricter rule that steps read only earlier ones.
    _check_acyclic([s.access for s in steps])
    for s in steps:
        if later := [j for j in s.access if j > s.index]:
            raise PlanError(f"step {s.index} reads step {later[0]}, which runs later")
    return Workflow(steps=tuple(steps))


def parse_plan(
    text: str, pool: Pool, *, max_steps: int | None = None, allow_conductor: bool = True
) -> Workflow:
    """Extract the last plan from the conductor's text and validate it against the pool."""
    return validate_plan(
        extract_plan(text), pool, max_steps=max_steps, allow_conductor=allow_conductor
    )
