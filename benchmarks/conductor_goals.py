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
        [--conductor champion] [--recipe NAME|FILE [--set KEY=VALUE ...]]
        [--train-result result.json [--train-wall-s S]] [--json]

``--recipe`` trains first, in this invocation and this home: ``conductor train-conductor
--recipe NAME|FILE --set … --no-promote --json`` (a built-in such as ``shipped``, the recipe
of the embedded conductor, or a file), timed as one command, and then measures the conductor
that training registered instead of ``--conductor``. ``--train-result`` reads the ``--json``
output of a training run earlier instead and measures the conductor it registered unless
``--conductor`` names another (``--train-wall-s``: the command's wall time as the shell timed
it; run in that training's home). Either gives issue #40's rows: the shipped
conductor's quality (mixed and arithmetic >= 85 %, word problems >= 60 % on both), the
command's wall time against ``--train-goal-min`` (120: the shipped recipe's goal), the
ledger's total worker calls, tokens and cost, and, when the training's runs are in this home,
whether the ledger's worker calls equal the ``steps`` table's rows of its runs. Evals go to
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

from benchmarks._training import ledger_total, run_training, steps_worker_calls
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
    """A question's domain: ``mixed`` and data files say it (``domain``); the arithmetic
    set's level 3 is word problems."""
    if "domain" in meta:
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
    order = ORDERS.get(dataset) or tuple(dict.fromkeys(domains.values()))
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


def goals(
    m: dict[str, Any],
    a: dict[str, Any],
    train: dict[str, Any] | None,
    train_goal_min: float = 120,
) -> list[dict]:
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
        out += _shipped_quality(m, a, row)
        out += _cost(train, train_goal_min, row)
    return out


def _shipped_quality(m: dict[str, Any], a: dict[str, Any], row: Any) -> list[dict]:
    """Issue #40's row for a recipe's conductor: the shipped conductor's quality (mixed and
    arithmetic >= 85 %, word problems >= 60 % on both splits; valid plans are rows above)."""
    return [
        row("recipe: mixed test accuracy", m["conductor_accuracy"], ">= 85 %",
            m["conductor_accuracy"] >= 0.85),
        row("recipe: arithmetic test accuracy", a["conductor_accuracy"], ">= 85 %",
            a["conductor_accuracy"] >= 0.85),
        row("recipe: word problems (mixed)", m["word_accuracy"], ">= 60 %",
            (m["word_accuracy"] or 0) >= 0.6),
        row("recipe: word problems (arithmetic)", a["word_accuracy"], ">= 60 %",
            (a["word_accuracy"] or 0) >= 0.6),
    ]  # fmt: skip


def _cost(train: dict[str, Any], goal_min: float, row: Any) -> list[dict]:
    """The training's cost rows: its wall time (the whole command when this invocation ran
    it) and its ledger (issue #40)."""
    minutes = train.get("command_wall_s", train["wall_s"]) / 60
    recipe = train.get("recipe", "?")
    out = [
        row(f"train-conductor --recipe {recipe} (min)", minutes, f"<= {goal_min:g}",
            minutes <= goal_min),
    ]  # fmt: skip
    total = ledger_total(train)
    if total is None:
        return out
    out += [
        row("training worker calls (ledger total)", total["worker_calls"], "reported", None),
        row("training tokens in + out (ledger total)",
            total["input_tokens"] + total["output_tokens"], "reported", None),
        row("training cost USD (ledger total)", total["cost_usd"], "reported", None),
    ]  # fmt: skip
    if "steps_worker_calls" in train:
        calls = train["steps_worker_calls"]
        out.append(
            row("ledger worker calls = steps table rows", calls,
                f"= {total['worker_calls']}", calls == total["worker_calls"])
        )  # fmt: skip
    return out


def _value(goal: dict[str, Any]) -> str:
    """A goal's measured value as read: a share as a percentage, minutes, counts, dollars."""
    v, measure = goal["value"], goal["measure"]
    if v is None:
        return "–"
    if isinstance(v, int):
        return str(v)
    if "USD" in measure:
        return f"{v:.4f}"
    return f"{v:.1f}" if measure.endswith("(min)") or v > 1.5 else f"{v:.1%}"


def _ledger_table(ledger: list[dict[str, Any]]) -> str:
    cols = ("stage", "worker_calls", "input_tokens", "output_tokens", "cost_usd",
            "conductor_generations", "wall_s")  # fmt: skip
    lines = ["  ".join(f"{c:>21}" if i else f"{c:<16}" for i, c in enumerate(cols))]
    for e in ledger:
        lines.append(
            "  ".join(f"{e.get(c)!s:>21}" if i else f"{e.get(c)!s:<16}" for i, c in enumerate(cols))
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=200, help="mixed test questions (first N)")
    ap.add_argument("--arith-limit", type=int, default=200, help="arithmetic test questions")
    ap.add_argument(
        "--conductor",
        help="conductor ref (dir, models:/…); default: the one --train-result registered, "
        "else the champion (--recipe measures the one it trains)",
    )
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", nargs="+", default=list(WORKERS))
    ap.add_argument(
        "--recipe", help="train first: a built-in recipe (conductor recipes) or a YAML file"
    )
    ap.add_argument(
        "--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
        help="a recipe override for --recipe (repeatable), e.g. stages.grpo.max_steps=0",
    )  # fmt: skip
    ap.add_argument("--train-result", type=Path, help="train-conductor --json output")
    ap.add_argument(
        "--train-wall-s", type=float,
        help="with --train-result: the command's wall time as the shell timed it",
    )  # fmt: skip
    ap.add_argument("--train-goal-min", type=float, default=120, help="training time goal")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = ap.parse_args()
    if args.recipe and args.train_result:
        ap.error("--recipe trains now; --train-result reads an earlier training: give one")
    if args.sets and not args.recipe:
        ap.error("--set overrides a setting of --recipe")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.train_wall_s is not None and not args.train_result:
        ap.error("--train-wall-s times the training of --train-result")
    train = json.loads(args.train_result.read_text()) if args.train_result else None
    if train is not None:  # run in the training's home, its steps are here to count
        calls = steps_worker_calls(train["run_id"])
        if calls:
            train["steps_worker_calls"] = calls
        if args.train_wall_s is not None:
            train["command_wall_s"] = args.train_wall_s
        args.conductor = args.conductor or train["adapter_uri"]
    if args.recipe:
        train = run_training(args.recipe, args.sets, ("--no-promote",))
        train["steps_worker_calls"] = steps_worker_calls(train["run_id"])
        args.conductor = train["adapter_uri"]
    args.conductor = args.conductor or "champion"
    mixed = measure("mixed", args.limit, args)
    arith = measure("arithmetic", args.arith_limit, args)
    result = {
        "conductor": args.conductor,
        "mixed": mixed,
        "arithmetic": arith,
        "goals": goals(mixed, arith, train, args.train_goal_min),
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
    if train is not None:
        print(f"\n## training ledger (recipe {train.get('recipe', '?')})")
        print(_ledger_table(train.get("ledger") or []))
    print("\n## goals")
    for g in result["goals"]:
        met = "–" if g["met"] is None else ("yes" if g["met"] else "NO")
        print(f"  {g['measure']:<42} {_value(g):>8}  goal {g['goal']:<28} met: {met}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
