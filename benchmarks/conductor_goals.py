"""Issue #18's goals, every row measured in one run: the conductor against every single worker
and the oracle router, on the held-out test splits of ``mixed`` and ``arithmetic``.

For each data set it runs, in this one invocation, ``conductor eval --split test --limit N``
with ``single:calculator``, ``single:python`` and ``single:smol`` and with the conductor
(``--conductor``, default ``champion``: the registry's champion, else the shipped adapter),
then reads every eval's per-question rows back from the Parquet runs table (by ``eval_id``):

- accuracy per domain and overall (mixed: ``meta["domain"]``; arithmetic: levels 1-2 are
  expressions, level 3 word problems);
- the **oracle router**: a question counts as right if any single worker got it right;
- **routing**: per domain, the share of the conductor's plans whose answering (last) step is
  that domain's worker (arithmetic and expressions: calculator, programs: python,
  knowledge: smol; word problems have no single worker and get no routing goal);
- the plan topology per domain: how many plans had each worker sequence (``invalid`` for a
  plan that did not parse), so a collapse onto one worker shows;
- valid plans, and the goals table (measured, goal, met).

    python -m benchmarks.conductor_goals [--limit 200] [--arith-limit 200]
        [--conductor champion] [--train-result result.json] [--json]

``--train-result`` takes the ``--json`` output of the ``conductor train-conductor`` run that
made the conductor, for the cost row (wall time ≤ 90 min, rollouts/s). Evals go to
``$CONDUCTOR_HOME``, as for ``conductor eval``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from prefect_conductor.conductor.data.datasets import MIXED_DOMAINS, load_dataset

from benchmarks.mixed_baselines import WORKERS, eval_rows, run_eval, table, tabulate

# The worker each domain's questions should go to (no entry: no single worker solves it).
ROUTES = {
    "arithmetic": "calculator",
    "program": "python",
    "knowledge": "smol",
    "expression": "calculator",
}
ORDERS = {"mixed": MIXED_DOMAINS, "arithmetic": ("expression", "word")}


def domain_of(dataset: str, meta: dict[str, Any]) -> str:
    if dataset == "mixed":
        return meta["domain"]
    return "word" if meta.get("level") == 3 else "expression"


def topology(workflow_json: str | None, valid: bool | None) -> str:
    """A plan's worker sequence, e.g. ``smol>calculator``; ``invalid`` if it did not parse."""
    if not valid or not workflow_json:
        return "invalid"
    return ">".join(json.loads(workflow_json)["model_id"])


def measure(dataset: str, limit: int, args: argparse.Namespace) -> dict[str, Any]:
    examples = load_dataset(dataset, split="test", limit=limit, seed=args.seed)
    domains = {e.id: domain_of(dataset, e.meta) for e in examples}
    verdicts, walls = {}, {}
    for worker in args.workers:
        started = time.perf_counter()
        summary = run_eval(worker, limit, args.concurrency, args.seed, dataset=dataset)
        walls[f"single:{worker}"] = round(time.perf_counter() - started, 1)
        verdicts[worker] = {q: bool(r["correct"]) for q, r in eval_rows(summary).items()}
    started = time.perf_counter()
    summary = run_eval(
        "", limit, args.concurrency, args.seed, dataset=dataset, strategy="conductor",
        extra=("--conductor", args.conductor),
    )  # fmt: skip
    walls["conductor"] = round(time.perf_counter() - started, 1)
    rows = eval_rows(summary, ("correct", "format_valid", "workflow_json"))
    conductor = {q: bool(r["correct"]) for q, r in rows.items()}
    order = ORDERS[dataset]
    table_rows = tabulate(verdicts, domains, order, extra={"conductor": conductor})
    topo: dict[str, Counter] = defaultdict(Counter)
    routed: dict[str, list[bool]] = defaultdict(list)
    for qid, domain in domains.items():
        row = rows.get(qid)
        shape = topology(row and row["workflow_json"], row and row["format_valid"])
        topo[domain][shape] += 1
        if domain in ROUTES:
            routed[domain].append(shape.split(">")[-1] == ROUTES[domain])
    valid = [bool(r["format_valid"]) for r in rows.values()]
    by_name = {r["strategy"]: r for r in table_rows}
    best_single = max((by_name[f"single:{w}"] for w in args.workers), key=lambda r: r["all"])
    return {
        "n": len(domains),
        "rows": table_rows,
        "best_single": best_single["strategy"],
        "best_single_accuracy": best_single["all"],
        "oracle_accuracy": by_name["oracle router"]["all"],
        "conductor_accuracy": by_name["conductor"]["all"],
        "word_accuracy": by_name["conductor"].get("word"),
        "valid_plans": sum(valid) / len(valid) if valid else None,
        "routing": {d: sum(v) / len(v) for d, v in routed.items()},
        "topology": {d: dict(c.most_common()) for d, c in topo.items()},
        "eval_wall_s": walls,
        "conductor_eval_id": summary["eval_id"],
    }


def goals(m: dict[str, Any], a: dict[str, Any], train: dict[str, Any] | None) -> list[dict]:
    def row(measure: str, value: float | None, goal: str, met: bool | None) -> dict:
        return {"measure": measure, "value": value, "goal": goal, "met": met}

    best = m["best_single_accuracy"]
    out = [
        row("mixed test accuracy", m["conductor_accuracy"],
            f">= {m['best_single']} + 25 pts ({best + 0.25:.0%})",
            m["conductor_accuracy"] >= best + 0.25),
        row("routing quality (share of oracle router)",
            m["conductor_accuracy"] / m["oracle_accuracy"] if m["oracle_accuracy"] else None,
            ">= 90 %", m["conductor_accuracy"] >= 0.9 * m["oracle_accuracy"]),
    ]  # fmt: skip
    for domain, share in m["routing"].items():
        out.append(row(f"routing: {domain} to {ROUTES[domain]}", share, ">= 90 %", share >= 0.9))
    out += [
        row("arithmetic test accuracy", a["conductor_accuracy"], ">= 67 %",
            a["conductor_accuracy"] >= 0.67),
        row("arithmetic word problems", a["word_accuracy"], "reported", None),
        row("valid plans (mixed)", m["valid_plans"], ">= 98 %", (m["valid_plans"] or 0) >= 0.98),
        row("valid plans (arithmetic)", a["valid_plans"], ">= 98 %",
            (a["valid_plans"] or 0) >= 0.98),
        row("moonshot: word problems (mixed)", m["word_accuracy"], ">= 50 %",
            (m["word_accuracy"] or 0) >= 0.5),
        row("moonshot: word problems (arithmetic)", a["word_accuracy"], ">= 50 %",
            (a["word_accuracy"] or 0) >= 0.5),
    ]  # fmt: skip
    if train is not None:
        minutes = train["wall_s"] / 60
        out.append(row("train-conductor --dataset mixed (min)", minutes, "<= 90", minutes <= 90))
    return out


def _pct(v: Any) -> str:
    return "–" if v is None else (f"{v:.1%}" if isinstance(v, float) and v <= 1.5 else f"{v:.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=200, help="mixed test questions (first N)")
    ap.add_argument("--arith-limit", type=int, default=200, help="arithmetic test questions")
    ap.add_argument("--conductor", default="champion", help="conductor ref (dir, models:/…)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", nargs="+", default=list(WORKERS))
    ap.add_argument("--train-result", type=Path, help="train-conductor --json output")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    mixed = measure("mixed", args.limit, args)
    arith = measure("arithmetic", args.arith_limit, args)
    train = json.loads(args.train_result.read_text()) if args.train_result else None
    result = {
        "conductor": args.conductor,
        "mixed": mixed,
        "arithmetic": arith,
        "goals": goals(mixed, arith, train),
        "train": train,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for name, m in (("mixed", mixed), ("arithmetic", arith)):
        print(f"\n## {name} test, first {m['n']} questions")
        print(table(m["rows"], ["strategy", *ORDERS[name], "all", "n"]))
        print("topology per domain:")
        for domain, shapes in m["topology"].items():
            print(f"  {domain:<11} " + ", ".join(f"{s} {n}" for s, n in shapes.items()))
    print("\n## goals")
    for g in result["goals"]:
        met = "–" if g["met"] is None else ("yes" if g["met"] else "NO")
        print(f"  {g['measure']:<42} {_pct(g['value']):>8}  goal {g['goal']:<28} met: {met}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
