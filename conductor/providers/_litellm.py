"""Import litellm configured for offline, quiet use. Import litellm through this module.

litellm fetches its model price map from the network when imported unless
``LITELLM_LOCAL_MODEL_COST_MAP`` is set; we always use the copy shipped in the wheel, so the
product works offline and start-up never waits on a network timeout.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402

# litellm prints a "Give Feedback / Get Help" banner on errors, and may log request bodies at
# debug level: neither belongs on a user's terminal or in Prefect logs.
litellm.suppress_debug_info = True
litellm.drop_params = True
litellm.telemetry = False

__all__ = ["fill_response", "litellm", "register_provider"]


def register_provider(name: str, handler: litellm.CustomLLM) -> None:
    """Route ``<name>/...`` models to ``handler`` (idempotent).

    litellm also runs ``custom_llm_setup`` before every completion; running it now lets
    ``get_llm_provider`` recognise the prefix before the first call.
    """
    entries = litellm.custom_provider_map
    if not any(e.get("provider") == name for e in entries):
        entries.append({"provider": name, "custom_handler": handler})
    litellm.utils.custom_llm_setup()


def fill_response(
    response: litellm.ModelResponse,
    *,
    text: str,
    model: str,
    finish_reason: str = "stop",
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
) -> litellm.ModelResponse:
    """Put a provider's answer and its token usage into litellm's response object."""
    response.choices[0].message.content = text
    response.choices[0].finish_reason = finish_reason
    response.model = model
    response.usage = litellm.Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )
    return response
