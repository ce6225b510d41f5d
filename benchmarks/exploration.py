"""How much learning signal each exploration scheme gets from the same rollout budget (issue #18).

GRPO learns only from groups whose rewards differ: a group where every plan scored the same
has zero advantage and changes nothing. "Four rollouts of one question per step did not
explore enough" is measured here directly, with no training: from one conductor
(``--conductor``, or with ``--train`` the warm-start adapter of a training this invocation
runs first), at the same budget of executed plans,

- ``G=k``: groups of k plans per question (k in ``--groups``) on ``budget / k`` fresh
  training questions, the conductor sampled at temperature 1.0 (``conductor eval
  --strategy conductor --samples k``, every plan run, verified and stored);

and for each scheme it reads the runs back from the Parquet store (by ``eval_id``):

- ``signal``: the share of rollouts in groups whose rewards differ (what GRPO can use);
- ``dense``: the share of rollouts in groups whose rewards are all equal but whose plans'
  steps failed differently (OrchRM's dense signal from intermediate artifacts, arXiv
  2606.13598, would separate them; the executed-plan reward cannot);
- ``solved``: questions with at least one verified-correct plan (pass@k), and the distinct
  verified-correct plans found, the material of a round of verified self-sampling;
- solved per domain, valid plans, rollouts per second.

    python -m benchmarks.exploration (--conductor REF | --train) [--budget 96]
        [--groups 4 8 16] [--offset 100] [--json]

``--train`` writes a recipe of its own (no built-in stops after the warm start): a
``collect`` stage (each single worker answers the first ``--offset`` questions of the mixed
training split), an ``sft`` stage (``warm-start``, the built-in recipes' settings) and the
held-out ``eval``, and runs it as ``conductor train-conductor --recipe FILE --no-promote
--json``; the conductor it registers is the one measured.

The questions are the ``mixed`` training split from ``--offset`` on (after those a recipe's
``collect`` stage with ``questions: {limit: OFFSET}`` used: 100 in the built-in recipes);
every scheme's questions are a prefix of the same list, so its domains stay balanced. Evals
go to ``$CONDUCTOR_HOME``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from prefect_conductor.conductor.data.datasets import load_dataset

from benchmarks._training import run_training, write_recipe
from benchmarks.mixed_baselines import run_eval


def warm_start_recipe(offset: int, seed: int, eval_limit: int = 20) -> dict[str, Any]:
    """The recipe ``--train`` runs: collect ``offset`` training questions, SFT on their
    verified plans (the warm start), the held-out eval; nothing after the warm start."""
    return {
        "name": "exploration-warm-start",
        "description": f"Collect {offset} mixed training questions, then a warm start (SFT).",
        "dataset": "mixed",
        "heldout": {"split": "test", "limit": eval_limit},
        "seed": seed,
        "stages": [
            {"kind": "collect", "name": "collect", "questions": {"limit": offset}},
            {"kind": "sft", "name": "warm-start", "num_train_epochs": 2, "max_examples": 160},
            {"kind": "eval", "name": "after"},
        ],
    }


def _questions_file(directory: Path, offset: int, n: int, seed: int) -> Path:
    train = load_dataset("mixed", split="train", seed=seed)
    rows = [
        {**e.model_dump(include={"id", "question", "reference", "kind", "meta"}), "split": "test"}
        for e in train[offset : offset + n]
    ]
    path = directory / f"explore-{offset}-{n}.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _failed_steps(artifacts: Path, run_ids: set[str]) -> dict[str, int]:
    import pyarrow.dataset as pads

    table = pads.dataset(artifacts / "steps", format="parquet").to_table(
        columns=["run_id", "status"]
    )
    failed: dict[str, int] = defaultdict(int)
    for row in table.to_pylist():
        if row["run_id"] in run_ids and row["status"] != "completed":
            failed[row["run_id"]] += 1
    return failed


def scheme(group: int, questions: Path, n: int, args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    summary = run_eval(
        "", n, args.concurrency, args.seed, dataset=str(questions), strategy="conductor",
        extra=("--samples", str(group), "--conductor", args.conductor),
    )  # fmt: skip
    wall = time.perf_counter() - started
    import pyarrow.dataset as pads

    artifacts = Path(summary["artifacts"])
    table = pads.dataset(artifacts / "runs", format="parquet").to_table(
        columns=["run_id", "question_id", "reward", "correct", "format_valid", "workflow_json",
                 "tags"]
    )  # fmt: skip
    runs = [
        r for r in table.to_pylist() if dict(r["tags"] or []).get("eval_id") == summary["eval_id"]
    ]
    failed = _failed_steps(artifacts, {r["run_id"] for r in runs})
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        groups[r["question_id"]].append(r)
    domains = {e.id: e.meta.get("domain", "?") for e in load_dataset(str(questions), split="test")}
    signal = dense = 0
    plans: set[tuple[str, str]] = set()
    solved_by: dict[str, list[bool]] = defaultdict(list)
    for qid, members in groups.items():
        rewards = [m["reward"] or 0.0 for m in members]
        if len(set(rewards)) > 1:
            signal += len(members)
        elif len({failed.get(m["run_id"], 0) for m in members}) > 1:
            dense += len(members)
        right = [m for m in members if m["correct"]]
        plans.update((qid, m["workflow_json"]) for m in right)
        solved_by[domains.get(qid, "?")].append(bool(right))
    total = len(runs)
    return {
        "group": group,
        "questions": len(groups),
        "rollouts": total,
        "signal": signal / total if total else None,
        "dense": dense / total if total else None,
        "solved": sum(any(v) for v in [[m["correct"] for m in g] for g in groups.values()])
        / max(1, len(groups)),
        "correct_plans": len(plans),
        "solved_by_domain": {d: f"{sum(v)}/{len(v)}" for d, v in sorted(solved_by.items())},
        "valid": statistics.mean(bool(r["format_valid"]) for r in runs) if runs else None,
        "rollouts_per_s": total / wall if wall else None,
        "wall_s": round(wall, 1),
        "eval_id": summary["eval_id"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--conductor", help="conductor ref (adapter dir, models:/…)")
    which.add_argument(
        "--train", action="store_true",
        help="train the conductor first: a recipe of collect (--offset questions) and SFT",
    )  # fmt: skip
    ap.add_argument("--budget", type=int, default=96, help="executed plans per scheme")
    ap.add_argument("--groups", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--offset", type=int, default=100, help="first training question used")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    most = max(args.budget // g for g in args.groups)
    with tempfile.TemporaryDirectory() as tmp:
        if args.train:
            recipe = write_recipe(
                Path(tmp) / "warm-start.yaml", warm_start_recipe(args.offset, args.seed)
            )
            args.conductor = run_training(recipe, (), ("--no-promote",))["adapter_uri"]
        questions = _questions_file(Path(tmp), args.offset, most, args.seed)
        results = [scheme(g, questions, args.budget // g, args) for g in args.groups]
    if args.json:
        print(json.dumps({"budget": args.budget, "conductor": args.conductor, "schemes": results}))
        return 0
    print(f"budget {args.budget} executed plans per scheme; conductor {args.conductor}")
    cols = ("group", "questions", "rollouts", "signal", "dense", "solved", "correct_plans",
            "valid", "rollouts_per_s")  # fmt: skip
    print("  ".join(f"{c:>13}" for c in cols) + "  solved by domain")
    for r in results:
        cells = [
            f"{r[c]:.0%}" if c in ("signal", "dense", "solved", "valid") and r[c] is not None
            else (f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]))
            for c in cols
        ]  # fmt: skip
        print("  ".join(f"{c:>13}" for c in cells) + "  " + json.dumps(r["solved_by_domain"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
