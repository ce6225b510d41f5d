"""Issue #41, item 5: the improvement loop improving itself, from a weaker start.

In a copy of a conductor home with stored runs (``--store``), the pool's conductor is the
weaker starting adapter (``--start``, e.g. a warm-start-only adapter); then ``conductor
improve --json`` runs ``--iterations`` times, as the weekly deployment would, each iteration
on the runs stored since the last one (the first: the copied store; the next ones: what the
previous iteration's round and evaluations stored). Until a conductor champion exists, an
iteration starts from the starting adapter (``--set init_adapter=<start>``) and must beat it
(it is the pool's own conductor); after, from the champion. Then, in a second copy whose pool
is the embedded one, one iteration from the shipped conductor: if it finds nothing better, it
must promote nothing.

Per iteration: runs in its window (with and without a reference), new pairs by source,
whether OrchRM was promoted, the champion's held-out accuracy before and the candidate's
after, whether it was promoted, and its ledger (worker calls, wall). Every iteration's result
is a JSON file in ``--work``: a rerun skips what is done (and ``improve`` resumes a killed
iteration by itself).

    python -m benchmarks.improve_loop --store HOME --start ADAPTER --work DIR [--json]
        [--iterations 3] [--questions 32] [--k 4] [--heldout 40] [--rm-steps 60]

The goals (issue #41): held-out accuracy rises each iteration that promotes; never a worse
champion; unreferenced runs counted per pair source in each iteration's report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.orchrm_loop import conductor_json, copy_home
from benchmarks.own_pool import step


def improve_args(args: argparse.Namespace, pool: Path, start: str | None) -> list[str]:
    """The ``conductor improve`` command line of one iteration.

    >>> ns = argparse.Namespace(questions=32, k=4, heldout=40, rm_steps=60, min_new_runs=20)
    >>> improve_args(ns, Path("p.yaml"), "/a")[-2:]
    ['--set', 'init_adapter=/a']
    """
    out = ["improve", "--pool", str(pool), "--min-new-runs", str(args.min_new_runs),
           "--rm-set", f"max_steps={args.rm_steps}", "--rm-set", "min_pairs=20",
           "--set", f"stages.guided.questions.limit={args.questions}",
           "--set", f"stages.guided.num_generations={args.k}",
           "--set", f"heldout.limit={args.heldout}"]  # fmt: skip
    return [*out, "--set", f"init_adapter={start}"] if start else out


def _has_champion(home: Path) -> bool:
    import mlflow

    os.environ["CONDUCTOR_HOME"] = str(home)
    from prefect_conductor.tasks.tracking import model_version_by_alias, tracking_uri

    client = mlflow.MlflowClient(tracking_uri())
    return model_version_by_alias(client, "conductor", "champion") is not None


def row(it: dict[str, Any]) -> dict[str, Any]:
    """One iteration's line of the table."""
    total = next((e for e in it.get("ledger") or [] if e["stage"] == "total"), {})
    return {
        "iteration": it["iteration"],
        "runs": it["runs"]["total"],
        "unreferenced": it["runs"]["unreferenced"],
        "pairs_new": it["pairs_new"],
        "pairs_by_source": it["pairs_by_source"],
        "pairs_unreferenced_by_source": it.get("pairs_unreferenced_by_source", {}),
        "orchrm_promoted": it["orchrm_promoted"],
        "orchrm_accuracy": it["orchrm_accuracy"],
        "champion_before": it["accuracy_before"],
        "candidate_after": it["accuracy_after"],
        "promoted": it["conductor_promoted"],
        "worker_calls": total.get("worker_calls"),
        "wall_s": total.get("wall_s"),
        "stopped": it.get("stopped"),
    }


def never_worse(rows: list[dict[str, Any]]) -> bool:
    """The champion's accuracy never falls: each promotion beat the champion before it.

    >>> never_worse([{"promoted": True, "champion_before": 0.5, "candidate_after": 0.6},
    ...              {"promoted": False, "champion_before": 0.6, "candidate_after": 0.55}])
    True
    >>> never_worse([{"promoted": True, "champion_before": 0.6, "candidate_after": 0.5}])
    False
    """
    return all(
        r["candidate_after"] > r["champion_before"]
        for r in rows
        if r["promoted"] and r["champion_before"] is not None
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from prefect_conductor.conductor.pool import load_pool, write_pool_file
    from prefect_conductor.tasks.registry import with_conductor

    work = Path(args.work).absolute()
    weak = copy_home(Path(args.store), work / "weak")
    pool = write_pool_file(with_conductor(load_pool(), args.start), work)
    rows = []
    for i in range(1, args.iterations + 1):
        start = None if _has_champion(weak) else args.start

        def iterate(start: str | None = start) -> dict[str, Any]:
            return conductor_json(weak, *improve_args(args, pool, start))

        rows.append(row(step(work / f"iteration-{i}.json", iterate)))
    shipped_home = copy_home(Path(args.store), work / "shipped")
    shipped = row(
        step(
            work / "shipped.json",
            lambda: conductor_json(shipped_home, *improve_args(args, Path(load_pool_path()), None)),
        )
    )
    return {"from_weak": rows, "from_shipped": shipped, "never_worse": never_worse(rows)}


def load_pool_path() -> str:
    from prefect_conductor.conductor.pool import default_pool_path

    return str(default_pool_path())


def sources(r: dict[str, Any]) -> str:
    """``source n (m)`` for each source that gave a pair; m of them from unreferenced runs.

    >>> sources({"pairs_by_source": {"valid-over-invalid": 5, "correct-over-incorrect": 0},
    ...          "pairs_unreferenced_by_source": {"valid-over-invalid": 2}})
    'valid-over-invalid 5 (2)'
    """
    unref = r.get("pairs_unreferenced_by_source") or {}
    made = [f"{s} {n} ({unref.get(s, 0)})" for s, n in r["pairs_by_source"].items() if n]
    return ", ".join(made) or "none"


def markdown(m: dict[str, Any]) -> str:
    out = [
        "| iteration | runs (no reference) | new pairs | OrchRM promoted | champion before "
        "| candidate after | promoted | worker calls | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def pct(v: float | None) -> str:
        return f"{v:.1%}" if v is not None else "–"

    for name, r in [*((f"{r['iteration']}", r) for r in m["from_weak"]),
                    ("shipped", m["from_shipped"])]:  # fmt: skip
        wall = f"{r['wall_s'] / 60:.1f} min" if r["wall_s"] else "–"
        out.append(
            f"| {name} | {r['runs']} ({r['unreferenced']}) | {r['pairs_new']} | "
            f"{'yes' if r['orchrm_promoted'] else 'no'} | {pct(r['champion_before'])} | "
            f"{pct(r['candidate_after'])} | {'yes' if r['promoted'] else 'no'} | "
            f"{r['worker_calls'] if r['worker_calls'] is not None else '–'} | {wall} |"
        )
    out.append("")
    for name, r in [*((f"{r['iteration']}", r) for r in m["from_weak"]),
                    ("shipped", m["from_shipped"])]:  # fmt: skip
        out.append(f"Pairs of iteration {name} by source (from runs without a reference): "
                   + sources(r))  # fmt: skip
    out.append("")
    out.append(f"Never a worse champion: {'yes' if m['never_worse'] else 'no'}.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="a conductor home with stored runs")
    ap.add_argument("--start", required=True, help="the weaker starting adapter (a directory)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--heldout", type=int, default=40)
    ap.add_argument("--rm-steps", type=int, default=60)
    ap.add_argument("--min-new-runs", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result = measure(args)
    print(json.dumps(result, indent=2) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
