"""Micro-batched generation for a causal LM shared by many threads (issue #3).

:class:`MicroBatcher` gathers concurrent requests; :func:`generate_group` runs one group of
them as a single left-padded ``model.generate`` call.

Callers block in :meth:`MicroBatcher.submit`. The first caller with no batch running becomes
the *leader*: it waits a short gather window for other callers, splits what arrived into groups
of compatible requests (``key``), runs each group with one ``run_group`` call and hands every
caller its own result through a ``Future``. When the leader's own request is answered it gives
up the lead, and a caller still waiting takes it over. There is no background thread: nothing
to start, stop or leak, and an exception surfaces in the thread that asked.

Why the window waits for a *quiet* gap instead of a fixed 5 ms: eight threads calling
``litellm.completion`` at once reach the provider spread over 30-40 ms on 2 cores (litellm's
own per-call work holds the GIL), so a fixed 5 ms window would batch only the first two.
Waiting until no request arrived for ``gather_s`` (capped at ``max_wait_s``) catches them all
while a lone request pays only ``gather_s``.

Why the leader may wait longer, up to ``fill_s``: a batch runs to its end before the next
starts, so callers that arrive spread out get split badly. Measured in an eval of 16
concurrent questions on 2 cores: when a batch of 16 finished, the 16 next questions reached
the model over a second or two (each first starts a Prefect subflow), the leader took the
first one alone, and the other 15 waited for that lone generation before running together;
throughput halved. So the leader expects as many callers as its previous batch had: while
fewer have arrived, it keeps waiting as long as arrivals keep coming (a gap under
``patience_s``), up to ``fill_s``. A lone caller after a lone caller still pays ``gather_s``;
a lone caller after a batch of k pays up to ``patience_s`` once.

Batching does not change greedy output: rows are left-padded, and ``generate`` derives each
row's position ids from the attention mask, so a row sees the positions and keys it would see
alone (checked token for token in tests/unit/test_local_model.py, fp32 on CPU; in bf16 on a GPU
a different batch shape may round differently and flip a near-tie).

:class:`ModelThread` is the one thread that runs a process's local-model work (loading and
``generate``). Torch's CPU ops run on an OpenMP team that belongs to the thread calling them,
and libgomp counts the workers of every team in the process: once they outnumber the cores it
stops spinning between parallel regions and parks workers on a futex, so every matmul pays a
wake-up. Measured on 2 cores with torch's default of 2 threads: a batch of 8 took 11.5-15 s
when the leader was a worker thread, against 8.8-9.7 s from the main thread, with 10x the
system time; an eval where many threads take the lead in turn makes a team per thread. With
every call on one long-lived thread there is a single team, and the batch takes 7.2-10 s from
any caller (issue #3, ``benchmarks/local_inference.py``). How many threads that team has is
:func:`prefect_conductor.conductor.providers.local_model.torch_threads`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from prefect_conductor.conductor.providers._prefix_cache import (
    PrefixCache,
    cache_kwarg,
    returned_cache,
)
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)

__all__ = [
    "BatchStats",
    "Completion",
    "GenerationRequest",
    "MicroBatcher",
    "ModelThread",
    "generate_group",
    "group_key",
]

Req = TypeVar("Req")
Res = TypeVar("Res")
T = TypeVar("T")
_log = logging.getLogger(__name__)


class ModelThread:
    """Runs calls one at a time on a single long-lived daemon thread (see the module docstring).

    Started on first use; ``setup`` runs first on it. A daemon, so a Ctrl-C exit does not wait
    for a generation to end. A call made from the thread itself runs inline, so nested use
    cannot deadlock.
    """

    def __init__(
        self, name: str = "conductor-model", setup: Callable[[], None] | None = None
    ) -> None:
        self.name = name
        self._setup = setup  # runs first on the thread (thread-local settings such as torch's)
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the model thread; its result, or its exception, here."""
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        future: Future[T] = Future()
        self._queue.put((future, lambda: fn(*args, **kwargs)))
        self._start()
        return future.result()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        if self._setup is not None:
            try:
                self._setup()
            except Exception:  # a failed tweak must not leave callers waiting on a dead thread
                _log.warning("model thread setup failed; running with defaults", exc_info=True)
        while True:
            future, call = self._queue.get()
            try:
                result = call()
            except BaseException as exc:  # the caller re-raises it; this thread goes on
                future.set_exception(exc)
            else:
                future.set_result(result)


@dataclass(frozen=True)
class BatchStats:
    """Counters since the batcher was built; tests read them to see that a batch happened."""

    requests: int = 0  # requests answered
    groups: int = 0  # run_group calls, i.e. model.generate calls
    largest: int = 0  # most requests in one run_group call


class MicroBatcher(Generic[Req, Res]):
    """Gathers concurrent ``submit`` calls into grouped ``run_group`` calls. Thread-safe."""

    def __init__(
        self,
        run_group: Callable[[list[Req]], list[Res]],
        key: Callable[[Req], Hashable],
        *,
        max_batch: int = 16,
        gather_s: float = 0.010,
        max_wait_s: float = 0.050,
        patience_s: float = 0.300,
        fill_s: float = 2.0,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if not 0 <= gather_s <= max_wait_s:
            raise ValueError(f"need 0 <= gather_s <= max_wait_s, got {gather_s}, {max_wait_s}")
        if not gather_s <= patience_s <= fill_s:
            raise ValueError(
                f"need gather_s <= patience_s <= fill_s, got {gather_s}, {patience_s}, {fill_s}"
            )
        self._run_group = run_group
        self._key = key
        self.max_batch = max_batch
        self.gather_s = gather_s
        self.max_wait_s = max_wait_s
        self.patience_s = patience_s
        self.fill_s = fill_s
        self._expected = 1  # callers the leader waits for: the size of the previous batch
        self._cond = threading.Condition()
        self._pending: list[tuple[Req, Future[Res]]] = []
        self._last_arrival = 0.0
        self._leading = False
        self._stats = BatchStats()

    @property
    def stats(self) -> BatchStats:
        return self._stats

    def submit(self, request: Req) -> Res:
        """Run ``request`` in the next batch and return its own result (or raise its error)."""
        future: Future[Res] = Future()
        with self._cond:
            self._pending.append((request, future))
            self._last_arrival = time.monotonic()
            self._cond.notify_all()  # a leader in its gather window counts the new arrival
            while not future.done() and self._leading:
                self._cond.wait()
            if future.done():
                return future.result()
            self._leading = True
        try:
            while not future.done():
                self._run(self._gather())
        finally:
            with self._cond:
                self._leading = False
                self._cond.notify_all()  # a waiting caller becomes the next leader
        return future.result()

    def _gather(self) -> list[tuple[Req, Future[Res]]]:
        """Take up to a batch once the expected callers are in (see the module docstring).

        With as many callers pending as the previous batch had: stop after a quiet
        ``gather_s`` (at most ``max_wait_s``). With fewer: stop after a quiet ``patience_s``
        (at most ``fill_s``). A full batch stops at once.
        """
        with self._cond:
            start = time.monotonic()
            expected = min(self.max_batch, self._expected)
            while len(self._pending) < self.max_batch:
                if len(self._pending) >= expected:
                    quiet, cap = self.gather_s, self.max_wait_s
                else:
                    quiet, cap = self.patience_s, self.fill_s
                until = min(self._last_arrival + quiet, start + cap)
                now = time.monotonic()
                if now >= until:
                    break
                self._cond.wait(until - now)
            taken = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            self._expected = max(1, len(taken))
            return taken

    def _run(self, batch: list[tuple[Req, Future[Res]]]) -> None:
        groups: dict[Hashable, list[tuple[Req, Future[Res]]]] = {}
        for item in batch:
            groups.setdefault(self._key(item[0]), []).append(item)
        try:
            for members in groups.values():
                self._run_one(members)
        finally:
            # Even on KeyboardInterrupt no caller may wait forever on a future nobody sets.
            for _, future in batch:
                if not future.done():
                    future.set_exception(RuntimeError("the batch leader stopped before this ran"))

    def _run_one(self, members: list[tuple[Req, Future[Res]]]) -> None:
        try:
            results = self._run_group([request for request, _ in members])
            if len(results) != len(members):
                raise RuntimeError(
                    f"run_group returned {len(results)} results for {len(members)} requests"
                )
        except Exception as exc:  # the group's callers each get the error; others still run
            self._count(len(members))
            for _, future in members:
                future.set_exception(exc)
        else:
            self._count(len(members))  # before any caller returns and reads the stats
            for (_, future), result in zip(members, results, strict=True):
                future.set_result(result)
        with self._cond:
            self._cond.notify_all()  # this group's callers return before later groups run

    def _count(self, size: int) -> None:
        with self._cond:
            s = self._stats
            self._stats = BatchStats(s.requests + size, s.groups + 1, max(s.largest, size))


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (EOS or a stop string) or "length" (max_tokens reached)


@dataclass(frozen=True, eq=False)  # eq=False: hashed by identity, see group_key
class GenerationRequest:
    messages: list[dict[str, Any]]
    max_tokens: int
    temperature: float
    top_p: float | None
    stop: tuple[str, ...]
    seed: int | None
    min_tokens: int


def group_key(request: GenerationRequest) -> Hashable:
    """Requests that may share one ``generate`` call: all of them.

    Sampling is done per row (:class:`_RowSampler`): each row has its own temperature, top_p
    and random generator, seeded by its own ``seed`` when it has one, so a seeded request
    samples the same text alone or in company, and greedy rows stay greedy. Before issue #18's
    eleventh session a seeded request ran alone, so ``self_sample_k`` plans per question (and
    ``eval --samples``, best-of-N proposals) were generated one at a time.
    """
    return "all"


class _RowSampler(LogitsProcessor):
    """Samples each sampled row's next token with the row's own temperature, top_p and
    ``torch.Generator``, and leaves only that token (generate then runs greedy, so its argmax
    takes it). Greedy rows (temperature 0) are left as they are.

    One draw per row per step, whatever the batch: a seeded row draws the same numbers alone
    or batched, and its logits are the same (left padding, see ``generate_group``).
    """

    def __init__(self, requests: list[GenerationRequest]) -> None:
        self.rows = [(row, r) for row, r in enumerate(requests) if r.temperature > 0]
        # An unseeded row takes its seed from torch's global generator, so that
        # torch.manual_seed still makes a run reproducible.
        self.seeds = [
            r.seed if r.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
            for _, r in self.rows
        ]
        self.generators: list[torch.Generator] | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if not self.rows:
            return scores
        if self.generators is None:
            self.generators = [
                torch.Generator(device=scores.device).manual_seed(seed) for seed in self.seeds
            ]
        scores = scores.clone()  # type: ignore[assignment]
        for (row, request), generator in zip(self.rows, self.generators, strict=True):
            probs = torch.softmax(scores[row].float() / request.temperature, dim=-1)
            if request.top_p is not None and request.top_p < 1:
                # Nucleus: the most probable tokens until their mass reaches top_p (at least
                # the first one).
                ranked, order = probs.sort(descending=True)
                keep = (ranked.cumsum(0) - ranked) < request.top_p
                probs = torch.zeros_like(probs).scatter(0, order[keep], ranked[keep])
            token = torch.multinomial(probs, 1, generator=generator)
            scores[row].fill_(-float("inf"))
            scores[row, token] = 0.0
        return scores


class _RowEnds(StoppingCriteria):
    """Ends each row at its own max_tokens, EOS or stop string; records where.

    generate's ``max_new_tokens`` and ``stop_strings`` apply to the whole batch, so the batch
    runs to the group's largest max_tokens and this criterion retires rows one by one
    (generate pads retired rows and stops when all are retired).
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, width: int, requests: list[GenerationRequest]
    ) -> None:
        self.tokenizer = tokenizer
        self.width = width  # padded prompt length: new tokens start at this column
        self.requests = requests
        self.ends: list[int | None] = [None] * len(requests)  # new tokens kept per row

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self.width
        last = input_ids[:, -1].tolist()
        for row, request in enumerate(self.requests):
            if self.ends[row] is None and (
                generated >= request.max_tokens
                or last[row] == self.tokenizer.eos_token_id
                or self._stopped(row, input_ids, request.stop)
            ):
                self.ends[row] = generated
        done = [end is not None for end in self.ends]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]

    def _stopped(self, row: int, input_ids: torch.LongTensor, stop: tuple[str, ...]) -> bool:
        if not stop:
            return False
        text = self.tokenizer.decode(input_ids[row, self.width :], skip_special_tokens=True)
        return any(s in text for s in stop)


class _MinTokens(LogitsProcessor):
    """Forbids EOS in each row until it has its own ``min_tokens`` (benchmarks, ignore_eos)."""

    def __init__(self, eos_token_id: int, width: int, minimums: list[int]) -> None:
        self.eos_token_id = eos_token_id
        self.width = width
        self.minimums = minimums

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        generated = input_ids.shape[1] - self.width
        rows = [row for row, least in enumerate(self.minimums) if generated < least]
        if rows:
            scores = scores.clone()  # type: ignore[assignment]
            scores[rows, self.eos_token_id] = -float("inf")
        return scores


def generate_group(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    requests: list[GenerationRequest],
    prefix_cache: PrefixCache | None = None,
) -> list[Completion]:
    """One ``model.generate`` for requests that share sampling parameters.

    With a ``prefix_cache`` (conductor.providers._prefix_cache), the rows start from the kept
    states of a prompt that begins as theirs do, or from the prefix they all share, computed once; a
    lone request's whole prompt is kept for the next.
    """
    # Tokenizing here, in the one thread running the batch: a fast tokenizer shared by
    # threads can fail with "Already borrowed".
    prompts = [
        tok.apply_chat_template(r.messages, add_generation_prompt=True, return_dict=True)[
            "input_ids"
        ]
        for r in requests
    ]
    with torch.inference_mode():
        # Rows that start with kept or shared prompt states begin there (``prefix_cache``):
        # [prefix][pad][rest of the prompt]; without: [pad][prompt]. Either way every row's
        # last prompt token is in the last column, and the padding is masked out.
        start, cached = (0, None) if prefix_cache is None else prefix_cache.start(model, prompts)
        input_ids, mask = _left_padded(tok, prompts, start, model.device)
        width = input_ids.shape[1]
        lone = prefix_cache if len(requests) == 1 else None  # its whole prompt is kept after
        config = GenerationConfig(
            max_new_tokens=max(r.max_tokens for r in requests),
            # Sampled rows are drawn by _RowSampler (per row, seeded); generate's own step is
            # greedy, which takes the one token the sampler left.
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            eos_token_id=tok.eos_token_id,
            pad_token_id=_pad_id(tok),
            return_dict_in_generate=lone is not None,  # the cache comes back with the tokens
        )
        ends = _RowEnds(tok, width, requests)
        processors = LogitsProcessorList()
        if any(r.min_tokens for r in requests):
            minimums = [r.min_tokens for r in requests]
            processors.append(_MinTokens(tok.eos_token_id, width, minimums))
        processors.append(_RowSampler(requests))  # last: after EOS is forbidden where it is
        extra = {cache_kwarg(model): cached} if cached is not None else {}
        out = model.generate(
            input_ids,
            attention_mask=mask,
            generation_config=config,
            stopping_criteria=StoppingCriteriaList([ends]),
            logits_processor=processors,
            **extra,
        )
        if lone is not None:
            lone.store(prompts[0], returned_cache(out))
            out = out.sequences
    new = out[:, width:].tolist()  # [rows][group max_tokens or fewer]
    return [
        _completion(tok, r, len(p), row[: end if end is not None else len(row)])
        for r, p, row, end in zip(requests, prompts, new, ends.ends, strict=True)
    ]


def _pad_id(tok: PreTrainedTokenizerBase) -> int:
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


def _left_padded(
    tok: PreTrainedTokenizerBase, prompts: list[list[int]], start: int, device: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, attention mask): each prompt's first ``start`` tokens (the same in every
    row), then padding, then the rest, so all rows end in the last column. Padding by hand
    (as padding_side="left" would, without mutating a tokenizer other code shares)."""
    pad = _pad_id(tok)
    width = max(len(p) for p in prompts) - start
    ids, mask = [], []
    for p in prompts:
        gap = width - (len(p) - start)
        ids.append(p[:start] + [pad] * gap + p[start:])
        mask.append([1] * start + [0] * gap + [1] * (len(p) - start))
    return torch.tensor(ids, device=device), torch.tensor(mask, device=device)


def _completion(
    tok: PreTrainedTokenizerBase, request: GenerationRequest, prompt_tokens: int, new_ids: list[int]
) -> Completion:
    text = tok.decode(new_ids, skip_special_tokens=True)
    cut = min((i for i in (text.find(s) for s in request.stop) if i >= 0), default=-1)
    if cut >= 0:
        text = text[:cut]
    hit_eos = bool(new_ids) and new_ids[-1] == tok.eos_token_id
    stopped = cut >= 0 or hit_eos or len(new_ids) < request.max_tokens
    return Completion(
        text=text,
        prompt_tokens=prompt_tokens,  # its own, unpadded
        completion_tokens=len(new_ids),  # up to its own stop, EOS or max_tokens
        finish_reason="stop" if stopped else "length",
    )
