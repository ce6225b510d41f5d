"""Model providers: every model and tool call, through litellm.

- ``llm``: ``complete()``, the one entry point for a worker or conductor call (usage, price,
  retries, error classification);
- ``_litellm``: litellm imported offline and quiet, and custom-provider registration;
- ``local_model``: the ``local/…`` provider (a causal LM in this process, LoRA adapters);
- ``_batching`` and ``_prefix_cache``: micro-batched generation and prompt-prefix reuse;
- ``tools/``: the ``tool/…`` provider, the calculator and the Python sandbox.

May import: ``conductor.errors``, ``conductor.home``, ``conductor.pool``,
``conductor.adapters``. Never ``plan``, ``data`` or ``training``. Importing this package
imports nothing heavy; litellm and torch load with the modules that need them.
"""
