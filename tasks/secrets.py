"""Prefect Secret blocks for the pool's ``api_key_secret`` (issue #39: I/O lives in tasks/).

Every task that calls a model reads keys through :func:`prefect_secrets`, a context in which
``prefect_conductor.conductor.providers.llm`` loads a named block; the core itself imports
no Prefect. The key goes to litellm for that call only: it is never stored, logged or sent to
MLflow.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prefect_conductor.conductor.errors import WorkerError
from prefect_conductor.conductor.providers.llm import secret_source

__all__ = ["load_secret", "prefect_secrets"]


def load_secret(name: str) -> str:
    """The value of the Prefect Secret block ``name``, or one non-retryable line."""
    from prefect.blocks.system import Secret

    try:
        return str(Secret.load(name).get())
    except ValueError as exc:
        raise WorkerError(
            f"Prefect Secret block {name!r} cannot be loaded: {exc}", retryable=False
        ) from None


@contextmanager
def prefect_secrets() -> Iterator[None]:
    """Model calls in this block read ``api_key_secret`` from Prefect Secret blocks."""
    with secret_source(load_secret):
        yield
