"""prefect-conductor: learned LLM orchestration on Prefect (issue #39 gives it one import name).

The repository keeps the design card's folders; they install under this package:
``prefect_conductor.conductor`` (the pure core), ``.reward_model`` (OrchRM), ``.tasks``
(Prefect tasks: every I/O), ``.flows`` (Prefect flows). The faces of the product live here
too: ``.cli`` (the ``conductor`` command), ``.runtime`` (the temporary server, result storage,
the offline and quiet defaults) and ``.fleet`` (``conductor serve``, fan-out).
"""

__all__: list[str] = []
