"""Many processes and hosts answering questions (issue #39).

- ``serve``: the long-lived process behind ``conductor serve`` (a warm pool, task workers);
- ``fanout``: ``--fan-out``, questions spread over background task runs on any host.

May import: ``prefect_conductor.runtime``, ``flows``, ``tasks``, ``conductor``.
"""
