"""Model and tool text printed on a terminal: control characters shown, not obeyed (#38)."""

from __future__ import annotations

import logging

import pytest
import typer
from prefect_conductor.conductor.terminal import TerminalFormatter, for_terminal

from prefect_conductor.cli.common import fail


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[31mred", "\\x1b[31mred"),  # lone ESC of a CSI colour
        ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),  # OSC retitle, ended by BEL
        ("a\x00b", "a\\x00b"),  # NUL
        ("\x9b31m", "\\x9b31m"),  # 8-bit CSI (C1)
        ("\x80\x9f", "\\x80\\x9f"),  # both ends of C1
        ("del\x7f", "del\\x7f"),
        ("over\rwrite", "over\\x0dwrite"),  # CR rewrites the line
        ("\x1b", "\\x1b"),
    ],
)
def test_control_characters_are_shown_escaped(raw, shown):
    assert for_terminal(raw) == shown
    assert for_terminal(raw, multiline=True) == shown


def test_text_is_kept_and_newline_tab_only_in_a_block():
    text = "café → 42 ✓ 日本 \xa0 ~ \\x1b"  # printable unicode, NBSP (not C1), a literal \x1b
    assert for_terminal(text) == text
    assert for_terminal("a\tb\nc", multiline=True) == "a\tb\nc"
    assert for_terminal("a\tb\nc") == "a\\x09b\\x0ac"  # one value stays on its one line


def test_terminal_formatter_escapes_the_formatted_line():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "out: %s", ("\x1b[2J",), None)
    assert TerminalFormatter("conductor: %(message)s").format(record) == "conductor: out: \\x1b[2J"
    inner = logging.Formatter("%(levelname)s %(message)s")
    assert TerminalFormatter(inner=inner).format(record) == "INFO out: \\x1b[2J"


def test_a_failure_reason_quoting_tool_output_is_escaped(capsys):
    with pytest.raises(typer.Exit):
        fail("step 0 (python) failed: \x1b]0;PWNED\x07", code=1)
    assert capsys.readouterr().err == "error: step 0 (python) failed: \\x1b]0;PWNED\\x07\n"
