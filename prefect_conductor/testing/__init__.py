"""Fakes that ship with the package (issue #39), as pydantic-ai ships ``models.test``: what the
test suite and the benchmarks both use, so neither imports the other.

- ``fakes``: the fake litellm provider, ``fake/<behaviour>`` models (echo, sleep, scripted
  plans and answers, rate limits and errors), registered with ``register_fake_provider()``;
- ``fleet``: a fleet of ``conductor serve`` processes on the local stack of
  ``deployments/stack.py``, each a "host" with its own environment, and what reads it back.

Importing this package imports neither module and starts nothing. May import: everything of
``prefect_conductor``; never ``tests`` or ``benchmarks``.
"""
