"""Bad input to ``conductor`` is one line on stderr, before any model, server or scan (issue 38).

A blank question was accepted and answered; ``conductor validate`` spent 53 s on a 100 KB
plan. The CLI runs as a user runs it: a subprocess with a fresh home and no Prefect server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.local_cli import run_cli

ADVERSARIAL = "model_id = [0 # '{}\n]\nsubtasks = ['x']\naccess_list = [[]]"


@pytest.mark.parametrize(
    ("command", "question", "message"),
    [
        ("run", "   ", "error: question is blank (3 characters, none visible); write the question"),
        ("plan", "  ", "error: question is blank (2 characters, none visible); write the question"),
        ("run", "\t\n", "error: question is blank (2 characters, none visible)"),
        ("run", "", "error: question is empty; write the question to answer"),
        ("plan", "", "error: question is empty; write the question to answer"),
    ],
    ids=["run-spaces", "plan-spaces", "run-tab-newline", "run-empty", "plan-empty"],
)
def test_a_blank_question_is_one_line_and_nothing_runs(
    tmp_path: Path, command: str, question: str, message: str
) -> None:
    proc = run_cli(tmp_path, command, question, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, proc.stderr
    assert line.startswith(message), line
    assert not (tmp_path / "home" / "artifacts").exists()  # no run, no store


@pytest.mark.parametrize(
    ("chars", "message"),
    [
        (1_000_000, "error: plan text is 200001 characters; at most 200000"),
        (150_000, "error: model_id is too big for a plan: 0 strings and"),
    ],
    ids=["1MB", "150KB"],
)
def test_validate_refuses_an_adversarial_plan_in_one_line(
    tmp_path: Path, chars: int, message: str
) -> None:
    # The 150 KB file took the old parser more than a minute; the work itself is counted in
    # tests/unit/test_plan_parse_limits.py, here the one line the user sees.
    plan = tmp_path / "plan.txt"
    plan.write_text(ADVERSARIAL.format("\\'" * (chars // 2)))
    proc = run_cli(tmp_path, "validate", str(plan), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    line = proc.stderr.strip()
    assert "\n" not in line and line.startswith(message), line
