"""prefect-conductor: learned LLM orchestration on Prefect.

    import prefect_conductor as pc
    result = pc.run("What is 17 + 25?")       # the embedded local pool: no key, no network
    print(result.answer)                      # 42

``run``, ``evaluate``, ``train`` and ``improve`` are what the ``conductor`` command calls
(:mod:`prefect_conductor.api`). The repository keeps the design card's folders; they install
under this one import name (issue #39): ``prefect_conductor.conductor`` (the pure core),
``.reward_model`` (OrchRM), ``.tasks`` (Prefect tasks: every I/O), ``.flows`` (Prefect flows).
The faces of the product live here too: ``.cli`` (the ``conductor`` command), ``.runtime``
(the temporary server, result storage, the offline and quiet defaults) and ``.fleet``
(``conductor serve``, fan-out); ``.testing`` holds the fakes that ship with it (a fake litellm
provider, a local fleet). Importing this package starts nothing and sets nothing.
"""

from prefect_conductor.api import (
    ConductorError,
    EvalResult,
    Pool,
    RunResult,
    evaluate,
    improve,
    load_pool,
    pool_from_dict,
    run,
    train,
)

__all__ = [
    "ConductorError",
    "EvalResult",
    "Pool",
    "RunResult",
    "evaluate",
    "improve",
    "load_pool",
    "pool_from_dict",
    "run",
    "train",
]
