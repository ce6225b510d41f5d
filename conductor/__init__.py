"""prefect-conductor's pure core: importable without Prefect, and with no side effects.

The tree says where a change goes; each subpackage's docstring says what it may import.

- ``errors``, ``home``, ``pool``, ``question``: the error root, where state lives, the pool
  file, what makes a question askable (third-party imports only);
- ``adapters``: trained conductors, i.e. LoRA adapter directories, the shipped adapter and
  the references that name them (imports the three above);
- ``providers``: every model call (litellm glue, the local model, batching, prefix reuse)
  and the tools (imports the base modules);
- ``data``: datasets, verifiers, artifact records and the Parquet store (the base modules,
  and ``providers.tools`` to test code answers in the sandbox);
- ``plan``: the workflow model, the parser and validator, prompts, strategies, the
  conductor policy (the base modules and ``providers``);
- ``training``: GRPO/SFT stage configs, rewards, warm-start data (anything above).

Nothing in ``conductor`` imports ``reward_model``, ``tasks`` or ``flows``.
"""

__all__: list[str] = []
