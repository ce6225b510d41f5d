"""The help of every command reads like a standard typer/click CLI (issue #10).

Typer 0.29 alone prints ``Usage: conductor run [OPTIONS] {question}`` and ``--json <bool>``;
``prefect_conductor.cli.help`` gives the commands click's display. The store summary is aligned lines.
"""

from __future__ import annotations

import json
import re

import pytest
import typer
from typer.testing import CliRunner

from prefect_conductor.cli.app import app

ANSI = re.compile(r"\x1b\[[0-9;]*m")
TYPE_TAG = re.compile(r"<(bool|str|int|float|path|file|dir|datetime)>")


def _command_paths(group: typer.core.TyperGroup, prefix: tuple[str, ...] = ()) -> list:
    paths = [prefix]
    for name, command in group.commands.items():
        if isinstance(command, typer.core.TyperGroup):
            paths += _command_paths(command, (*prefix, name))
        else:
            paths.append((*prefix, name))
    return paths


COMMANDS = _command_paths(typer.main.get_command(app))


def _help(*path: str) -> str:
    result = CliRunner().invoke(
        app, [*path, "--help"], prog_name="conductor", env={"COLUMNS": "100"}
    )
    assert result.exit_code == 0, result.output
    return ANSI.sub("", result.output)


def test_every_command_is_covered():
    names = {" ".join(p) for p in COMMANDS}
    assert {"", "run", "eval", "plan", "validate", "train-conductor", "train-rm"} <= names
    assert {"artifacts", "artifacts compact"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "conductor")
def test_help_has_no_type_tags_and_click_usage(path):
    text = _help(*path)
    usage = next(line.strip() for line in text.splitlines() if "Usage:" in line)
    assert usage.startswith(" ".join(("Usage: conductor", *path, "[OPTIONS]")))
    assert "{" not in usage, usage
    assert not TYPE_TAG.search(text), text
    # A flag takes no value: its help follows the name directly.
    assert re.search(r"--help\s+Show this message and exit\.", text), text


@pytest.mark.parametrize(
    ("command", "usage"),
    [
        ("run", "Usage: conductor run [OPTIONS] QUESTION"),
        ("plan", "Usage: conductor plan [OPTIONS] QUESTION"),
        ("validate", "Usage: conductor validate [OPTIONS] FILE"),
    ],
)
def test_arguments_in_the_usage_line_are_upper_case(command, usage):
    assert usage in _help(command)


def test_options_show_click_type_names_and_flags_none():
    text = _help("run")
    assert re.search(r"--json\s+Print one JSON object", text), text
    assert re.search(r"--plan-only\s+With --best-of", text), text
    assert re.search(r"--max-steps\s+INTEGER\s", text), text
    assert re.search(r"--pool\s+-p\s+PATH\s", text), text
    assert re.search(r"--conductor\s+-c\s+REF\s", text), text
    assert re.search(r"question\s+TEXT\s+The question to answer", text), text


def test_a_missing_argument_is_named_as_in_the_usage_line():
    result = CliRunner().invoke(app, ["run"], prog_name="conductor")
    assert result.exit_code == 2
    assert "Missing argument 'QUESTION'" in ANSI.sub("", result.output)


def test_artifacts_prints_aligned_lines_and_json_on_request(home):
    result = CliRunner().invoke(app, ["artifacts"], prog_name="conductor")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split(":", 1)[0] for line in lines] == [
        "location",
        "runs",
        "steps",
        "tokens",
        "cost",
        "files",
    ]
    assert len({len(re.match(r"\w+:\s+", line).group()) for line in lines}) == 1  # aligned
    assert "{" not in result.output
    assert lines[1].split(None, 1)[1] == "0 (0 failed)"
    assert lines[4].split(None, 1)[1] == "n/a"
    as_json = CliRunner().invoke(app, ["artifacts", "--json"], prog_name="conductor")
    data = json.loads(as_json.output)
    assert data["runs"] == 0 and data["location"] == str(home / "artifacts")
