"""Warm-start data for the conductor: verified-correct runs of the artifact store, as plans.

GRPO learns nothing while every sampled plan scores the same: the base SmolLM2 conductor
wrote no valid plan in 12 samples (issue #8), so every group had zero variance. A short
supervised stage first teaches the *format* from runs that already happened and were
verified correct, whatever strategy made them (single workers, random plans that happened
to work, earlier conductors). Each becomes one example: the conductor prompt for its question
(``conductor.plan.prompts``, the same text as serving) and its plan rendered in the paper's
three-list format.

What it never reads: the dataset's reference answers and the generator's ``expression``
field. It selects the columns below before anything else, so a target can only hold what a
run's plan held; what the conductor learns beyond the format it learns from reward.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import pandas as pd
from prefect_conductor.conductor.plan.prompts import conductor_messages, render_plan
from prefect_conductor.conductor.plan.workflow import Step, Workflow
from prefect_conductor.conductor.pool import Pool

__all__ = ["WARM_START_COLUMNS", "warm_start_examples"]

# The only columns read from the runs table.
WARM_START_COLUMNS = ("question_id", "question", "workflow_json", "correct", "status", "tags")


def _true(value: Any) -> bool:
    """True only for a real true (Parquet gives numpy bools; a null stays not-true)."""
    return bool(value.item() if hasattr(value, "item") else value) if value is not None else False


def _tags(tags: Any) -> dict[str, str]:
    return dict(tags.items() if isinstance(tags, dict) else (tags if tags is not None else []))


def _workflow(lists_json: str, pool: Pool) -> Workflow | None:
    """The stored plan, if every worker it names is still in ``pool``."""
    try:
        lists = json.loads(lists_json)
        names = {w.name for w in pool.workers if w.kind != "conductor"}
        steps = []
        for i, (worker, subtask, access) in enumerate(
            zip(lists["model_id"], lists["subtasks"], lists["access_list"], strict=True)
        ):
            if worker not in names:
                return None
            steps.append(Step(index=i, worker=worker, instruction=subtask, access=tuple(access)))
    except (ValueError, KeyError, TypeError):
        return None
    if not steps or len(steps) > pool.max_steps:
        return None
    return Workflow(steps=tuple(steps))


# A small worker set is repeated at most this many times over to match the largest one.
MAX_REPEAT = 3


def _balanced_draw(
    rows: list[dict[str, Any]], limit: int, seed: int, once: Iterable[tuple[str, ...]] = ()
) -> list[dict[str, Any]]:
    """At most ``limit`` rows, drawn round-robin over the data sets the plans' questions came
    from and, within each, over the worker sets the plans use (``_worker_draw``).

    A store fed by several data sets (the shipped recipe collects on ``mixed`` and then
    samples the ``words`` curriculum) would otherwise let the larger one's plans crowd a worker
    set: by the last curriculum round most of the calculator's plans were word problems, and
    the adapter that learned a 120-example draw of them sent 39 of 134 bare test expressions
    to the chat model. Each data set has an equal share, its worker sets balanced within it; a
    store of one data set is drawn exactly as before.
    """
    rng, once = random.Random(seed), set(once)
    by_dataset: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_dataset.setdefault(row.get("dataset", ""), []).append(row)
    streams = [_worker_draw(by_dataset[d], rng, once) for d in sorted(by_dataset)]

    def round_robin() -> Iterator[dict[str, Any]]:
        while streams:
            for stream in list(streams):
                row = next(stream, None)
                if row is None:
                    streams.remove(stream)
                else:
                    yield row

    return list(islice(round_robin(), limit))


def _worker_draw(
    rows: list[dict[str, Any]], rng: random.Random, once: set[tuple[str, ...]]
) -> Iterator[dict[str, Any]]:
    """Rows drawn round-robin over the worker sets their plans use, the smaller sets
    repeated (at most ``MAX_REPEAT`` times over) until each has as many rows as the largest
    set; a set in ``once`` is never repeated (``_dominated``).

    A plain draw keeps the store's proportions, and those follow how often each worker was
    right, not what the conductor must learn. Issue #18 measured it twice: 17 ``smol`` plans
    of 67 in the first warm start, and in the third run a second SFT round on all 112 stored
    plans (fewer than the limit, so nothing was balanced) after which every knowledge
    question went to the calculator. No set is drawn more often than the largest one has
    rows, so a store of one worker's plans is used as it is.
    """
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["workers"], []).append(row)
    largest = max((len(g) for g in groups.values()), default=0)
    pending = [
        (g, len(g) if s in once else min(largest, MAX_REPEAT * len(g)), [])
        for s, g in sorted(groups.items())
    ]  # (rows, how many to draw, the shuffled queue)
    counts = [0] * len(pending)
    while any(c < want for c, (_, want, _) in zip(counts, pending, strict=True)):
        for i, (group, want, queue) in enumerate(pending):
            if counts[i] < want:
                if not queue:  # each pass over a set is a fresh shuffle of all of it
                    queue.extend(rng.sample(group, len(group)))
                counts[i] += 1
                yield queue.pop()


def _head_to_head(
    sets: set[tuple[str, ...]],
    attempts: dict[tuple[str, ...], dict[str, bool]],
    memo: dict[tuple[tuple[str, ...], tuple[str, ...]], int],
) -> dict[tuple[str, ...], int]:
    """For each worker set of ``sets``, how many more questions it was right on than each
    other set of ``sets``, summed, counting only questions both were tried on.

    A question that two worker sets both answered right says nothing about which one to
    learn; their record on the questions both were tried on does. Issue #40's own-pool run
    measured why it matters: a rhyming distractor was right on 4 of 20 fact questions (a
    rhyme that happens to contain the answer), each of them one the chat model was right on
    too (8 of 20); the shortest-plan rule made half of those four the distractor's plan, the
    balanced draw repeated them, and the self-sampling rounds that followed sent facts to
    the distractor 30 times against the chat model's 4. ``memo`` keeps each pair's margin,
    so a store of many questions compares each pair of sets once.
    """
    score = dict.fromkeys(sets, 0)
    for a in sets:
        for b in sets - {a}:
            if (a, b) not in memo:
                shared = attempts.get(a, {}).keys() & attempts.get(b, {}).keys()
                memo[a, b] = sum(attempts[a][q] for q in shared) - sum(
                    attempts[b][q] for q in shared
                )
            score[a] += memo[a, b]
    return score


def _dominated(attempts: dict[tuple[str, ...], dict[str, bool]]) -> set[tuple[str, ...]]:
    """Worker sets another set dominates: on the questions both were tried on, every one
    this set was right on the other was right on too, and the other was right on more.

    Such a set's plans are kept (each was verified right) but never repeated by the balanced
    draw: repeating them taught the own-pool conductor to prefer its rhyming distractor,
    whose 4 right fact answers were all among the chat model's 8.
    """
    right = {s: {q for q, ok in seen.items() if ok} for s, seen in attempts.items()}
    out = set()
    for a, seen_a in attempts.items():
        for b, seen_b in attempts.items():
            shared = seen_a.keys() & seen_b.keys()
            if a == b or not shared:
                continue
            mine, theirs = right[a] & shared, right[b] & shared
            if mine <= theirs and len(theirs) > len(mine):
                out.add(a)
                break
    return out


def warm_start_examples(
    runs: pd.DataFrame,
    pool: Pool,
    *,
    exclude_questions: Iterable[str] = (),
    per_question: int = 1,
    limit: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Prompt/completion rows (TRL's conversational format) from verified-correct runs.

    - only runs with ``correct`` true and status ``completed``, whose plan decided the answer
      (self-consistency answers by a vote, not by its plan's last step, so it is skipped);
    - ``exclude_questions`` (the held-out split) never appear, nor any run tagged
      ``split=test``: a store shared by several evals holds other data sets' test
      questions too (issue #18: a word-problem probe's held-out evals would otherwise have
      become targets of a later ``--dataset mixed`` run);
    - at most ``per_question`` distinct plans per question, deduplicated; when plans of
      several worker sets were right on a question, the set that was right more often
      head-to-head comes first (``_head_to_head``), then the shortest (the simplest plan
      that was verified right: one tool step over a chain that also ended right);
    - balanced over the data sets the questions came from (the ``dataset`` tag), and within
      each over the worker sets the plans use, with ``seed`` (``_balanced_draw``): the
      smaller sets are repeated up to the largest one's count (a set another one dominates,
      ``_dominated``, is not repeated), at most ``limit`` rows in all
      (every row once when ``limit`` is None), so every kind of plan has an equal share
      whatever its share of the store.
    """
    missing = [c for c in WARM_START_COLUMNS if c not in runs.columns]
    if missing:
        raise ValueError(f"runs table lacks {missing}")
    runs = runs.loc[:, list(WARM_START_COLUMNS)]
    excluded = {q.strip() for q in exclude_questions}
    candidates: dict[str, dict[str, dict[str, Any]]] = {}
    attempts: dict[tuple[str, ...], dict[str, bool]] = {}  # set -> question -> ever right
    for run in runs.itertuples(index=False):
        if not run.workflow_json:
            continue
        tags = _tags(run.tags)
        if tags.get("strategy", "").startswith("self-consistency"):
            continue
        if tags.get("split") == "test":  # an eval of some test split, held out or not
            continue
        question = str(run.question).strip()
        if question in excluded:
            continue
        workflow = _workflow(run.workflow_json, pool)
        if workflow is None:
            continue
        right = _true(run.correct) and run.status == "completed"
        workers = tuple(sorted({s.worker for s in workflow.steps}))
        seen = attempts.setdefault(workers, {})
        seen[question] = seen.get(question, False) or right
        if not right:
            continue
        target = render_plan(workflow, pool)
        candidates.setdefault(question, {}).setdefault(
            target,
            {
                "prompt": conductor_messages(question, pool),
                "completion": [{"role": "assistant", "content": target}],
                "question_id": run.question_id,
                "workers": workers,
                "dataset": tags.get("dataset", ""),
            },
        )
    rows: list[dict[str, Any]] = []
    memo: dict[tuple[tuple[str, ...], tuple[str, ...]], int] = {}
    for plans in candidates.values():
        score = _head_to_head({p["workers"] for p in plans.values()}, attempts, memo)
        order = sorted(plans, key=lambda t: (-score[plans[t]["workers"]], len(t)))
        rows.extend(plans[t] for t in order[:per_question])
    if limit is not None:
        rows = _balanced_draw(rows, limit, seed, once=_dominated(attempts))
    return rows
