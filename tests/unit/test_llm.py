"""prefect_conductor.conductor.providers.llm: one worker call through litellm, its usage and its price."""

from __future__ import annotations

import pytest
from prefect_conductor.conductor.pool import WorkerSpec
from prefect_conductor.conductor.providers._litellm import litellm
from prefect_conductor.conductor.providers.llm import complete

MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def test_pool_prices_win_and_reach_litellm(fake_provider, monkeypatch):
    seen: dict = {}
    real = litellm.completion

    def spy(**kwargs):
        seen.update(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(litellm, "completion", spy)
    worker = WorkerSpec(
        name="priced",
        model="fake/echo",
        input_cost_per_token=0.001,
        output_cost_per_token=0.002,
    )
    done = complete(worker, MESSAGES)
    assert done.input_tokens and done.output_tokens
    assert done.cost_usd == pytest.approx(0.001 * done.input_tokens + 0.002 * done.output_tokens)
    # litellm prices the call for its own logging with the same prices, not a map search
    assert (seen["input_cost_per_token"], seen["output_cost_per_token"]) == (0.001, 0.002)


def test_known_model_is_priced_from_litellms_map():
    worker = WorkerSpec(name="gpt", model="openai/gpt-4o-mini", params={"mock_response": "4"})
    done = complete(worker, MESSAGES)
    assert done.text == "4"
    assert done.cost_usd is not None and done.cost_usd > 0


def test_unknown_model_without_pool_prices_has_null_cost(fake_provider):
    done = complete(WorkerSpec(name="free", model="fake/echo"), MESSAGES)
    assert done.text and done.cost_usd is None


def test_an_explicit_zero_price_is_zero_not_null(fake_provider):
    worker = WorkerSpec(name="free", model="fake/echo", input_cost_per_token=0.0)
    assert complete(worker, MESSAGES).cost_usd == 0.0


def test_the_core_reads_secret_blocks_only_through_the_task_layers_loader():
    """Issue #39: no Prefect import in the core; the loader is set per call, not globally."""
    from prefect_conductor.conductor.errors import WorkerError
    from prefect_conductor.conductor.pool import WorkerSpec
    from prefect_conductor.conductor.providers.llm import resolve_api_key, secret_source

    spec = WorkerSpec(name="w", model="openai/gpt-4o-mini", api_key_secret="team-key")
    with pytest.raises(WorkerError, match="call through the task layer") as raised:
        resolve_api_key(spec)
    assert not raised.value.retryable
    asked: list[str] = []
    with secret_source(lambda name: asked.append(name) or "sk-from-block"):
        assert resolve_api_key(spec) == "sk-from-block"
    assert asked == ["team-key"]
    with pytest.raises(WorkerError):  # the loader was for that block only
        resolve_api_key(spec)
