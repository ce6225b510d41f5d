"""OrchRM win/lose pairs from the artifact store's ``runs`` and ``steps`` (arXiv 2606.13598).

OrchRM is a Bradley-Terry reward model that scores an orchestration *plan* directly, without
running its sub-agents. It learns, without human labels, from win/lose pairs built out of the
artifacts that executing plans leaves behind. OrchRM's released dataset has the fields
``input`` (the prompt), ``chosen``, ``rejected`` and ``source`` (``correct-over-incorrect``
or ``specialized-over-base``); the pairs here carry the same fields, so the stored Parquet
loads straight into ``datasets``.

Sources, in priority order (:data:`PAIR_SOURCES`; a pair two sources would both give is kept
under the first):

1. ``specialized-over-base``: a trained conductor's plan over the base conductor's, when its
   reward was higher (the paper also draws pairs from intermediate model checkpoints). It is
   first so that the pairs it shares with sources 2 and 3 keep this, the more specific label;
2. ``correct-over-incorrect``: a verified-correct run over a verified-wrong run of the same
   question, plan only and (``with_outputs``) plan with its step outputs;
3. ``valid-over-invalid``: a valid plan over a conductor's unparseable text;
4. ``step-completed-over-failed``: the plan prefixes up to a step index at which one run's step
   completed and another's failed, *the same worker* in both (issue #41: across workers, a
   language model's step always "completes" while a tool given prose fails, so such pairs
   taught OrchRM to put the language model above the tools whatever the question; it ranked
   ``smol`` over ``python`` for five of six programs whose ``python`` plan was right);
5. ``prefix-correct-over-wrong``: each k-step plan prefix of a correct run over the differing
   k-step prefix of a wrong run (pairs from *intermediate* artifacts).

Sources 3-5 are this project's reading of "pairs from intermediate artifacts": the released
dataset has only ``correct-over-incorrect`` and ``specialized-over-base``. Departure: here
``specialized-over-base`` needs an outcome that supports it (a higher reward).

Runs are grouped by question id *and* text: a generated dataset reuses its ids across seeds.

Everything is pure (DataFrames in, a DataFrame out); the training flow reads the store and
passes the real tokenizer as ``count_tokens``. The runs' ``reference`` column is never read:
:data:`PAIR_RUN_COLUMNS` are selected first (pass them to ``read_pandas(columns=...)``).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd
import pyarrow as pa
from prefect_conductor.conductor.data.records import PAIRS_SCHEMA, utcnow
from prefect_conductor.reward_model.documents import (
    plan_document,
    raw_plan_document,
    reward_input,
    truncate,
)

__all__ = [
    "PAIR_SOURCES",
    "source_counts",
    "PAIR_RUN_COLUMNS",
    "PAIR_STEP_COLUMNS",
    "PairConfig",
    "PairSet",
    "build_pairs",
    "pairs_table",
    "plan_document",
    "raw_plan_document",
    "reward_input",
    "split_of",
    "truncate",
]

# In priority order: a pair two sources would both make keeps the first (most specific) label.
PAIR_SOURCES = (
    "specialized-over-base",
    "correct-over-incorrect",
    "valid-over-invalid",
    "step-completed-over-failed",
    "prefix-correct-over-wrong",
)

# The only columns read. ``reference`` is not among them: a pair may hold only what a plan held.
PAIR_RUN_COLUMNS = (
    "run_id",
    "question_id",
    "question",
    "conductor_model",
    "conductor_output",
    "workflow_json",
    "format_valid",
    "correct",
    "reward",
    "input_tokens",
    "output_tokens",
)
PAIR_STEP_COLUMNS = (
    "run_id",
    "step",
    "depth",
    "worker",
    "instruction",
    "access",
    "output",
    "status",
    "error",
)

# Columns of PairSet.pairs: PAIRS_SCHEMA without what pairs_table adds.
_COLUMNS = [n for n in PAIRS_SCHEMA.names if n not in ("pair_set", "created_at")]


def _approx_tokens(text: str) -> int:
    """About 4 characters a token: an approximation for when no tokenizer is given."""
    return max(1, len(text) // 4)


@dataclass(frozen=True)
class PairConfig:
    """How :func:`build_pairs` builds and samples pairs."""

    max_tokens: int = 256
    """Token budget of each chosen / rejected document (the prompt is counted separately)."""
    max_output_chars: int = 300
    """Each step output is cut to this many characters inside a document."""
    with_outputs: bool = True
    """Also emit correct-over-incorrect pairs whose documents include the step outputs."""
    test_fraction: float = 0.2
    """Share of questions (not pairs) held out: no question is on both sides."""
    max_per_question: int = 16
    """At most this many pairs per (question, source), drawn deterministically by ``seed``."""
    seed: int = 0
    """Seeds the per-question draw and the train/test split."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.max_output_chars < 1:
            raise ValueError(f"max_output_chars must be at least 1, got {self.max_output_chars}")
        if not 0.0 <= self.test_fraction <= 1.0:
            raise ValueError(f"test_fraction must be in [0, 1], got {self.test_fraction}")
        if self.max_per_question < 1:
            raise ValueError(f"max_per_question must be at least 1, got {self.max_per_question}")


@dataclass(frozen=True)
class PairSet:
    """The pairs (columns of ``PAIRS_SCHEMA`` but ``pair_set`` and ``created_at``; ``margin``
    NaN when unknown) and their statistics (counts per source and split, truncation, and
    pairs per 1k rollout tokens: the paper's token-efficiency measure)."""

    pairs: pd.DataFrame
    stats: dict[str, Any]


def split_of(question_id: str, test_fraction: float, seed: int = 0) -> str:
    """``"test"`` for a stable ``test_fraction`` of question ids (by sha256), else ``"train"``."""
    if not 0.0 <= test_fraction <= 1.0:
        raise ValueError(f"test_fraction must be in [0, 1], got {test_fraction}")
    digest = hashlib.sha256(f"{seed}\x00{question_id}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") / 2**64 < test_fraction else "train"


def _pair_id(prompt: str, chosen: str, rejected: str) -> str:
    return hashlib.sha256(f"{prompt}\x00{chosen}\x00{rejected}".encode()).hexdigest()[:16]


# -- runs as the pair builder sees them ------------------------------------------------------


def _missing(value: Any) -> bool:
    if value is None or value is pd.NA:
        return True
    return isinstance(value, float) and math.isnan(value)


def _text(value: Any) -> str | None:
    return None if _missing(value) else str(value)


def _flag(value: Any) -> bool | None:
    """True / False / None (unknown); Parquet gives numpy bools and None or NaN for nulls."""
    return None if _missing(value) else bool(value)


def _number(value: Any) -> float | None:
    return None if _missing(value) else float(value)


@dataclass
class _Run:
    run_id: str
    question_id: str
    question: str
    model: str
    text: str | None  # the conductor's raw plan text
    valid: bool
    correct: bool | None
    reward: float | None
    tokens: int
    workflow: dict[str, list[Any]] | None  # the executed plan, three-list form
    outputs: list[tuple[str, str | None] | None] = field(default_factory=list)  # by step index


def _parse_workflow(text: str | None) -> dict[str, list[Any]] | None:
    if text is None:
        return None
    try:
        lists = json.loads(text)
        workflow = {k: list(lists[k]) for k in ("model_id", "subtasks", "access_list")}
        plan_document(workflow)  # validates the shape
    except (ValueError, KeyError, TypeError):
        return None
    return workflow if workflow["model_id"] else None


def _steps_by_run(steps: pd.DataFrame) -> dict[str, list[Any]]:
    """Top-level (depth 0) step rows per run, ordered by step index."""
    missing = [c for c in PAIR_STEP_COLUMNS if c not in steps.columns]
    if missing:
        raise ValueError(f"steps table lacks columns {missing}")
    top = steps.loc[steps["depth"].fillna(0) == 0, list(PAIR_STEP_COLUMNS)]
    top = top.sort_values(["run_id", "step"], kind="stable")
    grouped: dict[str, list[Any]] = defaultdict(list)
    for row in top.itertuples(index=False):
        grouped[str(row.run_id)].append(row)
    return grouped


def _load_runs(runs: pd.DataFrame, steps: pd.DataFrame) -> dict[str, list[_Run]]:
    """Runs grouped by question (id and text: generated datasets reuse an id across seeds),
    sorted, so the result does not depend on row order."""
    missing = [c for c in PAIR_RUN_COLUMNS if c not in runs.columns]
    if missing:
        raise ValueError(f"runs table lacks columns {missing}")
    runs = runs.loc[:, list(PAIR_RUN_COLUMNS)]  # never touch the reference answers
    step_rows = _steps_by_run(steps)
    by_question: dict[str, list[_Run]] = defaultdict(list)
    for row in runs.itertuples(index=False):
        rows = step_rows.get(str(row.run_id), [])
        workflow = _parse_workflow(_text(row.workflow_json))
        if workflow is None and rows:  # no stored plan: what was executed is the plan
            workflow = {
                "model_id": [str(r.worker) for r in rows],
                "subtasks": [str(r.instruction) for r in rows],
                "access_list": [[] if _missing(r.access) else list(r.access) for r in rows],
            }
        size = len(workflow["model_id"]) if workflow is not None else 0
        outputs: list[tuple[str, str | None] | None] = [None] * size
        for r in rows:
            if 0 <= int(r.step) < len(outputs):
                status = str(r.status)
                body = _text(r.error) if status == "failed" else _text(r.output)
                outputs[int(r.step)] = (status, body)
        tokens = (_number(row.input_tokens) or 0) + (_number(row.output_tokens) or 0)
        by_question[f"{row.question_id}\x00{row.question}"].append(
            _Run(
                run_id=str(row.run_id),
                question_id=str(row.question_id),
                question=_text(row.question) or "",
                model=_text(row.conductor_model) or "",
                text=_text(row.conductor_output),
                valid=bool(_flag(row.format_valid)),
                correct=_flag(row.correct),
                reward=_number(row.reward),
                tokens=int(tokens),
                workflow=workflow,
                outputs=outputs,
            )
        )
    return {q: sorted(rs, key=lambda r: r.run_id) for q, rs in sorted(by_question.items())}


# -- candidates per source, within one question ----------------------------------------------


@dataclass(frozen=True)
class _Candidate:
    chosen: str
    rejected: str
    chosen_run: _Run
    rejected_run: _Run
    margin: float | None = None


def _prefix(workflow: dict[str, list[Any]], k: int) -> dict[str, list[Any]]:
    return {key: values[:k] for key, values in workflow.items()}


class _Documents:
    """Documents of one run, built once each (a run appears in many pairs)."""

    def __init__(self, max_output_chars: int):
        self._chars = max_output_chars
        self._cache: dict[tuple[str, int, bool], str] = {}

    def plan(self, run: _Run, k: int | None = None, outputs: bool = False) -> str | None:
        """The run's executed plan (its first ``k`` steps), or None when it has none."""
        if run.workflow is None:
            return None
        n = len(run.workflow["model_id"]) if k is None else k
        key = (run.run_id, n, outputs)
        if key not in self._cache:
            self._cache[key] = plan_document(
                _prefix(run.workflow, n),
                run.outputs[:n] if outputs else None,
                max_output_chars=self._chars,
            )
        return self._cache[key]

    def executed(self, run: _Run) -> str | None:
        """Plan only, or the raw text when the run stored no plan at all."""
        plan = self.plan(run)
        return plan if plan is not None or run.text is None else raw_plan_document(run.text)

    def written(self, run: _Run) -> str | None:
        """What the conductor wrote: its raw text when that did not parse (the stored plan is
        then a fallback the conductor did not write), else its plan."""
        if not run.valid and run.text is not None:
            return raw_plan_document(run.text)
        return self.plan(run)


def _margin(a: _Run, b: _Run) -> float | None:
    return a.reward - b.reward if a.reward is not None and b.reward is not None else None


def _correct_over_incorrect(
    runs: list[_Run], docs: _Documents, config: PairConfig
) -> Iterator[_Candidate]:
    right = [r for r in runs if r.correct is True]
    wrong = [r for r in runs if r.correct is False]
    for a in right:
        for b in wrong:
            chosen, rejected = docs.executed(a), docs.executed(b)
            if chosen is not None and rejected is not None:
                yield _Candidate(chosen, rejected, a, b, _margin(a, b))
            if config.with_outputs:
                chosen, rejected = docs.plan(a, outputs=True), docs.plan(b, outputs=True)
                if chosen is not None and rejected is not None:
                    yield _Candidate(chosen, rejected, a, b, _margin(a, b))


def _valid_over_invalid(runs: list[_Run], docs: _Documents, _: PairConfig) -> Iterator[_Candidate]:
    valid = [r for r in runs if r.valid and r.workflow is not None]
    invalid = [r for r in runs if not r.valid and r.text is not None]
    for a in valid:
        for b in invalid:
            if a.correct is False and b.correct is True:
                continue  # the outcome contradicts the format
            yield _Candidate(docs.plan(a) or "", raw_plan_document(b.text or ""), a, b)


def _worker(run: _Run, i: int) -> str | None:
    """The worker of step ``i`` of ``run``'s plan, if it has one."""
    names = run.workflow["model_id"] if run.workflow is not None else []
    return str(names[i]) if i < len(names) else None


def _step_completed_over_failed(
    runs: list[_Run], docs: _Documents, _: PairConfig
) -> Iterator[_Candidate]:
    by_step: dict[int, dict[str, list[_Run]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for i, outcome in enumerate(run.outputs):
            if outcome is not None and outcome[0] in ("completed", "failed"):
                by_step[i][outcome[0]].append(run)
    for i in sorted(by_step):
        for a in by_step[i]["completed"]:
            for b in by_step[i]["failed"]:
                if a.run_id != b.run_id and _worker(a, i) == _worker(b, i) is not None:
                    chosen = docs.plan(a, i + 1, outputs=True) or ""
                    yield _Candidate(chosen, docs.plan(b, i + 1, outputs=True) or "", a, b)


def _prefix_correct_over_wrong(
    runs: list[_Run], docs: _Documents, _: PairConfig
) -> Iterator[_Candidate]:
    right = [r for r in runs if r.correct is True and r.workflow is not None]
    wrong = [r for r in runs if r.correct is False and r.workflow is not None]
    for a in right:
        for b in wrong:
            shortest = min(len(a.workflow["model_id"]), len(b.workflow["model_id"]))  # type: ignore[index]
            for k in range(1, shortest + 1):
                chosen, rejected = docs.plan(a, k) or "", docs.plan(b, k) or ""
                if chosen != rejected:
                    yield _Candidate(chosen, rejected, a, b)


def _specialized_over_base(runs: list[_Run], docs: _Documents, base: str) -> Iterator[_Candidate]:
    scored = [r for r in runs if r.reward is not None]
    special = [r for r in scored if not r.model.startswith("(") and r.model != base]
    for a in special:
        for b in (r for r in scored if r.model == base):
            if a.reward > b.reward:  # type: ignore[operator]
                chosen, rejected = docs.written(a), docs.written(b)
                if chosen is not None and rejected is not None:
                    yield _Candidate(chosen, rejected, a, b, _margin(a, b))


# -- the builder -----------------------------------------------------------------------------


def build_pairs(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    pool_description: str,
    config: PairConfig = PairConfig(),  # noqa: B008 - frozen, so a shared default is safe
    count_tokens: Callable[[str], int] | None = None,
    base_conductor: str | None = None,
) -> PairSet:
    """Every pair the stored runs support (see the module docstring for the sources).

    - runs are grouped by question; outcome sources skip unverified runs (``correct`` null);
      a run whose status is ``failed`` still counts;
    - each document is cut to ``config.max_tokens`` by ``count_tokens`` (default: about four
      characters a token; the training flow passes the reward model's tokenizer); a pair whose
      two sides are then equal is dropped;
    - pairs are deduplicated on ``pair_id`` (the first source in :data:`PAIR_SOURCES` keeps it)
      and capped at ``config.max_per_question`` per (question, source), a seeded draw;
    - ``split`` is by question (:func:`split_of`), so no question is on both sides;
    - ``specialized-over-base`` needs ``base_conductor`` (the base model's ``conductor_model``);
      without it that source gives no pair.
    """
    count = count_tokens or _approx_tokens
    grouped = _load_runs(runs, steps)
    docs = _Documents(config.max_output_chars)
    cut: dict[str, tuple[str, bool]] = {}

    def fit(text: str) -> tuple[str, bool]:
        if text not in cut:
            cut[text] = truncate(text, config.max_tokens, count)
        return cut[text]

    def candidates(source: str, question_runs: list[_Run]) -> Iterator[_Candidate]:
        if source == "correct-over-incorrect":
            return _correct_over_incorrect(question_runs, docs, config)
        if source == "valid-over-invalid":
            return _valid_over_invalid(question_runs, docs, config)
        if source == "step-completed-over-failed":
            return _step_completed_over_failed(question_runs, docs, config)
        if source == "prefix-correct-over-wrong":
            return _prefix_correct_over_wrong(question_runs, docs, config)
        if base_conductor is None:
            return iter(())
        return _specialized_over_base(question_runs, docs, base_conductor)

    rows: list[dict[str, Any]] = []
    used: dict[str, dict[str, int]] = {s: {} for s in PAIR_SOURCES}  # run id -> tokens
    seen: set[str] = set()
    for source in PAIR_SOURCES:  # source-major, so the first source keeps a shared pair
        for key, question_runs in grouped.items():
            question_id = question_runs[0].question_id
            drawn = list(candidates(source, question_runs))
            random.Random(f"{config.seed}\x00{source}\x00{key}").shuffle(drawn)
            prompt = reward_input(question_runs[0].question, pool_description)
            split = split_of(question_id, config.test_fraction, config.seed)
            kept = 0
            for c in drawn:
                if kept >= config.max_per_question:
                    break
                (chosen, cut_chosen), (rejected, cut_rejected) = fit(c.chosen), fit(c.rejected)
                pair_id = _pair_id(prompt, chosen, rejected)
                if chosen == rejected or pair_id in seen:
                    continue
                seen.add(pair_id)
                kept += 1
                for run in (c.chosen_run, c.rejected_run):
                    used[source][run.run_id] = run.tokens
                rows.append(
                    {
                        "pair_id": pair_id,
                        "question_id": question_id,
                        "input": prompt,
                        "chosen": chosen,
                        "rejected": rejected,
                        "source": source,
                        "margin": math.nan if c.margin is None else c.margin,
                        "split": split,
                        "chosen_run_id": c.chosen_run.run_id,
                        "rejected_run_id": c.rejected_run.run_id,
                        "truncated": cut_chosen or cut_rejected,
                    }
                )
    pairs = pd.DataFrame(rows, columns=_COLUMNS).astype({"margin": "float64", "truncated": "bool"})
    verified = {r.run_id for runs in grouped.values() for r in runs if r.correct is not None}
    unreferenced = source_counts(pairs, verified)["unreferenced"]
    return PairSet(pairs=pairs, stats={**_stats(pairs, used, config), "unreferenced": unreferenced})


def source_counts(pairs: pd.DataFrame, verified: set[str]) -> dict[str, dict[str, int]]:
    """``{"by_source": …, "unreferenced": …}`` of ``pairs``; a pair is unreferenced when
    neither of its runs is in ``verified`` (runs with a reference, so verified either way)."""
    unverified = ~(pairs["chosen_run_id"].isin(verified) | pairs["rejected_run_id"].isin(verified))
    return {
        "by_source": {s: int((pairs["source"] == s).sum()) for s in PAIR_SOURCES},
        "unreferenced": {s: int(((pairs["source"] == s) & unverified).sum()) for s in PAIR_SOURCES},
    }


def _per_1k(pairs: int, tokens: int) -> float | None:
    return pairs / (tokens / 1000) if tokens else None


def _stats(
    pairs: pd.DataFrame, used: dict[str, dict[str, int]], config: PairConfig
) -> dict[str, Any]:
    """Counts, and pairs per 1k rollout tokens: each source's pairs over the tokens its
    distinct runs cost, the paper's measure of how much supervision a token of rollout buys."""
    by_source = {s: int((pairs["source"] == s).sum()) for s in PAIR_SOURCES}
    tokens = {s: sum(used[s].values()) for s in PAIR_SOURCES}
    every_run: dict[str, int] = {}
    for s in PAIR_SOURCES:
        every_run.update(used[s])
    overall = _per_1k(len(pairs), sum(every_run.values()))
    baseline = _per_1k(by_source["correct-over-incorrect"], tokens["correct-over-incorrect"])
    return {
        "pairs": len(pairs),
        "train": int((pairs["split"] == "train").sum()),
        "test": int((pairs["split"] == "test").sum()),
        "by_source": by_source,
        "truncated": int(pairs["truncated"].sum()),
        "max_tokens": config.max_tokens,
        "runs_used": {s: len(used[s]) for s in PAIR_SOURCES},
        "rollout_tokens": tokens,
        "pairs_per_1k_tokens": {s: _per_1k(by_source[s], tokens[s]) for s in PAIR_SOURCES},
        "all_sources_pairs_per_1k_tokens": overall,
        "efficiency_vs_correct_over_incorrect": (
            overall / baseline if overall is not None and baseline else None
        ),
    }


def pairs_table(
    pairs: pd.DataFrame, pair_set: str, *, created_at: datetime | None = None
) -> pa.Table:
    """``PairSet.pairs`` as a ``PAIRS_SCHEMA`` table for ``ArtifactStore.write_pairs``, every
    row stamped with ``pair_set`` (the build's id, e.g. its MLflow run id) and ``created_at``
    (default: now)."""
    missing = [c for c in _COLUMNS if c not in pairs.columns]
    if missing:
        raise ValueError(f"pairs lack columns {missing}")
    stamp = pd.Timestamp(created_at or utcnow())
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    frame = pairs.loc[:, _COLUMNS].assign(pair_set=pair_set, created_at=stamp)
    table = pa.Table.from_pandas(frame, schema=PAIRS_SCHEMA, preserve_index=False)
    return table.replace_schema_metadata(None)  # no pandas index metadata in the store
