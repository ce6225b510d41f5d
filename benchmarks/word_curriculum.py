"""Does a curriculum of easier word problems teach the conductor to write expressions? (issue #18)

Verified self-sampling keeps only the plans that were right, so the conductor learns a word
problem's story only once it has written one right plan for it; on the generators' word
problems it finds too few (``docs/benchmarks.md#word-problem-hint``: 30 % held-out at best,
on two of seven stories). This probe puts easier problems first in the *train* split: one
operation ("Ana has 20 shells and finds 45 more"), then two, in stories and phrasings the
generators do not use, then the generators' own training word problems. Each round is one
``conductor train-conductor`` command in one ``CONDUCTOR_HOME`` (so the verified plans of
every round stay in the store and each round's SFT sees them all), from the adapter the
round names, sampling 64 fresh questions of the train split from its offset, 4 plans each;
only the reference verifies, nothing but a verified plan becomes a target. After each round
the conductor is evaluated greedily on the held-out 40 (the first 40 of the test split: the
mixed and arithmetic test splits' word problems, interleaved, none of them in train).

The baseline, in the same run: the shipped conductor on the same 40 questions.

The rounds' SFT sees word-problem plans only, and the probe measured what that costs: after
round 3 every question of the mixed test split went to the calculator (knowledge 0/10,
programs 1/10). So a last stage, ``routing``, puts the mixed set's other domains back: each
single worker answers the first 100 questions of the mixed train split in the same home
(what ``train-conductor`` collects on an empty store), then one SFT epoch continues from the
last round's adapter on every verified plan stored (never a run tagged ``split=test``), and
the result is evaluated on the mixed test split's first 40 and on the held-out 40.

No round solved the stories of three operations (library, bus) or a bracketed sum (shop), and
no two-operation shape of the easy block was ever sampled right for the bracketed sum. So the
train split ends with a block of 128 such problems in the probe's own phrasings ("Zoe has 46
cards, buys 7 packs of 6 cards each, then gives away 36"), after the generators' rows so that
every earlier offset stays; ``round-4`` samples 64 of them 8 times each from the routing
stage's adapter, and ``round-5`` 64 of the generators' training word problems from round 4's;
each SFT (2 epochs, from the round's starting adapter) is on every verified plan stored, the
mixed set's other domains included, so routing is kept; each is scored on the held-out 40
and on the mixed test split's first 40. Round 5's adapter is the embedded default.

    python -m benchmarks.word_curriculum --home DIR [--json]

A round whose result file (``DIR/curriculum/<round>.json``) exists is not run again, so a
killed run resumes where it stopped. The data set is ``curriculum_rows`` of
``prefect_conductor.conductor.data.curriculum`` (curricula are data, issue #40), written to
``DIR/curriculum/words.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from prefect_conductor.conductor.data.curriculum import THREE, curriculum_rows

ROOT = Path(__file__).resolve().parent.parent

HELD_OUT = 40
QUESTIONS = 64  # fresh training questions per round
K = 4  # plans per question

#: The rounds: the conductor each starts from ("embedded", or an earlier round's adapter),
#: where in the train split its questions start, and whether it samples with the built-in
#: ``word-problems`` hint (worked examples in the sampling prompt only).
#: Questions 0-127 are one operation, 128-255 two, 256 on the generators' own.
ROUNDS: list[dict[str, Any]] = [
    {"name": "round-1", "init": "embedded", "offset": 0, "hints": True},
    {"name": "round-2", "init": "round-1", "offset": 96, "hints": False},
    {"name": "round-3", "init": "round-2", "offset": 224, "hints": False},
]

#: Rounds after the routing stage: round 4 from its adapter on the three-operation block
#: ("three": the block's offset), round 5 from round 4's on the generators' word problems
#: that round 3 did not reach (288-351), both sampled 8 times per question; the SFT (all stored
#: verified plans, word problems and the mixed set's other domains alike, balanced over
#: workers) runs 2 epochs.
AFTER_ROUTING: list[dict[str, Any]] = [
    {"name": "round-4", "init": "routing", "offset": "three", "hints": False, "k": 8,
     "epochs": 2, "examples": 400},
    {"name": "round-5", "init": "round-4", "offset": 288, "hints": False, "k": 8, "epochs": 2,
     "examples": 400},
]  # fmt: skip


def _conductor(home: Path, *args: str) -> dict[str, Any]:
    env = {**os.environ, "CONDUCTOR_HOME": str(home)}
    log = home / "curriculum" / "log.txt"
    with log.open("a") as stderr:
        done = subprocess.run(
            [sys.executable, "-c", "from prefect_conductor.cli.app import main; main()", *args, "--json"],  # noqa: E501
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"conductor {' '.join(args[:1])} failed ({done.returncode}); see {log}")
    return json.loads(done.stdout)


def _routing(home: Path, data: Path, adapter: str, seed: int) -> dict[str, Any]:
    """Collect the single workers on the mixed train split, then SFT on every stored plan."""
    for worker in ("smol", "calculator", "python"):
        _conductor(home, "eval", "--dataset", "mixed", "--split", "train", "--limit", "100",
                   "--strategy", f"single:{worker}", "--concurrency", "16")  # fmt: skip
    out = _conductor(home, "train-conductor", "--dataset", "mixed", "--init-adapter", adapter,
                     "--self-sample-rounds", "0", "--max-steps", "0",
                     "--warm-start-examples", "400", "--warm-start-epochs", "1",
                     "--eval-limit", str(HELD_OUT), "--no-eval-before", "--no-promote",
                     "--seed", str(seed))  # fmt: skip
    words = _conductor(home, "eval", "--dataset", str(data), "--strategy", "conductor",
                       "--conductor", out["adapter_uri"], "--limit", str(HELD_OUT))  # fmt: skip
    return {"mixed": out["accuracy_after"], "valid": out["format_valid_after"],
            "plans_trained": out["warm_start_examples"], "held_out": words["correct"] / words["n"],
            "adapter": out["adapter_uri"], "wall_s": out["wall_s"]}  # fmt: skip


def _sampled(home: Path, train_run: str) -> dict[str, int]:
    """Right samples, samples and questions with a right sample of one training run."""
    import pyarrow.dataset as ds

    table = ds.dataset(home / "artifacts" / "runs", format="parquet").to_table(
        columns=["question_id", "correct", "tags"]
    )
    rows = [r for r in table.to_pylist() if dict(r["tags"]).get("train_run") == train_run]
    right = [r for r in rows if r["correct"]]
    return {"samples": len(rows), "right": len(right),
            "questions": len({r["question_id"] for r in right})}  # fmt: skip


def run(home: Path, seed: int) -> dict[str, Any]:
    (home / "curriculum").mkdir(parents=True, exist_ok=True)
    data = home / "curriculum" / "words.jsonl"
    rows = curriculum_rows(seed)
    data.write_text("\n".join(json.dumps(r) for r in rows))
    results: dict[str, Any] = {}
    baseline = home / "curriculum" / "baseline.json"
    if not baseline.exists():
        out = _conductor(home, "eval", "--dataset", str(data), "--strategy", "conductor",
                         "--limit", str(HELD_OUT))  # fmt: skip
        baseline.write_text(json.dumps(out))
    base = json.loads(baseline.read_text())
    results["shipped conductor"] = {"held_out": base["correct"] / base["n"]}
    adapters = {"embedded": "embedded"}
    for spec in ROUNDS:
        results[spec["name"]] = _round(home, data, spec, adapters, seed)
    path = home / "curriculum" / "routing.json"
    if not path.exists():
        started = time.perf_counter()
        out = _routing(home, data, adapters[ROUNDS[-1]["name"]], seed)
        out["probe_wall_s"] = round(time.perf_counter() - started, 1)
        path.write_text(json.dumps(out))
    results["routing"] = json.loads(path.read_text())
    adapters["routing"] = results["routing"]["adapter"]
    three = sum(r["split"] == "train" for r in rows) - THREE
    for spec in AFTER_ROUTING:
        if spec["offset"] == "three":
            spec = {**spec, "offset": three}
        results[spec["name"]] = _round(home, data, spec, adapters, seed, mixed=True)
    return results


def _round(
    home: Path, data: Path, spec: dict[str, Any], adapters: dict[str, str], seed: int,
    mixed: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """One round (``train-conductor``, resumable by its result file); with ``mixed`` its
    adapter is also evaluated on the mixed test split's first ``HELD_OUT``."""
    path = home / "curriculum" / f"{spec['name']}.json"
    if not path.exists():
        started = time.perf_counter()
        args = [
            "train-conductor", "--dataset", str(data), "--init-adapter",
            adapters[spec["init"]], "--no-warm-start", "--self-sample-rounds", "1",
            "--self-sample-questions", str(QUESTIONS), "--self-sample-k", str(spec.get("k", K)),
            "--warm-start-epochs", str(spec.get("epochs", 4)),
            "--warm-start-examples", str(spec.get("examples", 160)),
            "--max-steps", "0", "--eval-stages",
            "--eval-limit", str(HELD_OUT), "--collect-limit", str(spec["offset"]),
            "--no-eval-before", "--no-promote", "--seed", str(seed),
            *(["--self-sample-hints", "word-problems"] if spec["hints"] else []),
        ]  # fmt: skip
        out = _conductor(home, *args)
        if mixed:
            scored = _conductor(home, "eval", "--dataset", "mixed", "--split", "test",
                                "--strategy", "conductor", "--conductor", out["adapter_uri"],
                                "--limit", str(HELD_OUT))  # fmt: skip
            out["mixed"] = scored["correct"] / scored["n"]
        out["probe_wall_s"] = round(time.perf_counter() - started, 1)
        path.write_text(json.dumps(out))
    out = json.loads(path.read_text())
    adapters[spec["name"]] = out["adapter_uri"]
    stage = out["stages"][-1]
    return {
        **spec,
        **_sampled(home, out["run_id"]),
        "plans_trained": stage["examples"],
        "held_out": stage["accuracy"],
        "valid": stage["format_valid"],
        **({"mixed": out["mixed"]} if "mixed" in out else {}),
        "wall_min": round(out.get("probe_wall_s", out["wall_s"]) / 60, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="a CONDUCTOR_HOME of its own")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = run(args.home.resolve(), args.seed)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"held-out word problems: the first {HELD_OUT} of the test split")
    print("| stage | from | questions | hint | right samples | questions solved | plans trained "
          "| held-out | mixed first 40 | valid | wall |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    routing = results.pop("routing")
    for name, r in results.items():  # the rows of AFTER_ROUTING come after the routing stage
        if "init" not in r:
            print(f"| {name} | – | – | – | – | – | – | {r['held_out']:.1%} | – | – | – |")
            continue
        print(
            f"| {name} | {r['init']} | {r['offset']}–{r['offset'] + QUESTIONS - 1} | "
            f"{'yes' if r['hints'] else 'no'} | {r['right']}/{r['samples']} | {r['questions']} | "
            f"{r['plans_trained']} | {r['held_out']:.1%} | "
            f"{format(r['mixed'], '.1%') if 'mixed' in r else '–'} | {r['valid']:.0%} | "
            f"{r['wall_min']} min |"
        )
    print(
        f"\nrouting (collect + one SFT epoch on {routing['plans_trained']} plans, "
        f"{routing['probe_wall_s'] / 60:.1f} min): mixed test first {HELD_OUT} "
        f"{routing['mixed']:.1%}, held-out word problems {routing['held_out']:.1%}, "
        f"valid {routing['valid']:.0%}"
    )


if __name__ == "__main__":
    main()
