"""Issue #40's routing row: a conductor on questions in wordings no generator uses.

``benchmarks/heldout/everyday.jsonl`` is a held-out set of our own, written by hand, never a
training split and never read by training code: 48 questions, 12 in each domain of the
embedded pool, asked as people ask them ("Capital of Portugal, please.", a program introduced
by "My script ends with a print. What does it show?", "Double 86, then add 9.", "A bus has 52
seats and 37 people are on it. How many seats are empty?"). References are computed from the
row's own ``program`` (run by Python) or ``worked`` expression (the calculator tool's
evaluator), checked by ``benchmarks/test_unseen_wordings.py``.

One run: ``conductor eval`` of every single worker and of the conductor on the whole set
(``benchmarks.conductor_goals.measure``: accuracy per domain, the oracle router, the worker
each plan's answering step went to, plan shapes), then the goals:

- the conductor >= 0.9 of the oracle router (a question counts for the oracle if any single
  worker answers it);
- each domain with a worker of its own (arithmetic: calculator, programs: python, knowledge:
  smol) routed there >= 90 % of the time; word problems have no single worker;
- moonshot: the conductor above the oracle router (expressions written for arithmetic in
  words and word problems, which no single worker answers).

    python -m benchmarks.unseen_wordings [--data FILE] [--conductor champion] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from benchmarks.conductor_goals import ROUTES, measure
from benchmarks.mixed_baselines import WORKERS, table

DATA = Path(__file__).resolve().parent / "heldout" / "everyday.jsonl"


def goals(m: dict[str, Any]) -> list[dict[str, Any]]:
    """The routing row's goals, decided on counts of right answers (exact, not floats)."""
    n = m["n"]
    right = round(m["conductor_accuracy"] * n)
    oracle = round(m["oracle_accuracy"] * n)
    out = [
        {"measure": "conductor / oracle router", "value": right / oracle if oracle else None,
         "goal": ">= 0.9", "met": 10 * right >= 9 * oracle},
    ]  # fmt: skip
    for domain, share in m["routing"].items():
        out.append({"measure": f"routing: {domain} to {ROUTES[domain]}", "value": share,
                    "goal": ">= 90 %", "met": share >= 0.9})  # fmt: skip
    out.append({"measure": "moonshot: conductor above the oracle router",
                "value": m["conductor_accuracy"], "goal": f"> {m['oracle_accuracy']:.1%}",
                "met": right > oracle})  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="a held-out JSONL with `domain`")
    ap.add_argument("--conductor", default="champion", help="conductor ref (dir, models:/…)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", nargs="+", default=list(WORKERS))
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    data = str(args.data.resolve())
    m = measure(data, sum(1 for line in Path(data).read_text().splitlines() if line.strip()), args)
    result = {"conductor": args.conductor, "data": data, **m, "goals": goals(m)}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    order = [r for r in m["rows"][0] if r not in ("strategy", "all", "n")]
    print(f"## {Path(data).name}: {m['n']} questions in wordings no generator uses")
    print(table(m["rows"], ["strategy", *order, "all", "n"]))
    print("topology per domain:")
    for domain, shapes in m["topology"].items():
        print(f"  {domain:<11} " + ", ".join(f"{s} {n}" for s, n in shapes.items()))
    print("\n## goals")
    for g in result["goals"]:
        value = "–" if g["value"] is None else f"{g['value']:.1%}"
        print(f"  {g['measure']:<44} {value:>7}  goal {g['goal']:<10} met: "
              f"{'yes' if g['met'] else 'NO'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
