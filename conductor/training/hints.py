"""Hints for verified self-sampling: worked examples the conductor reads only while it samples.

Self-sampling keeps the plans that were verified right, so it learns nothing on a domain where
the conductor writes none: on word problems the shipped conductor hands the calculator a
sentence (0 right of 64 samples, ``benchmarks/word_problem_hint.py``). A hint file adds a few
worked examples to the *sampling* prompt (3 right of 64 with the first ``word-problems``
file); the plans kept are trained with the standard prompt, so the hint is never part of what
the conductor is trained to see, and the reference still only verifies.

A hint file is YAML::

    note: "Word problems: write the arithmetic expression for the calculator."
    style: instructions        # or turns
    examples:
      - question: "Sam has 12 marbles and wins 7 more, then loses 4. How many ...?"
        steps: [{worker: calculator, subtask: "12 + 7 - 4"}]   # access: [] by default

Each example's plan is rendered for the pool (``render_plan``, the format the conductor is
trained on) and checked with the engine's parser, so a hint that names a worker the pool
lacks, or reads a later step, is one clear error before anything is sampled. A step may name
a built-in tool instead of a worker (``calculator``, ``python``): in a pool that calls its
calculator ``calc`` the step goes to ``calc``, so the built-in hints fit renamed pools.

``style: instructions`` (the default) writes the examples after the note at the end of the
conductor's instructions; ``style: turns`` gives them as earlier turns of the conversation
(the question as a user turn, the plan as an assistant turn) and leaves the instructions as
they are but for the note. Turns break a trained conductor's format less often than examples in
its instructions do (issue #40: a curriculum round's adapter wrote ``subtasks = [[]]`` for
every two-operation problem with the examples as instructions), though an adapter trained on
few plans can still lose it (docs/benchmarks.md, the shipped recipe).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from prefect_conductor.conductor.errors import ConductorError, PlanError
from prefect_conductor.conductor.plan.parse import parse_plan
from prefect_conductor.conductor.plan.prompts import render_plan
from prefect_conductor.conductor.plan.workflow import Step, Workflow
from prefect_conductor.conductor.pool import ConductorHint, Pool, Shot
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["BUILTIN_HINTS", "HintError", "hint_rotations", "load_hint"]

#: Hint files shipped with the package, by name.
BUILTIN_HINTS = {p.stem: p for p in sorted((Path(__file__).parent / "hints").glob("*.yaml"))}


class HintError(ConductorError):
    """A hint file is missing, malformed, or does not fit the pool."""


class _HintStep(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker: str = Field(min_length=1)
    subtask: str = Field(min_length=1)
    access: list[int] = Field(default_factory=list)


class _HintExample(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1)
    steps: list[_HintStep] = Field(min_length=1)


class _HintFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    note: str = ""
    style: Literal["instructions", "turns"] = "instructions"
    examples: list[_HintExample] = Field(min_length=1, max_length=16)


def _read(source: str) -> tuple[Path, Any]:
    path = BUILTIN_HINTS.get(source) or Path(source).expanduser()
    try:
        return path, yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        names = ", ".join(BUILTIN_HINTS)
        raise HintError(f"{source}: no such hint file (built-in: {names})") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise HintError(f"{path}: cannot read hint file ({' '.join(str(exc).split())})") from None


def load_hint(source: str, pool: Pool) -> ConductorHint:
    """The hint of ``source`` (a built-in name or a YAML path) for ``pool``, examples in the
    file's order."""
    return hint_rotations(source, pool)[-1]


def hint_rotations(source: str, pool: Pool) -> list[ConductorHint]:
    """One hint per worked example of ``source``, hint ``k`` ending with example ``k`` (the
    others before it in file order, rotated). A small conductor copies the example it read
    last (issue #18: most hinted samples of the built-in file reused its last plan's shape
    and numbers), so sample ``k`` of a question reads rotation ``k mod n`` and the samples of
    one question see every example last in turn. The last hint is the file's own order
    (``load_hint``). ``style: instructions`` puts the examples as text after the note at the
    end of the instructions; ``style: turns`` gives them as earlier turns of the
    conversation, the instructions unchanged but for the note."""
    note, style, shots = _shots(source, pool)
    n = len(shots)
    rotated = [shots[(k + 1) % n :] + shots[: (k + 1) % n] for k in range(n)]
    if style == "turns":
        return [ConductorHint(note=note, shots=tuple(order)) for order in rotated]
    return [
        ConductorHint(
            note="\n\n".join(
                part
                for part in (note, *(f"Question: {s.question}\n{s.plan}" for s in order))
                if part
            )
        )
        for order in rotated
    ]


def _shots(source: str, pool: Pool) -> tuple[str, str, list[Shot]]:
    path, data = _read(source)
    try:
        hints = _HintFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the top level"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise HintError(f"{path}: {where}: {first['msg']}{more}") from None
    names = {w.name for w in pool.workers}
    by_tool = _tool_workers(pool)
    shots = []
    for n, example in enumerate(hints.examples):
        unknown = sorted({s.worker for s in example.steps} - names - by_tool.keys())
        if unknown:
            raise HintError(
                f"{path}: examples.{n}: worker {unknown[0]!r} is not in the pool "
                f"(workers: {', '.join(sorted(names))})"
            )
        steps = tuple(
            Step(
                index=i,
                worker=s.worker if s.worker in names else by_tool[s.worker],
                instruction=s.subtask,
                access=tuple(s.access),
            )
            for i, s in enumerate(example.steps)
        )
        text = render_plan(Workflow(steps=steps), pool)
        try:
            parse_plan(text, pool)
        except PlanError as exc:
            raise HintError(f"{path}: examples.{n}: {exc}") from None
        shots.append(Shot(question=" ".join(example.question.split()), plan=text))
    return hints.note.strip(), hints.style, shots


def _tool_workers(pool: Pool) -> dict[str, str]:
    """A built-in tool's name (``calculator``, ``python``) -> the pool's worker that is that
    tool, whatever the pool calls it (``calc: {model: tool/calculator}``), when exactly one
    worker is: a hint written for the embedded pool fits a pool of renamed workers."""
    found: dict[str, list[str]] = {}
    for worker in pool.workers:
        if worker.model.startswith("tool/"):
            found.setdefault(worker.model.removeprefix("tool/"), []).append(worker.name)
    return {tool: names[0] for tool, names in found.items() if len(names) == 1}
