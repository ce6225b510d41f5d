"""Single-worker baselines on the mixed task set, per domain, and the oracle router (issue #18).

Runs ``conductor eval --dataset mixed --split test --limit N --strategy single:W`` for each
worker W of the embedded pool (``calculator``, ``python``, ``smol``), in one session, then
reads each eval's per-question rows back from the Parquet runs table (selected by the eval's
``eval_id`` tag) and joins them with the dataset's ``meta["domain"]``. The first N questions
of the test split are domain-balanced by construction (N a multiple of 4 keeps them equal).

The **oracle router** counts a question as correct if any single worker got it right: the
ceiling of a conductor that only routes whole questions (issue #18's routing goal is 90 % of
it; answers no single worker gives, such as word problems, can beat it).

    python -m benchmarks.mixed_baselines [--limit 100] [--concurrency 4] [--json]

Evals go to ``$CONDUCTOR_HOME`` (default ``./.conductor``), as for ``conductor eval``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from prefect_conductor.conductor.data.datasets import MIXED_DOMAINS, load_dataset

ROOT = Path(__file__).resolve().parent.parent

WORKERS = ("calculator", "python", "smol")


def run_eval(
    worker: str,
    limit: int,
    concurrency: int,
    seed: int,
    *,
    dataset: str = "mixed",
    strategy: str | None = None,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One ``conductor eval`` in a subprocess (``single:worker`` unless ``strategy``); its
    ``--json`` summary."""
    strategy = strategy or f"single:{worker}"
    cmd = [
        str(Path(sys.executable).with_name("conductor")),  # the CLI of this environment
        "eval",
        "--dataset",
        dataset,
        "--split",
        "test",
        "--limit",
        str(limit),
        "--strategy",
        strategy,
        "--concurrency",
        str(concurrency),
        "--seed",
        str(seed),
        *extra,
        "--json",
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(
            f"eval {strategy} on {dataset} failed ({done.returncode}):\n{done.stderr[-3000:]}"
        )
    return json.loads(done.stdout)


def eval_rows(summary: dict[str, Any], columns: tuple[str, ...] = ("correct",)) -> dict[str, dict]:
    """``question_id -> {column: value}`` for one eval's runs, from the runs table."""
    import pyarrow.dataset as pads

    table = pads.dataset(Path(summary["artifacts"]) / "runs", format="parquet").to_table(
        columns=["question_id", "tags", *columns]
    )
    out: dict[str, dict] = {}
    for row in table.to_pylist():
        if dict(row["tags"] or []).get("eval_id") == summary["eval_id"]:
            out[row["question_id"]] = row
    return out


def per_question(summary: dict[str, Any]) -> dict[str, bool]:
    """``question_id -> correct`` for one eval, from the runs table."""
    return {q: bool(r["correct"]) for q, r in eval_rows(summary).items()}


def tabulate(
    verdicts: dict[str, dict[str, bool]],
    domains: dict[str, str],
    order: tuple[str, ...] = MIXED_DOMAINS,
    extra: dict[str, dict[str, bool]] | None = None,
) -> list[dict[str, Any]]:
    """One row per strategy (the workers, the oracle router, then ``extra``): accuracy per
    domain (in ``order``) and overall."""
    strategies = {f"single:{w}": v for w, v in verdicts.items()}
    strategies["oracle router"] = {
        q: any(v.get(q, False) for v in verdicts.values()) for q in domains
    }
    strategies.update(extra or {})
    rows = []
    for name, got in strategies.items():
        row: dict[str, Any] = {"strategy": name}
        by_domain: dict[str, list[bool]] = defaultdict(list)
        for qid, domain in domains.items():
            by_domain[domain].append(got.get(qid, False))
        for domain in order:
            hits = by_domain[domain]
            row[domain] = sum(hits) / len(hits) if hits else None
        row["all"] = sum(got.get(q, False) for q in domains) / len(domains)
        row["n"] = len(domains)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]], cols: list[str] | None = None) -> str:
    cols = cols or ["strategy", *MIXED_DOMAINS, "all", "n"]

    def cell(key: str, value: Any) -> str:
        if value is None:
            return "–"
        return f"{value:.0%}" if isinstance(value, float) else str(value)

    cells = [[cell(k, r.get(k)) for k in cols] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(cols)]
    lines = [
        "  ".join(
            k.ljust(w) if i == 0 else k.rjust(w)
            for i, (k, w) in enumerate(zip(cols, widths, strict=True))
        )
    ]
    lines += [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=100, help="first N test questions")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", nargs="+", default=list(WORKERS))
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    examples = load_dataset("mixed", split="test", limit=args.limit, seed=args.seed)
    domains = {e.id: e.meta["domain"] for e in examples}
    verdicts, evals = {}, {}
    for worker in args.workers:
        start = time.perf_counter()
        summary = run_eval(worker, args.limit, args.concurrency, args.seed)
        evals[worker] = {
            "eval_id": summary["eval_id"],
            "accuracy": summary["accuracy"],
            "wall_s": round(time.perf_counter() - start, 1),
        }
        verdicts[worker] = per_question(summary)
        missing = set(domains) - set(verdicts[worker])
        if missing:
            print(f"single:{worker}: no stored run for {len(missing)} questions", file=sys.stderr)
    rows = tabulate(verdicts, domains)
    if args.json:
        print(
            json.dumps(
                {"limit": args.limit, "seed": args.seed, "rows": rows, "evals": evals}, indent=2
            )
        )
    else:
        print(table(rows))
        for worker, info in evals.items():
            print(f"single:{worker}: eval {info['eval_id']}, {info['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
