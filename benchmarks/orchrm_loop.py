"""Issue #41, item 2: OrchRM-guided sampling against execute-all, at equal budgets.

One run, the same starting adapter, store and questions for every arm. Each arm is one
``conductor train-conductor --recipe <arm> --no-promote --json`` (a recipe this script
writes) in its own copy of one starting home, so no arm sees another's runs:

- ``execute-all``: a self-sampling round as the recipes run it today: ``K`` plans for each of
  ``Q`` training questions, every plan executed, SFT on the right ones (the store's earlier
  verified plans replayed);
- ``merge-only``: the same ``K`` plans written, identical ones merged, every distinct valid
  plan executed (``guide: {execute: K}``): what merging alone saves;
- ``orchrm-top<m>``: the distinct valid plans scored by OrchRM from the plan alone and only
  its top ``m`` executed (``guide: {execute: m}``);
- with ``--grpo STEPS``: ``grpo-executed`` (every rollout executed, the paper's reward) and
  ``grpo-orchrm`` (OrchRM's reward, ``execute_fraction`` of the rollouts executed to check
  it), equal steps.

Fair budgets: OrchRM is trained (``conductor train-rm``) in the starting home on the runs
stored there before any arm starts, so it costs the arms no worker call; an arm's worker
calls are its training stage's ledger entry (the held-out evals are not a training cost).
Accuracy is each arm's held-out ``after`` eval on the same questions (``--heldout`` of the
mixed test split); the starting adapter's own accuracy is measured once, in the starting home.

``calls_to_match``: per arm, the worker calls it spent if its held-out accuracy reached
execute-all's, else null (one budget per arm: a point, not a curve).

    python -m benchmarks.orchrm_loop --store HOME --start ADAPTER --work DIR [--json]
        [--questions 32] [--k 4] [--top 1 2] [--heldout 40] [--grpo STEPS [--grpo-lr LR]]
        [--plot PNG]

``HOME`` is a conductor home with stored runs (its ``artifacts``, ``mlflow.db`` and
``mlartifacts`` are copied; an MLflow experiment that already exists there keeps logging its
artifacts to where it was created); ``ADAPTER`` the starting conductor (a weaker one:
a warm-start-only adapter). Each arm's result is a JSON file in ``DIR``: a rerun skips what is
done. The goal rows (issue #41): guided ≤ 1/3 of execute-all's calls at its accuracy
(moonshot ≤ 1/10); guided ≤ 1/2 of merge-only's calls at equal accuracy; GRPO on OrchRM's
reward ≥ executed-reward GRPO's accuracy − 2 points with ≤ 10 % of rollouts executed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks._training import run_training, write_recipe
from benchmarks.own_pool import step

COPIED = ("artifacts", "mlflow.db", "mlartifacts")


def arms(
    k: int, top: list[int], grpo_steps: int | None, grpo_lr: float | None = None
) -> dict[str, dict[str, Any]]:
    """Each arm's training stage (a recipe stage); both GRPO arms share ``grpo_lr`` (the
    recipe's default when None).

    >>> sorted(arms(4, [1, 2], None))
    ['execute-all', 'merge-only', 'orchrm-top1', 'orchrm-top2']
    >>> arms(4, [1], 8)["grpo-orchrm"]["reward"]
    'orchrm'
    >>> arms(4, [1], 8, 2e-4)["grpo-orchrm"]["learning_rate"]
    0.0002
    """
    sample = {"kind": "self-sample", "name": "round", "num_generations": k, "temperature": 1.0}
    out: dict[str, dict[str, Any]] = {
        "execute-all": sample,
        "merge-only": {**sample, "guide": {"execute": k}},
        **{f"orchrm-top{m}": {**sample, "guide": {"execute": m}} for m in top},
    }
    if grpo_steps:
        grpo = {
            "kind": "grpo",
            "name": "round",
            "max_steps": grpo_steps,
            "num_generations": 4,
            "per_device_train_batch_size": 4,
            "questions": {"limit": 1000, "fresh": False},
            **({"learning_rate": grpo_lr} if grpo_lr is not None else {}),
        }
        out["grpo-executed"] = grpo
        out["grpo-orchrm"] = {**grpo, "reward": "orchrm", "execute_fraction": 0.1}
    return out


def recipe(name: str, stage: dict[str, Any], start: str, questions: int, heldout: int) -> dict:
    """The recipe of one arm: its stage from ``start``, then the held-out eval."""
    stage = dict(stage)
    if stage["kind"] == "self-sample":
        stage["questions"] = {"limit": questions}
        stage["sft"] = {"init": "previous", "num_train_epochs": 1, "max_examples": 200}
    return {
        "name": f"orchrm-loop-{name}",
        "dataset": "mixed",
        "heldout": {"split": "test", "limit": heldout},
        "init_adapter": start,
        "stages": [stage, {"kind": "eval", "name": "after"}],
    }


def calls_to_match(results: dict[str, dict[str, Any]]) -> dict[str, int | None]:
    """Per arm, its worker calls if it reached execute-all's held-out accuracy, else None.

    >>> calls_to_match({"execute-all": {"worker_calls": 90, "accuracy": 0.5},
    ...                 "orchrm-top1": {"worker_calls": 20, "accuracy": 0.52},
    ...                 "merge-only": {"worker_calls": 60, "accuracy": 0.44}})
    {'execute-all': 90, 'orchrm-top1': 20, 'merge-only': None}
    """
    target = results["execute-all"]["accuracy"]
    return {
        name: r["worker_calls"] if r["accuracy"] >= target else None for name, r in results.items()
    }


def goals(results: dict[str, dict[str, Any]], matched: dict[str, int | None]) -> dict[str, Any]:
    """The issue's goal rows from the arms' figures (``None`` where an arm did not run).

    >>> r = {"execute-all": {"worker_calls": 90, "accuracy": 0.5},
    ...      "merge-only": {"worker_calls": 60, "accuracy": 0.5},
    ...      "orchrm-top1": {"worker_calls": 24, "accuracy": 0.5},
    ...      "orchrm-top2": {"worker_calls": 48, "accuracy": 0.4}}
    >>> g = goals(r, calls_to_match(r))
    >>> g["guided_vs_execute_all"], g["guided_vs_merge_only"], g["guided_met"]
    (0.2667, 0.4, True)
    """
    base = results["execute-all"]["worker_calls"]
    guided = [c for n, c in matched.items() if "orchrm" in n and "grpo" not in n and c is not None]
    best = min(guided) if guided else None
    merge = matched.get("merge-only")
    out: dict[str, Any] = {
        "guided_vs_execute_all": round(best / base, 4) if best is not None and base else None,
        "guided_vs_merge_only": round(best / merge, 4) if best is not None and merge else None,
    }
    out["guided_met"] = (
        out["guided_vs_execute_all"] is not None and out["guided_vs_execute_all"] <= 1 / 3
    )
    out["guided_moonshot"] = (
        out["guided_vs_execute_all"] is not None and out["guided_vs_execute_all"] <= 0.1
    )
    if "grpo-executed" in results and "grpo-orchrm" in results:
        gap = results["grpo-orchrm"]["accuracy"] - results["grpo-executed"]["accuracy"]
        out["grpo_orchrm_minus_executed"] = round(gap, 4)
        out["grpo_met"] = gap >= -0.02
    return out


def plot(m: dict[str, Any], path: Path) -> Path:
    """Held-out accuracy against the worker calls each arm spent, the start at 0 calls."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.axhline(m["start_accuracy"] * 100, color="grey", linestyle=":", label="start (0 calls)")
    target = m["arms"]["execute-all"]["accuracy"] * 100
    ax.axhline(target, color="tab:blue", linestyle="--", linewidth=0.8)
    for name, r in m["arms"].items():
        color = (
            "tab:blue"
            if name == "execute-all"
            else ("tab:green" if "orchrm" in name else "tab:orange")
        )
        marker = "s" if name.startswith("grpo") else "o"
        ax.scatter(r["worker_calls"], r["accuracy"] * 100, color=color, marker=marker, zorder=3)
        below = name.startswith("grpo")  # GRPO labels under their points: none overlap
        ax.annotate(name, (r["worker_calls"], r["accuracy"] * 100), textcoords="offset points",
                    xytext=(5, -12 if below else 5), fontsize=8)  # fmt: skip
    ax.set_xlabel("worker calls spent by the training stage")
    ax.set_ylabel(f"held-out accuracy, % ({m['heldout']} mixed test questions)")
    ax.set_xlim(left=0)
    ax.set_title("OrchRM in the loop: accuracy against worker calls", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def copy_home(store: Path, home: Path) -> Path:
    """A copy of what the trainings read of ``store``: the artifact tables and MLflow."""
    if not home.exists():
        tmp = home.with_name(home.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in COPIED:
            src = store / name
            if src.is_dir():
                shutil.copytree(src, tmp / name)
            elif src.is_file():
                shutil.copy2(src, tmp / name)
        tmp.rename(home)
    return home


def conductor_json(home: Path, *args: str) -> dict[str, Any]:
    """``conductor ARGS --json`` with ``CONDUCTOR_HOME=home``: its result."""
    cmd = [str(Path(sys.executable).with_name("conductor")), *args, "--json"]
    print("running " + " ".join(cmd[1:]), file=sys.stderr)
    env = {**os.environ, "CONDUCTOR_HOME": str(home)}
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"conductor {args[0]} failed ({done.returncode})")
    return json.loads(done.stdout)


def arm_row(result: dict[str, Any]) -> dict[str, Any]:
    """What an arm spent and reached, from its ``train-conductor --json`` result."""
    stage = next(s for s in result["stages"] if s["stage"] == "round")
    entry = next(e for e in result["ledger"] if e["stage"] == "round")
    return {
        "worker_calls": entry["worker_calls"],
        "tokens": entry["input_tokens"] + entry["output_tokens"],
        "plans_written": stage.get("sampled") or stage.get("rollouts"),
        "plans_executed": stage.get("rollouts"),
        "right": stage.get("right"),
        "accuracy": result["accuracy_after"],
        "orchrm_agreement": stage.get("orchrm_agreement"),
        "wall_s": entry["wall_s"],
        "run_id": result["run_id"],
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work).absolute()
    base = copy_home(Path(args.store), work / "base")
    rm = step(work / "orchrm.json", lambda: conductor_json(base, "train-rm", *args.rm_args))
    start = step(
        work / "start.json",
        lambda: conductor_json(
            base,
            "eval",
            "--dataset",
            "mixed",
            "--split",
            "test",
            "--limit",
            str(args.heldout),
            "--strategy",
            "conductor",
            "--conductor",
            args.start,
        ),  # fmt: skip
    )
    results: dict[str, dict[str, Any]] = {}
    for name, stage in arms(args.k, args.top, args.grpo, args.grpo_lr).items():
        home = copy_home(base, work / f"arm-{name}")
        spec = recipe(name, stage, args.start, args.questions, args.heldout)
        path = write_recipe(work / f"{name}.yaml", spec)

        def train(home: Path = home, path: Path = path) -> dict[str, Any]:
            os.environ["CONDUCTOR_HOME"] = str(home)
            return run_training(path, (), ("--no-promote",))

        results[name] = arm_row(step(work / f"{name}.json", train))
    matched = calls_to_match(results)
    base_calls = results["execute-all"]["worker_calls"]
    return {
        "questions": args.questions,
        "k": args.k,
        "heldout": args.heldout,
        "start_accuracy": start.get("accuracy"),
        "orchrm": {k: rm.get(k) for k in ("model_uri", "pairwise_accuracy", "pairs_train")},
        "arms": results,
        "calls_to_match": matched,
        "ratio_to_execute_all": {
            n: (c / base_calls if c is not None and base_calls else None)
            for n, c in matched.items()
        },
        "goals": goals(results, matched),
    }


def markdown(m: dict[str, Any]) -> str:
    out = [
        f"Start: {m['start_accuracy']:.1%} held-out ({m['heldout']} mixed test questions); "
        f"{m['questions']} training questions x {m['k']} plans; OrchRM {m['orchrm']['model_uri']}"
        f" (pairwise accuracy {m['orchrm']['pairwise_accuracy']}).",
        "",
        "| arm | worker calls | plans written | executed | right | held-out accuracy "
        "| calls to match execute-all | vs execute-all |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in m["arms"].items():
        matched = m["calls_to_match"][name]
        ratio = m["ratio_to_execute_all"][name]
        out.append(
            f"| {name} | {r['worker_calls']} | {r['plans_written']} | {r['plans_executed']} | "
            f"{r['right']} | {r['accuracy']:.1%} | {matched if matched is not None else '–'} | "
            f"{f'{ratio:.2f}x' if ratio is not None else '–'} |"
        )
    g = m.get("goals") or {}
    if g:
        out += ["", f"guided / execute-all calls at its accuracy: {g['guided_vs_execute_all']} "
                f"(goal ≤ 0.33: {'met' if g['guided_met'] else 'not met'}); guided / merge-only: "
                f"{g['guided_vs_merge_only']} (goal ≤ 0.5)"]  # fmt: skip
        if "grpo_met" in g:
            gap = g["grpo_orchrm_minus_executed"]
            out.append(f"GRPO, OrchRM reward − executed reward: {gap:+.3f}"
                       f" (goal ≥ −0.02: {'met' if g['grpo_met'] else 'not met'})")  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="a conductor home with stored runs")
    ap.add_argument("--start", required=True, help="the starting adapter (a directory)")
    ap.add_argument("--work", required=True, help="where the arms' homes and results go")
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--top", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--heldout", type=int, default=40)
    ap.add_argument("--grpo", type=int, default=None, help="GRPO arms of this many steps")
    ap.add_argument("--grpo-lr", type=float, default=None,
                    help="the GRPO arms' learning rate (default: the recipe's)")  # fmt: skip
    ap.add_argument("--rm-args", nargs="*", default=["--min-pairs", "1", "--max-steps", "60"])
    ap.add_argument("--plot", type=Path, default=None, help="a PNG of accuracy against calls")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result = measure(args)
    if args.plot:
        print(f"plot: {plot(result, args.plot)}", file=sys.stderr)
    print(json.dumps(result, indent=2) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
