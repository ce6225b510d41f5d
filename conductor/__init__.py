"""prefect-conductor's pure core: importable without Prefect, and with no side effects.

The tree says where a change goes; each subpackage's docstring says what it may import.

- ``errors``, ``home``, ``pool``: the error root, where state lives, the pool file
  (third-party imports only);
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

Modules moved into subpackages in 0.2 (issue #16) keep their old import paths:
``import conductor.store`` returns ``conductor.data.store`` (the same module object, so
``monkeypatch`` and pickled results made before the move work unchanged).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__all__: list[str] = []

#: old module path -> new module path (issue #16's move; pure renames, no behaviour change).
MOVED_MODULES: dict[str, str] = {
    "conductor.workflow": "conductor.plan.workflow",
    "conductor.prompts": "conductor.plan.prompts",
    "conductor.strategies": "conductor.plan.strategies",
    "conductor.policy": "conductor.plan.policy",
    "conductor.requests": "conductor.plan.requests",
    "conductor.llm": "conductor.providers.llm",
    "conductor._litellm": "conductor.providers._litellm",
    "conductor.local_model": "conductor.providers.local_model",
    "conductor._batching": "conductor.providers._batching",
    "conductor._prefix_cache": "conductor.providers._prefix_cache",
    "conductor.tools": "conductor.providers.tools",
    "conductor.tools.calculator": "conductor.providers.tools.calculator",
    "conductor.tools.provider": "conductor.providers.tools.provider",
    "conductor.tools.sandbox": "conductor.providers.tools.sandbox",
    "conductor.datasets": "conductor.data.datasets",
    "conductor.verify": "conductor.data.verify",
    "conductor.records": "conductor.data.records",
    "conductor.store": "conductor.data.store",
    "conductor.rewards": "conductor.training.rewards",
    "conductor.warm_start": "conductor.training.warm_start",
    # ``conductor.plan`` and ``conductor.training`` were modules; they are now packages that
    # re-export what the modules offered (``parse`` and ``config``).
}


class _MovedModuleLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self._target = target

    def create_module(self, spec):  # the moved module itself, not a copy
        return importlib.import_module(self._target)

    def exec_module(self, module) -> None:  # already executed by import_module
        return None


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Resolve an old module path to the module that now lives at the new one."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _MovedModuleLoader(new))


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())
