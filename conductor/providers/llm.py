"""Every model call goes through here, and through litellm.

``complete`` makes one chat completion for an endpoint of the pool (a worker or the
conductor), turns litellm's exceptions into ``WorkerError`` with a ``retryable`` flag, reads
token usage from the response and prices it. Retrying is the caller's job (the Prefect step
task retries only retryable errors), so litellm's own retries are off.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from prefect_conductor.conductor.errors import WorkerError
from prefect_conductor.conductor.pool import _Endpoint
from prefect_conductor.conductor.providers._litellm import litellm

__all__ = [
    "Completion",
    "SecretLoader",
    "classify_error",
    "complete",
    "price",
    "resolve_api_key",
    "secret_source",
]

_RETRYABLE = (
    litellm.exceptions.RateLimitError,
    litellm.exceptions.Timeout,
    litellm.exceptions.APIConnectionError,
    litellm.exceptions.InternalServerError,
    litellm.exceptions.ServiceUnavailableError,
    litellm.exceptions.BadGatewayError,
)
_FATAL = (
    litellm.exceptions.AuthenticationError,
    litellm.exceptions.PermissionDeniedError,
    litellm.exceptions.BadRequestError,
    litellm.exceptions.NotFoundError,
    litellm.exceptions.UnprocessableEntityError,
)


_LITELLM_PREFIX = re.compile(r"^(?:litellm\.\w+(?:Error|Exception|Timeout):\s*)+")


@dataclass(frozen=True)
class Completion:
    """One answered call: the text, what it cost, and who answered (after fallbacks)."""

    text: str
    model: str
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: float | None
    latency_s: float


SecretLoader = Callable[[str], str]
"""Reads a named secret (a Prefect Secret block): I/O the core does not do itself (issue #39).
The task layer provides it, ``prefect_conductor.tasks.secrets.prefect_secrets``."""

_SECRETS: ContextVar[SecretLoader | None] = ContextVar("conductor_secret_loader", default=None)


@contextmanager
def secret_source(loader: SecretLoader) -> Iterator[None]:
    """Calls in this block (this thread, this context) read ``api_key_secret`` through
    ``loader``. Set per call, never process-wide."""
    token = _SECRETS.set(loader)
    try:
        yield
    finally:
        _SECRETS.reset(token)


def resolve_api_key(endpoint: _Endpoint) -> str | None:
    """The key named by the pool: an environment variable, or a secret read through the
    ``secret_source`` in effect (a Prefect Secret block, from a task).

    ``None`` lets litellm read its provider's usual variable (``OPENAI_API_KEY``, ...).
    """
    if endpoint.api_key_env:
        value = os.environ.get(endpoint.api_key_env)
        if not value:
            raise WorkerError(
                f"environment variable {endpoint.api_key_env} (api_key_env of {endpoint.model}) "
                "is not set",
                retryable=False,
            )
        return value
    if endpoint.api_key_secret:
        loader = _SECRETS.get()
        if loader is None:
            raise WorkerError(
                f"api_key_secret {endpoint.api_key_secret!r} of {endpoint.model} is a Prefect "
                "Secret block: call through the task layer (prefect_conductor.tasks.secrets)",
                retryable=False,
            )
        return loader(endpoint.api_key_secret)
    return None


def classify_error(exc: BaseException, model: str) -> WorkerError:
    """Map a litellm (or transport) exception to a one-line ``WorkerError``."""
    if isinstance(exc, WorkerError):
        return exc
    # litellm wraps what a custom provider raises (our local model, tools) in an
    # APIConnectionError; the provider's own WorkerError, with its retryable flag, wins.
    inner = exc.__cause__ or exc.__context__
    if isinstance(inner, WorkerError):
        return WorkerError(f"{model}: {inner}", retryable=inner.retryable)
    kind = type(exc).__name__
    status = getattr(exc, "status_code", None)
    if isinstance(exc, _FATAL):
        retryable = False
    elif isinstance(exc, _RETRYABLE):
        retryable = True
    elif isinstance(status, int):
        retryable = status == 429 or status >= 500
    else:
        retryable = isinstance(exc, (TimeoutError, ConnectionError))
    message = str(getattr(exc, "message", None) or exc).strip().splitlines()
    # litellm prefixes its messages with the class chain ("litellm.BadRequestError: ...").
    first = _LITELLM_PREFIX.sub("", message[0]) if message else kind
    if len(first) > 300:
        first = first[:297] + "..."
    return WorkerError(f"{model}: {kind}: {first}", retryable=retryable)


def _pool_priced(endpoint: _Endpoint) -> bool:
    return endpoint.input_cost_per_token is not None or endpoint.output_cost_per_token is not None


def price(
    endpoint: _Endpoint, response: Any, input_tokens: int | None, output_tokens: int | None
) -> float | None:
    """The pool's per-token prices win; else litellm's price map; unknown -> ``None``.

    litellm has already priced the response from its map (``_hidden_params``) while logging
    the call; asking ``completion_cost`` again would repeat the lookup.
    """
    if _pool_priced(endpoint):
        if input_tokens is None or output_tokens is None:
            return None
        return (endpoint.input_cost_per_token or 0.0) * input_tokens + (
            endpoint.output_cost_per_token or 0.0
        ) * output_tokens
    cost = (getattr(response, "_hidden_params", None) or {}).get("response_cost")
    return float(cost) if cost is not None else None


def _ensure_provider(model: str) -> None:
    """Register our own litellm providers the first time one of their models is called."""
    if model.startswith("local/"):
        from prefect_conductor.conductor.providers.local_model import register

        register()
    elif model.startswith("tool/"):
        from prefect_conductor.conductor.providers.tools.provider import register as register_tools

        register_tools()


def complete(
    endpoint: _Endpoint,
    messages: list[dict[str, str]],
    **overrides: Any,
) -> Completion:
    """Call ``endpoint`` once. Raises ``WorkerError`` (``retryable`` set) on failure."""
    params: dict[str, Any] = {**endpoint.params, **overrides}
    api_key = resolve_api_key(endpoint)
    if api_key is not None:
        params["api_key"] = api_key
    if endpoint.api_base:
        params["api_base"] = endpoint.api_base
    if _pool_priced(endpoint):
        # litellm prices every response for its logging; told the pool's prices it skips the
        # fuzzy model-name search it runs for names missing from its map (~4 ms per call).
        params["input_cost_per_token"] = endpoint.input_cost_per_token or 0.0
        params["output_cost_per_token"] = endpoint.output_cost_per_token or 0.0
    _ensure_provider(endpoint.model)
    started = time.perf_counter()
    try:
        response = litellm.completion(
            model=endpoint.model,
            messages=messages,
            timeout=endpoint.timeout_s,
            num_retries=0,
            **params,
        )
    except Exception as exc:  # noqa: BLE001 - every failure becomes a WorkerError
        raise classify_error(exc, endpoint.model) from None
    latency = time.perf_counter() - started
    choice = response.choices[0]
    text = (getattr(choice.message, "content", None) or "").strip()
    usage = getattr(response, "usage", None)
    input_tokens = getattr(usage, "prompt_tokens", None)
    output_tokens = getattr(usage, "completion_tokens", None)
    return Completion(
        text=text,
        model=endpoint.model,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=price(endpoint, response, input_tokens, output_tokens),
        latency_s=latency,
    )
