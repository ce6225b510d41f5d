"""Prompt-prefix reuse in the local provider (prefect_conductor.conductor.providers._prefix_cache), on a tiny random Llama
with the SmolLM2 tokenizer: the same tokens as a full prefill, less prompt computed."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from types import SimpleNamespace

import pytest
import torch
from prefect_conductor.conductor.providers._batching import GenerationRequest, generate_group
from prefect_conductor.conductor.providers._prefix_cache import PrefixCache, cache_kwarg
from prefect_conductor.conductor.providers.local_model import LocalModel
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)

SYSTEM = (
    "You are the Conductor. Write a workflow for a team of models: model_id, subtasks and "
    "access_list, one Python list each. Model 0: a small assistant. Model 1: a calculator. "
    "Model 2: a Python sandbox."
)
QUESTIONS = [
    "What is 17 + 25?",
    "A shop sells 41 stickers. Each costs 5 dollars. How much for all of them?",
    "What is (3 + 4) * 12?",
    "Write a program that prints the sum of the first 10 primes.",
]


@pytest.fixture(scope="module")
def tokenizer(tiny_base) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_base)  # SmolLM2's, saved with the tiny model


@pytest.fixture(scope="module")
def model(tiny_base) -> LlamaForCausalLM:
    return AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32).eval()


def request(question: str, **kwargs) -> GenerationRequest:
    fields = {
        "max_tokens": 12,
        "temperature": 0.0,
        "top_p": None,
        "stop": (),
        "seed": None,
        "min_tokens": 0,
        **kwargs,
    }
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return GenerationRequest(messages=messages, **fields)


def prompt_ids(tokenizer, req: GenerationRequest) -> list[int]:
    return tokenizer.apply_chat_template(
        req.messages, add_generation_prompt=True, return_dict=True
    )["input_ids"]


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@pytest.mark.parametrize(
    "sampling",
    [{}, {"temperature": 1.0, "top_p": 0.9, "seed": 7}, {"max_tokens": 30, "min_tokens": 30}],
    ids=["greedy", "seeded-sample", "min-tokens"],
)
def test_reused_prefix_gives_the_tokens_of_a_full_prefill(model, tokenizer, sampling) -> None:
    cache = PrefixCache()
    for question in QUESTIONS:
        req = request(question, **sampling)
        full = generate_group(model, tokenizer, [req])  # no reuse: the whole prompt computed
        reused = generate_group(model, tokenizer, [req], cache)
        assert reused == full, question  # text, usage and finish reason
    ids = [prompt_ids(tokenizer, request(q)) for q in QUESTIONS]
    stats = cache.stats
    assert stats.lookups == len(QUESTIONS)
    assert stats.hits == len(QUESTIONS) - 1  # the first prompt finds nothing kept
    # Each later prompt reuses its longest common prefix with an earlier one: the system
    # prompt and the chat template's tokens up to the question.
    expected = sum(max(shared_prefix(ids[i], ids[j]) for j in range(i)) for i in range(1, 4))
    assert stats.reused_tokens == expected
    assert expected > 3 * 40  # the system prompt really was skipped


def test_the_same_prompt_again_reuses_all_but_its_last_token(model, tokenizer) -> None:
    cache = PrefixCache()
    req = request(QUESTIONS[0])
    first = generate_group(model, tokenizer, [req], cache)
    again = generate_group(model, tokenizer, [req], cache)
    assert again == first
    assert cache.stats.reused_tokens == len(prompt_ids(tokenizer, req)) - 1
    assert len(cache) == 1  # kept once


def test_a_short_common_prefix_is_a_miss(model, tokenizer) -> None:
    cache = PrefixCache(min_tokens=10_000)
    for question in QUESTIONS[:2]:
        generate_group(model, tokenizer, [request(question)], cache)
    assert cache.stats.hits == 0 and cache.stats.lookups == 2
    assert len(cache) == 0  # a prompt shorter than min_tokens is not kept either


@pytest.mark.parametrize("kept_first", [False, True], ids=["fresh", "after-a-lone-request"])
def test_a_batch_starts_every_row_from_the_prefix_they_share(model, tokenizer, kept_first) -> None:
    cache = PrefixCache()
    batch = [request(q, max_tokens=16) for q in QUESTIONS]
    alone = [generate_group(model, tokenizer, [r])[0] for r in batch]  # no reuse, one by one
    if kept_first:
        generate_group(model, tokenizer, [request("Something else entirely?")], cache)
    together = generate_group(model, tokenizer, batch, cache)
    assert together == alone  # text, usage and finish reason, row by row
    ids = [prompt_ids(tokenizer, r) for r in batch]
    shared = min(shared_prefix(ids[0], i) for i in ids[1:])
    stats = cache.stats
    assert shared > 40  # the system prompt and the template up to the questions
    assert stats.reused_tokens == shared * len(batch)
    if kept_first:  # the lone request's prompt already holds the shared part: read it
        assert (stats.prefills, stats.hits) == (0, 1)
    else:  # computed once, as one row, and kept for the next batch
        assert (stats.prefills, stats.hits) == (1, 0)
        assert tuple(ids[0][:shared]) in cache._entries  # noqa: SLF001
    again = generate_group(model, tokenizer, batch, cache)
    assert again == alone
    assert cache.stats.prefills == stats.prefills and cache.stats.hits == stats.hits + 1


def test_rows_of_one_prompt_share_all_but_its_last_token(model, tokenizer) -> None:
    cache = PrefixCache()
    sampled = [request(QUESTIONS[1], temperature=1.0, top_p=0.9, max_tokens=8)] * 4
    torch.manual_seed(3)
    out = generate_group(model, tokenizer, sampled, cache)
    assert len(out) == 4
    assert cache.stats.reused_tokens == 4 * (len(prompt_ids(tokenizer, sampled[0])) - 1)


def test_a_batch_without_a_long_shared_prefix_runs_as_before(model, tokenizer) -> None:
    cache = PrefixCache()
    batch = [
        GenerationRequest(
            [{"role": "system", "content": q}, {"role": "user", "content": "Go."}],
            10,
            0.0,
            None,
            (),
            None,
            0,
        )  # fmt: skip
        for q in ("Alpha beta gamma.", "Zeta eta theta, and so on for a while.")
    ]
    together = generate_group(model, tokenizer, batch, cache)
    assert together == [generate_group(model, tokenizer, [r])[0] for r in batch]
    assert cache.stats.prefills == 0 and cache.stats.hits == 0 and len(cache) == 0


def synthetic_cache(n: int, layers: int = 2) -> DynamicCache:
    """A one-row cache of ``n`` positions: 16 bytes a position and layer (keys and values)."""
    data = [(torch.full((1, 1, n, 2), float(i)), torch.zeros(1, 1, n, 2)) for i in range(layers)]
    return DynamicCache(ddp_cache_data=data)


def test_memory_bound_evicts_the_least_recently_used(model) -> None:
    a, b, c = list(range(10)), list(range(100, 110)), list(range(200, 210))
    cache = PrefixCache(max_bytes=2 * 10 * 32 + 100, min_tokens=4)  # room for two prompts
    cache.store(a, synthetic_cache(10))
    cache.store(b, synthetic_cache(10))
    reused, _ = cache.start(model, [[*a, 5]])  # touches a: b is now the least recently used
    assert reused == 10
    cache.store(c, synthetic_cache(10))
    assert list(cache._entries) == [tuple(a), tuple(c)]  # noqa: SLF001
    assert cache._bytes == 2 * 10 * 32 <= cache.max_bytes  # noqa: SLF001
    cache.store(list(range(300, 340)), synthetic_cache(40))  # over the bound alone: not kept
    assert len(cache) == 2


def test_reused_states_are_the_kept_ones_and_stay_unchanged(model) -> None:
    cache = PrefixCache(min_tokens=4)
    kept = synthetic_cache(10)
    cache.store(list(range(10)), kept)
    reused, fresh = cache.start(model, [[*range(6), 99, 98]])
    assert reused == 6
    assert fresh.layers[1].keys.shape == (1, 1, 6, 2)
    assert torch.equal(fresh.layers[1].keys, torch.full((1, 1, 6, 2), 1.0))
    fresh.update(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2), 0)  # what generate does
    again, _ = cache.start(model, [[*range(10), 1]])
    assert again == 10
    assert torch.equal(cache._entries[tuple(range(10))][0][0], torch.zeros(1, 1, 10, 2))  # noqa: SLF001


def test_a_cache_that_is_not_full_attention_is_not_kept() -> None:
    cache = PrefixCache(min_tokens=1)
    sliding = SimpleNamespace(layers=[SimpleNamespace(keys=torch.zeros(1, 1, 4, 2))])
    cache.store([1, 2, 3, 4], sliding)  # a layer that is not a DynamicLayer
    assert len(cache) == 0


def test_invalid_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="min_tokens"):
        PrefixCache(min_tokens=0)


def test_cache_kwarg_follows_the_model_signature(model) -> None:
    import inspect

    expected = (
        "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    )
    assert cache_kwarg(model) == expected


def test_a_local_model_reuses_its_prompts_through_litellm(model, tokenizer) -> None:
    served = LocalModel(model, tokenizer)
    first = served.generate(request(QUESTIONS[0]).messages, max_tokens=8)
    second = served.generate(request(QUESTIONS[2]).messages, max_tokens=8)
    assert served.prefix_cache.stats.hits == 1
    assert second == generate_group(model, tokenizer, [request(QUESTIONS[2], max_tokens=8)])[0]
    assert first.prompt_tokens > 40


def test_serve_warms_the_conductor_with_its_planning_prompt(model, tokenizer) -> None:
    from prefect_conductor.conductor.plan.prompts import conductor_messages
    from prefect_conductor.conductor.pool import Pool
    from prefect_conductor.conductor.providers.local_model import LocalModelRegistry, register

    from prefect_conductor.fleet.serve import warm

    register()
    served = LocalModelRegistry.put("tiny-conductor", model, tokenizer)
    try:
        pool = Pool.model_validate(
            {
                "conductor": {"model": "local/tiny-conductor", "params": {"max_tokens": 4}},
                "default_worker": "calculator",
                "workers": [{"name": "calculator", "kind": "tool", "model": "tool/calculator"}],
            }
        )
        assert warm(pool) == ["local/tiny-conductor"]
        assert len(served.prefix_cache) == 1
        question = "A shop sells 41 stickers at 5 dollars each. What do they cost?"
        messages = conductor_messages(question, pool)
        served.generate(messages, max_tokens=4)
        system_only = tokenizer.apply_chat_template(messages[:1], return_dict=True)["input_ids"]
        # Everything up to the question was computed once, in the warm-up.
        assert served.prefix_cache.stats.reused_tokens >= len(system_only)
    finally:
        LocalModelRegistry.remove("tiny-conductor")


@pytest.mark.parametrize(
    ("value", "on"),
    [(None, True), ("1", True), ("yes", True), ("0", False), ("off", False), (" False ", False)],
)
def test_conductor_prefix_cache_turns_reuse_off(model, tokenizer, monkeypatch, value, on) -> None:
    from prefect_conductor.conductor.providers.local_model import prefix_reuse

    if value is None:
        monkeypatch.delenv("CONDUCTOR_PREFIX_CACHE", raising=False)
    else:
        monkeypatch.setenv("CONDUCTOR_PREFIX_CACHE", value)
    assert prefix_reuse(os.environ) is on
    served = LocalModel(model, tokenizer)
    assert (served.prefix_cache is not None) is on
    served.generate(request(QUESTIONS[0]).messages, max_tokens=2)  # works either way
