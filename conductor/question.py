"""What makes a question askable: some text that is not only whitespace (issue 38).

One check, in the project's own words, for every way a question comes in: ``conductor run``
and ``conductor plan`` (before any model or Prefect server starts), ``OrchestrateRequest``
(the flow's parameters, so a deployment form too) and dataset rows (whose reader adds the file
and the row). A blank question used to be accepted and answered, an empty one refused in
pydantic's words. A base module, like ``errors``, so that ``plan`` and ``data`` may import it.
"""

from __future__ import annotations

import unicodedata

from prefect_conductor.conductor.errors import ConductorError

__all__ = ["QuestionError", "check_question"]


class QuestionError(ConductorError):
    """A question is missing, not text, empty or blank."""


def check_question(text: object, *, where: str | None = None) -> str:
    """``text`` unchanged if it can be asked, else ``QuestionError``: one line, prefixed by
    ``where`` (say ``"data.jsonl: row 3"``) when given, e.g. ``question is blank (3
    characters, none visible); write the question to answer``. Blank is whitespace and
    invisible format characters (zero-width space, byte order mark) only.

    >>> check_question("What is 2 + 2?")
    'What is 2 + 2?'
    """
    prefix = f"{where}: " if where else ""
    if not isinstance(text, str):
        raise QuestionError(f"{prefix}question must be text, got {type(text).__name__}")
    if not text:
        raise QuestionError(f"{prefix}question is empty; write the question to answer")
    if all(c.isspace() or unicodedata.category(c) == "Cf" for c in text):
        what = "character" if len(text) == 1 else "characters"
        raise QuestionError(
            f"{prefix}question is blank ({len(text):,} {what}, none visible); "
            "write the question to answer"
        )
    return text
