"""Can a few-shot hint bootstrap expression-writing for word problems? (issue #18, moonshot)

Verified self-sampling learns only from plans that were right. On word problems the
conductor has written none: it gives the calculator a sentence or hands the problem to
``smol``. This measures, with no training and no engine, whether showing it worked examples
at sampling time (a *hint*: hand-written word problems of stories the generator does not
use, each with the calculator expression) would make some of its samples right, which a round
of self-sampling could then keep. Both arms run in the same process on the same questions:

- ``plain``: the conductor's own prompt (the pool's prompt style, as ``conductor run``);
- ``hint``: the same prompt plus the worked examples of the built-in ``word-problems`` hint
  file, as a recipe's ``self-sample`` stage with ``hints: word-problems`` samples (the
  built-in ``shipped`` recipe's first ``words-easy`` rounds);
- or, with ``--hint FILE`` (repeatable), one arm per hint file instead, named by its stem
  (``benchmarks/hints/shape-*.yaml``: three worked examples of one operation shape each).
  A file that helps here is trained with the same recipe and ``--set``:
  ``conductor train-conductor --recipe shipped --set stages.words-easy.hints=FILE``.

``--match REGEX`` keeps only the word problems whose question matches, ``--per-match`` takes
the first N of each alternative of the regex (``"A shop sells|A farmer packs"``: N of each
story), so that stories the conductor never solves can be probed on their own.

Every sample is parsed with the engine's parser; a one-step calculator plan is evaluated with
the calculator tool (the same function the worker runs) and compared with the reference,
which only verifies. Reported per arm: valid plans, calculator plans, plans whose expression
uses only numbers that appear in the question, right plans, and questions with a right plan.

``--conductor REF`` samples with another adapter (a recipe stage's, to see what the next
round would find) and ``--level N`` takes the `words` curriculum's level-N training questions
instead of the mixed set's word problems (``--skip K``: after the first K, the questions a
round of ``limit: K`` already used).

    python -m benchmarks.word_problem_hint [--questions 16] [--samples 4] [--json]
        [--hint FILE ...] [--match REGEX --per-match N] [--conductor REF] [--level N [--skip K]]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prefect_conductor.conductor.adapters import with_conductor
from prefect_conductor.conductor.data.datasets import load_dataset
from prefect_conductor.conductor.errors import ConductorError
from prefect_conductor.conductor.plan.parse import parse_plan
from prefect_conductor.conductor.plan.prompts import conductor_messages
from prefect_conductor.conductor.pool import Pool, load_pool
from prefect_conductor.conductor.providers.llm import complete
from prefect_conductor.conductor.providers.tools.calculator import extract_expression
from prefect_conductor.conductor.providers.tools.provider import answer_calculator
from prefect_conductor.conductor.training.hints import load_hint

HINT = "word-problems"  # stories the generator does not use, one per operation shape

_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def hinted_messages(question: str, pool: Pool, hint: str = HINT) -> list[dict[str, str]]:
    """The prompt hinted self-sampling sends: a hint file (by default the built-in
    ``word-problems``, ``conductor/training/hints``) after the conductor's instructions."""
    return conductor_messages(question, pool.with_conductor_hint(load_hint(hint, pool)))


def _sample(pool: Pool, example: Any, messages: list[dict[str, str]], seed: int) -> dict:
    text = complete(pool.conductor, messages, temperature=1.0, seed=seed).text
    row = {
        "question": example.question,
        "text": text,
        "valid": False,
        "calculator": False,
        "own_numbers": False,
        "right": False,
    }
    try:
        plan = parse_plan(text, pool)
    except ConductorError:
        return row
    row["valid"] = True
    if len(plan.steps) != 1 or plan.steps[0].worker != "calculator":
        return row
    row["calculator"] = True
    subtask = plan.steps[0].instruction
    try:
        numbers = set(_NUMBER.findall(extract_expression(subtask, require_operator=True)))
        value = answer_calculator([{"role": "user", "content": subtask}], sandbox="process")
    except ConductorError:
        return row
    row["own_numbers"] = numbers <= set(_NUMBER.findall(example.question))
    row["right"] = float(value) == float(example.reference)
    return row


def _questions(
    seed: int,
    questions: int,
    match: str | None,
    per_match: int,
    level: int | None = None,
    skip: int = 0,
) -> list[Any]:
    if level is None:
        train = load_dataset("mixed", split="train", seed=seed)
        words = [e for e in train if e.meta.get("domain") == "word"]
    else:  # a level of the built-in ``words`` curriculum, as a recipe's ``where: {level: N}``
        words = [e for e in load_dataset("words", split="train") if e.meta.get("level") == level]
        words = words[skip:]
    if not match:
        return words[:questions]
    chosen = []
    for part in match.split("|"):
        chosen += [e for e in words if re.search(part, e.question)][:per_match]
    return chosen


def measure(
    questions: int,
    samples: int,
    seed: int,
    hints: list[str] | None = None,
    match: str | None = None,
    per_match: int = 4,
    conductor: str | None = None,
    level: int | None = None,
    skip: int = 0,
) -> dict[str, Any]:
    pool = with_conductor(load_pool(), conductor) if conductor else load_pool()
    words = _questions(seed, questions, match, per_match, level, skip)
    arms: dict[str, Any] = {"plain": conductor_messages}
    for hint in hints or [HINT]:
        name = "hint" if hint == HINT else Path(hint).stem
        arms[name] = lambda q, p, h=hint: hinted_messages(q, p, h)
    keys = ("valid", "calculator", "own_numbers", "right")
    out: dict[str, Any] = {"questions": len(words), "samples": samples, "arms": {}}
    for name, messages in arms.items():
        started = time.perf_counter()
        jobs = [(e, messages(e.question, pool), seed + k) for e in words for k in range(samples)]
        with ThreadPoolExecutor(8) as executor:
            rows = list(executor.map(lambda job: _sample(pool, *job), jobs))
        out["arms"][name] = {
            "plans": len(rows),
            **{key: sum(r[key] for r in rows) for key in keys},
            "questions_solved": len({r["question"] for r in rows if r["right"]}),
            "right_by_match": {
                part: sum(r["right"] for r in rows if re.search(part, r["question"]))
                for part in (match.split("|") if match else [])
            },
            "wall_s": round(time.perf_counter() - started, 1),
            "examples": [r["text"] for r in rows[:3]],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hint", action="append", help="a hint file; one arm per --hint")
    parser.add_argument("--match", help="only word problems matching this regex")
    parser.add_argument("--per-match", type=int, default=4)
    parser.add_argument("--conductor", help="an adapter (dir, models:/…) instead of the shipped")
    parser.add_argument("--level", type=int, help="the `words` curriculum's level N instead")
    parser.add_argument(
        "--skip", type=int, default=0,
        help="with --level: after the first N (those a round already used)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(
        args.questions, args.samples, args.seed, args.hint, args.match, args.per_match,
        args.conductor, args.level, args.skip,
    )  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['questions']} word problems × {result['samples']} samples at T=1")
    print("| arm | valid | calculator | own numbers | right | questions solved | wall |")
    print("|---|---|---|---|---|---|---|")
    for name, arm in result["arms"].items():
        print(
            f"| {name} | {arm['valid']}/{arm['plans']} | {arm['calculator']} | "
            f"{arm['own_numbers']} | {arm['right']} | {arm['questions_solved']} | "
            f"{arm['wall_s']} s |"
        )
    for name, arm in result["arms"].items():
        if arm["right_by_match"]:
            print(f"{name}: right by --match alternative {arm['right_by_match']}")


if __name__ == "__main__":
    main()
