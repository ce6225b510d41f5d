"""Trained conductors: LoRA adapter directories and the references that name them (issue #8).

An adapter directory is what PEFT's ``save_pretrained`` writes (``adapter_config.json``,
``adapter_model.safetensors``) plus ``conductor.json``, which says what serving needs:

- ``base``: the local model the adapter applies to (``smollm2-135m-instruct``, or an HF
  model directory), loaded through the same code as ``local/…`` workers;
- ``prompt``: the prompt style it was trained with (``conductor.plan.prompts.PromptStyle``);
- ``provenance``: how it was made (command, MLflow run, data, steps, wall time).

A conductor reference is a directory, ``models:/conductor@champion`` (or any MLflow model
URI: the registered artifacts are downloaded once under ``$CONDUCTOR_HOME/models``), or
``embedded`` for the adapter shipped inside this package. ``local/<adapter dir>`` serves it
through litellm; the local provider keeps one base model in memory for the adapter and for
the workers that use the base (``prefect_conductor.conductor.providers.local_model``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from prefect_conductor.conductor.errors import ConductorError
from prefect_conductor.conductor.pool import Pool

__all__ = [
    "ADAPTER_META",
    "CHAMPION_URI",
    "EMBEDDED_ADAPTER",
    "INCUMBENT",
    "AdapterError",
    "AdapterInfo",
    "NotRegistered",
    "Download",
    "embedded_adapter_path",
    "is_adapter_dir",
    "read_adapter",
    "resolve_conductor",
    "with_conductor",
    "write_adapter_meta",
]

ADAPTER_META = "conductor.json"
EMBEDDED_ADAPTER = "smollm2-135m-conductor"


class AdapterError(ConductorError):
    """A conductor reference names nothing loadable."""


class NotRegistered(AdapterError):
    """A ``models:/…`` reference the MLflow registry does not hold."""


#: The conductor a retraining continues from and must beat: the registry's champion, else
#: the adapter shipped in the package (what ``conductor run`` uses while there is none).
INCUMBENT = "champion"
CHAMPION_URI = "models:/conductor@champion"


@dataclass(frozen=True)
class AdapterInfo:
    path: Path
    base: str
    prompt: str = "compact"
    provenance: dict[str, Any] = field(default_factory=dict)


def embedded_adapter_path() -> Path:
    """The trained conductor shipped in the package (``conductor/adapters/<name>``)."""
    return Path(str(resources.files("prefect_conductor.conductor") / "adapters" / EMBEDDED_ADAPTER))


def is_adapter_dir(path: Path) -> bool:
    return path.is_dir() and (path / "adapter_config.json").is_file()


def read_adapter(path: str | Path) -> AdapterInfo:
    """Read an adapter directory's ``conductor.json``; errors name the path."""
    p = Path(path).expanduser()
    if not is_adapter_dir(p):
        raise AdapterError(f"{p}: not a LoRA adapter directory (no adapter_config.json)")
    meta_file = p / ADAPTER_META
    meta: dict[str, Any] = {}
    if meta_file.is_file():
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise AdapterError(f"{meta_file}: unreadable ({exc})") from None
    if not meta.get("base"):  # a plain PEFT adapter: take PEFT's own record of its base
        config = json.loads((p / "adapter_config.json").read_text(encoding="utf-8"))
        meta["base"] = config.get("base_model_name_or_path") or ""
    if not meta["base"]:
        raise AdapterError(f"{p}: the adapter does not say which base model it applies to")
    prompt = meta.get("prompt", "compact")
    if prompt not in ("full", "compact"):
        raise AdapterError(f"{meta_file}: prompt must be 'full' or 'compact', got {prompt!r}")
    return AdapterInfo(p.resolve(), meta["base"], prompt, meta.get("provenance") or {})


def write_adapter_meta(
    path: Path, base: str, prompt: str, provenance: dict[str, Any] | None = None
) -> None:
    meta = {"base": base, "prompt": prompt, "provenance": provenance or {}}
    (path / ADAPTER_META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


Download = Callable[[str], Path]
"""Resolves a ``models:/…`` reference to a local directory: registry I/O, which the core does
not do (issue #39); ``prefect_conductor.tasks.registry.download_registered`` is the one."""


def _registry(ref: str, download: Download | None) -> Path:
    if download is None:
        raise AdapterError(
            f"{ref}: a model-registry reference; resolve it through "
            "prefect_conductor.tasks.registry (the core reads no registry)"
        )
    return download(ref)


def resolve_conductor(ref: str, download: Download | None = None) -> AdapterInfo:
    """A directory, ``models:/NAME@ALIAS``, ``embedded``, or ``champion`` (``INCUMBENT``:
    ``models:/conductor@champion`` if the registry has one, else ``embedded``) -> the
    adapter it names. Registry references need ``download``."""
    ref = ref.strip()
    if ref == INCUMBENT:
        try:
            return read_adapter(_registry(CHAMPION_URI, download))
        except NotRegistered:
            ref = "embedded"
    if ref in ("embedded", EMBEDDED_ADAPTER):
        path = embedded_adapter_path()
        if not is_adapter_dir(path):
            raise AdapterError("this installation ships no trained conductor adapter")
        return read_adapter(path)
    if ref.startswith("models:/"):
        return read_adapter(_registry(ref, download))
    return read_adapter(ref)


def with_conductor(pool: Pool, ref: str, download: Download | None = None) -> Pool:
    """``pool`` with its conductor replaced by the trained adapter ``ref`` (local model)."""
    info = resolve_conductor(ref, download)
    conductor = pool.conductor.model_copy(
        update={"model": f"local/{info.path}", "prompt": info.prompt}
    )
    return pool.model_copy(update={"conductor": conductor})
