"""Best-of-N with OrchRM (arXiv 2606.13598), and ``QUESTION_FLOWS``: the flows that the
question tasks (``tasks/questions.py``) run, handed to them by the flows that submit them.

- ``best-of-n:N[:PROPOSER]``: N plans are proposed and all N run (``orchestrate`` subflows,
  concurrently); OrchRM scores each plan with its step outputs and the best run is the answer.
  On the same N runs the selection also records the majority vote, a random pick and the
  oracle (any of the N correct), so an eval shows how much of the ceiling OrchRM captures.
- ``best-of-n-plan:N[:PROPOSER]``: OrchRM scores the N plans *before* execution and only
  the chosen one runs, so only it spends worker tokens.

Proposals come from the pool's conductor sampled at temperature 1.0, or from ``random-plan``
with seeds ``seed .. seed + N - 1`` (the same plans as ``--samples N`` of ``random-plan``).
Every executed candidate is stored as a run tagged ``selection`` (the strategy),
``selection_id``, ``candidate`` and ``plan_score``; the full selection (scores, the chosen
candidate, the baselines) is the ``selection`` field of the result and a table artifact.
"""

from __future__ import annotations

import hashlib
import random
import time

from prefect import flow
from prefect.artifacts import create_table_artifact
from prefect.runtime import flow_run
from prefect.states import Failed, State
from prefect.task_runners import ThreadPoolTaskRunner
from prefect_conductor.conductor.data.verify import answer_key
from prefect_conductor.conductor.errors import PlanError
from prefect_conductor.conductor.plan.parse import parse_plan
from prefect_conductor.conductor.plan.prompts import describe_workers, render_plan
from prefect_conductor.conductor.plan.requests import OrchestrateRequest, RunResult
from prefect_conductor.conductor.plan.strategies import (
    PROPOSER_TEMPERATURE,
    Strategy,
    majority_vote,
    parse_strategy,
    random_plan,
    random_plan_seed,
)
from prefect_conductor.conductor.pool import Pool, load_pool
from prefect_conductor.flows.orchestrate import orchestrate, run_unstored
from prefect_conductor.reward_model.model import CHAMPION
from prefect_conductor.tasks.planning import write_plan
from prefect_conductor.tasks.questions import QuestionFlows, run_candidate
from prefect_conductor.tasks.registry import with_conductor
from prefect_conductor.tasks.reward_model import score_plans

__all__ = ["QUESTION_FLOWS", "best_of_n", "DEFAULT_RM"]

DEFAULT_RM = CHAMPION


def _question_id(request: OrchestrateRequest) -> str:
    return request.question_id or hashlib.sha256(request.question.strip().encode()).hexdigest()[:16]


def _proposals(
    request: OrchestrateRequest, pool: Pool, strategy: Strategy, qid: str
) -> tuple[list[tuple[str, dict | None]], str, tuple[int, int]]:
    """N proposals as (plan text, parsed lists or None), who wrote them, and their tokens
    (input, output)."""
    n, max_steps = strategy.samples, request.max_steps or pool.max_steps
    if strategy.proposer == "random-plan":
        plans = [
            random_plan(pool, random_plan_seed(qid, request.seed + k), request.question, max_steps)
            for k in range(n)
        ]
        return [(render_plan(w, pool), w.to_lists()) for w in plans], "random-plan", (0, 0)
    futures = [
        write_plan.submit(
            request.question,
            pool.with_conductor_sampling(PROPOSER_TEMPERATURE, request.seed + k),
            max_steps,
        )
        for k in range(n)
    ]
    out, inp, outp = [], 0, 0
    for f in futures:
        completion = f.result()
        inp += completion.input_tokens or 0
        outp += completion.output_tokens or 0
        try:
            lists = parse_plan(completion.text, pool, max_steps=max_steps).to_lists()
        except PlanError:
            lists = None
        out.append((completion.text, lists))
    return out, pool.conductor.model, (inp, outp)


def _argmax(scores: list[float]) -> int:
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def _baselines(results: list[RunResult], kind: str, qid: str, seed: int) -> dict[str, object]:
    """Majority vote, a random pick and the oracle over the same executed candidates."""
    answers = [r.answer or "" for r in results if r.status == "completed"]
    voted = majority_vote(answers, lambda text: answer_key(kind, text)) if answers else None
    majority = next((r for r in results if voted is not None and r.answer == voted), None)
    pick = random.Random(random_plan_seed(qid, seed)).randrange(len(results))
    return {
        "majority_answer": voted,
        "majority_correct": bool(majority and majority.correct),
        "random_pick": pick,
        "random_correct": bool(results[pick].correct),
        "oracle_correct": any(bool(r.correct) for r in results),
    }


@flow(
    name="best-of-n",
    flow_run_name="best-of-n ({request.strategy})",
    task_runner=ThreadPoolTaskRunner(64),
    log_prints=False,
)
def best_of_n(request: OrchestrateRequest) -> RunResult | State:
    """Propose N plans, let OrchRM choose (before or after running them), return the chosen run."""
    started = time.perf_counter()
    pool = load_pool(request.pool)
    if request.conductor:
        pool = with_conductor(pool, request.conductor)
    strategy = parse_strategy(request.strategy, pool)
    if not strategy.best_of:
        raise ValueError(f"best_of_n runs best-of-n strategies, not {strategy}")
    qid = _question_id(request)
    rm = request.rm or DEFAULT_RM
    workers = describe_workers(pool)
    proposals, source, (proposal_in, proposal_out) = _proposals(request, pool, strategy, qid)
    proposal_tokens = proposal_in + proposal_out
    plans = [lists if lists is not None else text for text, lists in proposals]
    plan_scores = score_plans(rm, request.question, plans, None, workers)
    selection_id = str(flow_run.id or time.time_ns())

    def candidate(k: int, selected: bool | None) -> OrchestrateRequest:
        tags = {
            **request.tags,
            "selection": str(strategy),
            "selection_id": selection_id,
            "candidate": str(k),
            "plan_score": f"{plan_scores[k]:.6f}",
        }
        if selected is not None:
            tags["selected"] = str(selected).lower()
        return request.model_copy(
            update={
                "question_id": qid,
                "plan_text": proposals[k][0],
                "plan_source": source,
                "tags": tags,
            }
        )

    n = len(proposals)
    if strategy.kind == "best-of-n-plan":
        chosen = _argmax(plan_scores)
        result = run_candidate(candidate(chosen, True), chosen, QUESTION_FLOWS)
        results: list[RunResult | None] = [None] * n
        results[chosen] = result
        scores = plan_scores
        selection: dict[str, object] = {"executed": 1}
        tokens = result.input_tokens + result.output_tokens
    else:
        futures = [run_candidate.submit(candidate(k, None), k, QUESTION_FLOWS) for k in range(n)]
        done = [f.result() for f in futures]
        scores = score_plans(rm, request.question, plans, [r.step_outputs for r in done], workers)
        chosen = _argmax(scores)
        result, results = done[chosen], list(done)
        selection = {"executed": n, **_baselines(done, request.kind, qid, request.seed)}
        tokens = sum(r.input_tokens + r.output_tokens for r in done)
    selection |= {
        "strategy": str(strategy),
        "selection_id": selection_id,
        "rm": rm,
        "chosen": chosen,
        "chosen_correct": result.correct,
        "plan_scores": plan_scores,
        "scores": scores,
        "plan_pick": _argmax(plan_scores),
        "plan_pick_correct": (
            results[_argmax(plan_scores)].correct if results[_argmax(plan_scores)] else None
        ),
        "candidates": [
            {
                "run_id": r.run_id if r else None,
                "answer": r.answer if r else None,
                "correct": r.correct if r else None,
                "tokens": (r.input_tokens + r.output_tokens) if r else None,
            }
            for r in results
        ],
        "proposal_tokens": proposal_tokens,
        "tokens": tokens + proposal_tokens,
    }
    create_table_artifact(
        key="best-of-n",
        table=[
            {
                "candidate": k,
                "plan score": round(plan_scores[k], 4),
                "score": round(scores[k], 4),
                "chosen": "yes" if k == chosen else "",
                "answer": (r.answer or "")[:80] if r else "(not run)",
                "correct": "" if r is None or r.correct is None else str(r.correct),
            }
            for k, r in enumerate(results)
        ],
        description=f"{strategy}: OrchRM scores of the {n} candidates",
    )
    out = result.model_copy(
        update={
            "selection": selection,
            # What the strategy spent: every executed candidate and the proposals.
            "input_tokens": sum(r.input_tokens for r in results if r) + proposal_in,
            "output_tokens": sum(r.output_tokens for r in results if r) + proposal_out,
            "wall_s": round(time.perf_counter() - started, 3),
        }
    )
    if out.status != "completed":
        return Failed(message=out.reason or "the chosen run failed", data=out)
    return out


#: What the question tasks run (``tasks/questions.py``): ``tasks/`` imports no ``flows/``, so
#: the flow that submits a question task hands it these.
QUESTION_FLOWS = QuestionFlows(
    orchestrate=orchestrate, best_of_n=best_of_n, run_unstored=run_unstored
)
