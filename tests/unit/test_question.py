"""A blank question is refused like an empty one, in the project's own words (issue 38)."""

from __future__ import annotations

import pytest
from prefect_conductor.conductor.errors import ConductorError
from prefect_conductor.conductor.plan.requests import OrchestrateRequest
from prefect_conductor.conductor.question import QuestionError, check_question
from pydantic import ValidationError


@pytest.mark.parametrize(
    "text", ["What is 2 + 2?", "  indented?", "x", "?\n", "\u200bhidden then text", "检查"]
)
def test_askable_questions_come_back_unchanged(text: str) -> None:
    assert check_question(text) is text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "question is empty; write the question to answer"),
        (" ", "question is blank (1 character, none visible); write the question to answer"),
        ("   ", "question is blank (3 characters, none visible); write the question to answer"),
        ("\t\n\r\x0b\x0c", "question is blank (5 characters, none visible)"),
        ("\u00a0\u2003\u3000", "question is blank (3 characters, none visible)"),
        ("\u200b\ufeff\u200d", "question is blank (3 characters, none visible)"),
        (" " * 20_000, "question is blank (20,000 characters, none visible)"),
    ],
    ids=["empty", "space", "spaces", "ascii", "unicode-spaces", "zero-width", "long"],
)
def test_empty_and_blank_questions_are_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(QuestionError) as info:
        check_question(text)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ConductorError)  # the CLI prints it as one line, exit 2


def test_where_names_the_file_and_row() -> None:
    with pytest.raises(QuestionError, match=r"^data\.jsonl: row 3: question is blank \(2 "):
        check_question("  ", where="data.jsonl: row 3")
    with pytest.raises(QuestionError, match=r"^data\.csv: row 1: question must be text, got int$"):
        check_question(7, where="data.csv: row 1")
    with pytest.raises(QuestionError, match=r"^question must be text, got NoneType$"):
        check_question(None)


@pytest.mark.parametrize(
    ("question", "message"),
    [
        ("", "question is empty; write the question to answer"),
        ("   ", "question is blank (3 characters, none visible); write the question to answer"),
    ],
)
def test_the_request_refuses_them_in_the_same_words(question: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        OrchestrateRequest(question=question)
    (error,) = info.value.errors()
    assert error["loc"] == ("question",)
    assert error["msg"] == message  # not pydantic's "String should have at least 1 character"


def test_the_request_keeps_its_other_checks_and_its_schema() -> None:
    assert OrchestrateRequest(question=" Why? ").question == " Why? "
    with pytest.raises(ValidationError, match="at most 20000 characters"):
        OrchestrateRequest(question="x" * 20_001)
    with pytest.raises(ValidationError, match="valid string"):
        OrchestrateRequest(question=5)
    # The deployment form still marks the field as required text.
    schema = OrchestrateRequest.model_json_schema()["properties"]["question"]
    assert schema["minLength"] == 1 and schema["maxLength"] == 20_000
