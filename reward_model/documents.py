"""The text OrchRM scores: a plan as a document, at training and at serving time alike.

``plan_document`` renders a plan (and, optionally, its step outputs) one line per step;
``reward_input`` is the prompt read before it; ``truncate`` fits a document to a token budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["plan_document", "raw_plan_document", "reward_input", "truncate"]


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def _outcome(status: str, text: str | None, max_chars: int) -> str:
    body = _cut(_one_line(text), max_chars) if text is not None else ""
    if status == "completed":
        return f"  -> {body or '(no output)'}"
    if status == "failed":
        return f"  -> failed: {body or 'no error message'}"
    return f"  -> {status}"


def plan_document(
    workflow: Mapping[str, Sequence[Any]],
    outputs: Sequence[tuple[str, str | None] | None] | None = None,
    *,
    max_output_chars: int = 300,
) -> str:
    """The canonical text a plan is scored on, by training and by serving alike.

    ``workflow`` is the paper's three-list form (``Workflow.to_lists()``). One line per step,
    workers by name, whitespace collapsed::

        step 0 · calculator · reads [-]: What is 17 + 25?
          -> 42

    The ``->`` line comes only with ``outputs``: ``outputs[i]`` is step i's ``(status, output
    or error)``, giving ``-> <output>``, ``-> failed: <error>`` or ``-> skipped``, each cut to
    ``max_output_chars``; a missing or None entry gives no line.

    >>> plan_document({"model_id": ["calculator"], "subtasks": ["17 + 25"], "access_list": [[]]},
    ...               [("completed", "42")])
    'step 0 · calculator · reads [-]: 17 + 25\\n  -> 42'
    """
    try:
        steps = list(
            zip(workflow["model_id"], workflow["subtasks"], workflow["access_list"], strict=True)
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(
            "workflow must hold lists model_id, subtasks and access_list of equal length, "
            f"got keys {sorted(workflow)}: {e}"
        ) from e
    lines = []
    for i, (worker, subtask, access) in enumerate(steps):
        reads = ", ".join(str(int(j)) for j in access) if len(access) else "-"
        lines.append(f"step {i} · {_one_line(worker)} · reads [{reads}]: {_one_line(subtask)}")
        if outputs is not None and i < len(outputs) and outputs[i] is not None:
            status, text = outputs[i]  # type: ignore[misc]
            lines.append(_outcome(status, text, max_output_chars))
    return "\n".join(lines)


def raw_plan_document(text: str) -> str:
    """The document of a plan text that did not parse: ``unparsed plan:`` and the text."""
    return f"unparsed plan:\n{text.strip()}"


def reward_input(question: str, pool_description: str) -> str:
    """The prompt OrchRM reads before a document: the question and the workers."""
    return f"Question: {question.strip()}\nWorkers: {pool_description.strip()}\nPlan:"


def truncate(text: str, max_tokens: int, count_tokens: Callable[[str], int]) -> tuple[str, bool]:
    """The longest prefix of ``text`` within ``max_tokens`` (binary search over characters,
    assuming ``count_tokens`` grows with the prefix), and whether anything was cut.

    >>> truncate("abcdefgh", 2, len)
    ('ab', True)
    """
    if max_tokens < 0:
        raise ValueError(f"max_tokens must not be negative, got {max_tokens}")
    if count_tokens(text) <= max_tokens:
        return text, False
    lo, hi = 0, len(text) - 1  # the answer is in [lo, hi]; text[:lo] fits (or lo == 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(text[:mid]) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo], True
