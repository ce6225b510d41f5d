"""Measured scripts (CONTRIBUTING.md, "Benchmarks"): each prints a table and ``--json`` and
measures its baseline in the same run. Run one from the repository's root as a module,
``python -m benchmarks.NAME``; a benchmark imports another as ``benchmarks.NAME``.

Not installed, and a leaf: a benchmark imports the package (and ``prefect_conductor.testing``
for the fakes), never ``tests``, and nothing outside ``benchmarks/`` imports a benchmark
(``tests/unit/test_packaging.py`` checks both). Each benchmark's own arithmetic is checked by
``benchmarks/test_NAME.py``, which pytest collects with the suite.
"""
