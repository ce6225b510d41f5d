"""Verification task: the answer against the reference, and the Conductor paper's reward."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect_conductor.conductor.data.datasets import Example
from prefect_conductor.conductor.data.verify import reward, verify

__all__ = ["Verification", "verify_answer"]


@dataclass(frozen=True)
class Verification:
    correct: bool
    reward: float
    details: str


@task(cache_policy=NO_CACHE, name="verify", task_run_name="verify answer")
def verify_answer(example: Example, answer: str | None, format_valid: bool) -> Verification:
    """Run the verifier of ``example.kind`` (code runs in the sandbox, never in-process)."""
    verdict = verify(example, answer)
    return Verification(verdict.correct, reward(format_valid, verdict.correct), verdict.details)
