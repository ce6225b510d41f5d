"""Prompt-prefix reuse: the key/value states of prompt prefixes already computed, for the
next prompts that start the same way (issue #10, the conductor's cold start; evals).

Every plan request of a pool sends the same long system prompt (the format rules and the
workers: about 290 of the trained conductor's 307 prompt tokens) and a short question. On
the 2-core CPU, prefill runs at ~300 tokens/s on one torch thread, so those 290 tokens cost
about 1 s of a ~3.9 s plan alone, and 8.5 s of a 14 s batch of eight plans. Like vLLM's
automatic prefix caching, for one process and a handful of prefixes:

- a lone request starts ``generate`` from the kept states of the longest common prefix (at
  token granularity) with any kept prompt, and its own prompt's states are kept afterwards;
- a batch computes the prefix all its rows share once, as one row, keeps it, and starts
  every row from it. The rows' own remainders follow, left-padded *after* the prefix
  (``[prefix][pad][rest]``, the padding masked out); ``generate`` numbers each row's
  positions from the attention mask, so every row sees the positions and keys it would see
  alone.

Output does not change: a causal model's states at a position depend only on the tokens up
to it, so the reused states are the ones a full prefill computes there, and the rest is
computed against them as it would be after one. Checked token for token, alone and in
batches, in tests/unit/test_prefix_cache.py (fp32; in bf16 on a GPU a different shape may
round differently and flip a near-tie, as batching itself may).

Only models whose every cache layer is a plain full-attention ``DynamicLayer`` take part (a
sliding-window layer keeps only part of the past). Not thread-safe: it lives on the model
thread, as every ``generate`` does (``conductor.providers._batching.ModelThread``).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

__all__ = ["PrefixCache", "PrefixStats", "cache_kwarg"]

States = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class PrefixStats:
    """Counters since the cache was built (tests and benchmarks read them)."""

    lookups: int = 0  # generate calls that looked for a prefix
    hits: int = 0  # lookups that started from at least ``min_tokens`` kept positions
    reused_tokens: int = 0  # prompt positions, summed over rows, not computed by generate
    prefills: int = 0  # shared prefixes computed once for a batch


def cache_kwarg(model: Any) -> str:
    """The name under which this transformers version passes a KV cache to a model:
    ``cache`` from transformers 5 on, ``past_key_values`` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def returned_cache(out: Any) -> Any:
    """The cache a forward or ``generate`` (with ``return_dict_in_generate``) returned."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _nbytes(states: States) -> int:
    return sum(t.nelement() * t.element_size() for pair in states for t in pair)


def _states(cache: Any) -> States | None:
    """Per-layer (keys, values) of a one-row cache, or None when it is not all full attention."""
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
        return None
    if any(getattr(layer, "keys", None) is None for layer in layers):
        return None
    return [(layer.keys, layer.values) for layer in layers]


def _cache(model: PreTrainedModel, states: States, n: int, rows: int = 1) -> DynamicCache:
    # Views, not copies: the cache's first update concatenates, which copies them into a
    # tensor of its own, so kept states are never written to.
    data = [(k[..., :n, :].expand(rows, -1, -1, -1), v[..., :n, :].expand(rows, -1, -1, -1))
            for k, v in states]  # fmt: skip
    return DynamicCache(ddp_cache_data=data, config=model.config)


class PrefixCache:
    """Kept prompt prefixes, least recently used evicted first.

    ``max_bytes`` bounds the memory (SmolLM2-135M: 46 KB a token in fp32, so a 307-token
    conductor prompt is 14 MB); a prefix shorter than ``min_tokens`` is not worth it.
    """

    def __init__(self, max_bytes: int = 256 << 20, min_tokens: int = 16) -> None:
        if max_bytes < 0 or min_tokens < 1:
            raise ValueError(
                f"need max_bytes >= 0 and min_tokens >= 1, got {max_bytes}, {min_tokens}"
            )
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self._entries: OrderedDict[tuple[int, ...], States] = OrderedDict()
        self._bytes = 0
        self._stats = PrefixStats()

    @property
    def stats(self) -> PrefixStats:
        return self._stats

    def __len__(self) -> int:
        return len(self._entries)

    def start(self, model: PreTrainedModel, prompts: Sequence[Sequence[int]]) -> tuple[int, Any]:
        """(n, a cache of every row's first n prompt positions) to start ``generate`` from;
        (0, None) when no prefix of at least ``min_tokens`` is kept or shared.

        Each row keeps at least its last prompt token to compute: ``generate`` needs its
        logits. Call in inference mode, on the model thread.
        """
        rows = len(prompts)
        shared = min(len(p) for p in prompts) - 1
        for p in prompts[1:]:
            shared = min(shared, common_prefix(prompts[0], p))
        best, n = None, 0
        for key in self._entries:
            k = min(shared, common_prefix(key, prompts[0]))
            if k > n:
                best, n = key, k
        states = self._entries[best] if best is not None else None
        if best is not None:
            self._entries.move_to_end(best)
        kept, prefilled = n, 0
        if rows > 1 and shared - n >= self.min_tokens:
            computed = self._prefill(model, prompts[0][:shared], states, n)
            if computed is not None:
                states, n, prefilled = computed, shared, 1
        s = self._stats
        if states is None or n < self.min_tokens:
            self._stats = PrefixStats(s.lookups + 1, s.hits, s.reused_tokens, s.prefills)
            return 0, None
        hit = int(kept >= self.min_tokens)
        self._stats = PrefixStats(
            s.lookups + 1, s.hits + hit, s.reused_tokens + n * rows, s.prefills + prefilled
        )
        return n, _cache(model, states, n, rows)

    def _prefill(
        self, model: PreTrainedModel, ids: Sequence[int], states: States | None, n: int
    ) -> States | None:
        """Compute the states of ``ids`` as one row (from the first ``n`` kept), and keep them."""
        kwargs: dict[str, Any] = {"use_cache": True}
        if states is not None and n > 0:
            kwargs[cache_kwarg(model)] = _cache(model, states, n)
        else:
            n = 0
        input_ids = torch.tensor([list(ids[n:])], device=model.device)
        computed = _states(returned_cache(model(input_ids=input_ids, **kwargs)))
        if computed is not None:
            self._keep(tuple(ids), computed)
        return computed

    def store(self, ids: Sequence[int], cache: Any) -> None:
        """Keep the states of prompt ``ids`` from the one-row cache ``generate`` returned."""
        key = tuple(ids)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        states = _states(cache)
        if states is None or len(key) < self.min_tokens:
            return
        # The cache also holds the generated tokens: keep the prompt's positions only, as
        # contiguous copies so the rest of the generation's cache can be freed.
        self._keep(key, [(k[..., : len(key), :].clone(), v[..., : len(key), :].clone())
                         for k, v in states])  # fmt: skip

    def _keep(self, key: tuple[int, ...], states: States) -> None:
        size = _nbytes(states)
        if key in self._entries or size > self.max_bytes:
            return
        self._entries[key] = states
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self._bytes -= _nbytes(old)
