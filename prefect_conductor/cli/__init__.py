"""The ``conductor`` command: a thin face over the flows (issue #39).

- ``app``: the commands and ``main()`` (the console entry point);
- ``train``: the training commands (``train-conductor``, ``train-rm``);
- ``common``: what commands share (calling a flow, reading options, failing in one line);
- ``help``: the help screens.

May import: ``prefect_conductor.runtime``, ``prefect_conductor.fleet`` and everything below
them (``flows``, ``tasks``, ``reward_model``, ``conductor``). Nothing imports the CLI.
"""
