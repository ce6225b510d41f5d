"""Where and how flows run in this process (issue #39): applied at call time, never at import.

- ``server``: Prefect's temporary server (started with a parent-death signal, its log and its
  database under the one home), the settings of local runs, result storage;
- ``quiet``: what reaches the terminal, and the offline defaults (no telemetry, litellm's price
  map from the package) that every face applies, a user's own setting winning.

May import: ``prefect`` and ``conductor``. Never ``flows``, the CLI or the fleet.
"""
