"""How a question becomes a plan: the conductor, or one of the paper's baselines.

Strategies (the Conductor paper's comparisons, arXiv 2512.04388 §5; issue #3):
- ``conductor``: the conductor model writes the plan;
- ``single:WORKER``: one step on one worker, the question as its subtask;
- ``self-consistency:WORKER:K``: K independent samples on one worker, majority vote;
- ``random-plan``: a random valid plan over the pool, a control for the planning itself;
- ``best-of-n:N[:PROPOSER]``: N proposed plans all run, OrchRM picks one run by its plan and
  step outputs (arXiv 2606.13598);
- ``best-of-n-plan:N[:PROPOSER]``: OrchRM scores the N plans *before* execution and only the
  chosen one runs (the paper's token saving). ``PROPOSER`` is ``conductor`` (the pool's
  conductor sampled at temperature 1.0) or ``random-plan``.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from prefect_conductor.conductor.errors import ConductorError
from prefect_conductor.conductor.plan.workflow import Step, Workflow
from prefect_conductor.conductor.pool import Pool

__all__ = [
    "SELF_CONSISTENCY_TEMPERATURE",
    "STRATEGY_EXAMPLES",
    "STRATEGY_PATTERN",
    "Strategy",
    "parse_strategy",
    "PROPOSERS",
    "random_plan",
    "random_plan_seed",
    "self_consistency_plan",
    "majority_vote",
]

Kind = Literal[
    "conductor", "single", "self-consistency", "random-plan", "best-of-n", "best-of-n-plan"
]
PROPOSERS = ("conductor", "random-plan")
# A proposing conductor samples at the Conductor paper's rollout temperature.
PROPOSER_TEMPERATURE = 1.0

# Subtasks a random plan draws from: generic, so that only the structure is random.
# Self-consistency needs diverse samples: a greedy worker samples at this temperature
# (Wang et al. 2023 sample at 0.5-0.7).
SELF_CONSISTENCY_TEMPERATURE = 0.7

_RANDOM_SUBTASKS = (
    "Solve the question step by step.",
    "Check the work above for mistakes and correct them.",
    "Answer the question directly and briefly.",
    "Summarise the work above and state the final answer.",
)


# Every text ``parse_strategy`` accepts, as one regular expression: the JSON-schema
# ``pattern`` of the request models, so the Prefect deployment form rejects a bad strategy
# before a run starts. WORKER: a pool worker name without ``:``; K in 1..64, N in 2..64.
_WORKER = r"[A-Za-z0-9_.-]+"
_K = r"0*(?:[1-9]|[1-5][0-9]|6[0-4])"
_N = r"0*(?:[2-9]|[1-5][0-9]|6[0-4])"
STRATEGY_PATTERN = (
    rf"^(?:conductor|random-plan|single:{_WORKER}|self-consistency:{_WORKER}:{_K}"
    rf"|best-of-n(?:-plan)?:{_N}(?::(?:conductor|random-plan))?)$"
)
STRATEGY_EXAMPLES = (
    "conductor",
    "single:calculator",
    "self-consistency:smol:5",
    "random-plan",
    "best-of-n:4",
    "best-of-n-plan:8:random-plan",
)


@dataclass(frozen=True)
class Strategy:
    kind: Kind
    worker: str | None = None
    samples: int = 1
    proposer: str = "conductor"

    def __str__(self) -> str:
        if self.kind in ("best-of-n", "best-of-n-plan"):
            return f"{self.kind}:{self.samples}:{self.proposer}"
        if self.kind == "single":
            return f"single:{self.worker}"
        if self.kind == "self-consistency":
            return f"self-consistency:{self.worker}:{self.samples}"
        return self.kind

    @property
    def uses_conductor(self) -> bool:
        """The plan is conductor-style text (written by the conductor or a proposer)."""
        return self.kind in ("conductor", "best-of-n", "best-of-n-plan")

    @property
    def best_of(self) -> bool:
        return self.kind in ("best-of-n", "best-of-n-plan")


def _count(text: str, value: str, name: str, low: int, high: int = 64) -> int:
    if not (value.isascii() and value.isdigit()):
        raise ConductorError(f"strategy {text!r}: {name} must be an integer, got {value!r}")
    k = int(value)
    if not low <= k <= high:
        raise ConductorError(f"strategy {text!r}: {name} must be between {low} and {high}, got {k}")
    return k


def parse_strategy(text: str, pool: Pool | None = None) -> Strategy:
    """Parse a strategy (see the module docstring); the text matches ``STRATEGY_PATTERN``."""
    parts = text.strip().split(":")
    head = parts[0]
    usage = (
        "expected conductor, single:WORKER, self-consistency:WORKER:K, random-plan, "
        "best-of-n:N[:PROPOSER] or best-of-n-plan:N[:PROPOSER]"
    )
    if head in ("conductor", "random-plan") and len(parts) == 1:
        strategy = Strategy(kind=head)  # type: ignore[arg-type]
    elif head == "single" and len(parts) == 2 and parts[1]:
        strategy = Strategy(kind="single", worker=parts[1])
    elif head == "self-consistency" and len(parts) == 3 and parts[1]:
        k = _count(text, parts[2], "K", 1)
        strategy = Strategy(kind="self-consistency", worker=parts[1], samples=k)
    elif head in ("best-of-n", "best-of-n-plan") and len(parts) in (2, 3):
        n = _count(text, parts[1], "N", 2)
        proposer = parts[2] if len(parts) == 3 else "conductor"
        if proposer not in PROPOSERS:
            raise ConductorError(
                f"strategy {text!r}: unknown proposer {proposer!r}; "
                "expected conductor or random-plan"
            )
        strategy = Strategy(kind=head, samples=n, proposer=proposer)  # type: ignore[arg-type]
    else:
        raise ConductorError(f"unknown strategy {text!r}: {usage}")
    if not re.fullmatch(STRATEGY_PATTERN, text.strip()):  # e.g. a worker name with a space
        raise ConductorError(f"unknown strategy {text!r}: {usage}")
    if pool is not None and strategy.worker is not None:
        pool.worker(strategy.worker)  # raises, naming the known workers
    return strategy


def random_plan_seed(question_id: str, seed: int) -> int:
    """The random-plan seed of one question: its id's hash plus the run's seed."""
    return int(hashlib.sha256(question_id.encode()).hexdigest()[:8], 16) + seed


def random_plan(pool: Pool, seed: int, question: str, max_steps: int | None = None) -> Workflow:
    """A random valid plan: random length, workers and access lists (the paper's control)."""
    rng = random.Random(seed)
    names = [w.name for w in pool.workers if w.kind != "conductor"]
    n = rng.randint(1, max_steps or pool.max_steps)
    steps = []
    for i in range(n):
        earlier = list(range(i))
        access = tuple(sorted(rng.sample(earlier, rng.randint(0, len(earlier))))) if earlier else ()
        instruction = question if i == 0 else rng.choice(_RANDOM_SUBTASKS)
        steps.append(
            Step(index=i, worker=rng.choice(names), instruction=instruction, access=access)
        )
    if n > 1:  # the last step states the answer, so it sees something to answer from
        last = steps[-1]
        steps[-1] = last.model_copy(update={"access": last.access or (n - 2,)})
    return Workflow(steps=tuple(steps))


def self_consistency_plan(worker: str, question: str, samples: int) -> Workflow:
    """K independent steps on one worker; the answer is their majority vote."""
    return Workflow(
        steps=tuple(Step(index=i, worker=worker, instruction=question) for i in range(samples))
    )


def majority_vote(outputs: list[str], key: Callable[[str], str | None]) -> str | None:
    """The output whose extracted answer is most common; ties go to the earliest sample."""
    keyed = [(key(o), o) for o in outputs]
    counts = Counter(k for k, _ in keyed if k is not None)
    if not counts:
        return outputs[0] if outputs else None
    best = max(counts.values())
    return next(o for k, o in keyed if k is not None and counts[k] == best)
