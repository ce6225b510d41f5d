"""A fake litellm provider for tests and benchmarks: ``fake/<behaviour>`` models.

Behaviours, from the model name:
- ``fake/echo``: answers ``echo: <last user message>``;
- ``fake/sleep-<seconds>``: sleeps, then answers ``slept <seconds>``;
- ``fake/ratelimit-<n>``: raises ``RateLimitError`` on its first n calls, then answers ``ok``;
- ``fake/auth``: always raises ``AuthenticationError``;
- ``fake/timeout``: always raises ``Timeout``;
- ``fake/badrequest``: always raises ``BadRequestError``;
- ``fake/lookup``: answers ``ANSWERS[last user message]`` (or "I don't know");
- ``fake/plan``: a scripted conductor: answers ``PLANS["nested"]`` to a recursion round
  (its prompt shows an earlier workflow) and ``PLANS["top"]`` otherwise; the messages of
  each call are appended to ``PLAN_PROMPTS``;
- ``fake/cycle``: a sampling conductor: the n-th call about one question (its last user
  message) answers ``CYCLE[n % len(CYCLE)]``, so k samples of a question are known.

``CALLS`` counts calls per model name, so tests can assert what was (not) retried.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

from litellm import CustomLLM, ModelResponse
from litellm.types.utils import Choices, Message, Usage

from prefect_conductor.conductor.providers._litellm import litellm

__all__ = [
    "ANSWERS",
    "CALLS",
    "CYCLE",
    "PLANS",
    "PLAN_PROMPTS",
    "FakeLLM",
    "register_fake_provider",
]

CALLS: Counter[str] = Counter()
PLANS: dict[str, str] = {"top": "", "nested": ""}
ANSWERS: dict[str, str] = {}
PLAN_PROMPTS: list[list[dict[str, Any]]] = []
CYCLE: list[str] = []
_CYCLED: Counter[str] = Counter()
_lock = threading.Lock()


def _respond(model: str, text: str, messages: list[dict[str, Any]]) -> ModelResponse:
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
    return ModelResponse(
        model=model,
        choices=[
            Choices(index=0, finish_reason="stop", message=Message(role="assistant", content=text))
        ],
        usage=Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=len(text.split()),
            total_tokens=prompt_tokens + len(text.split()),
        ),
    )


class FakeLLM(CustomLLM):
    def completion(self, model: str, messages: list, *args: Any, **kwargs: Any) -> ModelResponse:
        name = model.split("/", 1)[-1]
        with _lock:
            CALLS[name] += 1
            count = CALLS[name]
        last = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        if name == "plan":
            PLAN_PROMPTS.append(list(messages))
            nested = any("An earlier workflow was" in str(m.get("content")) for m in messages)
            return _respond(model, PLANS["nested" if nested else "top"], messages)
        if name == "cycle":
            with _lock:
                n = _CYCLED[last]
                _CYCLED[last] += 1
            return _respond(model, CYCLE[n % len(CYCLE)], messages)
        if name == "lookup":
            return _respond(model, ANSWERS.get(last, "I don't know"), messages)
        if name == "echo":
            return _respond(model, f"echo: {last}", messages)
        if name.startswith("sleep-"):
            seconds = float(name.removeprefix("sleep-"))
            time.sleep(seconds)
            return _respond(model, f"slept {seconds}", messages)
        if name.startswith("ratelimit-"):
            if count <= int(name.removeprefix("ratelimit-")):
                raise litellm.RateLimitError("slow down", llm_provider="fake", model=model)
            return _respond(model, "ok", messages)
        if name == "auth":
            raise litellm.AuthenticationError("bad key", llm_provider="fake", model=model)
        if name == "timeout":
            raise litellm.Timeout("took too long", model=model, llm_provider="fake")
        if name == "badrequest":
            raise litellm.BadRequestError("bad request", model=model, llm_provider="fake")
        raise litellm.BadRequestError(
            f"unknown fake behaviour {name!r}", model=model, llm_provider="fake"
        )

    async def acompletion(
        self, model: str, messages: list, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        name = model.split("/", 1)[-1]
        if name.startswith("sleep-"):
            await asyncio.sleep(float(name.removeprefix("sleep-")))
            with _lock:
                CALLS[name] += 1
            return _respond(model, f"slept {float(name.removeprefix('sleep-'))}", messages)
        return await asyncio.to_thread(self.completion, model, messages)


_handler = FakeLLM()


def register_fake_provider() -> None:
    """Make ``fake/...`` models reachable through litellm (idempotent)."""
    if not any(p.get("provider") == "fake" for p in litellm.custom_provider_map):
        litellm.custom_provider_map.append({"provider": "fake", "custom_handler": _handler})
    litellm.utils.custom_llm_setup()
