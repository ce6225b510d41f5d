"""Data: the questions, how answers are judged, and the intermediate-artifact dataset.

- ``datasets``: built-in and user question sets (``Example``), seeded splits;
- ``curriculum``: the word-problem curriculum (issue #18), easier problems first in train;
- ``verify``: verifiers (math, multiple choice, text, code) returning a ``Verdict``;
- ``records``: ``RunRecord`` / ``StepRecord`` rows and the Parquet schemas;
- ``store``: ``ArtifactStore``, the Parquet dataset (local disk or any pyarrow filesystem).

May import: ``conductor.errors``, ``conductor.home``, ``conductor.question`` and
``prefect_conductor.conductor.providers.tools`` (code answers are tested in the sandbox).
Never ``plan`` or ``training``.
"""
