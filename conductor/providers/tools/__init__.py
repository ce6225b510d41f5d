"""Tool workers (issue #3): a safe calculator and a sandboxed Python runner.

They are called like any model, through litellm: ``conductor.providers.tools.provider``
registers the ``tool`` provider, so a pool worker ``{kind: tool, model: tool/calculator}``
is routed by ``conductor.providers.llm.complete`` like an LLM. This package imports neither
litellm nor the provider; import ``prefect_conductor.conductor.providers.tools.provider`` for that.
"""

from __future__ import annotations

from prefect_conductor.conductor.errors import WorkerError

__all__ = [
    "SANDBOXED_MODELS",
    "ToolError",
    "SandboxResult",
    "SandboxUnavailable",
    "evaluate",
    "extract_code",
    "extract_expression",
    "run_python",
    "run_python_tests",
    "run_sandboxed",
]

# Tool models that run model-written code: a step answered by one records the pool's
# ``sandbox`` setting (issue #17).
SANDBOXED_MODELS = frozenset({"tool/python"})


class ToolError(WorkerError):
    """A tool refused or could not run its input. Never retryable: the input won't change."""

    def __init__(self, message: str, *, worker: str | None = None) -> None:
        super().__init__(message, retryable=False, worker=worker)


# Defined above before these imports, because the submodules import ToolError from here.
from prefect_conductor.conductor.providers.tools.calculator import evaluate, extract_expression  # noqa: E402
from prefect_conductor.conductor.providers.tools.sandbox import (  # noqa: E402
    SandboxResult,
    SandboxUnavailable,
    extract_code,
    run_python,
    run_python_tests,
    run_sandboxed,
)
