"""Verifiers: is an answer correct for an :class:`~conductor.data.datasets.Example`? (issue #3).

Answers are model output, so hostile input: every pattern here is linear (no nested
quantifiers), number search looks at the last ``_TAIL_CHARS`` characters only, and code is
never executed in this process. ``verify_code`` hands the program to an injected
``run_tests(program, tests, entry_point) -> (passed, log)``; the default runs it in the
subprocess sandbox of ``prefect_conductor.conductor.providers.tools.sandbox``.

``reward`` is the Conductor's outcome reward (arXiv 2512.04388): 0 for an unparseable plan,
0.5 for a valid plan with a wrong answer, 1 for a correct answer.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from prefect_conductor.conductor.data.datasets import DatasetError, Example
from prefect_conductor.conductor.errors import ConductorError

__all__ = [
    "RunTests",
    "SANDBOX_TIMEOUT_S",
    "TEXT_MIN_TOKENS",
    "TEXT_TOKENS_PER_REF",
    "Verdict",
    "answer_key",
    "extract_code",
    "extract_number",
    "normalize_text",
    "reward",
    "sandbox_run_tests",
    "verify",
    "verify_code",
    "verify_math",
    "verify_mc",
    "verify_text",
]

RunTests = Callable[[str, str, str], tuple[bool, str]]
SANDBOX_TIMEOUT_S = 10.0
_TAIL_CHARS = 20_000  # final answers sit at the end; bounds the work on long outputs
_MAX_DETAILS = 2_000


@dataclass(frozen=True)
class Verdict:
    correct: bool
    extracted: str | None
    details: str


# --- math -------------------------------------------------------------------------------------

_INT = r"(?:\d{1,3}(?:,\d{3}(?!\d))+|\d+)(?:\.\d+)?"  # 1,234 or 1234, then an optional .5
_NUM = rf"-?{_INT}(?:/{_INT})?"  # an optional /denominator makes a fraction
_NUM_RE = re.compile(rf"(?<![\w.]){_NUM}")
_ANSWER_NUM_RE = re.compile(rf"answer(?:\s+is)?\s*[:=]?[^\w\n-]{{0,12}}({_NUM})", re.IGNORECASE)
_EQ_END_RE = re.compile(rf"=[ \t*$]*({_NUM})[ \t*$.!)\]]*$")
_FRAC_RE = re.compile(r"\\[dt]?frac\{\s*(-?[\d.,]+)\s*\}\{\s*(-?[\d.,]+)\s*\}")


def _boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (nested braces allowed), if any."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return text[i:]  # unclosed: take the rest


def _clean_latex(text: str) -> str:
    text = text.replace("\u2212", "-").replace("{,}", ",").replace("\\!", "")
    return _FRAC_RE.sub(r"\1/\2", text)


def extract_number(text: str) -> tuple[str | None, str]:
    """The final numeric answer in ``text`` and the rule that found it.

    Rules in order: the last ``\\boxed{}``; the number after the last "answer is"/"answer:";
    a trailing "= N"; the last number. Returns ``(None, reason)`` when there is none.
    """
    boxed = _boxed(text)
    if boxed is not None:
        found = _NUM_RE.findall(_clean_latex(boxed))
        return (found[-1], "boxed") if found else (None, f"boxed {boxed[:80]!r} has no number")
    tail = _clean_latex(text[-_TAIL_CHARS:])
    matches = list(_ANSWER_NUM_RE.finditer(tail))
    if matches:
        return matches[-1].group(1), "answer is"
    match = _EQ_END_RE.search(tail.rstrip())
    if match:
        return match.group(1), "trailing ="
    found = _NUM_RE.findall(tail)
    return (found[-1], "last number") if found else (None, "no number in the answer")


def _to_fraction(token: str) -> Fraction | None:
    num, _, den = token.replace(",", "").partition("/")
    try:
        return Fraction(num) / Fraction(den) if den else Fraction(num)
    except (ValueError, ZeroDivisionError):  # a zero denominator, or digits past int limits
        return None


def _equal(a: Fraction, b: Fraction, inexact: bool) -> bool:
    if not inexact:
        return a == b
    return abs(a - b) <= Fraction(1, 10**6) * max(abs(a), abs(b))


def verify_math(answer: str, reference: str) -> Verdict:
    """Compare the final number of ``answer`` with ``reference``, exactly as fractions.

    >>> verify_math("17 + 25 = 42", "42").correct
    True
    >>> verify_math("so it is 3/4", "0.75").correct
    True
    """
    token, rule = extract_number(answer)
    if token is None:
        return Verdict(False, None, rule)
    ref_token, _ = extract_number(reference)
    ref = _to_fraction(ref_token) if ref_token else None
    if ref is None or ref_token is None:
        return Verdict(False, token, f"reference {reference[:80]!r} is not a number")
    value = _to_fraction(token)
    if value is None:
        return Verdict(False, token, f"{rule}: {token!r} is not a valid number")
    ok = _equal(value, ref, "." in token or "." in ref_token)
    return Verdict(ok, token, f"{rule}: {token} {'==' if ok else '!='} reference {ref_token}")


# --- multiple choice --------------------------------------------------------------------------

# "answer is (B)", "Answer: d", "**Answer:** C". A lowercase letter must end the clause, so that
# "the answer is a bit longer" is not read as (a).
_MC_ANSWER_RE = re.compile(
    r"(?i:answer)(?:\s+is)?\s*[:=]?[\s*(\[]*(?:[Oo]ption\s+)?"
    r"(?:([A-J])(?![A-Za-z0-9])|([a-j])(?=[)\].:*]|[ \t]*$))",
    re.MULTILINE,
)
_MC_PATTERNS = (
    ("bold", re.compile(r"\*\*\(?([A-Ja-j])\)?\*\*")),  # **C** or **(C)**
    ("parenthesised", re.compile(r"\(([A-Ja-j])\)")),  # (B)
    ("line start", re.compile(r"^[ \t]*([A-J])[.):](?:\s|$)", re.MULTILINE)),  # "B. Paris"
    ("single letter", re.compile(r"^\s*\(?([A-Ja-j])\)?[ \t.]*$")),  # the whole answer
)


def _extract_letter(text: str) -> tuple[str | None, str]:
    tail = text[-_TAIL_CHARS:]
    matches = list(_MC_ANSWER_RE.finditer(tail))
    if matches:
        return (matches[-1].group(1) or matches[-1].group(2)).upper(), "answer is"
    for rule, pattern in _MC_PATTERNS:
        found = pattern.findall(tail)
        if found:
            return found[-1].upper(), rule
    return None, "no option letter in the answer"


def verify_mc(answer: str, reference: str) -> Verdict:
    """Compare the chosen option letter with the reference letter, case-insensitively.

    >>> verify_mc("The answer is (B).", "b").correct
    True
    """
    letter, rule = _extract_letter(answer)
    if letter is None:
        return Verdict(False, None, rule)
    ref, _ = _extract_letter(reference)
    if ref is None:
        return Verdict(False, letter, f"reference {reference[:80]!r} is not an option letter")
    ok = letter == ref
    return Verdict(ok, letter, f"{rule}: {letter} {'==' if ok else '!='} reference {ref}")


# --- text -------------------------------------------------------------------------------------

# Short-answer matching as SQuAD/TriviaQA evaluation does it (issue #18): the normalised
# reference must appear as a whole-word span of the normalised answer, which must be short.
# The answer is the boxed text, the "answer:" line, or else the first sentence (_text_span).
# Four guards against answers that "contain" the reference without giving it; each is one
# linear pass over at most MAX_TEXT_TOKENS tokens:
# 1. length: at most max(TEXT_MIN_TOKENS, TEXT_TOKENS_PER_REF * reference tokens) tokens, so a
#    list of twenty candidates fails (a sentence around the answer passes);
# 2. negation: a negation word among the two tokens before the span ("not Paris", "isn't
#    Paris", "never Paris", "is not really Paris") fails the answer. Not caught: a negation
#    after the span ("Paris is not the capital") or a longer reach ("I would not say Paris");
# 3. alternatives: the span is one bare item of a list (split at , ; / | newlines, "and",
#    "or") that has three items or more, or that joins it with "or"/"/" ("Berlin, Paris,
#    Rome", "Paris or Lyon"); "Paris, France" (two items, no "or") passes;
# 4. a bag of words: three or more tokens besides the span and none of them a function word
#    ("Paris London Berlin Rome Madrid"): a sentence has at least one ("is", "of", ...).
# What it does not catch: a short sentence naming one wrong and one right candidate in prose
# ("it is Paris, maybe it is Lyon" passes) within the length bound.

TEXT_MIN_TOKENS = 12
TEXT_TOKENS_PER_REF = 4
_ALIAS_SEP = "|"
_PUNCT = frozenset(string.punctuation)
_ARTICLES_RE = re.compile(r"\b(?:a|an|the)\b")
_TEXT_ANSWER_RE = re.compile(r"answer(?:\s+is)?\s*:?[ \t]*([^\n]+)", re.IGNORECASE)
# A sentence ends at a line break, or at . ! ? before a space and a capital or a quote
# ("D.C. is" and "3.5 m" do not end one).
_SENTENCE_END_RE = re.compile(r"\n|(?<=[.!?])[ \t]+(?=[A-Z\"'\u201c(])")
_NEGATIONS = frozenset(
    "not no never isnt arent wasnt werent dont doesnt didnt cannot cant wont neither nor "
    "nothing none without hardly".split()
)
_FUNCTION_WORDS = frozenset(
    "is are was were be been being am of in on at to for from by with as it its this that "
    "these those which who whom whose what there here has have had does do did and but so "
    "because called named known means meaning would will can could should i you he she they "
    "we my your his her their our answer word".split()
)
# List separators; "or" and "/" offer alternatives, so two items are already a hedge.
_ITEM_SEP_RE = re.compile(r"[,;|\n\u2022]|\s(?:and|&)\s|(/|\s(?:or|either)\s)", re.IGNORECASE)


def normalize_text(text: str) -> str:
    """SQuAD's normalisation: lowercase, drop punctuation (ASCII and Unicode, so typographic
    quotes too) and articles, squeeze whitespace.

    >>> normalize_text("The  Eiffel Tower!")
    'eiffel tower'
    >>> normalize_text("\u201ccold\u201d")
    'cold'
    """
    text = "".join(
        ch
        for ch in text.lower()
        if ch not in _PUNCT and not unicodedata.category(ch).startswith("P")
    )
    return " ".join(_ARTICLES_RE.sub(" ", text).split())


def _text_span(answer: str) -> str:
    """The last ``\\boxed{}``, else the rest of the line after the last "answer is"/"answer:",
    else the first sentence (or line) of the text.

    The first sentence, because small models answer and then ramble ("The opposite of hot is
    cold. This is a fundamental concept in science ..."): what an answer commits to first is
    its answer, and later sentences cannot add candidates. A preamble ("Sure! It is Paris.")
    therefore fails: the verifier errs on the strict side.
    """
    boxed = _boxed(answer)
    if boxed is not None:
        return boxed
    matches = list(_TEXT_ANSWER_RE.finditer(answer[-_TAIL_CHARS:]))
    if matches:
        return matches[-1].group(1)
    head = answer.strip()[:_TAIL_CHARS]
    return _SENTENCE_END_RE.split(head, maxsplit=1)[0]


def _find_spans(tokens: list[str], ref: list[str]) -> list[int]:
    n = len(ref)
    return [i for i in range(len(tokens) - n + 1) if tokens[i : i + n] == ref]


def _is_list_item(raw: str, ref: str) -> bool:
    """Guard 3: ``ref`` is a bare item of a list of 3+ items, or of an "or" alternative."""
    parts = _ITEM_SEP_RE.split(raw)
    items = [normalize_text(p) for p in parts[::2]]  # split() interleaves the captured group
    hedged = any(p is not None for p in parts[1::2])
    items = [item for item in items if item]
    return ref in items and (len(items) >= 3 or (hedged and len(items) >= 2))


def _match_alias(tokens: list[str], raw: str, alias: str) -> tuple[bool, str]:
    ref = alias.split()
    if tokens == ref:
        return True, "exact match"
    if not ref:
        return False, "empty reference"
    bound = max(TEXT_MIN_TOKENS, TEXT_TOKENS_PER_REF * len(ref))
    if len(tokens) > bound:
        return False, f"answer has {len(tokens)} tokens, more than {bound} for this reference"
    spans = _find_spans(tokens, ref)
    if not spans:
        return False, "reference not a whole-word span of the answer"
    for i in spans:
        negation = next((t for t in tokens[max(0, i - 2) : i] if t in _NEGATIONS), None)
        if negation is not None:
            return False, f"negated: {negation!r} before the reference"
    if _is_list_item(raw, alias):
        return False, "the reference is one item of a list of candidates"
    inside = {j for i in spans for j in range(i, i + len(ref))}
    others = [t for j, t in enumerate(tokens) if j not in inside]
    if len(others) >= 3 and not any(t in _FUNCTION_WORDS for t in others):
        return False, "a bag of candidate words, not a sentence"
    return True, "whole-word span"


def verify_text(answer: str, reference: str) -> Verdict:
    """Short-answer match (issue #18): correct when one alias of ``reference`` (aliases are
    separated by ``|``) is a whole-word span of the normalised answer and no guard above
    rejects it. The answer is the last ``\\boxed{}``, else the rest of the line after the last
    "answer is"/"answer:", else the first sentence of the text.

    >>> verify_text("The capital city of France is Paris.", "Paris").correct
    True
    >>> verify_text("The opposite of hot is cold. Cold is a concept in ...", "cold").correct
    True
    >>> verify_text("Paris London Berlin Rome Madrid", "Paris").correct
    False
    >>> verify_text("It is not Paris.", "Paris").correct
    False
    >>> verify_text("Paris, France", "paris, france|Paris").correct
    True
    """
    raw = _text_span(answer)
    got = normalize_text(raw)
    tokens = got.split()
    aliases = [normalize_text(a) for a in reference.split(_ALIAS_SEP)]
    reasons = []
    for alias in dict.fromkeys(aliases):
        ok, why = _match_alias(tokens, raw, alias)
        if ok:
            return Verdict(True, got, f"{why}: reference {alias!r} in {got[:200]!r}")
        reasons.append(f"{alias!r}: {why}")
    return Verdict(False, got, f"{got[:200]!r} rejected; " + "; ".join(reasons))


# --- code -------------------------------------------------------------------------------------


def extract_code(text: str) -> str:
    """The last ```python block, else the last fenced block, else the text itself.

    A line scanner rather than a regex, so the work stays linear; an unclosed final fence
    runs to the end of the text.
    """
    blocks: list[tuple[str, str]] = []
    lang: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if lang is None:
            if stripped.startswith("```"):
                lang, lines = stripped.strip("`").strip().lower(), []
        elif stripped.startswith("```") and not stripped.strip("`"):
            blocks.append((lang, "\n".join(lines)))
            lang = None
        else:
            lines.append(line)
    if lang is not None:
        blocks.append((lang, "\n".join(lines)))
    python = [code for tag, code in blocks if tag.split()[:1] in (["python"], ["py"], ["python3"])]
    if python:
        return python[-1]
    return blocks[-1][1] if blocks else text


def sandbox_run_tests(program: str, tests: str, entry_point: str) -> tuple[bool, str]:
    """The default ``run_tests``: the isolated sandbox (whatever the pool says; issue #17),
    ``SANDBOX_TIMEOUT_S`` per program. Raises ``SandboxUnavailable`` where isolation cannot be
    set up: a wrong verdict would be worse than none."""
    try:  # imported here so this module loads before (or without) the sandbox
        from prefect_conductor.conductor.providers.tools.sandbox import run_python_tests
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("prefect_conductor.conductor.providers.tools"):
            raise
        raise ConductorError(
            "verify_code needs the sandbox prefect_conductor.conductor.providers.tools.sandbox, "
            "which is not "
            "installed; pass run_tests= to use another runner"
        ) from exc
    result = run_python_tests(program, tests, entry_point, timeout_s=SANDBOX_TIMEOUT_S)
    if result.timed_out:
        return False, f"timed out after {SANDBOX_TIMEOUT_S:g} s"
    if result.returncode != 0:
        return False, f"tests failed (exit {result.returncode}): {result.stderr[-_MAX_DETAILS:]}"
    if not result.ran_to_end:  # exit 0 without the harness's sentinel: os._exit(0) and kin
        return False, "the tests did not run to their end (the program exited before)"
    return True, "all tests passed"


def verify_code(answer: str, example: Example, run_tests: RunTests = sandbox_run_tests) -> Verdict:
    """Run the answer's code against ``example.meta["test"]`` through ``run_tests``.

    If the code does not define ``entry_point`` it is taken as the function body and the prompt
    is prepended. If it does, the prompt is still prepended, as a stub the answer redefines:
    the prompt carries imports and helpers (HumanEval/10, /38, /50) the function may use, as in
    the official harness, which runs prompt + completion.
    """
    entry_point, tests = example.meta.get("entry_point"), example.meta.get("test")
    if not entry_point or not tests:
        raise DatasetError(f"example {example.id!r} has kind 'code' but no entry_point or test")
    code = extract_code(answer)
    prompt = str(example.meta.get("prompt", ""))
    defines = re.search(
        rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", code, re.MULTILINE
    )
    program = f"{prompt.rstrip()}\n\n\n{code}\n" if defines else f"{prompt}{code}\n"
    passed, log = run_tests(program, tests, entry_point)
    return Verdict(bool(passed), code, log[-_MAX_DETAILS:])


# --- dispatch and reward ----------------------------------------------------------------------


def verify(
    example: Example, answer: str | None, *, run_tests: RunTests = sandbox_run_tests
) -> Verdict:
    """Check ``answer`` with the verifier of ``example.kind``; ``None`` is "no answer"."""
    if answer is None:
        return Verdict(False, None, "no answer")
    if example.kind == "math":
        return verify_math(answer, example.reference)
    if example.kind == "mc":
        return verify_mc(answer, example.reference)
    if example.kind == "code":
        return verify_code(answer, example, run_tests)
    return verify_text(answer, example.reference)


def answer_key(kind: str, text: str) -> str | None:
    """What two answers must share to count as the same vote (self-consistency)."""
    if kind == "math":
        number, _ = extract_number(text)
        fraction = _to_fraction(number) if number is not None else None
        return str(fraction) if fraction is not None else number
    if kind == "mc":
        return _extract_letter(text)[0]
    if kind == "code":
        return extract_code(text).strip() or None
    return normalize_text(_text_span(text)) or None


def reward(format_valid: bool, correct: bool) -> float:
    """The Conductor's outcome reward (arXiv 2512.04388).

    >>> reward(False, False), reward(True, False), reward(True, True)
    (0.0, 0.5, 1.0)
    """
    if not format_valid:
        return 0.0
    return 1.0 if correct else 0.5
