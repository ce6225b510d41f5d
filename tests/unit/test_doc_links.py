"""Every relative link of README.md and CONTRIBUTING.md points to a file that exists (issue
#16). The built documentation is ``tests/integration/test_docs.py`` (``mkdocs build
--strict``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


@pytest.mark.parametrize("doc", ["README.md", "CONTRIBUTING.md"])
def test_relative_links_point_to_files(doc):
    path = ROOT / doc
    targets = _LINK.findall(path.read_text(encoding="utf-8"))
    relative = [t for t in targets if not re.match(r"^[a-z]+:|^#|^/", t)]
    assert relative, f"{doc} links to no file"
    missing = [t for t in relative if not (ROOT / t.split("#", 1)[0]).exists()]
    assert not missing, f"{doc}: links to missing files: {missing}"
