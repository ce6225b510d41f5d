"""Many processes and hosts answering questions (issue #39).

- ``serve``: the long-lived process behind ``conductor serve`` (a warm pool, task workers);
- ``fanout``: ``--fan-out``, questions spread over background task runs on any host.

The tasks they serve and send (``served_request``, ``fleet_question``) are ``tasks/fleet.py``'s;
``serve`` hands them their flows (``flows/fleet_question.py``).

May import: ``serve``: ``prefect_conductor.runtime``, ``flows``, ``tasks``, ``conductor``;
``fanout`` only ``tasks`` and ``conductor``, since the ``evaluate`` and ``train-conductor`` flows
use its scheduler (``Fleet``).
"""
