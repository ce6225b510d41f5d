"""The documentation builds with no warning, and what it documents cannot drift (issue #16).

- ``mkdocs build --strict`` fails on any warning: a page missing from the nav, a link to a
  missing file or anchor (``validation:`` in ``mkdocs.yml``), a hook error.
- The CLI reference is rendered from the typer app at build time; the built page must name
  every command and every option the app has.
- The artifact schema page names every column of the Arrow schemas.

That every relative link of README.md and CONTRIBUTING.md points to a file that exists, which
needs no build, is ``tests/unit/test_doc_links.py``.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
pytest.importorskip("material", reason="the docs extra: pip install -e '.[docs]'")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site_dir = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return site_dir


def _text(page: Path) -> str:
    """The page's text with tags removed and entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def _commands() -> list[tuple[str, Any]]:
    """(command path, command) for the root and every subcommand of ``prefect_conductor.cli.app:app``."""
    import typer

    from prefect_conductor.cli.app import app

    root = typer.main.get_command(app)
    found: list[tuple[str, Any]] = []

    def walk(command: Any, path: str, parent: Any) -> None:
        ctx = command.context_class(command, info_name=path.split()[-1], parent=parent)
        found.append((path, command))
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), f"{path} {name}", ctx)

    walk(root, "conductor", None)
    return found


def test_every_page_builds(site):
    for page in (
        "index",
        "concepts",
        "pools",
        "cli",
        "evaluation",
        "orchrm",
        "training",
        "deployments",
        "artifacts",
        "benchmarks",
    ):
        path = site / page / "index.html" if page != "index" else site / "index.html"
        assert path.is_file(), f"{page}.md did not build"


def test_cli_reference_names_every_command_and_option(site):
    page = site / "cli" / "index.html"
    raw = page.read_text(encoding="utf-8")
    text = _text(page)
    commands = _commands()
    assert len(commands) > 5
    for path, command in commands:
        anchor = path.replace(" ", "-")
        assert f'id="{anchor}"' in raw, f"no section for `{path}`"
        assert path in text
        for param in command.params:
            for name in [*param.opts, *param.secondary_opts]:
                if name.startswith("-"):
                    assert name in text, f"`{path}`: option {name} missing from the CLI page"
            if param.help:  # its first words, as rendered (backticks become code)
                words = " ".join(param.help.replace("`", "").split())[:40]
                assert words in text, f"`{path}` {param.name}: help text missing"


def test_artifact_page_names_every_column(site):
    from prefect_conductor.conductor.data.records import PAIRS_SCHEMA, RUNS_SCHEMA, STEPS_SCHEMA

    text = _text(site / "artifacts" / "index.html")
    for schema in (STEPS_SCHEMA, RUNS_SCHEMA, PAIRS_SCHEMA):
        for name in schema.names:
            assert name in text, f"column {name} is not on the artifact schema page"
