"""One error root for the whole product.

User errors (bad plan, bad pool file, unknown worker) subclass ``ConductorError`` and are
printed by the CLI as one line, without a traceback. ``WorkerError`` carries a ``retryable``
flag so that the step task retries only what may succeed on a second try.
"""

from __future__ import annotations

__all__ = [
    "ConductorError",
    "PlanError",
    "PoolConfigError",
    "WorkerError",
    "StoreError",
    "StoreUnavailableError",
    "TrackingError",
    "TrackingUnavailableError",
]


class ConductorError(Exception):
    """Root of every error this package raises on purpose."""


class PlanError(ConductorError):
    """The conductor's output cannot be parsed, or the parsed plan is invalid."""


class PoolConfigError(ConductorError):
    """The pool file is missing, malformed, or names something that does not exist."""


class StoreError(ConductorError):
    """A store cannot be read or written: the artifact store (Parquet, local or on an object
    store) or MLflow's tracking store (``TrackingError``). A runtime failure: the CLI exits 1."""


class StoreUnavailableError(StoreError):
    """The artifact store's server stayed unreachable through every retry (an outage, not a
    bad path or a refused credential)."""


class TrackingError(StoreError):
    """MLflow's tracking store cannot be written (a bad setting, an unreachable server)."""


class TrackingUnavailableError(TrackingError):
    """The MLflow tracking server stayed unreachable through every retry (an outage, not a
    refused request)."""


class WorkerError(ConductorError):
    """A worker call failed. ``retryable`` says whether a retry may succeed."""

    def __init__(self, message: str, *, retryable: bool = False, worker: str | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.worker = worker
