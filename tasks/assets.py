"""Prefect assets (issue #41): the artifact store's tables and every registered model version
are assets, materialised by the tasks that write them, so the UI (and the events API) shows
which data made which model: ``runs``/``steps`` ← the runs that wrote them; ``pairs`` ← the
``runs`` and ``steps`` tables; ``orchrm`` version N ← ``pairs``; ``conductor`` version N ←
the ``runs`` and ``steps`` its training stored, the OrchRM versions that guided it, and the
conductor version it started from.

Keys are URIs of where the thing lives: a table is the store's location and the table's
name (``file:///home/me/.conductor/artifacts/runs``, ``s3://bucket/prefix/pairs``); a model
version is the tracking store's URI and ``models/<name>/<version>``
(``sqlite:////home/me/.conductor/mlflow.db/models/conductor/3``). Prefect records each
materialisation as an event ``prefect.asset.materialization.succeeded`` whose related
resources are its upstream assets.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.assets import add_asset_metadata
from prefect.cache_policies import NO_CACHE
from prefect.tasks import MaterializingTask, Task
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.tasks.tracking import tracking_uri

__all__ = ["model_asset", "model_ref_asset", "record_model_version", "table_asset", "writing"]


@functools.lru_cache(maxsize=64)
def _store_uri(root: str | None) -> str:
    location = ArtifactStore(root).root
    uri = location if "://" in location else Path(location).resolve().as_uri()
    return uri.rstrip("/")


def table_asset(table: str, root: str | None = None) -> str:
    """The asset key of one table of the artifact store at ``root`` (default: the home's)."""
    return f"{_store_uri(root)}/{table}"


def model_asset(name: str, version: str) -> str:
    """The asset key of version ``version`` of registered model ``name``."""
    return f"{tracking_uri().rstrip('/')}/models/{name}/{version}"


def model_ref_asset(ref: str) -> str:
    """The asset key of what a model reference names now: ``models:/NAME@ALIAS`` or
    ``models:/NAME/VERSION`` a registered version; ``champion`` the conductor champion (else
    the shipped adapter, as training resolves it); ``embedded`` or a directory its files."""
    import mlflow
    from prefect_conductor.conductor.adapters import INCUMBENT, embedded_adapter_path
    from prefect_conductor.tasks.tracking import model_version_by_alias

    if ref == INCUMBENT:
        ref = "models:/conductor@champion"
    if ref.startswith("models:/"):
        name, _, version = ref.removeprefix("models:/").partition("/")
        if "@" in name:
            name, alias = name.split("@", 1)
            found = model_version_by_alias(mlflow.MlflowClient(tracking_uri()), name, alias)
            if found is None:  # no champion yet: training starts from the shipped adapter
                return embedded_adapter_path().resolve().as_uri()
            version = str(found.version)
        return model_asset(name, version)
    if ref == "embedded":
        return embedded_adapter_path().resolve().as_uri()
    return Path(ref).expanduser().resolve().as_uri()


@functools.lru_cache(maxsize=256)
def _materializing(task: Task, assets: tuple[str, ...], deps: tuple[str, ...]) -> Task:
    return MaterializingTask(
        fn=task.fn,
        assets=list(assets),
        asset_deps=list(deps) or None,
        name=task.name,
        task_run_name=task.task_run_name,
        retries=task.retries,
        retry_delay_seconds=task.retry_delay_seconds,
        retry_condition_fn=task.retry_condition_fn,
        cache_policy=NO_CACHE,
    )


def writing(task: Task, assets: Sequence[str], deps: Sequence[str] = ()) -> Task:
    """``task``, materialising ``assets`` (their upstream: ``deps``) when it completes."""
    return _materializing(task, tuple(assets), tuple(deps))


@task(cache_policy=NO_CACHE, name="record-model-version")
def _record(key: str, metadata: dict[str, Any]) -> str:
    add_asset_metadata(key, {k: v for k, v in metadata.items() if v is not None})
    return key


def record_model_version(
    name: str, version: str, upstream: Callable[[], Sequence[str]], metadata: dict[str, Any]
) -> str | None:
    """Materialise model version ``name``/``version`` as an asset whose upstream is what
    ``upstream()`` names (right after the task that registered it); returns its key. Lineage
    never costs the model it describes: a failure is one warning, and None."""
    try:
        key = model_asset(name, version)
        task = writing(_record, [key], upstream())
        return task(key, {"name": name, "version": version, **metadata})
    except Exception as exc:  # noqa: BLE001 - the model is registered; say what is missing
        _logger().warning("lineage of %s version %s not recorded: %s", name, version, exc)
        return None


def _logger() -> Any:
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)
