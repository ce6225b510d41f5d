"""mkdocs hook: render the CLI reference from the typer app at build time (issue #16).

``docs/cli.md`` holds prose and one marker line, ``<!-- cli-reference -->``; this hook replaces
the marker with every command of ``prefect_conductor.cli.app:app`` (walked through
``typer.main.get_command``, the click group the ``conductor`` script runs): its usage line,
its help text and every option with its type, default and help. Nothing generated is checked
in, so the page cannot drift from the code; ``tests/integration/test_docs.py`` builds the site and
checks that every command and option name is on the page.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

MARKER = "<!-- cli-reference -->"
PAGE = "cli.md"


# Typer 0.29 builds its commands on a click of its own (``typer._click``), so commands,
# groups and contexts are recognised by what they do, and a context is made by the
# command's own ``context_class``.


def _context(command: Any, name: str, parent: Any = None) -> Any:
    return command.context_class(command, info_name=name, parent=parent)


def _is_group(command: Any) -> bool:
    return hasattr(command, "list_commands")


def _subcommands(command: Any, ctx: Any) -> list[str]:
    return [n for n in command.list_commands(ctx) if not command.get_command(ctx, n).hidden]


def _commands(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    """The command, then its subcommands depth-first, in the order they were declared."""
    yield command, ctx
    if _is_group(command):
        for name in _subcommands(command, ctx):
            sub = command.get_command(ctx, name)
            yield from _commands(sub, _context(sub, name, ctx))


def _path(ctx: Any) -> str:
    return ctx.command_path


def _anchor(ctx: Any) -> str:
    return _path(ctx).replace(" ", "-")


def _param_lines(command: Any, ctx: Any) -> list[str]:
    lines: list[str] = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:  # an argument without help
            record = (param.name or "", "")
        names, text = record
        if param.param_type_name == "argument":
            names = f"{(param.metavar or param.name or '').upper()} (argument)"
        text = " ".join(text.split()) or "&nbsp;"
        lines.append(f"- `{names}`: {text}")
    return lines


def render(app: object | None = None) -> str:
    """Markdown for every command of the typer app (``prefect_conductor.cli.app:app`` by
    default)."""
    import typer

    if app is None:
        from prefect_conductor.cli.app import app
    root = typer.main.get_command(app)
    out: list[str] = []
    for command, ctx in _commands(root, _context(root, "conductor")):
        depth = _path(ctx).count(" ")  # the root and its commands at h3, subcommands below
        level = "#" * (3 + max(depth - 1, 0))
        out.append(f"{level} `{_path(ctx)}` {{ #{_anchor(ctx)} }}")
        out.append("")
        out += ["```text", command.get_usage(ctx).strip(), "```", ""]
        if command.help:
            out += [inspect.cleandoc(command.help).replace("\b\n", ""), ""]
        if _is_group(command):
            subs = _subcommands(command, ctx)
            links = ", ".join(f"[`{n}`](#{_anchor(ctx)}-{n})" for n in subs)
            out += [f"Commands: {links}.", ""]
        out += ["**Options**", "", *_param_lines(command, ctx), ""]
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:  # mkdocs hook signature
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/{PAGE}: the marker {MARKER!r} is missing")
    return markdown.replace(MARKER, render())
