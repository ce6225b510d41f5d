"""Model and tool text made safe to print on a terminal (issue #38).

A worker's output, a conductor's plan text or a tool program's stdout may hold bytes that a
terminal interprets rather than shows: ``ESC ] 0 ; … BEL`` retitles the window, ``ESC [ 31 m``
recolours it, the 8-bit CSI ``U+009B`` does the same on terminals that honour C1 controls, and
a carriage return overwrites what the line said so far. Wherever the CLI prints such text it
passes through :func:`for_terminal`, which shows every control character as a visible escape
(``ESC`` becomes the four characters ``\\x1b``). Only the printed copy changes: the stored
rows and ``--json`` keep the exact text (JSON escapes control characters itself).
"""

from __future__ import annotations

import logging

__all__ = ["TerminalFormatter", "for_terminal"]

# C0 (U+0000-U+001F), DEL (U+007F) and C1 (U+0080-U+009F): the characters a terminal may act on.
_CONTROLS = [*range(0x20), 0x7F, *range(0x80, 0xA0)]
_ONE_LINE = {c: f"\\x{c:02x}" for c in _CONTROLS}
# In a block of several lines, newline and tab lay the text out and do nothing else.
_MULTILINE = {c: e for c, e in _ONE_LINE.items() if chr(c) not in "\n\t"}


def for_terminal(text: str, *, multiline: bool = False) -> str:
    r"""``text`` with each control character shown as ``\xNN``; everything else kept.

    ``multiline`` keeps newline and tab, for a block printed as several lines (an answer, a
    plan); without it a newline is escaped too, so one value stays on its one line.

    >>> for_terminal("\x1b]0;title\x07\x1b[31mred\x9b é →")
    '\\x1b]0;title\\x07\\x1b[31mred\\x9b é →'
    >>> for_terminal("a\tb\nc", multiline=True)
    'a\tb\nc'
    >>> for_terminal("a\r\nb", multiline=True)
    'a\\x0d\nb'
    """
    return text.translate(_MULTILINE if multiline else _ONE_LINE)


class TerminalFormatter(logging.Formatter):
    """A log formatter for a terminal handler: another formatter's output (or this one's
    ``fmt``), passed through :func:`for_terminal`, newlines and tabs kept (tracebacks,
    multi-line progress blocks)."""

    def __init__(self, fmt: str | None = None, *, inner: logging.Formatter | None = None):
        super().__init__(fmt)
        self._inner = inner

    def format(self, record: logging.LogRecord) -> str:
        text = self._inner.format(record) if self._inner else super().format(record)
        return for_terminal(text, multiline=True)
